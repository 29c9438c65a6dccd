/* matmul.c - quantized matrix x activation-rows products on the thread pool.
 *
 * Output rows (weight rows) are handed out in chunks through an atomic
 * counter, so a thread that is slowed down (shared cores) takes fewer. Within
 * a chunk each weight row is read from memory once and decoded once per group
 * of up to KCPU_MAX_NA activation rows; with nb activation rows the weights
 * still stream from memory only once per call, which is what makes batched
 * prompt processing cheaper per token than decode.
 *
 * Where the ISA has the shared-layout kernels (kcpu_gemm_t: AVX-512) and
 * rows are at least one superblock long, each thread packs the activation
 * rows once per call; from KCPU_GEMM_MIN_NB rows on every tile of weight
 * rows is unpacked once and reused for all of them, below that each weight
 * row is unpacked in registers. Both compute the same way, so a row's result
 * does not depend on the batch it came in. The buffers are per-thread
 * scratch that grows to the largest call seen and is freed when the thread
 * exits; without it the raw row kernels do the work. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

/* Below this many bytes of weights a chunk costs more to hand out than to
 * compute, and a matrix with a single chunk is done by the caller alone. */
#define MIN_CHUNK_BYTES 16384
#define CHUNKS_PER_THREAD 4
/* Weight rows decoded together against each group of activation rows. */
#define TILE_BYTES (128 * 1024)

/* Weight bytes (unpacked) per tile in the batched path: with the packed
 * activations it stays in L2. */
#define GEMM_TILE_BYTES (96 * 1024)
/* Types on interleaved row groups, matrices without the copy: from this
 * many activation rows on, packing a group of rows pays (bench_matvec
 * --only prefill, rows); below it the row kernel (same bits) takes them. */
#ifndef GRP_PACK_MIN_NB
#define GRP_PACK_MIN_NB 4
#endif
/* Activation rows per tile call in the batched path, between prefetches of
 * the next tile's weights. */
#define PREFETCH_ROWS 8
/* From this many activation rows the group kernels prefetch the copy's next
 * group, spread over their blocks. Once 4: on the slow-memory host a
 * prefetch with fewer rows was slower (pp8 -10 %); on the fast-memory host
 * one stream per core does not reach the memory's speed without it
 * (ds2-lite-4l, 2026-12-02: 8-sequence decode steps, whose experts see 1-3
 * rows, +4.9 %, one-sequence decode +2.4 %; docs/benchmarks.md "Serving"). */
#ifndef GRP_PREFETCH_MIN_NB
#define GRP_PREFETCH_MIN_NB 1
#endif
/* How far ahead of its reads (bytes) a group kernel prefetches the copy
 * with up to GRP_AHEAD_MAX_NB activation rows (decode: the kernels prefetch
 * into L1 there, PREFETCH_L1_MAX_NA): the bytes prefetched per group stay
 * one group's, but start this far into the stream rather than at the next
 * group. A 16-row group is 15-70 KB, so a whole group ahead filled the
 * 48 KB L1 with lines long before their use and evicted the group in use:
 * one thread streamed the expert-shaped copies from DRAM 14-26 % slower,
 * two the 4096-column ones 5-55 % (bench_matvec --only copy / matvec, where
 * 1 and 2 KB were slower than 4 and 8 KB); on the 4-layer ds2-lite cut 8 KB
 * beat 4 and 16 KB (docs/benchmarks.md, "the decode copies' prefetch
 * distance"); Zen 5 takes 4 KB (kcpu_prefetch_ahead). With more rows a
 * group computes long enough for a whole group ahead, into L2. */
#ifndef GRP_PREFETCH_AHEAD
#define GRP_PREFETCH_AHEAD kcpu_prefetch_ahead()
#endif
#define GRP_AHEAD_MAX_NB 3
/* Scratch larger than this is not worth having: the row kernels take over. */
#define SCRATCH_MAX ((size_t)256 << 20)

typedef struct {
    const kcpu_mat_t *w;
    const uint8_t *act; /* as the caller gave it */
    size_t act_stride;
    int nb;
    float *y;
    int64_t ldy;
    kcpu_kernel_t k;
    int64_t chunk_rows;
    int64_t nchunks;
    _Atomic int64_t next; /* next chunk to hand out after each thread's first */
    /* shared-layout kernels (gemm.w_sb != 0 where the ISA has them) */
    kcpu_gemm_t gemm;
    int64_t nsb;
    size_t packed_row; /* bytes of a packed activation row */
    int64_t tile_rows;
} mm_task_t;

/* What one thread computes with: the raw activations and row kernels, or
 * its own packed copy of the activations and the shared-layout kernels. */
typedef struct {
    const uint8_t *act;
    size_t stride;
    kcpu_kernel_t k;
    bool tiled; /* nb >= KCPU_GEMM_MIN_NB: unpacked weight tiles */
    bool grp;   /* every product on interleaved row groups (kcpu_gemm_t.grp) */
    uint8_t *unpacked; /* where the copy's groups are rewritten (grp_unpack), or NULL */
} mm_view_t;

/* ---- per-thread scratch ---- */

enum { SCRATCH_ACT, SCRATCH_TILE, SCRATCH_SLOTS };

typedef struct {
    void *p[SCRATCH_SLOTS];
    size_t cap[SCRATCH_SLOTS];
} scratch_t;

static _Thread_local scratch_t tls_scratch;
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;
static bool scratch_key_ok;

static void scratch_release(void *v)
{
    scratch_t *s = v;
    for (int i = 0; i < SCRATCH_SLOTS; i++) {
        free(s->p[i]);
        s->p[i] = NULL;
        s->cap[i] = 0;
    }
}

static void scratch_key_init(void)
{
    scratch_key_ok = pthread_key_create(&scratch_key, scratch_release) == 0;
}

static _Atomic uint64_t n_grows;

uint64_t kcpu_scratch_grows(void) { return atomic_load_explicit(&n_grows, memory_order_relaxed); }

/* A 64-byte aligned buffer of at least bytes for this thread, or NULL. */
static void *scratch(int slot, size_t bytes)
{
    scratch_t *s = &tls_scratch;
    if (s->cap[slot] >= bytes)
        return s->p[slot];
    pthread_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok || bytes > SCRATCH_MAX)
        return NULL;
    /* the key only makes the thread's exit free the buffers */
    if (!pthread_getspecific(scratch_key) && pthread_setspecific(scratch_key, s) != 0)
        return NULL;
    free(s->p[slot]);
    s->p[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    s->cap[slot] = s->p[slot] ? bytes : 0;
    atomic_fetch_add_explicit(&n_grows, 1, memory_order_relaxed);
    return s->p[slot];
}

/* Rows [r0, r1) in tiles that stay in L2: for each group of activation rows
 * (which stays in L1) the tile's weight rows are decoded again from L2. The
 * other order (all groups per weight row) would stream every activation row
 * from L2 once per weight row, several times the traffic for big batches. */
static void mm_rows(const mm_task_t *t, const mm_view_t *v, int64_t r0, int64_t r1)
{
    const kcpu_mat_t *w = t->w;
    const int64_t tile = w->row_bytes < TILE_BYTES ? (int64_t)(TILE_BYTES / w->row_bytes) : 1;
    float out[KCPU_ROWS_W * KCPU_MAX_NA];
    for (int64_t t0 = r0; t0 < r1; t0 += tile) {
        const int64_t t1 = t0 + tile < r1 ? t0 + tile : r1;
        for (int b = 0; b < t->nb; b += KCPU_MAX_NA) {
            const int na = t->nb - b < KCPU_MAX_NA ? t->nb - b : KCPU_MAX_NA;
            const uint8_t *a = v->act + (size_t)b * v->stride;
            float *y = t->y + (int64_t)b * t->ldy;
            int64_t r = t0;
            /* several weight rows per pass where a pass has rows enough */
            for (; v->k.rows && r + KCPU_ROWS_W <= t1; r += KCPU_ROWS_W) {
                v->k.rows(w->ncols, (const uint8_t *)w->data + (size_t)r * w->row_bytes,
                          w->row_bytes, a, v->stride, na, out);
                for (int m = 0; m < KCPU_ROWS_W; m++)
                    for (int j = 0; j < na; j++)
                        y[(int64_t)j * t->ldy + r + m] = out[m * KCPU_MAX_NA + j];
            }
            for (; r < t1; r++) {
                const void *wr = (const uint8_t *)w->data + (size_t)r * w->row_bytes;
                if (v->k.multi) {
                    v->k.multi(w->ncols, wr, a, v->stride, na, out);
                } else {
                    for (int j = 0; j < na; j++)
                        out[j] = v->k.dot(w->ncols, wr, a + (size_t)j * v->stride);
                }
                for (int j = 0; j < na; j++)
                    y[(int64_t)j * t->ldy + r] = out[j];
            }
        }
    }
}

/* Rows [r0, r1) with the batched kernels, one unpacked tile at a time. */
static bool gemm_rows(const mm_task_t *t, const mm_view_t *v, int64_t r0, int64_t r1)
{
    const kcpu_mat_t *w = t->w;
    const size_t wrow = (size_t)t->nsb * t->gemm.w_sb;
    uint8_t *buf = scratch(SCRATCH_TILE, wrow * (size_t)t->tile_rows);
    if (!buf)
        return false;
    for (int64_t t0 = r0; t0 < r1; t0 += t->tile_rows) {
        const int nw = (int)(t0 + t->tile_rows < r1 ? t->tile_rows : r1 - t0);
        for (int i = 0; i < nw; i++)
            t->gemm.unpack_w((const uint8_t *)w->data + (size_t)(t0 + i) * w->row_bytes,
                             w->ncols, buf + (size_t)i * wrow);
        /* the next tile's weights come from DRAM while this one computes:
         * its lines are prefetched a slice per block of activation rows */
        const int64_t n1 = t0 + t->tile_rows < r1 ? t0 + t->tile_rows : r1;
        const int64_t n2 = n1 + t->tile_rows < r1 ? n1 + t->tile_rows : r1;
        const uint8_t *next = (const uint8_t *)w->data + (size_t)n1 * w->row_bytes;
        const size_t next_bytes = (size_t)(n2 - n1) * w->row_bytes;
        for (int b = 0; b < t->nb; b += PREFETCH_ROWS) {
            const int na = t->nb - b < PREFETCH_ROWS ? t->nb - b : PREFETCH_ROWS;
            t->gemm.tile(buf, nw, v->act + (size_t)b * v->stride, na, t->nsb,
                         t->y + (int64_t)b * t->ldy + t0, t->ldy);
            const size_t p0 = next_bytes * (size_t)b / (size_t)t->nb / 64 * 64;
            const size_t p1 = next_bytes * (size_t)(b + na) / (size_t)t->nb;
            for (size_t o = p0; o < p1; o += 64)
                __builtin_prefetch(next + o, 0, 2);
        }
    }
    return true;
}

/* Rows [r, r1) from the rows' own kernel, one activation row per call (the
 * lone-row layout): the end of a view whose last group is partial, for
 * types without grp_pack. */
static void grp_rows_tail(const mm_task_t *t, const mm_view_t *v, int64_t r, int64_t r1)
{
    const kcpu_mat_t *w = t->w;
    for (int64_t i = r; i < r1; i++)
        for (int b = 0; b < t->nb; b++)
            t->gemm.multi(w->ncols, (const uint8_t *)w->data + (size_t)i * w->row_bytes,
                          v->act + (size_t)b * v->stride, v->stride, 1,
                          t->y + (int64_t)b * t->ldy + i);
}

/* Rows [r, r + nr) packed into buf, the next group's rows [r + nr, r2)
 * prefetched meanwhile: sixteen rows side by side are too many short
 * streams for the hardware prefetcher. */
static void grp_pack_rows(const mm_task_t *t, int64_t r, int nr, int64_t r2, uint8_t *buf)
{
    const kcpu_mat_t *w = t->w;
    const uint8_t *nx = (const uint8_t *)w->data + (size_t)(r + nr) * w->row_bytes;
    for (size_t o = 0; r + nr < r2 && o < (size_t)(r2 - r - nr) * w->row_bytes; o += 64)
        __builtin_prefetch(nx + o, 0, 2);
    t->gemm.grp_pack((const uint8_t *)w->data + (size_t)r * w->row_bytes, w->row_bytes, nr,
                     w->ncols, buf);
}

/* Group g (nr <= 16 valid rows, output rows from r) against every
 * activation row, grp_na at a time; [pf, pf + pfb) (pf NULL: nothing): the
 * copy's bytes that come from DRAM while this group computes, a slice of
 * them prefetched by each call's kernel (grp_rows says which). */
static void grp_call(const mm_task_t *t, const mm_view_t *v, const uint8_t *g, int nr, int64_t r,
                     const uint8_t *pf, size_t pfb)
{
    /* a group decoded once for all the passes (t->gemm.grp_unpack) */
    void (*grp)(const void *, int64_t, const void *, size_t, int, float *, int64_t, const void *,
                size_t) = g == v->unpacked ? t->gemm.grp_unpacked : t->gemm.grp;
    const int max_na = t->gemm.grp_na ? t->gemm.grp_na : KCPU_MAX_NA;
    for (int b = 0; b < t->nb; b += max_na) {
        const int na = t->nb - b < max_na ? t->nb - b : max_na;
        const uint8_t *a = v->act + (size_t)b * v->stride;
        float *y = t->y + (int64_t)b * t->ldy + r;
        /* this pass's slice of the next group, prefetched by the kernel a
         * piece per block (a burst here would hold up the pass's loads) */
        const size_t p0 = pf ? pfb * (size_t)b / (size_t)t->nb / 64 * 64 : 0;
        const size_t p1 = pf ? pfb * (size_t)(b + na) / (size_t)t->nb : 0;
        const uint8_t *ps = pf ? pf + p0 : NULL;
        if (nr == KCPU_R16_ROWS) {
            grp(g, t->w->ncols, a, v->stride, na, y, t->ldy, ps, p1 - p0);
            continue;
        }
        float part[KCPU_GRP_MAX_NA * KCPU_R16_ROWS];
        grp(g, t->w->ncols, a, v->stride, na, part, KCPU_R16_ROWS, ps, p1 - p0);
        for (int j = 0; j < na; j++)
            memcpy(y + (int64_t)j * t->ldy, part + j * KCPU_R16_ROWS, (size_t)nr * sizeof *part);
    }
}

/* Rows [r0, r1) (r0 a multiple of KCPU_R16_ROWS) a group of 16 at a time,
 * from the interleaved copy where the matrix has one, else packed into that
 * layout here (the same bytes); each group against every activation row
 * while it is in L1. False if the packing buffer cannot be had. */
static bool grp_rows(const mm_task_t *t, const mm_view_t *v, int64_t r0, int64_t r1)
{
    const kcpu_mat_t *w = t->w;
    const size_t group = kcpu_r16_bytes(w->type, KCPU_R16_ROWS, w->ncols);
    const size_t far = GRP_PREFETCH_AHEAD;
    const size_t ahead = t->nb <= GRP_AHEAD_MAX_NB && far < group ? far : group;
    uint8_t *buf = NULL;
    for (int64_t r = r0; r < r1; r += KCPU_R16_ROWS) {
        const int nr = (int)(r1 - r < KCPU_R16_ROWS ? r1 - r : KCPU_R16_ROWS);
        const uint8_t *g = buf, *pf = NULL;
        size_t pfb = 0;
        if (w->r16 && nr == KCPU_R16_ROWS) {
            g = (const uint8_t *)w->r16 + (size_t)(r / KCPU_R16_ROWS) * group;
            /* a group's worth from `ahead` on (the stream's next bytes
             * a fixed distance ahead); the range's last group only the
             * rest of itself */
            pfb = r + 2 * KCPU_R16_ROWS <= r1 ? group : group - ahead;
            if (t->nb >= GRP_PREFETCH_MIN_NB && pfb)
                pf = g + ahead;
            if (v->unpacked) {
                t->gemm.grp_unpack(g, w->ncols, v->unpacked);
                g = v->unpacked;
            }
        } else if (!t->gemm.grp_pack) {
            grp_rows_tail(t, v, r, r1);
            break;
        } else {
            if (!buf && !(g = buf = scratch(SCRATCH_TILE, group)))
                return false;
            grp_pack_rows(t, r, nr, r + 2 * KCPU_R16_ROWS < r1 ? r + 2 * KCPU_R16_ROWS : r1, buf);
        }
        grp_call(t, v, g, nr, r, pf, pfb);
    }
    return true;
}

static void mm_range(const mm_task_t *t, const mm_view_t *v, int64_t r0, int64_t r1)
{
    if (v->grp) { /* else the packed rows' row kernel: the same bits */
        if (!((t->w->r16 || t->nb >= GRP_PACK_MIN_NB) && grp_rows(t, v, r0, r1)))
            mm_rows(t, v, r0, r1);
    } else if (!v->tiled || !gemm_rows(t, v, r0, r1))
        mm_rows(t, v, r0, r1);
}

/* Whether products of w with nb rows rewrite the copy's groups (from three
 * passes over each: with two the rewrite costs more than it saves,
 * bench_matvec --only prefill), and into how many bytes. */
static bool unpacks(const kcpu_gemm_t *g, int nb)
{
    return g->grp_unpack && nb > 2 * g->grp_na;
}

static size_t unpacked_bytes(const kcpu_mat_t *w)
{
    return kcpu_r16_bytes(ECS_TYPE_Q8_0, KCPU_R16_ROWS, w->ncols);
}

/* Each thread packs the activations into its own scratch: a copy that one
 * thread wrote and the other read would cross between the cores' caches on
 * every call, which costs more than packing (~25 cycles per 256 values). */
static mm_view_t mm_view(const mm_task_t *t)
{
    mm_view_t v = {t->act, t->act_stride, t->k, false, false, NULL};
    if (!t->gemm.w_sb && !t->gemm.grp)
        return v;
    uint8_t *packed = scratch(SCRATCH_ACT, t->packed_row * (size_t)t->nb);
    if (!packed)
        return v;
    /* interleaved groups: always (grp_pack), or with the copy; else tiles,
     * or the row kernel for one row */
    v.grp = t->gemm.grp && (t->gemm.grp_pack || t->w->r16);
    v.tiled = !v.grp && t->nb >= KCPU_GEMM_MIN_NB;
    if (v.grp && t->w->r16 && unpacks(&t->gemm, t->nb))
        v.unpacked = scratch(SCRATCH_TILE, unpacked_bytes(t->w));
    for (int b = 0; b < t->nb; b++)
        (v.grp || t->nb == 1 ? t->gemm.pack_act1 : t->gemm.pack_act)(
            t->act + (size_t)b * t->act_stride, t->w->ncols, packed + (size_t)b * t->packed_row);
    v.act = packed;
    v.stride = t->packed_row;
    v.k.multi = t->gemm.multi; /* the packed rows' row kernel */
    return v;
}

static void mm_chunk(const mm_task_t *t, const mm_view_t *v, int64_t c)
{
    const int64_t r0 = c * t->chunk_rows;
    mm_range(t, v, r0, r0 + t->chunk_rows < t->w->nrows ? r0 + t->chunk_rows : t->w->nrows);
}

static void mm_worker(void *arg, int ith, int nth)
{
    mm_task_t *t = arg;
    /* a thread that comes late (shared cores) finds the work done and
     * packs nothing */
    int64_t c = ith < t->nchunks ? ith /* first chunk by index: no contention */
                                 : atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
    if (c >= t->nchunks)
        return;
    const mm_view_t v = mm_view(t);
    for (;;) {
        mm_chunk(t, &v, c);
        c = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (c >= t->nchunks)
            break;
    }
    (void)nth;
}

/* The shared-layout kernels for the type, where the ISA has them and rows
 * are at least one superblock long: a shorter row (a legacy type) would pay
 * a whole superblock's work, twice what the row kernels cost at 128 values
 * (whichever kernels a matrix gets, it gets them for every nb). */
static void gemm_prepare(mm_task_t *t)
{
    const kcpu_gemm_t g = kcpu_gemm(t->w->type);
    if ((!g.w_sb && !g.grp) || t->w->ncols < KCPU_GEMM_SB)
        return;
    t->gemm = g;
    t->nsb = (t->w->ncols + g.sb_cols - 1) / g.sb_cols;
    t->packed_row = (size_t)t->nsb * g.a_sb;
    if (g.grp_pack) /* no tiles: groups of rows (grp_rows) */
        return;
    const size_t wrow = (size_t)t->nsb * g.w_sb;
    const int64_t rows = (int64_t)(GEMM_TILE_BYTES / wrow) / g.mr * g.mr;
    t->tile_rows = rows > g.mr ? rows : g.mr;
}

bool kcpu_mat_reads_rows(const kcpu_mat_t *w)
{
    const kcpu_gemm_t g = kcpu_gemm(w->type);
    if (!w->r16 || w->ncols < KCPU_GEMM_SB)
        return true;
    return !g.grp;
}

static void fill_nan(float *y, int64_t ldy, int nb, int64_t nrows)
{
    for (int b = 0; b < nb; b++)
        for (int64_t r = 0; r < nrows; r++)
            y[(int64_t)b * ldy + r] = NAN;
}

/* The task of w x act, or false (y filled with NaN) for a type without
 * kernels. */
static bool task_init(mm_task_t *t, const kcpu_mat_t *w, const void *act, int nb, float *y,
                      int64_t ldy)
{
    const ecs_type_traits_t *tr = ecs_type_traits(w->type);
    *t = (mm_task_t){.w = w, .act = act, .nb = nb, .y = y, .ldy = ldy, .k = kcpu_kernel(w->type)};
    if (!tr || !t->k.dot) {
        /* no error channel here: make a caller's missing type check loud */
        fill_nan(y, ldy, nb, w->nrows);
        return false;
    }
    t->act_stride = ecs_row_size(tr->vec_dot_type, w->ncols);
    gemm_prepare(t);
    return true;
}

void kcpu_matmul_q(ecs_threadpool_t *tp, const kcpu_mat_t *w, const void *act, int nb, float *y,
                   int64_t ldy)
{
    if (nb < 1 || w->nrows < 1)
        return;
    mm_task_t t;
    if (!task_init(&t, w, act, nb, y, ldy))
        return;

    const int nth = ecs_threadpool_size(tp);
    int64_t rows = (w->nrows + (int64_t)nth * CHUNKS_PER_THREAD - 1) /
                   ((int64_t)nth * CHUNKS_PER_THREAD);
    const int64_t min_rows = (int64_t)(MIN_CHUNK_BYTES / (w->row_bytes * (size_t)nb + 1)) + 1;
    if (rows < min_rows)
        rows = min_rows;
    /* whole microkernels (not whole tiles: that unbalances the threads),
     * whole interleaved row groups */
    const int64_t align = (w->r16 && t.gemm.grp) || t.gemm.grp_pack ? KCPU_R16_ROWS : t.gemm.mr;
    if (t.gemm.w_sb || t.gemm.grp)
        rows = (rows + align - 1) / align * align;
    t.chunk_rows = rows;
    t.nchunks = (w->nrows + rows - 1) / rows;
    atomic_init(&t.next, nth < t.nchunks ? nth : t.nchunks);
    if (nth == 1 || t.nchunks == 1) {
        const mm_view_t v = mm_view(&t);
        mm_range(&t, &v, 0, w->nrows);
    } else {
        ecs_threadpool_run(tp, mm_worker, &t);
    }
}

void kcpu_matmul_q_pair(const kcpu_mat_t *w1, const kcpu_mat_t *w2, const void *act, int nb,
                        float *y1, float *y2, int64_t ldy)
{
    if (nb < 1)
        return;
    /* one packing serves both where both compute from the same view */
    if (w1->type != w2->type || w1->ncols != w2->ncols || !w1->r16 != !w2->r16 ||
        w1->nrows < 1 || w2->nrows < 1) {
        kcpu_matmul_q(NULL, w1, act, nb, y1, ldy);
        kcpu_matmul_q(NULL, w2, act, nb, y2, ldy);
        return;
    }
    mm_task_t t1, t2;
    const bool ok1 = task_init(&t1, w1, act, nb, y1, ldy);
    const bool ok2 = task_init(&t2, w2, act, nb, y2, ldy);
    if (!ok1 || !ok2)
        return;
    const mm_view_t v = mm_view(&t1);
    mm_range(&t1, &v, 0, w1->nrows);
    mm_range(&t2, &v, 0, w2->nrows);
}

typedef struct {
    ecs_type_t vdt;
    const float *x;
    int64_t ldx;
    int nb;
    int64_t ncols;
    uint8_t *act;
    size_t stride;
} qr_task_t;

static void qr_worker(void *arg, int ith, int nth)
{
    const qr_task_t *t = arg;
    for (int b = ith; b < t->nb; b += nth)
        kcpu_quantize_act(t->vdt, t->x + (int64_t)b * t->ldx, t->act + (size_t)b * t->stride,
                          t->ncols);
}

void kcpu_quantize_rows(ecs_threadpool_t *tp, ecs_type_t wtype, const float *x, int64_t ldx,
                        int nb, int64_t ncols, void *act)
{
    const ecs_type_traits_t *tr = ecs_type_traits(wtype);
    if (!tr || nb < 1)
        return;
    qr_task_t t = {tr->vec_dot_type, x, ldx, nb, ncols, act, ecs_row_size(tr->vec_dot_type, ncols)};
    /* one row takes a couple of microseconds: not worth waking threads */
    if (nb < 4)
        qr_worker(&t, 0, 1);
    else
        ecs_threadpool_run(tp, qr_worker, &t);
}

void kcpu_matmul(ecs_threadpool_t *tp, const kcpu_mat_t *w, const float *x, int64_t ldx, int nb,
                 float *y, int64_t ldy, void *scratch)
{
    const ecs_type_traits_t *tr = ecs_type_traits(w->type);
    const void *act = scratch;
    if (tr && tr->vec_dot_type == ECS_TYPE_F32 && ldx == w->ncols)
        act = x; /* already in the activation layout */
    else
        kcpu_quantize_rows(tp, w->type, x, ldx, nb, w->ncols, scratch);
    kcpu_matmul_q(tp, w, act, nb, y, ldy);
}

/* ---- scratch reserved up front ---- */

typedef struct {
    size_t need[SCRATCH_SLOTS];
    _Atomic int failed;
} reserve_t;

/* What kcpu_matmul_q asks scratch() for: packed activations (shared-layout
 * kernels) and one unpacked weight tile (nb >= KCPU_GEMM_MIN_NB). */
static void scratch_need(const kcpu_mat_t *w, int nb, size_t need[SCRATCH_SLOTS])
{
    mm_task_t t = {.w = w, .nb = nb};
    gemm_prepare(&t);
    need[SCRATCH_ACT] = t.gemm.w_sb || t.gemm.grp ? t.packed_row * (size_t)nb : 0;
    need[SCRATCH_TILE] = t.gemm.grp_pack ? kcpu_r16_bytes(w->type, KCPU_R16_ROWS, w->ncols)
                         : t.gemm.w_sb && nb >= KCPU_GEMM_MIN_NB
                             ? (size_t)t.nsb * t.gemm.w_sb * (size_t)t.tile_rows
                             : 0;
    if (w->r16 && unpacks(&t.gemm, nb) && need[SCRATCH_TILE] < unpacked_bytes(w))
        need[SCRATCH_TILE] = unpacked_bytes(w);
}

static void reserve_worker(void *arg, int ith, int nth)
{
    reserve_t *r = arg;
    (void)ith, (void)nth;
    for (int i = 0; i < SCRATCH_SLOTS; i++)
        if (r->need[i] && !scratch(i, r->need[i]))
            atomic_store(&r->failed, 1);
}

size_t kcpu_matmul_scratch(const kcpu_mat_t *w, int nb)
{
    size_t need[SCRATCH_SLOTS];
    scratch_need(w, nb, need);
    return need[SCRATCH_ACT] + need[SCRATCH_TILE];
}

ecs_err_t kcpu_matmul_reserve(ecs_threadpool_t *tp, const kcpu_mat_t *w, int nb)
{
    if (nb < 1 || nb > KCPU_MAX_BATCH)
        return ecs_error(ECS_ERR_INVAL, "kernels: reserve for %d rows (1..%d)", nb,
                         KCPU_MAX_BATCH);
    reserve_t r = {.failed = 0};
    scratch_need(w, nb, r.need);
    ecs_threadpool_run(tp, reserve_worker, &r);
    if (atomic_load(&r.failed))
        return ecs_error(ECS_ERR_NOMEM, "kernels: cannot reserve %zu bytes of scratch per thread",
                         r.need[SCRATCH_ACT] + r.need[SCRATCH_TILE]);
    return ECS_OK;
}
