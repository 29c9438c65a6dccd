/* gpu.c - the grouped FFN's checks and CPU reference, the loader of
 * libecs_cuda.so (dlopen: nothing here needs CUDA headers or libraries),
 * and the host emulation of the device interface. */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernels/gpu/deq.h"
#include "kernels/gpu/gpu.h"

struct kgpu {
    const kgpu_api_t *api;
    void *ctx;
    void *dl;
    int max_segs;
    size_t n_allocs, dev_bytes; /* kgpu_alloc_stats */
    char name[160];
};

bool kgpu_type_supported(ecs_type_t t) { return kgpu_row_bytes(t, 256) > 0; }

static ecs_err_t check_type(ecs_type_t t, int n, const char *what)
{
    if (!kgpu_type_supported(t))
        return ecs_error(ECS_ERR_UNSUPPORTED, "gpu ffn: %s weights of type %s have no kernel",
                         what, ecs_type_name(t) ? ecs_type_name(t) : "?");
    if (n % ecs_type_traits(t)->blck_size != 0)
        return ecs_error(ECS_ERR_INVAL, "gpu ffn: %s rows of %d values are not whole %s blocks",
                         what, n, ecs_type_name(t));
    return ECS_OK;
}

ecs_err_t kgpu_ffn_check(const kgpu_ffn_t *f)
{
    if (!f || f->n_embd < 1 || f->n_ff < 1 || f->n_segs < 0 || f->n_rows < 0 ||
        (f->n_segs > 0 && !f->segs) || (f->n_rows > 0 && (!f->x || !f->h || !f->y)))
        return ecs_error(ECS_ERR_INVAL, "gpu ffn: bad call (shape %d x %d, %d segments, %d rows)",
                         f ? f->n_embd : 0, f ? f->n_ff : 0, f ? f->n_segs : 0,
                         f ? f->n_rows : 0);
    ecs_err_t e;
    if ((e = check_type(f->gate_type, f->n_embd, "gate")) != ECS_OK ||
        (e = check_type(f->up_type, f->n_embd, "up")) != ECS_OK ||
        (e = check_type(f->down_type, f->n_ff, "down")) != ECS_OK)
        return e;
    for (int i = 0; i < f->n_segs; i++) {
        const kgpu_seg_t *s = &f->segs[i];
        if (!s->gate || !s->up || !s->down)
            return ecs_error(ECS_ERR_INVAL, "gpu ffn: segment %d has no weights", i);
        if (s->row0 < 0 || s->n_rows < 0 || s->row0 > f->n_rows - s->n_rows)
            return ecs_error(ECS_ERR_RANGE, "gpu ffn: segment %d rows [%d, +%d) outside %d rows",
                             i, s->row0, s->n_rows, f->n_rows);
    }
    return ECS_OK;
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

static float dot(const float *a, const float *b, int n)
{
    float s = 0;
    for (int i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

ecs_err_t kgpu_ffn_ref(const kgpu_ffn_t *f)
{
    ecs_err_t e = kgpu_ffn_check(f);
    if (e != ECS_OK)
        return e;
    const int E = f->n_embd, F = f->n_ff;
    const size_t rg = ecs_row_size(f->gate_type, E), ru = ecs_row_size(f->up_type, E);
    const size_t rd = ecs_row_size(f->down_type, F);
    float *wa = malloc(sizeof(float) * (size_t)(2 * E + F));
    if (!wa)
        return ecs_error(ECS_ERR_NOMEM, "gpu ffn reference: no memory for %d values", 2 * E + F);
    float *wb = wa + E, *wd = wa + 2 * E;
    for (int i = 0; i < f->n_segs; i++) {
        const kgpu_seg_t *s = &f->segs[i];
        for (int o = 0; o < F; o++) {
            ecs_dequantize_row(f->gate_type, (const char *)s->gate + (size_t)o * rg, wa, E);
            ecs_dequantize_row(f->up_type, (const char *)s->up + (size_t)o * ru, wb, E);
            for (int r = s->row0; r < s->row0 + s->n_rows; r++) {
                const float *x = f->x + (size_t)r * E;
                f->h[(size_t)r * F + o] = silu(dot(wa, x, E)) * dot(wb, x, E);
            }
        }
        for (int o = 0; o < E; o++) {
            ecs_dequantize_row(f->down_type, (const char *)s->down + (size_t)o * rd, wd, F);
            for (int r = s->row0; r < s->row0 + s->n_rows; r++)
                f->y[(size_t)r * E + o] = dot(wd, f->h + (size_t)r * F, F);
        }
    }
    free(wa);
    return ECS_OK;
}

/* ---- host emulation: device memory is host memory, the FFN the reference ---- */

static int emu_init(int device, int max_segs, void **ctx, char *msg, size_t n)
{
    (void)device;
    (void)max_segs;
    (void)msg;
    (void)n;
    *ctx = NULL;
    return 0;
}
static void emu_fini(void *ctx) { (void)ctx; }
static int emu_info(void *ctx, char *name, size_t n, size_t *mem_free)
{
    (void)ctx;
    snprintf(name, n, "host emulation");
    *mem_free = (size_t)1 << 40;
    return 0;
}
static int emu_alloc(void *ctx, size_t bytes, void **p, char *msg, size_t n)
{
    (void)ctx;
    *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!*p) {
        snprintf(msg, n, "host emulation: cannot allocate %zu bytes", bytes);
        return 2; /* cudaErrorMemoryAllocation */
    }
    return 0;
}
static void emu_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
}
static int emu_copy(void *ctx, void *dst, const void *src, size_t bytes, int dir, int stream,
                    char *msg, size_t n)
{
    (void)ctx;
    (void)dir;
    (void)stream;
    (void)msg;
    (void)n;
    memmove(dst, src, bytes);
    return 0;
}
static int emu_fence(void *ctx, char *msg, size_t n)
{
    (void)ctx;
    (void)msg;
    (void)n;
    return 0;
}
static int emu_sync(void *ctx, int stream, char *msg, size_t n)
{
    (void)stream;
    return emu_fence(ctx, msg, n);
}
static int emu_ffn(void *ctx, const kgpu_ffn_t *f, char *msg, size_t n)
{
    (void)ctx;
    if (kgpu_ffn_ref(f) != ECS_OK) {
        snprintf(msg, n, "%s", ecs_errmsg());
        return 2;
    }
    return 0;
}

static const kgpu_api_t emu_api = {
    KGPU_ABI, emu_init,  emu_fini, emu_info,  emu_alloc, emu_free,
    emu_alloc, emu_free, emu_copy, emu_fence, emu_sync,  emu_ffn,
};

/* ---- the loader ---- */

/* $ECS_CUDA_LIB, else ../lib/libecs_cuda.so beside the executable (the
 * build tree's layout), else the bare name for the dynamic loader's path. */
static void lib_path(const kgpu_opts_t *o, char *buf, size_t n)
{
    const char *env = getenv("ECS_CUDA_LIB");
    if (o->lib || (env && *env)) {
        snprintf(buf, n, "%s", o->lib ? o->lib : env);
        return;
    }
    char exe[PATH_MAX];
    const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (len > 0) {
        exe[len] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            snprintf(buf, n, "%s/../lib/libecs_cuda.so", exe);
            if (access(buf, R_OK) == 0)
                return;
        }
    }
    snprintf(buf, n, "libecs_cuda.so");
}

ecs_err_t kgpu_open(const kgpu_opts_t *o, kgpu_t **out)
{
    *out = NULL;
    if (!o || o->device < 0 || o->max_segs < 1 || o->max_segs > KGPU_MAX_SEGS)
        return ecs_error(ECS_ERR_INVAL, "gpu: bad options (device %d, max_segs %d)",
                         o ? o->device : -1, o ? o->max_segs : 0);
    kgpu_t *g = calloc(1, sizeof *g);
    if (!g)
        return ecs_error(ECS_ERR_NOMEM, "gpu: no memory");
    g->max_segs = o->max_segs;
    char msg[512] = "";
    if (o->emulate) {
        g->api = &emu_api;
    } else {
        char path[PATH_MAX + 32];
        lib_path(o, path, sizeof path);
        g->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!g->dl) {
            const char *why = dlerror();
            free(g);
            return ecs_error(ECS_ERR_UNSUPPORTED,
                             "no GPU backend: cannot load %s: %s (libecs_cuda.so is built only "
                             "where nvcc exists, and needs libcudart on the loader's path)",
                             path, why ? why : "?");
        }
        const kgpu_api_t *(*entry)(void) = NULL;
        *(void **)&entry = dlsym(g->dl, KGPU_ENTRY);
        g->api = entry ? entry() : NULL;
        if (!g->api || g->api->abi != KGPU_ABI) {
            const unsigned abi = g->api ? g->api->abi : 0;
            dlclose(g->dl);
            free(g);
            return ecs_error(ECS_ERR_UNSUPPORTED, "no GPU backend: %s has %s (want ABI %d)", path,
                             abi ? "another ABI" : "no " KGPU_ENTRY, KGPU_ABI);
        }
    }
    if (g->api->init(o->device, o->max_segs, &g->ctx, msg, sizeof msg) != 0) {
        /* not dlclose: libcudart, once called, may hold handlers and threads */
        free(g);
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s", msg);
    }
    size_t mem = 0;
    g->api->info(g->ctx, g->name, sizeof g->name, &mem);
    *out = g;
    return ECS_OK;
}

void kgpu_close(kgpu_t *g)
{
    if (!g)
        return;
    g->api->fini(g->ctx);
    /* libcudart keeps threads and atexit handlers: unloading it under them
     * is unsafe, so the .so stays mapped until the process exits */
    free(g);
}

const char *kgpu_name(const kgpu_t *g) { return g->name; }

int kgpu_max_segs(const kgpu_t *g) { return g->max_segs; }

size_t kgpu_mem_free(const kgpu_t *g)
{
    char name[8];
    size_t mem = 0;
    return g->api->info(g->ctx, name, sizeof name, &mem) == 0 ? mem : 0;
}

static ecs_err_t dev_fail(int rc, const char *msg)
{
    return ecs_error(rc == 2 ? ECS_ERR_NOMEM : ECS_ERR_IO, "gpu: %s", msg);
}

typedef int (*alloc_fn)(void *ctx, size_t bytes, void **p, char *msg, size_t n);

static ecs_err_t alloc_with(kgpu_t *g, alloc_fn fn, size_t bytes, void **p)
{
    char msg[256] = "";
    const int rc = fn(g->ctx, bytes, p, msg, sizeof msg);
    if (rc)
        return dev_fail(rc, msg);
    g->n_allocs++;
    return ECS_OK;
}

void kgpu_alloc_stats(const kgpu_t *g, size_t *n_allocs, size_t *dev_bytes)
{
    *n_allocs = g->n_allocs;
    *dev_bytes = g->dev_bytes;
}

ecs_err_t kgpu_alloc(kgpu_t *g, size_t bytes, void **dev)
{
    ecs_err_t e = alloc_with(g, g->api->alloc, bytes, dev);
    if (e == ECS_OK)
        g->dev_bytes += bytes;
    return e;
}

ecs_err_t kgpu_host_alloc(kgpu_t *g, size_t bytes, void **host)
{
    return alloc_with(g, g->api->host_alloc, bytes, host);
}

void kgpu_free(kgpu_t *g, void *dev)
{
    if (dev)
        g->api->free(g->ctx, dev);
}

void kgpu_host_free(kgpu_t *g, void *host)
{
    if (host)
        g->api->host_free(g->ctx, host);
}

ecs_err_t kgpu_copy(kgpu_t *g, void *dst, const void *src, size_t bytes, kgpu_dir_t dir,
                    kgpu_stream_t s)
{
    char msg[256] = "";
    const int rc = g->api->copy(g->ctx, dst, src, bytes, (int)dir, (int)s, msg, sizeof msg);
    return rc ? dev_fail(rc, msg) : ECS_OK;
}

ecs_err_t kgpu_fence(kgpu_t *g)
{
    char msg[256] = "";
    const int rc = g->api->fence(g->ctx, msg, sizeof msg);
    return rc ? dev_fail(rc, msg) : ECS_OK;
}

ecs_err_t kgpu_sync(kgpu_t *g, kgpu_stream_t s)
{
    char msg[256] = "";
    const int rc = g->api->sync(g->ctx, (int)s, msg, sizeof msg);
    return rc ? dev_fail(rc, msg) : ECS_OK;
}

ecs_err_t kgpu_ffn(kgpu_t *g, const kgpu_ffn_t *f)
{
    ecs_err_t e = kgpu_ffn_check(f);
    if (e != ECS_OK)
        return e;
    if (f->n_segs > g->max_segs)
        return ecs_error(ECS_ERR_RANGE, "gpu ffn: %d segments (opened for %d)", f->n_segs,
                         g->max_segs);
    if (f->n_segs == 0)
        return ECS_OK;
    char msg[256] = "";
    const int rc = g->api->ffn(g->ctx, f, msg, sizeof msg);
    return rc ? dev_fail(rc, msg) : ECS_OK;
}
