/* load.c - reading a deepseek2 / qwen3moe GGUF into hyperparameters
 * (common/arch.c) and tensor views (model_weights_t) pointing into the
 * mapping.
 *
 * Tensor names follow llama.cpp's loader (c392e509 for deepseek2,
 * ik_llama.cpp for qwen3moe): see shared/reference/model-shapes-*.md. Every
 * tensor's shape is checked against the hyperparameters, so the sizes the
 * workspace is later built from are bounded by the file itself. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "coordinator/model/model_int.h"

/* ----------------------------------------------------------------- tensors */

static ecs_err_t find(const gguf_file_t *f, const char *name, const gguf_tensor_t **t)
{
    *t = gguf_find_tensor(f, name);
    if (!*t)
        return ecs_error(ECS_ERR_NOTFOUND, "%s: missing tensor %s", gguf_path(f), name);
    return ECS_OK;
}

static ecs_err_t bad_shape(const gguf_file_t *f, const gguf_tensor_t *t, int64_t a, int64_t b,
                           int64_t c)
{
    return ecs_error(ECS_ERR_FORMAT,
                     "%s: tensor %s has shape [%lld, %lld, %lld], expected [%lld, %lld, %lld]",
                     gguf_path(f), t->name, (long long)t->ne[0], (long long)t->ne[1],
                     (long long)t->ne[2], (long long)a, (long long)b, (long long)c);
}

/* A matrix of n3 stacked [nrows x ncols] slices (n3 = 1: plain matrix). */
static ecs_err_t load_mat(const gguf_file_t *f, const char *name, int64_t ncols, int64_t nrows,
                          int64_t n3, kcpu_mat_t *m)
{
    const gguf_tensor_t *t;
    MODEL_TRY(find(f, name, &t));
    if (t->ne[0] != ncols || t->ne[1] != nrows || t->ne[2] != n3 || t->ne[3] != 1)
        return bad_shape(f, t, ncols, nrows, n3);
    size_t rb = ecs_row_size(t->type, ncols);
    if (rb == 0 || !kcpu_vec_dot_for(t->type, KCPU_ISA_SCALAR))
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: tensor %s has type %s, not supported for matmul",
                         gguf_path(f), name, ecs_type_name(t->type));
    m->type = t->type;
    m->ncols = ncols;
    m->nrows = nrows * n3;
    m->row_bytes = rb;
    m->data = t->data;
    m->r16 = NULL;
    return ECS_OK;
}

static ecs_err_t load_vec(const gguf_file_t *f, const char *name, int64_t n, const float **v)
{
    const gguf_tensor_t *t;
    MODEL_TRY(find(f, name, &t));
    if (t->ne[0] != n || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return bad_shape(f, t, n, 1, 1);
    if (t->type != ECS_TYPE_F32)
        return ecs_error(ECS_ERR_UNSUPPORTED, "%s: tensor %s has type %s, expected f32",
                         gguf_path(f), name, ecs_type_name(t->type));
    *v = t->data;
    return ECS_OK;
}

static const char *tname(char *buf, size_t n, int layer, const char *what)
{
    snprintf(buf, n, "blk.%d.%s.weight", layer, what);
    return buf;
}

static ecs_err_t load_ffn(const gguf_file_t *f, const arch_hparams_t *hp, int il,
                          model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd;
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "ffn_norm"), E, &ly->ffn_norm));
    ly->moe = arch_layer_moe(hp, il);
    if (!ly->moe) {
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate"), E, hp->n_ff, 1, &ly->ffn_gate));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_up"), E, hp->n_ff, 1, &ly->ffn_up));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_down"), hp->n_ff, E, 1, &ly->ffn_down));
        return ECS_OK;
    }
    const int64_t X = hp->n_expert, F = hp->n_ff_exp;
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate_inp"), E, X, 1, &ly->gate_inp));
    MODEL_TRY(load_mat(f, arch_exps_name(b, sizeof b, il, ARCH_EXPS_GATE), E, F, X, &ly->gate_exps));
    MODEL_TRY(load_mat(f, arch_exps_name(b, sizeof b, il, ARCH_EXPS_UP), E, F, X, &ly->up_exps));
    MODEL_TRY(load_mat(f, arch_exps_name(b, sizeof b, il, ARCH_EXPS_DOWN), F, E, X, &ly->down_exps));
    snprintf(b, sizeof b, "blk.%d.exp_probs_b.bias", il);
    if (gguf_find_tensor(f, b))
        MODEL_TRY(load_vec(f, b, X, &ly->exp_probs_b));
    if (hp->n_ff_shexp > 0) {
        const int64_t S = hp->n_ff_shexp;
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_gate_shexp"), E, S, 1, &ly->gate_shexp));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_up_shexp"), E, S, 1, &ly->up_shexp));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "ffn_down_shexp"), S, E, 1, &ly->down_shexp));
    }
    return ECS_OK;
}

static ecs_err_t load_attn_ds2(const gguf_file_t *f, const arch_hparams_t *hp, int il,
                               model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd, H = hp->n_head, KV = hp->kv_lora_rank;
    if (hp->q_lora_rank > 0) {
        const int64_t Q = hp->q_lora_rank;
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q_a"), E, Q, 1, &ly->wq_a));
        MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_q_a_norm"), Q, &ly->q_a_norm));
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q_b"), Q, H * hp->head_k, 1, &ly->wq_b));
    } else {
        MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q"), E, H * hp->head_k, 1, &ly->wq));
    }
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_kv_a_mqa"), E, KV + hp->rope.n_rot, 1, &ly->wkv_a));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_kv_a_norm"), KV, &ly->kv_a_norm));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_kv_b"), KV, H * (hp->qk_nope + hp->head_v), 1,
                 &ly->wkv_b));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_output"), H * hp->head_v, E, 1, &ly->wo));
    return ECS_OK;
}

static ecs_err_t load_attn_qwen(const gguf_file_t *f, const arch_hparams_t *hp, int il,
                                model_layer_t *ly)
{
    char b[128];
    const int64_t E = hp->n_embd, D = hp->head_k;
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_q"), E, hp->n_head * D, 1, &ly->wq));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_k"), E, hp->n_head_kv * D, 1, &ly->wk));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_v"), E, hp->n_head_kv * D, 1, &ly->wv));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_q_norm"), D, &ly->q_norm));
    MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_k_norm"), D, &ly->k_norm));
    MODEL_TRY(load_mat(f, tname(b, sizeof b, il, "attn_output"), hp->n_head * D, E, 1, &ly->wo));
    return ECS_OK;
}

ecs_err_t model_load_weights(model_t *m)
{
    const gguf_file_t *f = m->file;
    arch_hparams_t *hp = &m->hp;
    model_weights_t *w = &m->w;
    const gguf_tensor_t *te;
    MODEL_TRY(find(f, "token_embd.weight", &te));
    if (te->ne[0] != hp->n_embd || te->ne[1] < 1 || te->ne[1] > INT32_MAX || te->ne[2] != 1)
        return bad_shape(f, te, hp->n_embd, te->ne[1], 1);
    hp->n_vocab = (int)te->ne[1];
    MODEL_TRY(load_mat(f, "token_embd.weight", hp->n_embd, hp->n_vocab, 1, &w->token_embd));
    MODEL_TRY(load_vec(f, "output_norm.weight", hp->n_embd, &w->output_norm));
    hp->tied_output = gguf_find_tensor(f, "output.weight") == NULL;
    if (hp->tied_output)
        w->output = w->token_embd;
    else
        MODEL_TRY(load_mat(f, "output.weight", hp->n_embd, hp->n_vocab, 1, &w->output));

    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    if (!w->layers)
        return ecs_error(ECS_ERR_NOMEM, "model: no memory for %d layers", hp->n_layer);
    char b[128];
    for (int il = 0; il < hp->n_layer; il++) {
        model_layer_t *ly = &w->layers[il];
        MODEL_TRY(load_vec(f, tname(b, sizeof b, il, "attn_norm"), hp->n_embd, &ly->attn_norm));
        if (hp->arch == ARCH_DEEPSEEK2)
            MODEL_TRY(load_attn_ds2(f, hp, il, ly));
        else
            MODEL_TRY(load_attn_qwen(f, hp, il, ly));
        MODEL_TRY(load_ffn(f, hp, il, ly));
    }
    return ECS_OK;
}

ecs_err_t model_read_hparams(model_t *m) { return arch_read_hparams(m->file, &m->hp); }

/* ------------------------------------------------------- derived tensors */

/* The transposed W_k keeps an exact float type as it is; a quantized
 * W_kv_b becomes Q8_0 (what llama.cpp's converter makes of attn_k_b), or
 * F32 when qk_nope is not a multiple of Q8_0's block. */
static ecs_type_t wkt_type(ecs_type_t t, int nope)
{
    if (t == ECS_TYPE_F32 || t == ECS_TYPE_F16 || t == ECS_TYPE_BF16)
        return t;
    return nope % 32 == 0 ? ECS_TYPE_Q8_0 : ECS_TYPE_F32;
}

/* Short Q8_0 rows go in the packed layout (model_simd_t.dot_q8p), whose
 * groups of rows must not straddle heads. */
static bool wkt_packed(ecs_type_t t, int nope, int kvl)
{
    return t == ECS_TYPE_Q8_0 && nope / 32 <= MODEL_Q8P_MAXBLK && kvl % MODEL_Q8P_ROWS == 0;
}

/* Head h of W_kv_b's W_k (nope rows of kvl), transposed into kvl rows of
 * nope values of wkt's type. w holds nope * kvl + 2 * nope floats. */
static void transpose_head(const kcpu_mat_t *wb, const arch_hparams_t *hp, int h, float *w,
                           kcpu_mat_t *wkt, bool packed)
{
    const int nope = hp->qk_nope, kvl = hp->kv_lora_rank;
    float *col = w + (size_t)nope * kvl;
    void *row = col + nope; /* a packed row before it is spread */
    for (int d = 0; d < nope; d++) {
        const size_t r = (size_t)h * (nope + hp->head_v) + (size_t)d;
        ecs_dequantize_row(wb->type, (const char *)wb->data + r * wb->row_bytes,
                           w + (size_t)d * kvl, kvl);
    }
    for (int j = 0; j < kvl; j++) {
        char *dst = (char *)wkt->data + ((size_t)h * kvl + (size_t)j) * wkt->row_bytes;
        for (int d = 0; d < nope; d++)
            col[d] = w[(size_t)d * kvl + (size_t)j];
        if (wkt->type == ECS_TYPE_F32) {
            memcpy(dst, col, (size_t)nope * sizeof *col);
        } else if (wkt->type == ECS_TYPE_F16) {
            for (int d = 0; d < nope; d++)
                ((ecs_fp16_t *)dst)[d] = ecs_f32_to_fp16(col[d]);
        } else if (wkt->type == ECS_TYPE_BF16) {
            for (int d = 0; d < nope; d++)
                ((ecs_bf16_t *)dst)[d] = ecs_f32_to_bf16(col[d]);
        } else if (packed) {
            ecs_quantize_row(wkt->type, col, row, nope);
            model_q8p_put((char *)wkt->data + (size_t)h * kvl * wkt->row_bytes, j, nope / 32, row);
        } else {
            ecs_quantize_row(wkt->type, col, dst, nope);
        }
    }
}

#define EXT_HUGE ((size_t)2 << 20)

ecs_err_t model_build_ext(model_t *m)
{
    const arch_hparams_t *hp = &m->hp;
    m->ext = calloc((size_t)hp->n_layer, sizeof *m->ext);
    if (!m->ext)
        return ecs_error(ECS_ERR_NOMEM, "model: no memory for %d layers", hp->n_layer);
    if (hp->arch != ARCH_DEEPSEEK2)
        return ECS_OK;
    const int nope = hp->qk_nope, kvl = hp->kv_lora_rank, nh = hp->n_head;
    size_t total = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        kcpu_mat_t *t = &m->ext[il].wkt;
        t->type = wkt_type(m->w.layers[il].wkv_b.type, nope);
        t->ncols = nope;
        t->nrows = (int64_t)nh * kvl;
        t->row_bytes = ecs_row_size(t->type, nope);
        m->ext[il].packed = wkt_packed(t->type, nope, kvl);
        total += ((size_t)t->nrows * t->row_bytes + 63) & ~(size_t)63;
    }
    float *w = malloc(((size_t)nope * kvl + 2 * (size_t)nope) * sizeof *w);
    /* decode reads all of W_kT for every token (30 MB in V2-Lite): in 4 KB
     * pages that is a TLB miss every 4 KB, and its reads measured ~20 %
     * slower than in 2 MB pages (advice only: failure is harmless) */
    const size_t align = total >= EXT_HUGE ? EXT_HUGE : 64;
    total = (total + align - 1) & ~(align - 1);
    m->ext_mem = aligned_alloc(align, total);
    if (m->ext_mem && align == EXT_HUGE)
        madvise(m->ext_mem, total, MADV_HUGEPAGE);
    if (!w || !m->ext_mem) {
        free(w);
        return ecs_error(ECS_ERR_NOMEM, "model: cannot allocate %zu bytes for W_k^T", total);
    }
    m->ext_bytes = total;
    char *p = m->ext_mem;
    for (int il = 0; il < hp->n_layer; il++) {
        kcpu_mat_t *t = &m->ext[il].wkt;
        t->data = p;
        p += ((size_t)t->nrows * t->row_bytes + 63) & ~(size_t)63;
        for (int h = 0; h < nh; h++)
            transpose_head(&m->w.layers[il].wkv_b, hp, h, w, t, m->ext[il].packed);
    }
    free(w);
    return ECS_OK;
}
