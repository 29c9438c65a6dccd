/* cpu.h - CPU compute kernels: quantized dot products, matrix-vector and
 * small-batch matrix products, with runtime SIMD dispatch.
 *
 * Every kernel has a scalar reference (common/quant.h's ecs_vec_dot_ref) and
 * AVX2 / AVX-512 (VNNI) versions chosen at run time with cpuid, so one binary
 * runs on any x86-64. Tests compare each SIMD path against the reference. */
#ifndef ECS_KERNELS_CPU_H
#define ECS_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"
#include "common/threadpool.h"

typedef enum {
    KCPU_ISA_SCALAR = 0,
    KCPU_ISA_AVX2 = 1,   /* AVX2 + FMA + F16C */
    KCPU_ISA_AVX512 = 2, /* AVX-512 F/BW/VL/VNNI (+BF16 where present) */
} kcpu_isa_t;

/* Best ISA this CPU supports. */
kcpu_isa_t kcpu_isa_detect(void);
/* ISA in use (default: detected; ECS_ISA=scalar|avx2|avx512 in the
 * environment lowers it). */
kcpu_isa_t kcpu_isa(void);
/* Lowers (never raises above detected) the ISA in use; returns the ISA now in use. */
kcpu_isa_t kcpu_set_isa(kcpu_isa_t isa);
const char *kcpu_isa_name(kcpu_isa_t isa);
/* Whether the decode kernels (up to PREFETCH_L1_MAX_NA activation rows)
 * prefetch the copy's next lines into L1 rather than L2: where the L1 data
 * cache holds at least KCPU_PREFETCH_L1_MIN bytes (or its size is unknown). */
#define KCPU_PREFETCH_L1_MIN (48 << 10)
bool kcpu_prefetch_l1(void);
/* How far ahead (bytes) the decode group kernels prefetch the copy they
 * stream (matmul.c's GRP_PREFETCH_AHEAD): per CPU family, read once. */
size_t kcpu_prefetch_ahead(void);

/* dot(w row of n elements of wtype, a row of n elements of wtype's vec_dot_type) */
typedef float (*kcpu_vec_dot_fn)(int64_t n, const void *w, const void *a);
/* The implementation for one ISA (NULL if that ISA has none for wtype; callers
 * then fall back to a lower ISA). */
kcpu_vec_dot_fn kcpu_vec_dot_for(ecs_type_t wtype, kcpu_isa_t isa);

/* Quantizes a row of n floats to vec_dot type vdt (F32, F16, BF16, Q8_0, Q8_1,
 * Q8_K), SIMD where available. Result equals ecs_quantize_row's bit for bit,
 * except that float rounding may differ in the last place of a scale. */
void kcpu_quantize_act(ecs_type_t vdt, const float *x, void *out, int64_t n);

/* A weight matrix: nrows rows of ncols elements of type, row_bytes apart.
 * r16, when not NULL, is the same matrix in the row-interleaved layout
 * below (kcpu_r16_pack): products read it instead of data, with the same
 * arithmetic, so results do not change (kcpu_mat_reads_rows: whether data
 * is still read). */
typedef struct {
    ecs_type_t type;
    int64_t ncols;
    int64_t nrows;
    size_t row_bytes;
    const void *data;
    const void *r16;
} kcpu_mat_t;

/* Rows [r0, r0 + n) of w as a matrix of their own (r16 kept where r0 is a
 * multiple of KCPU_R16_ROWS, else dropped). */
kcpu_mat_t kcpu_mat_rows(const kcpu_mat_t *w, int64_t r0, int64_t n);

/* ---- Row-interleaved weights (decode) ----
 * A lone activation row against a weight row costs the row kernel a
 * transpose and a horizontal sum per superblock, which keeps a core below
 * the memory's speed. With KCPU_R16_ROWS rows interleaved, one activation
 * broadcast feeds all of them and each lane accumulates one row. Q4_K: for
 * each group of 16 rows (nrows a multiple of 16) and each 256-value block,
 * 2368 bytes: d[16], dmin[16] (fp16), the 6-bit scales [8][16] and mins
 * [8][16] as bytes, then qs as [4 chunks][8 words][16 rows] 32-bit words
 * (word k of chunk c of a row: its qs bytes 32 c + 4 k .. + 3). Q5_0 and
 * Q8_0: the same bytes per row as the GGUF (r16.c has the details). */
#define KCPU_R16_ROWS 16
/* Changes whenever the layout does: copies made for another are remade. */
#define KCPU_R16_LAYOUT 4
#define KCPU_R16_Q4_K_BLOCK 2368 /* 16 rows x 256 values */
/* Offsets inside a Q4_K block (internal to kernels/cpu: r16.c and
 * k4_avx512.c pack, k4_avx512.c reads; every Q4_K product on AVX-512 runs
 * on this layout). */
#define KCPU_R16_Q4_K_D 0
#define KCPU_R16_Q4_K_DMIN 32
#define KCPU_R16_Q4_K_SC 64
#define KCPU_R16_Q4_K_MN 192
#define KCPU_R16_Q4_K_QS 320
#define KCPU_R16_Q5_0_BLOCK 352  /* 16 rows x 32 values */
#define KCPU_R16_Q8_0_BLOCK 544

/* Whether a type/shape has the layout: Q4_K (ncols % 256 == 0), Q5_0 and
 * Q8_0 (ncols % 64 == 0), nrows % 16 == 0, ncols >= KCPU_GEMM_SB. */
bool kcpu_r16_fits(ecs_type_t type, int64_t nrows, int64_t ncols);
/* Bytes of the interleaved copy of rows of that shape (0 if it does not fit). */
size_t kcpu_r16_bytes(ecs_type_t type, int64_t nrows, int64_t ncols);
/* Writes rows [r0, r0 + n) of w (r0, n multiples of 16) interleaved to out
 * (kcpu_r16_bytes(w->type, n, w->ncols) bytes); the rows of w must fit. */
void kcpu_r16_pack(const kcpu_mat_t *w, int64_t r0, int64_t n, void *out);

#define KCPU_MAX_BATCH 512

/* Bytes needed to hold nb activation rows of ncols quantized for w's type. */
size_t kcpu_act_bytes(ecs_type_t wtype, int64_t ncols, int nb);

/* Quantizes nb rows of x (ldx floats apart) into act (rows packed,
 * ecs_row_size(vdt, ncols) apart) for weights of type wtype. */
void kcpu_quantize_rows(ecs_threadpool_t *tp, ecs_type_t wtype, const float *x, int64_t ldx,
                        int nb, int64_t ncols, void *act);

/* y[b*ldy + r] = dot(W row r, activation row b) for r in [0, w->nrows),
 * b in [0, nb), 1 <= nb <= KCPU_MAX_BATCH. act as made by kcpu_quantize_rows.
 * Output rows are split across the pool's threads. A result's bits depend
 * neither on nb (the other rows of the batch) nor on the thread count; they
 * may differ from kcpu_vec_dot_for's in the float rounding. */
void kcpu_matmul_q(ecs_threadpool_t *tp, const kcpu_mat_t *w, const void *act, int nb,
                   float *y, int64_t ldy);

/* kcpu_matmul_q(NULL, w1, ...) and kcpu_matmul_q(NULL, w2, ...) on the same
 * activations (a SwiGLU's gate and up), on the calling thread: the
 * activations are packed once for both when the two matrices share type,
 * width and layout. Same bits as the two calls. */
void kcpu_matmul_q_pair(const kcpu_mat_t *w1, const kcpu_mat_t *w2, const void *act, int nb,
                        float *y1, float *y2, int64_t ldy);

/* kcpu_matmul_q keeps per-thread scratch (packed activations, one unpacked
 * weight tile) that grows to the largest call. To keep allocation off a
 * step's path, reserve it up front: kcpu_matmul_reserve grows the scratch
 * of every thread of tp (the caller included) to what products of w with
 * up to nb rows need (it only ever grows; ECS_ERR_NOMEM if it cannot).
 * kcpu_matmul_scratch is that size per thread; kcpu_scratch_grows counts
 * the allocations made so far (tests check a step makes none). */
ecs_err_t kcpu_matmul_reserve(ecs_threadpool_t *tp, const kcpu_mat_t *w, int nb);
/* Whether kcpu_matmul_q may read w's rows (w->data) for some nb; false where
 * w's interleaved copy (w->r16) serves every product (Q4_K, Q5_0 and Q8_0
 * on AVX-512, rows of at least KCPU_GEMM_SB values). */
bool kcpu_mat_reads_rows(const kcpu_mat_t *w);
size_t kcpu_matmul_scratch(const kcpu_mat_t *w, int nb);
uint64_t kcpu_scratch_grows(void);

/* Convenience: quantize x into scratch (kcpu_act_bytes large) then matmul. */
void kcpu_matmul(ecs_threadpool_t *tp, const kcpu_mat_t *w, const float *x, int64_t ldx, int nb,
                 float *y, int64_t ldy, void *scratch);

/* ---- Parallel regions (par.c) ----
 * Parallel regions on the pool. A region is a list of matrix products
 * (jobs); their weight rows are cut into chunks, largest first and
 * shrinking towards the end (guided scheduling), and the pool's threads
 * take chunks from a shared counter. One region = one pool wake-up however
 * many matrices it holds, and the tail where one thread waits for the other
 * is a small chunk. */

typedef enum {
    KCPU_JOB_MM,     /* y = W act */
    KCPU_JOB_SWIGLU, /* y = silu(W act) * (W2 act), y2 scratch; then optionally quantized */
} kcpu_job_kind_t;

typedef struct {
    kcpu_job_kind_t kind;
    kcpu_mat_t w, w2;   /* w2: the up projection of KCPU_JOB_SWIGLU */
    const void *act;    /* nb activation rows of w's vec_dot type, act_stride bytes apart */
    size_t act_stride;
    const void *act2;   /* KCPU_JOB_SWIGLU: w2's rows, act2_stride apart */
    size_t act2_stride;
    int nb;             /* any count: products run in tiles of KCPU_MAX_BATCH rows */
    float *y, *y2;      /* [nb][ldy]; y2 only for KCPU_JOB_SWIGLU */
    int64_t ldy;
    /* KCPU_JOB_SWIGLU: when hq is set, each chunk also quantizes its columns of
     * y to hq_vdt (rows hq_stride bytes apart); chunks are then aligned to
     * that type's block. */
    void *hq;
    size_t hq_stride;
    ecs_type_t hq_vdt;
} kcpu_job_t;

typedef struct {
    int job;
    int64_t r0, r1;
} kcpu_chunk_t;

typedef struct {
    kcpu_chunk_t *chunks;
    int cap;
} kcpu_plan_t;

/* A job for y = w act over nb rows (act as kcpu_quantize_rows makes it). */
kcpu_job_t kcpu_job_mm(const kcpu_mat_t *w, const void *act, int nb, float *y, int64_t ldy);
/* A SwiGLU job: y = silu(gate act) * (up act_up), y2 scratch, both
 * [nb][ldy]; y quantized for down into hq (may be NULL) when chunks can. */
kcpu_job_t kcpu_job_swiglu(const kcpu_mat_t *gate, const kcpu_mat_t *up, const kcpu_mat_t *down,
                           const void *act, const void *act_up, int nb, float *y, float *y2,
                           int64_t ldy, void *hq);
/* Runs jobs[0, n) as one region; plan->chunks holds plan->cap chunks
 * (KCPU_PLAN_CHUNKS(n) is always enough: a full plan gives each job's
 * remaining rows to its last chunk). */
void kcpu_run_jobs(ecs_threadpool_t *tp, kcpu_plan_t *plan, const kcpu_job_t *jobs, int n);
#define KCPU_PLAN_CHUNKS(n_jobs) (64 * (n_jobs) + 1024)

/* A list of jobs being built for one region: callers (and modules that
 * add their products to a caller's region, kernels/moe) append at n. */
typedef struct {
    kcpu_job_t *jobs;
    int n;
} kcpu_jobs_t;

/* g[i] = silu(g[i]) * u[i] (AVX-512 where in use: the same values up to a
 * last-place exp rounding; each ISA always gives the same bits). */
void kcpu_swiglu(float *g, const float *u, int64_t n);

/* log(sum_i e^x[i]) as max + log(sum e^(x[i] - max)), the sum in double
 * (a sampled row's log-probabilities: ~0.5 ms for a 102400-token vocabulary
 * with libm's exp, ~0.05 ms on AVX-512 where in use: the same values up to
 * a last-place exp rounding; each ISA always gives the same bits). */
float kcpu_logsumexp(const float *x, int64_t n);

/* fn(arg, item, ith) for item in [0, n), items handed out in order. */
typedef void (*kcpu_item_fn)(void *arg, int item, int ith);
void kcpu_par_for(ecs_threadpool_t *tp, int n, kcpu_item_fn fn, void *arg);
/* Parallel regions started by this process (for profiles). */
uint64_t kcpu_regions(void);

/* Bytes between packed activation rows for weights of type wtype. */
size_t kcpu_act_row(ecs_type_t wtype, int64_t ncols);

/* ---- Internal to kernels/cpu: how the per-ISA files (*_avx2.c, *_avx512.c)
 * hand their kernels to dispatch.c and matmul.c. Other modules use the API
 * above. ---- */

#define KCPU_MAX_NA 4
#define KCPU_GRP_MAX_NA 6

/* out[j] = dot(w, a + j*a_stride) for j in [0, na), 1 <= na <= KCPU_MAX_NA:
 * the weight row is decoded once for na activation rows, which is what
 * makes batched (prompt / multi-token) products cheaper than na dots. */
typedef void (*kcpu_dot_multi_fn)(int64_t n, const void *w, const void *a, size_t a_stride,
                                  int na, float *out);

/* out[m * KCPU_MAX_NA + j] = dot(weight row m, activation row j) for
 * KCPU_ROWS_W weight rows w_stride bytes apart and na activation rows:
 * each pair's sum is multi's, bit for bit, with fewer loads per FMA. */
#define KCPU_ROWS_W 4
typedef void (*kcpu_dot_rows_fn)(int64_t n, const void *w, size_t w_stride, const void *a,
                                 size_t a_stride, int na, float *out);

typedef struct {
    kcpu_vec_dot_fn dot;     /* NULL: no kernel for this type on this ISA */
    kcpu_dot_multi_fn multi; /* NULL: callers loop over dot */
    kcpu_dot_rows_fn rows;   /* NULL: weight rows one at a time */
} kcpu_kernel_t;

kcpu_kernel_t kcpu_kernel_avx2(ecs_type_t wtype);
kcpu_kernel_t kcpu_kernel_avx512(ecs_type_t wtype);
/* The kernel for wtype at the ISA in use, falling back to lower ISAs (the
 * scalar level always has one for a weight type). */
kcpu_kernel_t kcpu_kernel(ecs_type_t wtype);

/* Quantized products in a layout that all quant types share (AVX-512 VNNI),
 * which kcpu_matmul_q takes for rows of at least KCPU_GEMM_SB values (the
 * row kernels below that). Each thread packs the activation rows once per
 * call (pack_act). With nb >= KCPU_GEMM_MIN_NB rows, each tile of weight
 * rows is unpacked once (unpack_w: int8 levels plus float scales per group,
 * in superblocks of sb_cols values; a row whose length is no multiple of
 * sb_cols gets a zero-padded last superblock) and every pair of the tile
 * computed (tile); with fewer rows, multi unpacks each weight row in
 * registers instead. Both do the same arithmetic: a product does not depend
 * on the number of rows. */
#define KCPU_GEMM_SB 256
#define KCPU_GEMM_MIN_NB 4

typedef struct {
    size_t w_sb; /* bytes per superblock of an unpacked weight row; 0: none */
    size_t a_sb; /* bytes per superblock of a packed activation row */
    int sb_cols; /* values per superblock: 256 or 512 */
    int mr;      /* weight rows the microkernel takes at once: tiles are multiples */
    /* out: 64-byte aligned, ceil(ncols / sb_cols) * w_sb (a_sb) bytes */
    void (*unpack_w)(const void *w, int64_t ncols, void *out);
    void (*pack_act)(const void *a, int64_t ncols, void *out);
    /* a lone activation row (nb = 1): multi with na = 1 takes this layout,
     * which may differ from pack_act's */
    void (*pack_act1)(const void *a, int64_t ncols, void *out);
    /* y[j * ldy + i] = dot(weight row i, activation row j) for i < nw, j < na;
     * w: nw unpacked rows, a: na packed rows, nsb superblocks each. */
    void (*tile)(const void *w, int nw, const void *a, int na, int64_t nsb, float *y,
                 int64_t ldy);
    /* a raw weight row against na <= KCPU_MAX_NA packed activation rows */
    kcpu_dot_multi_fn multi;
    /* out[i] = dot(row i, a) for the 16 rows of an interleaved row group
     * (kcpu_r16_pack) against one activation row packed by pack_act1 (grp
     * with one row); NULL where the type has no interleaved layout, which
     * is how callers tell which matrices a copy is made for */
    void (*r16)(const void *w, int64_t ncols, const void *a, float *out);
    /* grp takes an interleaved group of 16 rows against na <= grp_na
     * activation rows packed by pack_act1, as bytes apart: y[j * ldy + i]
     * for i < 16, j < na. Types with grp_pack (Q4_K, k4_avx512.c; w_sb is
     * 0 and the tile fields NULL) run every product that way: on the copy's
     * groups, or on rows that grp_pack puts in the layout (nrows <= 16 rows
     * row_bytes apart, the rest of the group zeros, into
     * kcpu_r16_bytes(type, 16, ncols) bytes, 64-byte aligned). It also
     * prefetches pf_bytes at pf (or nothing), a slice per block of its work:
     * the next group, coming from DRAM while this one computes. */
    void (*grp)(const void *g, int64_t ncols, const void *a, size_t as, int na, float *y,
                int64_t ldy, const void *pf, size_t pf_bytes);
    void (*grp_pack)(const void *rows, size_t row_bytes, int nrows, int64_t ncols, void *out);
    /* Types with grp but no grp_pack (Q5_0, Q8_0) compute like the tiles and
     * the row kernels: grp takes every product where the matrix has the
     * copy, the tiles and row kernels the others. */
    /* the most activation rows grp takes per call, <= KCPU_GRP_MAX_NA (0:
     * KCPU_MAX_NA): more rows per pass over a group share its unpacking */
    int grp_na;
    /* Where not NULL (Q5_0), products of more than 2 grp_na rows rewrite each
     * group once (grp_unpack, into kcpu_r16_bytes(Q8_0, 16, ncols) bytes,
     * 64-byte aligned) and pass over that with grp_unpacked: the same bits
     * as grp, the group's decoding not repeated per pass. */
    void (*grp_unpack)(const void *g, int64_t ncols, void *out);
    void (*grp_unpacked)(const void *g, int64_t ncols, const void *a, size_t as, int na, float *y,
                         int64_t ldy, const void *pf, size_t pf_bytes);
} kcpu_gemm_t;

kcpu_gemm_t kcpu_gemm_avx512(ecs_type_t wtype);
kcpu_gemm_t kcpu_gemm_q4_K_avx512(void);
/* Adds the row-interleaved kernels (r16, grp) of Q5_0 and Q8_0 to g. */
void kcpu_gemm_r16_avx512(ecs_type_t wtype, kcpu_gemm_t *g);
/* The kernels for wtype at the ISA in use (w_sb == 0: none). */
kcpu_gemm_t kcpu_gemm(ecs_type_t wtype);

/* SIMD activation quantizers; false if vdt has none on that ISA. */
bool kcpu_quantize_act_avx2(ecs_type_t vdt, const float *x, void *out, int64_t n);
bool kcpu_quantize_act_avx512(ecs_type_t vdt, const float *x, void *out, int64_t n);
/* kcpu_swiglu on AVX-512 (swiglu_avx512.c); false where not built. */
bool kcpu_swiglu_avx512(float *g, const float *u, int64_t n);
/* kcpu_logsumexp on AVX-512 (lse_avx512.c) into *out; false where not built. */
bool kcpu_logsumexp_avx512(const float *x, int64_t n, float *out);

/* Defines name##_multi (a kcpu_dot_multi_fn) from impl(NA, n, w, a, a_stride,
 * out), an always-inline kernel whose activation-row count NA is a
 * compile-time constant. */
#define KCPU_DEFINE_MULTI(name, impl)                                                         \
    static void name##_multi(int64_t n, const void *w, const void *a, size_t as, int na,      \
                             float *out)                                                      \
    {                                                                                         \
        switch (na) {                                                                         \
        case 1: impl(1, n, w, a, as, out); break;                                             \
        case 2: impl(2, n, w, a, as, out); break;                                             \
        case 3: impl(3, n, w, a, as, out); break;                                             \
        default: impl(4, n, w, a, as, out); break;                                            \
        }                                                                                     \
    }

/* Defines name##_dot (a kcpu_vec_dot_fn) and name##_multi from impl. */
#define KCPU_DEFINE_KERNEL(name, impl)                                                        \
    static float name##_dot(int64_t n, const void *w, const void *a)                          \
    {                                                                                         \
        float r;                                                                              \
        impl(1, n, w, a, 0, &r);                                                              \
        return r;                                                                             \
    }                                                                                         \
    KCPU_DEFINE_MULTI(name, impl)

#endif
