/* model_int.h - private structures shared by the files of the model module
 * (loader, forward pass, attention, local expert backend,
 * SIMD helpers). Not part of the API. */
#ifndef ECS_MODEL_INT_H
#define ECS_MODEL_INT_H

#include <stdatomic.h>

#include "common/mem.h"
#include "coordinator/model/model.h"
#include "kernels/moe/moe.h"
#include "kernels/repack/repack.h"

/* x (nb rows, ldx apart) as activations for w: x itself when w takes F32
 * rows of exactly ncols, else quantized into buf (on the pool for big
 * batches). */
const void *model_act(ecs_threadpool_t *tp, const kcpu_mat_t *w, const float *x, int64_t ldx,
                      int nb, void *buf);

/* ------------------------------------------------------------ simd
 * Hot loops with an AVX-512 version (simd_avx512.c) and a plain one
 * (simd.c); model_simd() picks by the ISA in use (kcpu_isa()). */

/* Element type of a KV cache. The attention kernels take it as kt: F16 and
 * F32 caches are read as F32 (queries and probabilities F32, rounded to F16
 * for an F16 cache), every product added in order of the dimension. A BF16
 * cache takes BF16 queries and sums pairs of BF16 products the way
 * vdpbf16ps does: s = (s + a[2i+1] b[2i+1]) + a[2i] b[2i], pair after pair,
 * each step rounded to F32 (the products are exact). The plain loops are
 * the reference; the instruction also reads subnormal inputs as zero and
 * flushes subnormal sums, which the plain loops do for inputs too
 * (bf16_daz in simd.c): results agree bit for bit unless a partial sum
 * falls below FLT_MIN. Without AVX-512 BF16 a BF16 cache runs the plain
 * loops (the same bits, slower). */
typedef enum { MODEL_KV_F16, MODEL_KV_BF16, MODEL_KV_F32, MODEL_KV_Q8 } model_kvt_t;

/* Bytes of one element of a cache of type t (an 8-bit cache's rows are
 * counted in bytes). */
static inline size_t model_kvt_size(model_kvt_t t)
{
    return t == MODEL_KV_F32 ? 4 : t == MODEL_KV_Q8 ? 1 : 2;
}
/* The type a latent cache of type t expands into for prompts (attn_exp.c). */
static inline model_kvt_t model_kvt_expanded(model_kvt_t t)
{
    return t == MODEL_KV_Q8 ? MODEL_KV_BF16 : t;
}

/* The 8-bit latent cache (MODEL_KV_Q8, deepseek2 only; attn_q8.c): a row
 * [c (dc values) | k_pe (dk - dc)] as bytes u = round(x / s) + 128, s =
 * max|x| / 127 of its part (levels in [-127, 127]), then the two parts'
 * F32 scales, padded to model_q8_row_bytes(dk). A query is quantized the
 * same way per part (s8 levels, model_q8_query: groups of 16 queries,
 * QT8[g][d / 4][i][d % 4], then per group 2 x 16 scales and 2 x 16
 * corrections 128 x sum of levels). Score of query j, key t: Ic, Ir the
 * integer products of the parts (u - 128 through the correction), then
 * scale * fmaf(Ir, sq_r sk_r, Ic * (sq_c sk_c)). P.V of a block of keys
 * (model_q8_pv): per query the probabilities times the keys' c scales, to
 * u8 levels of max / 255 (model_q8_pv_levels), the integer sum over keys
 * of level x (u - 128) per column, times max / 255. Plain loops and
 * VNNI kernels give the same bits. dk <= MODEL_Q8_MAXDK, dk % 4 == 0,
 * dc % 16 == 0 (model_q8_shape_ok). */
#define MODEL_Q8_MAXDK 1024
size_t model_q8_row_bytes(int dk);
/* x[0..n) as levels in [-127, 127] plus off (0: s8 bytes, 128: u8) into
 * lv, *sum the levels' sum; returns the scale max|x| / 127. The same bits
 * both ways (the vector one wants AVX-512F/BW). */
float model_q8_levels_ref(const float *x, int n, int off, uint8_t *lv, int32_t *sum);
float model_q8_levels_avx512(const float *x, int n, int off, uint8_t *lv, int32_t *sum);
bool model_q8_shape_ok(int dc, int dk);
void model_q8_put(void *row, const float *x, int dc, int dk);
/* dst[0..n) = values [d0, d0 + n) of row, dequantized. */
void model_q8_get(float *dst, const void *row, int d0, int n, int dc, int dk);
size_t model_q8_query_bytes(int nq, int dk);
void model_q8_query(void *QT, int nq, int j, int dc, int dk, const float *q);
void model_q8_query_parts(void *QT, int nq, int dk, const int8_t **qt, const float **sq,
                          const int32_t **corr);
/* S[j][t] for j < nq, t < nt (rows written up to nt rounded up to 16 by
 * the vector kernel), keys ks bytes apart; kbuf: 16 rows. */
void model_q8_scores(const void *QT, int nq, int dc, int dk, const void *K, size_t ks, int nt,
                     float scale, float *S, int lds, void *kbuf);
void model_q8_scores_ref(const void *QT, int nq, int dc, int dk, const void *K, size_t ks, int nt,
                         float scale, float *S, int lds);
void model_q8_scores_avx512(const void *QT, int nq, int dc, int dk, const void *K, size_t ks,
                            int nt, float scale, float *S, int lds, void *kbuf);
/* O[j][d] for j < nq, d < dc over the keys of nrun runs (rn[r] rows at
 * vr[r], ks bytes apart; at most MODEL_SPLIT_KEYS in all), O overwritten;
 * P rows ldp floats apart (F32 probabilities, zero past each query's
 * keys); scratch: model_q8_pv_scratch(nq) bytes. */
void model_q8_pv(const float *P, int nq, int ldp, const void *const *vr, const int *rn, int nrun,
                 size_t ks, int dc, int dk, float *O, int ldo, void *scratch);
void model_q8_pv_ref(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                     int nrun, size_t ks, int dc, int dk, float *O, int ldo, void *scratch);
void model_q8_pv_avx512(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                        int nrun, size_t ks, int dc, int dk, float *O, int ldo, void *scratch);
int model_q8_pv_levels(const float *P, int nq, int ldp, const void *const *vr, const int *rn,
                       int nrun, size_t ks, int dk, uint8_t *pu, float *sv, float *ps);
size_t model_q8_pv_scratch(int nq);
/* Whether the VNNI kernels run here (AVX-512 VNNI and VBMI, the ISA in use
 * AVX-512); the plain loops otherwise. */
bool model_cpu_q8(void);

typedef struct {
    /* S[j][t] = scale * Q[j] . K[t] for j < nq (multiple of 4), t < len[j]
     * <= nt (what lies past len[j] is left unspecified: causal masking
     * never reads it); Q rows ldq floats apart, zero-padded to dkp
     * (multiple of 16), F32 or for a BF16 cache dkp BF16 values (the
     * row's first half); K rows ks elements apart of type kt, dk long (even
     * for BF16); S rows hold nt rounded up to 16; kbuf holds 32 * dkp
     * floats (two panels of 16 transposed keys). */
    void (*scores)(const float *Q, int nq, int ldq, const void *K, size_t ks, model_kvt_t kt,
                   int dk, int dkp, const int *len, int nt, float scale, float *S, int lds,
                   float *kbuf);
    /* The same scores with the queries transposed: QT holds (nq + 15) / 16
     * groups of dk x 16 floats (QT[g][d][i] = Q[16 g + i][d], rounded as
     * for scores, zero for padding queries; for a BF16 cache, groups of
     * dk / 2 x 16 pairs of BF16 values: QT[g][p][i] = Q[16 g + i][2p, 2p+1],
     * model_qt_bf16), and every query sees every key t < nt. S[j][t] for
     * j < nq, t < nt (rows written up to nt rounded up to 16); kbuf holds
     * 16 * dk floats. Bit for bit the scores of the same queries (each
     * score is the same sum), but no transposition of the keys: the decode
     * split of latent attention (attn.c) hands each thread all queries and
     * a fixed run of the keys. */
    void (*scores_t)(const float *QT, int nq, const void *K, size_t ks, model_kvt_t kt, int dk,
                     int nt, float scale, float *S, int lds, float *kbuf);
    /* Row j of S (nt_j = len[j] valid values, row padded to nt): softmax
     * in place, probabilities rounded to F16 / BF16 for such a cache, zero
     * past len[j]. With mx (and sum) not NULL, one block of an online
     * softmax: exp(S - max) not divided by the sum, rounded the same way;
     * mx[j] = the row's max (-inf when len[j] is 0), sum[j] = the sum of
     * its unrounded exponentials (0 then). */
    void (*softmax)(float *S, int nq, int lds, const int *len, int nt, model_kvt_t kt, float *mx,
                    float *sum);
    /* O[j][d] = sum_t P[j][t] V[t][d] over t < len[j] (P is zero past it,
     * and adding 0 * V changes no sum), j < nq (multiple of 4), d < dv; V
     * rows vs elements apart of type kt. acc: the sums start from O's
     * values instead of zero (P.V over blocks of keys, one call each,
     * equals one call over all of them bit for bit; for BF16 when every
     * block but the last has an even number of keys: pairs are (t, t+1),
     * t even, a missing t+1 is zero). */
    void (*pv)(const float *P, int nq, int ldp, const void *V, size_t vs, model_kvt_t kt, int dv,
               const int *len, float *O, int ldo, bool acc);
    /* dst = src rounded to F16 and back / converted to F16 / to BF16
     * (nearest even, as ecs_f32_to_bf16) */
    void (*round_f16)(float *dst, const float *src, int64_t n);
    void (*to_f16)(ecs_fp16_t *dst, const float *src, int64_t n);
    void (*to_bf16)(ecs_bf16_t *dst, const float *src, int64_t n);
    /* y[j * ldy + i] = W row i . activation row j, i < nrows (a multiple of
     * MODEL_Q8P_ROWS), j < na: W Q8_0 rows of nblk blocks in the packed
     * layout (model_q8p_put), a Q8_0 rows as bytes apart. Per row, each
     * block's integer dot product times (d_w * d_a), summed with FMAs in
     * block order: the same bits on every ISA and for every na. */
    void (*dot_q8p)(const void *w, int nrows, int nblk, const void *a, size_t as, int na, float *y,
                    int64_t ldy);
    /* o[d] = scale * (((0 + w[0] x[0][d]) + w[1] x[1][d]) + ...), d < n,
     * x[b] = x + b * xs floats, b < nb: each product and sum rounded to F32
     * in block order, then the product with scale (the merge of the decode
     * key split's blocks, attn.c); the same bits on every ISA. */
    void (*wsum)(float *o, int n, const float *x, size_t xs, const float *w, int nb, float scale);
} model_simd_t;

/* Query j (dk BF16 values at q) into the transposed BF16 groups at QT
 * (model_simd_t.scores_t). */
void model_qt_bf16(float *QT, int j, int dk, const ecs_bf16_t *q);
/* Whether this CPU runs AVX-512 BF16 (vdpbf16ps) and the ISA in use is
 * AVX-512. */
bool model_cpu_bf16(void);
/* attn_bf16_avx512.c: scores, scores_t and pv of model_simd_t for a BF16
 * cache with vdpbf16ps (only where model_cpu_bf16()). */
void model_bf16_scores(const float *Q, int nq, int ldq, const void *K, size_t ks, int dk, int dkp,
                       const int *len, int nt, float scale, float *S, int lds, float *kbuf);
void model_bf16_scores_t(const float *QT, int nq, const void *K, size_t ks, int dk, int nt,
                         float scale, float *S, int lds, float *kbuf);
void model_bf16_pv(const float *P, int nq, int ldp, const void *V, size_t vs, int dv,
                   const int *len, float *O, int ldo, bool acc);

/* Whether this CPU has AMX-BF16 and the kernel lets the process use its
 * tiles (asked once, arch_prctl), with AVX-512 BF16 (model_cpu_bf16). */
bool model_cpu_amx(void);
/* Whether m's attention on BF16 caches runs on the tile unit (attn.c,
 * where the shapes fit the tiles): model_cpu_amx() and not opts.no_amx. */
bool model_attn_amx(const model_t *m);
/* attn_amx.c: the decode key split's block on a BF16 cache with AMX (only
 * where model_cpu_amx(); dk even, dv a multiple of 64). model_amx_scores:
 * model_simd_t.scores_t's contract (QT's
 * groups zero past the dk / 2 pairs, as a whole group, and dk >= 32), each score the tile unit's sum (within
 * rounding of scores_t's, not its bits). model_amx_pv: O[j][d] = sum_t
 * P[j][t] V[t][d] for j < nq rounded up to 16 (rows past nq zero, O holds
 * them), d < dv, over the keys of nrun runs (run r: rn[r] rows at vr[r], vs
 * elements apart; every run but the last an even count), O overwritten
 * (acc: added to; calls over consecutive chunks of keys, each but the last
 * a multiple of 32 keys, sum each chunk's tiles in turn);
 * P rows ldp floats apart, BF16 values as model_simd_t.softmax leaves them;
 * stage: model_amx_pv_stage(nq, keys, dv) bytes, 64-byte aligned. */
void model_amx_scores(const float *QT, int nq, const void *K, size_t ks, int dk, int nt,
                      float scale, float *S, int lds, float *kbuf);
void model_amx_pv(const float *P, int nq, int ldp, const void *const *vr, const int *rn, int nrun,
                  size_t vs, int dv, float *O, int ldo, bool acc, void *stage);
size_t model_amx_pv_stage(int nq, int nt, int dv);

/* The packed Q8_0 layout of W_kT (short rows: 128 values in ds2): groups of
 * MODEL_Q8P_ROWS rows; per group and block, the rows' F16 scales, then the
 * levels plus 128 (unsigned, for VNNI) four at a time: 4 of row 0, 4 of
 * row 1, ... So one 64-byte load holds 4 levels of every row of the group,
 * and a product accumulates one row per SIMD lane with no reductions. Same
 * bytes as plain Q8_0 rows. */
#define MODEL_Q8P_ROWS 16
/* Blocks a packed row holds at most (longer W_kT rows stay plain Q8_0). */
#define MODEL_Q8P_MAXBLK 16
/* Stores Q8_0 row r (nblk blocks) in the packed matrix at w. */
void model_q8p_put(void *w, int r, int nblk, const void *row);

const model_simd_t *model_simd(void);
const model_simd_t *model_simd_plain(void);
const model_simd_t *model_simd_avx512(void); /* NULL when not built */

/* ------------------------------------------------------------ model */

/* Queries one attention work item handles at most (S rows). */
#define MODEL_ATT_QMAX 64
/* deepseek2 latent contexts: a step of up to this many rows runs the
 * absorbed attention core as one region (decode). */
#define MODEL_FUSED_ROWS 4
/* Keys per block of the decode key split (attn.c): fixed, so the online
 * softmax's merge order depends on neither the thread count nor timing. */
#define MODEL_SPLIT_KEYS 256

/* Scratch for one forward step of up to MODEL_MAX_BATCH rows; every buffer
 * is sized at load from the hyperparameters. Row-major, one row per token. */
typedef struct {
    float *x;        /* [nb][n_embd] residual stream */
    float *xn;       /* [nb][n_embd] normalised input of a block */
    float *q;        /* [nb][n_head*head_k] */
    float *qa;       /* [nb][q_lora_rank] */
    float *kv;       /* [nb][kv_w]: ds2 latent+k_pe, qwen K */
    float *v;        /* [nb][n_head_kv*head_v] qwen V */
    float *kvb;      /* [nb][n_head*(qk_nope+head_v)] ds2 expanded K/V (also the
                        expansion of a block of latent rows, attn_exp.c) */
    float *kvrow;    /* [n_head*(head_k+head_v)] one expanded K and V row */
    float *att;      /* [nb][n_head][kv_lora] absorbed queries (ds2 latent) */
    float *ato;      /* [nb][n_head][kv_lora] latent attention output */
    float *attv;     /* [nb][n_head*head_v] attention output per head (input of W_o) */
    void *qn_act;    /* n_head blocks of nb rows of qk_nope quantized for W_kT */
    void *att_act;   /* n_head blocks of nb rows of kv_lora quantized for W_v */
    size_t qn_row, att_row; /* bytes per row of the two above */
    /* ds2 expanded-form attention of latent contexts (attn_exp.c): one
     * sequence's cached rows expanded to per-head K = [W_k c | k_pe] and
     * V = W_v c, F16 or F32 as its cache; ex_pos F32 rows fit (twice as
     * many F16 ones). exc: a block of latent rows in F32. The absorbed
     * rows of a mixed step are gathered into qsub / attvsub. */
    void *exk, *exv;
    int ex_pos;
    /* Earlier positions [0, exp_n) of exp_ctx (at n_past exp_past) at
     * exp_layer, expanded in exk / exv by model_slice_expand for that
     * sequence's next attention there; exp_ctx NULL: none. Any expanded
     * attention takes them or drops them (the scratch is the step's). */
    const model_ctx_t *exp_ctx;
    int exp_layer, exp_past, exp_n;
    float *exc;      /* [nb][kv_lora] */
    float *qsub;     /* [nb][n_head*head_k] */
    float *attvsub;  /* [nb][n_head*head_v] */
    float *ffa, *ffb;/* [ff_cap] gate (then h) / up of dense and shared FFNs */
    void *ffq;       /* h quantized for the down projection */
    float *sh;       /* [nb][n_embd] shared experts output */
    float *moe;      /* [nb][n_embd] routed experts output */
    float *tmp;      /* [nb][n_embd] a block's output before the residual add */
    float *router;   /* [nb][n_expert] */
    int32_t *ids;    /* [nb][n_expert_used] */
    float *w;        /* [nb][n_expert_used] */
    float *route_scratch; /* [nb][3*n_expert] */
    float *rope;     /* [nb][n_rot] cos/sin per row */
    void *act;       /* quantized activations of one matrix input, nb rows */
    float *thr;      /* per thread attention scratch, thr_stride floats */
    size_t thr_stride;
    kcpu_plan_t plan;
    kcpu_job_t *jobs; /* [jobs_cap] for regions of many products */
    int jobs_cap;
    int kv_w, att_w, ff_w;
    size_t ff_cap;   /* floats in ffa / ffb */
    int att_qmax;    /* queries per attention item (<= MODEL_ATT_QMAX) */
    int dkp, dvp;    /* widest key / value rows, padded to 16 */
    int t_pad;       /* n_ctx padded to 16 */
    float *split_o;  /* the decode key split's per-block outputs (attn.c) */
    char *amx_stage; /* per thread amx_stride bytes: model_amx_pv's staging */
    size_t amx_stride;
} model_ws_t;

/* deepseek2 latent attention: W_k of W_kv_b transposed per head, so that
 * absorbing a query (W_k^T q_nope) is a plain matrix product: n_head
 * blocks of kv_lora rows of qk_nope values. */
typedef struct {
    kcpu_mat_t wkt;  /* all heads stacked: n_head*kv_lora rows */
    bool packed;     /* Q8_0 in the packed layout (model_simd_t.dot_q8p) */
} model_layer_ext_t;

struct model {
    gguf_file_t *file;
    arch_hparams_t hp;
    model_weights_t w;
    model_opts_t opts;
    ecs_threadpool_t *tp;

    model_layer_ext_t *ext; /* [n_layer] */
    void *ext_mem;
    size_t ext_bytes;

    model_ws_t ws;
    void *ws_mem;
    size_t ws_bytes;
    size_t kscratch_bytes; /* kernel scratch reserved at load, all threads */

    const model_experts_ops *ex_ops;
    void *ex_ctx;
    model_experts_local_t *ex_local;
    int n_micro;            /* micro-batches per step (model_set_micro_batches), >= 1 */

    model_prof_t prof[MODEL_PH_COUNT];

    /* repack.c: the interleaved decode copy (opts.repack_dir) */
    krepack_t *r16;       /* the mapped copy (kernels/repack), NULL: none */
    const void **r16_src; /* [r16_n] data of the copied matrices whose rows
                           * the kernels never read (else NULL) */
    int r16_n;
    char r16_note[512];   /* why there is none, if it was asked for */
    char pages_note[512]; /* weights read back into 2 MB pages at load */

    /* validate.c */
    void *align_copy;     /* tensors the file has at misaligned addresses */
    size_t align_bytes;
    char warn[512];       /* model_load_warning() */
};

/* repack.c: maps (making it first if needed) the interleaved copy of the
 * matrices decode reads, in dir, and points their views at it; on failure
 * leaves the views alone and the reason in r16_note. */
void model_repack(model_t *m, const char *dir);
/* model.c: base's resident 2 MB regions held in small folios read back
 * (ecs_huge_refresh), noted in pages_note. */
void model_pages_refresh(model_t *m, const void *base, size_t n, const char *path);
void model_repack_free(model_t *m);

/* Phase timing (opts.profile): prof_start marks now; prof_end charges the
 * time since the mark to a phase and moves the mark. */
typedef struct {
    double wall, cpu;
    uint64_t regions;
} prof_mark_t;

void prof_start(const model_t *m, prof_mark_t *mk);
void prof_end(model_t *m, model_phase_t ph, prof_mark_t *mk);

/* KV memory (paged): a pool of n_blocks blocks of MODEL_KV_BLOCK tokens,
 * laid out layer by layer: layer l's K rows of every block, block after
 * block, at mem + l * lay_stride, then (unless latent) its V rows at
 * + v_base. So token i of block b is K row b * MODEL_KV_BLOCK + i of the
 * layer, and blocks with consecutive ids are one contiguous run of rows
 * (the identity table of model_ctx_new is the whole context's run, the
 * layout of one contiguous cache). Rows are F16, BF16 (MODEL_CTX_KV_BF16)
 * or F32 (MODEL_CTX_KV_F32); in the ds2 latent layout V aliases K (the first
 * kv_lora values). */
typedef struct {
    unsigned flags;
    bool latent;
    model_kvt_t kvt;
    int n_kv_head;      /* heads stored; the latent has one shared by all */
    int dk, dv;         /* per head */
    size_t k_row, v_row;      /* elements per token */
    size_t elt;               /* bytes per element */
    size_t blk_bytes;         /* one block, every layer */
    size_t lay_stride, v_base; /* set by the pool: bytes per layer, V's offset in it */
} model_kv_geom_t;

struct model_kvpool {
    model_t *m;
    model_kv_geom_t g;
    int n_blocks;
    char *mem;
};

/* A sequence: its block table (tab[i] holds tokens [i * MODEL_KV_BLOCK,
 * (i + 1) * MODEL_KV_BLOCK)), of which n_blk entries are filled. A context
 * made by model_ctx_new owns a pool of its own with the identity table. */
struct model_ctx {
    model_t *m;
    unsigned flags;
    int n_ctx;
    int n_past;
    bool latent;
    model_kvt_t kvt;
    int n_kv_head;
    int dk, dv;
    size_t k_row, v_row;
    size_t elt;
    model_kvpool_t *pool;
    bool own_pool;
    int32_t *tab;
    int n_blk;
};

/* Row of token t of c in its layer's rows of the pool. */
static inline size_t model_kv_prow(const model_ctx_t *c, int t)
{
    return (size_t)c->tab[t / MODEL_KV_BLOCK] * MODEL_KV_BLOCK + (size_t)(t % MODEL_KV_BLOCK);
}

/* Token t's K (V) row of c at layer. Every access to cached rows goes
 * through these or model_ctx_kv (attn.c). */
static inline char *model_kv_krow(const model_ctx_t *c, int layer, int t)
{
    const model_kv_geom_t *g = &c->pool->g;
    return c->pool->mem + (size_t)layer * g->lay_stride + model_kv_prow(c, t) * g->k_row * g->elt;
}

static inline char *model_kv_vrow(const model_ctx_t *c, int layer, int t)
{
    const model_kv_geom_t *g = &c->pool->g;
    return c->pool->mem + (size_t)layer * g->lay_stride + g->v_base +
           model_kv_prow(c, t) * g->v_row * g->elt;
}

/* Row of a step: which sequence, at which position; seq_rows: how many
 * rows of its sequence the step has (it picks the deepseek2 attention form,
 * and stays that of the whole step when the last layer runs on fewer). */
typedef struct {
    model_ctx_t *ctx;
    int pos;
    int32_t token;
    int seq_rows;
} model_step_row_t;

#define MODEL_TRY(expr)                                                                            \
    do {                                                                                           \
        ecs_err_t err_ = (expr);                                                                   \
        if (err_ != ECS_OK)                                                                        \
            return err_;                                                                           \
    } while (0)

/* load.c: hyperparameters, then tensor views (needs the former), then the
 * derived per-layer tensors (W_kT) */
ecs_err_t model_read_hparams(model_t *m);
ecs_err_t model_load_weights(model_t *m);
ecs_err_t model_build_ext(model_t *m);

/* validate.c: no overlapping tensors, unused tensors named in m->warn,
 * misaligned tensors copied to align_copy (after the views; the metadata's
 * ranges are arch_read_hparams'). */
ecs_err_t model_validate_tensors(model_t *m);

/* finite.c: after a step failed with e or its logits were not all finite,
 * reruns it with a check of every MoE layer's activations and returns an
 * error naming the first layer, phase and tensor where values stopped being
 * finite (e itself when they all are). */
ecs_err_t model_diagnose_step(model_t *m, const model_step_row_t *rows, int n,
                              const int *out_rows, int n_out, float *logits, ecs_err_t e);
bool model_all_finite(const float *x, size_t n);

/* forward.c: logits for out_rows (ascending), in that order. The last
 * layer runs in full only for those; the other rows only store their K/V. */
ecs_err_t model_forward(model_t *m, const model_step_row_t *rows, int n,
                        const int *out_rows, int n_out, float *logits);
/* Units [u0, u1) of the step (model_eval_slice): u0 > 0 starts from the
 * residual in resid, u1 < model_slice_units leaves it there; u1
 * model_slice_units ends as model_forward does. */
ecs_err_t model_forward_layers(model_t *m, const model_step_row_t *rows, int n, int u0, int u1,
                               float *resid, const int *out_rows, int n_out, float *logits);

/* attn.c: the attention core of one layer, after the step's K/V rows are
 * in the caches. ds2 latent: queries in ws->q (q_pe rotated), output in
 * ws->attv. Others: queries in ws->q, output in ws->attv. */
void model_attention(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                     const model_step_row_t *rows, int n, int layer);
/* One layer's K and V rows: token t, head h at t * k_row + h * dk (V
 * likewise), of type kvt; contiguous (tab NULL) or paged: token t is row
 * tab[t / MODEL_KV_BLOCK] * MODEL_KV_BLOCK + t % MODEL_KV_BLOCK from k
 * (attn.c reads each run of consecutive block ids as one contiguous run). */
typedef struct {
    const void *k, *v;
    size_t k_row, v_row; /* elements between tokens */
    model_kvt_t kvt;
    const int32_t *tab;  /* paged: the block table; NULL: contiguous */
} model_kv_t;

/* Ordinary multi-head attention (one K/V head per query head, dk / dv per
 * head) of the rows of only in ws->q against kv, output in ws->attv, with
 * the rounding rules of kv's type. */
void model_attend_kv(model_t *m, const model_step_row_t *rows, int n, const model_ctx_t *only,
                     const model_kv_t *kv, int dk, int dv);
/* Absorbed latent attention of n rows: queries q (n rows as ws->q), output
 * attv (n rows as ws->attv). */
void model_attn_absorbed(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                         const model_step_row_t *rows, int n, int layer, const float *q,
                         float *attv);
/* attn_exp.c: the attention core of a step of latent contexts; chooses
 * per sequence between the absorbed and the expanded form. */
void model_attn_mla(model_t *m, const model_layer_t *ly, const model_layer_ext_t *ex,
                    const model_step_row_t *rows, int n, int layer);
/* F32 rows of expansion scratch ws_layout budgets for a context of n_ctx. */
int model_exp_positions(const arch_hparams_t *hp, int n_ctx);
/* Stores row r's K (and V, unless the cache is latent) at its position. */
void model_cache_put(const model_step_row_t *r, int layer, const float *k, const float *v);

/* experts.c: the local backend over kernels/moe; the model's default
 * path runs its jobs inside its own regions (forward.c). */
struct model_experts_local {
    kmoe_t *moe;
    kmoe_expert_t *experts;       /* [n_layer * n_expert] views of the stacks */
    const kmoe_expert_t **layers; /* [n_layer]: NULL for a dense layer */
    ecs_threadpool_t *tp;
    int n_embd, k_used;
    /* the current step */
    int n_tok, k, layer;
    ecs_err_t status;             /* of the last submit, reported by wait */
    const float *w;               /* submit's weights, summed by wait */
};
/* Checks a step's rows (k must be n_expert_used), groups and quantizes
 * them (kmoe_prepare); then kmoe_gate_up / kmoe_down on l->moe. */
ecs_err_t model_experts_local_prepare(model_experts_local_t *l, int layer, int n_tok,
                                      const float *x, int k, const int32_t *ids);
/* out[t] = sum over slots (in slot order) of w[t][slot] * expert output. */
void model_experts_local_finish(model_experts_local_t *l, const float *w, float *out);
/* Most jobs one region of the local backend appends, plus one. */
int model_experts_local_max_jobs(const model_t *m);

/* c's cache may change (or c go): an expansion of its rows run ahead by
 * model_slice_expand is no longer its (seq.c). */
void model_ctx_touched(model_ctx_t *c);


#endif
