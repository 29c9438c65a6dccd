/* gen.c - seeded random weights for ecs-mkmodel, quantized and streamed into
 * the GGUF writer one tensor at a time.
 *
 * Every row of every tensor has its own generator, seeded from (seed, tensor
 * name, row index): the values do not depend on the thread count or on which
 * other tensors exist, and a consumer can regenerate any row on its own. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/ecs-mkmodel/mkmodel.h"

/* splitmix64's output function: a bijective 64-bit mixer. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

/* xoshiro256** */
typedef struct {
    uint64_t s[4];
} rng_t;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t out = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return out;
}

static void rng_seed(rng_t *r, uint64_t seed, uint64_t name_hash, uint64_t row)
{
    uint64_t sm = mix64(seed ^ mix64(name_hash ^ mix64(row + 0x9e3779b97f4a7c15ull)));
    for (int i = 0; i < 4; i++) {
        sm += 0x9e3779b97f4a7c15ull;
        r->s[i] = mix64(sm);
    }
}

/* Box-Muller: one 64-bit draw gives two 32-bit uniforms and two normals.
 * u1 is in (0, 1] so the log is finite. */
static void fill_normal(rng_t *r, float *x, int64_t n, float stddev)
{
    const float two_pi = 6.28318530717958647692f;
    for (int64_t i = 0; i < n; i += 2) {
        uint64_t b = rng_next(r);
        float u1 = (float)((b >> 32) + 1) * 0x1p-32f;
        float u2 = (float)(b & 0xffffffffu) * 0x1p-32f;
        float rad = stddev * sqrtf(-2.0f * logf(u1));
        x[i] = rad * cosf(two_pi * u2);
        if (i + 1 < n)
            x[i + 1] = rad * sinf(two_pi * u2);
    }
}

typedef struct {
    const mk_tensor_t *t;
    uint64_t seed, name_hash;
    float stddev;
    int64_t nrows;
    size_t row_bytes;
    uint8_t *out;
    float *scratch; /* nth rows of ne[0] floats */
    int nth;
} job_t;

typedef struct {
    job_t *job;
    int ith;
} worker_arg_t;

static void *gen_rows(void *p)
{
    worker_arg_t *a = p;
    job_t *j = a->job;
    int64_t ne0 = j->t->ne[0];
    int64_t r0 = j->nrows * a->ith / j->nth, r1 = j->nrows * (a->ith + 1) / j->nth;
    float *x = j->scratch + (size_t)a->ith * (size_t)ne0;
    for (int64_t r = r0; r < r1; r++) {
        if (j->t->init == MK_INIT_ONES) {
            for (int64_t i = 0; i < ne0; i++)
                x[i] = 1.0f;
        } else {
            rng_t rng;
            rng_seed(&rng, j->seed, j->name_hash, (uint64_t)r);
            fill_normal(&rng, x, ne0, j->stddev);
        }
        ecs_quantize_row(j->t->type, x, j->out + (size_t)r * j->row_bytes, ne0);
    }
    return NULL;
}

/* Runs gen_rows on nth threads (the caller is thread 0). Tiny tensors run
 * inline: a thread costs more than they do. */
static void run_job(const job_t *j)
{
    enum { MAX_THREADS = 64 };
    pthread_t tid[MAX_THREADS];
    worker_arg_t args[MAX_THREADS];
    int nth = j->nrows * j->t->ne[0] < (1 << 16) ? 1 : j->nth;
    int started = 1;
    job_t local = *j;
    local.nth = nth;
    for (int i = 0; i < nth; i++)
        args[i] = (worker_arg_t){ &local, i };
    for (; started < nth; started++)
        if (pthread_create(&tid[started], NULL, gen_rows, &args[started]))
            break;
    /* Threads that failed to start: the caller does their rows too. */
    for (int i = started; i < nth; i++)
        gen_rows(&args[i]);
    gen_rows(&args[0]);
    for (int i = 1; i < started; i++)
        pthread_join(tid[i], NULL);
}

static size_t tensor_bytes(const mk_tensor_t *t)
{
    return ecs_row_size(t->type, t->ne[0]) * (size_t)(t->ne[1] * t->ne[2]);
}

ecs_err_t mk_generate(gguf_writer_t *w, const char *path, const mk_tensor_t *t, int n,
                      uint64_t seed, float stddev, int nthreads)
{
    ecs_err_t err = ECS_OK;
    size_t max_bytes = 0, max_row = 0;
    if (nthreads < 1 || nthreads > 64)
        return ecs_error(ECS_ERR_RANGE, "--threads %d out of range [1, 64]", nthreads);
    for (int i = 0; i < n; i++) {
        if ((err = gguf_writer_add_tensor(w, t[i].name, t[i].type, t[i].n_dims, t[i].ne)))
            return err;
        if (tensor_bytes(&t[i]) > max_bytes)
            max_bytes = tensor_bytes(&t[i]);
        if ((size_t)t[i].ne[0] > max_row)
            max_row = (size_t)t[i].ne[0];
    }
    /* One tensor's output at a time: memory is bounded by the largest
     * tensor, not by the model. */
    uint8_t *out = malloc(max_bytes ? max_bytes : 1);
    float *scratch = malloc(max_row * (size_t)nthreads * sizeof *scratch);
    if (!out || !scratch) {
        err = ecs_error(ECS_ERR_NOMEM, "cannot allocate %zu bytes for the largest tensor",
                        max_bytes);
        goto done;
    }
    if ((err = gguf_writer_begin(w, path)))
        goto done;
    for (int i = 0; i < n && !err; i++) {
        job_t j = {
            .t = &t[i], .seed = seed, .name_hash = fnv1a(t[i].name), .stddev = stddev,
            .nrows = t[i].ne[1] * t[i].ne[2], .row_bytes = ecs_row_size(t[i].type, t[i].ne[0]),
            .out = out, .scratch = scratch, .nth = nthreads,
        };
        run_job(&j);
        err = gguf_writer_write_tensor(w, out, tensor_bytes(&t[i]));
    }
    if (!err)
        err = gguf_writer_finish(w);
done:
    free(out);
    free(scratch);
    return err;
}
