/* pages.c - the page cache while ecs-plan times the layouts' expert
 * phases (measure.h, docs/planner.md "The page cache"): what each layout's
 * workers read, dropping what nothing reads any more when it does not all
 * fit, reading the layout's files in before its timing and saying how much
 * of them was resident around it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/resident.h"
#include "coordinator/dispatch/dispatch.h"
#include "tools/ecs-plan/measure.h"

/* The planner's own routed-expert ranges: f(ctx, mapped range, file, its offset). */
typedef void (*range_fn)(void *ctx, const void *p, size_t n, const char *path, uint64_t off);

static void each_routed(const model_t *m, bool gguf_only, range_fn fn, void *ctx)
{
    const gguf_file_t *f = model_gguf(m);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        if (model_is_routed_expert(m, t->data))
            fn(ctx, t->data, t->nbytes, gguf_path(f), gguf_data_offset(f) + t->offset);
    }
    const char *copy;
    const unsigned char *map = model_repack_map(m);
    model_repack_bytes(m, &copy, NULL);
    const arch_hparams_t *hp = model_hparams(m);
    for (int l = 0; !gguf_only && map && l < hp->n_layer; l++) {
        const model_layer_t *ly = &model_weights(m)->layers[l];
        const kcpu_mat_t *w3[3] = {&ly->gate_exps, &ly->up_exps, &ly->down_exps};
        for (int j = 0; ly->moe && j < 3; j++) {
            const size_t n = kcpu_r16_bytes(w3[j]->type, w3[j]->nrows, w3[j]->ncols);
            if (w3[j]->r16 && n)
                fn(ctx, w3[j]->r16, n, copy, (uint64_t)((const unsigned char *)w3[j]->r16 - map));
        }
    }
}

typedef struct {
    uint64_t bytes, resident;
} tally_t;

static void tally(void *ctx, const void *p, size_t n, const char *path, uint64_t off)
{
    (void)path, (void)off;
    tally_t *t = ctx;
    uint64_t r = 0;
    t->bytes += n;
    if (ecs_resident(p, n, &r) == ECS_OK)
        t->resident += r;
}

static void drop(void *ctx, const void *p, size_t n, const char *path, uint64_t off)
{
    (void)ctx;
    ecs_unmap_pages(p, n);
    (void)ecs_file_evict(path, off, n);
}

static void touch(void *ctx, const void *p, size_t n, const char *path, uint64_t off)
{
    (void)ctx, (void)path, (void)off;
    ecs_touch(p, n);
}

void meas_pages_init(model_t *m, bool no_repack, meas_pages_t *pg)
{
    memset(pg, 0, sizeof *pg);
    pg->no_repack = no_repack;
    const gguf_file_t *f = model_gguf(m);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        if (model_is_routed_expert(m, t->data))
            pg->routed_bytes += t->nbytes;
        else
            pg->keep_bytes += t->nbytes;
    }
    pg->gguf_bytes = gguf_file_size(f);
    pg->copy_bytes = model_repack_bytes(m, NULL, NULL);
}

void meas_pages_free(meas_pages_t *pg) { meas_files_free(&pg->done); }

void meas_files_free(meas_files_t *fs)
{
    for (int i = 0; i < fs->n; i++)
        free(fs->path[i]);
    free(fs->path);
    memset(fs, 0, sizeof *fs);
}

/* Adds path unless it is there already (-1: out of memory). */
static int files_add(meas_files_t *fs, const char *path)
{
    for (int i = 0; i < fs->n; i++)
        if (!strcmp(fs->path[i], path))
            return 0;
    char **grown = realloc(fs->path, (size_t)(fs->n + 1) * sizeof *grown);
    if (!grown)
        return -1;
    fs->path = grown;
    if (!(fs->path[fs->n] = strdup(path)))
        return -1;
    fs->n++;
    return 0;
}

/* The decode copies the layout's workers have mapped (/proc/PID/maps). */
static int worker_files(const dispatch_t *d, meas_files_t *out)
{
    for (int w = 0; w < dispatch_n_workers(d); w++) {
        dispatch_worker_stats_t ws;
        char maps[64], line[4600];
        if (dispatch_worker_stats(d, w, &ws) != ECS_OK || ws.pid <= 0)
            return -1;
        snprintf(maps, sizeof maps, "/proc/%d/maps", ws.pid);
        FILE *f = fopen(maps, "r");
        if (!f)
            return -1;
        int rc = 0;
        while (!rc && fgets(line, sizeof line, f)) {
            line[strcspn(line, "\n")] = 0;
            const char *path = strchr(line, '/');
            const size_t n = path ? strlen(path) : 0;
            if (n >= 5 && !strcmp(path + n - 4, ".r16"))
                rc = files_add(out, path);
        }
        fclose(f);
        if (rc)
            return -1;
    }
    return 0;
}

/* Resident bytes of the layout's files (the GGUF's routed experts when the
 * workers have no copy), and their size. */
static void files_resident(model_t *m, const meas_files_t *fs, uint64_t *res, uint64_t *bytes)
{
    *res = *bytes = 0;
    if (!fs->n) {
        tally_t t = {0, 0};
        each_routed(m, true, tally, &t);
        *res = t.resident, *bytes = t.bytes;
        return;
    }
    for (int i = 0; i < fs->n; i++) {
        uint64_t r = 0, b = 0;
        (void)ecs_file_resident(fs->path[i], &r, &b);
        *res += r, *bytes += b;
    }
}

int meas_copies(int n_workers, int replication)
{
    return replication >= n_workers ? 1 : replication;
}

void meas_pages_before_start(model_t *m, meas_pages_t *pg, int copies, meas_pages_use_t *u)
{
    memset(u, 0, sizeof *u);
    tally_t own = {0, 0};
    if (!pg->no_repack) /* with --no-repack the workers read these very pages */
        each_routed(m, false, tally, &own);
    uint64_t others = 0;
    for (int i = 0; i < pg->done.n; i++) {
        uint64_t r = 0;
        (void)ecs_file_resident(pg->done.path[i], &r, NULL);
        others += r;
    }
    /* the workers' copies hold every routed expert `copies` times */
    const plan_pages_t p = {.room = ecs_mem_available(), .keep = pg->keep_bytes,
                            .own_routed = own.resident, .others = others,
                            .need = pg->routed_bytes * (uint64_t)copies};
    u->pages = p;
    u->evict = plan_pages_evict(&p);
    if (u->evict & PLAN_EVICT_OWN)
        each_routed(m, false, drop, NULL);
    for (int i = 0; (u->evict & PLAN_EVICT_OTHERS) && i < pg->done.n; i++)
        (void)ecs_file_evict(pg->done.path[i], 0, 0);
}

/* The kernel's reclaim and compaction work so far (/proc/vmstat's page
 * scans, migrations, khugepaged's collapses): 0 if it cannot be read. */
static uint64_t vm_work(void)
{
    static const char *keys[] = {"pgscan_kswapd", "pgscan_direct", "pgmigrate_success",
                                 "compact_migrate_scanned", "compact_free_scanned",
                                 "thp_collapse_alloc"};
    FILE *f = fopen("/proc/vmstat", "r");
    uint64_t sum = 0;
    char name[64];
    unsigned long long v;
    while (f && fscanf(f, "%63s %llu", name, &v) == 2)
        for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
            if (!strcmp(name, keys[i]))
                sum += v;
    if (f)
        fclose(f);
    return sum;
}

/* Waits until the kernel stops reclaiming and compacting after the files
 * were read in (the counters still for two looks 250 ms apart; at most
 * 15 s): the full model's layouts timed right after a 10 GB shuffle ran
 * 35-55 % slow as a whole, the coordinator's own work included
 * (docs/benchmarks.md, "The planner's worker decode phase"). */
static double settle(void)
{
    const double t0 = meas_now();
    uint64_t last = vm_work();
    int still = 0;
    while (still < 2 && meas_now() - t0 < 15) {
        nanosleep(&(struct timespec){0, 250000000L}, NULL);
        const uint64_t now = vm_work();
        still = now == last ? still + 1 : 0;
        last = now;
    }
    return meas_now() - t0;
}

int meas_pages_warm(model_t *m, const dispatch_t *d, meas_pages_use_t *u)
{
    if (worker_files(d, &u->files)) {
        meas_files_free(&u->files);
        return -1;
    }
    const double t0 = meas_now();
    if (!u->files.n)
        each_routed(m, true, touch, NULL);
    for (int i = 0; i < u->files.n; i++)
        if (ecs_file_warm(u->files.path[i], NULL) != ECS_OK) {
            meas_files_free(&u->files);
            return -1;
        }
    u->warm_s = meas_now() - t0;
    u->settle_s = settle();
    u->n_files = u->files.n;
    uint64_t r, b;
    files_resident(m, &u->files, &r, &b);
    u->bytes = b;
    u->before = b ? (double)r / (double)b : 0;
    return 0;
}

void meas_pages_after(model_t *m, meas_pages_t *pg, meas_pages_use_t *u)
{
    uint64_t r, b;
    files_resident(m, &u->files, &r, &b);
    u->after = b ? (double)r / (double)b : 0;
    u->warm = b > 0 && plan_phase_warm(u->before, u->after);
    /* these are the next layouts' "others" (a failed add only leaves
     * one file out of what may be dropped) */
    for (int i = 0; i < u->files.n; i++)
        (void)files_add(&pg->done, u->files.path[i]);
    meas_files_free(&u->files);
}
