/* seq.c - sequences: the KV block pool, paged and whole-cache contexts, and
 * moving a context's rows in and out (prefix-cache files, preemption). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model_int.h"


static void kv_geometry(const model_t *m, unsigned flags, model_kv_geom_t *g)
{
    const arch_hparams_t *hp = &m->hp;
    g->flags = flags;
    g->kvt = flags & MODEL_CTX_KV_F32    ? MODEL_KV_F32
             : flags & MODEL_CTX_KV_BF16 ? MODEL_KV_BF16
             : flags & MODEL_CTX_KV_Q8   ? MODEL_KV_Q8
                                         : MODEL_KV_F16;
    g->elt = model_kvt_size(g->kvt);
    if (hp->arch == ARCH_DEEPSEEK2 && !(flags & MODEL_CTX_MLA_EXPANDED)) {
        g->latent = true;
        g->n_kv_head = 1;
        g->dk = hp->kv_lora_rank + hp->rope.n_rot;
        g->dv = hp->kv_lora_rank;
        g->k_row = g->v_row = g->kvt == MODEL_KV_Q8 ? model_q8_row_bytes(g->dk) : (size_t)g->dk;
    } else {
        g->latent = false;
        g->n_kv_head = hp->n_head_kv;
        g->dk = hp->head_k;
        g->dv = hp->head_v;
        g->k_row = (size_t)g->n_kv_head * g->dk;
        g->v_row = (size_t)g->n_kv_head * g->dv;
    }
    g->blk_bytes = (size_t)hp->n_layer * MODEL_KV_BLOCK * (g->k_row + (g->latent ? 0 : g->v_row)) *
                   g->elt;
}

static bool flags_ok(unsigned flags)
{
    const unsigned types = MODEL_CTX_KV_F32 | MODEL_CTX_KV_BF16 | MODEL_CTX_KV_Q8;
    return !(flags & ~(unsigned)(MODEL_CTX_MLA_EXPANDED | MODEL_CTX_MLA_ABSORBED | types)) &&
           !((flags & types) & ((flags & types) - 1)); /* one type at most */
}

/* An 8-bit cache holds deepseek2's latent rows only. */
static ecs_err_t q8_ok(const model_t *m, const model_kv_geom_t *g)
{
    if (g->kvt != MODEL_KV_Q8)
        return ECS_OK;
    if (!g->latent)
        return ecs_error(ECS_ERR_UNSUPPORTED, "--kv-type q8: only deepseek2's latent cache "
                         "(this model%s)", m->hp.arch == ARCH_DEEPSEEK2 ? " with an expanded "
                         "cache" : " is not deepseek2");
    if (m->ws.att_qmax < (m->hp.n_head + 15) / 16 * 16)
        return ecs_error(ECS_ERR_UNSUPPORTED, "--kv-type q8: a context of %d tokens leaves "
                         "room for %d queries per attention item, fewer than one row's %d heads "
                         "(shorten --ctx)", m->opts.n_ctx, m->ws.att_qmax, m->hp.n_head);
    if (!model_q8_shape_ok(m->hp.kv_lora_rank, g->dk))
        return ecs_error(ECS_ERR_UNSUPPORTED, "--kv-type q8: latent rows of %d + %d values "
                         "(the 8-bit kernels take kv_lora_rank %% 16 == 0, rows %% 4 == 0, up "
                         "to %d)", m->hp.kv_lora_rank, g->dk - m->hp.kv_lora_rank,
                         MODEL_Q8_MAXDK);
    return ECS_OK;
}

int model_kv_type_flag(const char *name)
{
    return !strcmp(name, "f16")    ? 0
           : !strcmp(name, "bf16") ? (int)MODEL_CTX_KV_BF16
           : !strcmp(name, "f32")  ? (int)MODEL_CTX_KV_F32
           : !strcmp(name, "q8")   ? (int)MODEL_CTX_KV_Q8
                                   : -1;
}

const char *model_kv_type_name(unsigned flags)
{
    return flags & MODEL_CTX_KV_F32    ? "f32"
           : flags & MODEL_CTX_KV_BF16 ? "bf16"
           : flags & MODEL_CTX_KV_Q8   ? "q8"
                                       : "f16";
}

static int blocks_for(int n_tok) { return (n_tok + MODEL_KV_BLOCK - 1) / MODEL_KV_BLOCK; }

size_t model_kv_block_bytes(const model_t *m, unsigned flags)
{
    model_kv_geom_t g;
    kv_geometry(m, flags, &g);
    return g.blk_bytes;
}

ecs_err_t model_kvpool_new(model_t *m, int n_blocks, unsigned flags, model_kvpool_t **out)
{
    *out = NULL;
    if (!flags_ok(flags))
        return ecs_error(ECS_ERR_INVAL, "model: unknown context flags 0x%x", flags);
    if (n_blocks < 1)
        return ecs_error(ECS_ERR_RANGE, "model: a KV pool of %d blocks", n_blocks);
    model_kvpool_t *p = calloc(1, sizeof *p);
    if (!p)
        return ecs_error(ECS_ERR_NOMEM, "model: out of memory");
    p->m = m;
    p->n_blocks = n_blocks;
    kv_geometry(m, flags, &p->g);
    if (q8_ok(m, &p->g) != ECS_OK) {
        free(p);
        return ECS_ERR_UNSUPPORTED;
    }
    const size_t rows = (size_t)n_blocks * MODEL_KV_BLOCK;
    p->g.v_base = p->g.latent ? 0 : rows * p->g.k_row * p->g.elt;
    p->g.lay_stride = rows * (p->g.k_row + (p->g.latent ? 0 : p->g.v_row)) * p->g.elt;
    const size_t bytes = (size_t)n_blocks * p->g.blk_bytes;
    p->mem = bytes / p->g.blk_bytes == (size_t)n_blocks ? ecs_alloc_huge(bytes) : NULL;
    if (!p->mem) {
        free(p);
        return ecs_error(ECS_ERR_NOMEM, "model: cannot allocate %zu bytes of KV cache (%d blocks "
                         "of %d tokens)", bytes, n_blocks, MODEL_KV_BLOCK);
    }
    *out = p;
    return ECS_OK;
}

void model_kvpool_free(model_kvpool_t *p)
{
    if (!p)
        return;
    free(p->mem);
    free(p);
}

int model_kvpool_n_blocks(const model_kvpool_t *p) { return p->n_blocks; }

/* Block b's rows, layer by layer (K, then V), to or from buf. */
static void block_copy(model_kvpool_t *p, int b, char *buf, bool to_buf)
{
    const model_kv_geom_t *g = &p->g;
    const size_t row0 = (size_t)b * MODEL_KV_BLOCK;
    for (int l = 0; l < p->m->hp.n_layer; l++)
        for (int kv = 0; kv < (g->latent ? 1 : 2); kv++) {
            const size_t row = (kv ? g->v_row : g->k_row) * g->elt, n = MODEL_KV_BLOCK * row;
            char *at = p->mem + (size_t)l * g->lay_stride + (kv ? g->v_base : 0) + row0 * row;
            memcpy(to_buf ? buf : at, to_buf ? at : buf, n);
            buf += n;
        }
}

void model_kvpool_block_get(const model_kvpool_t *p, int b, void *out)
{
    block_copy((model_kvpool_t *)p, b, out, true);
}

void model_kvpool_block_put(model_kvpool_t *p, int b, const void *in)
{
    block_copy(p, b, (char *)in, false);
}

size_t model_ctx_bytes(const model_t *m, int n_ctx, unsigned flags)
{
    return (size_t)blocks_for(n_ctx > 0 ? n_ctx : 0) * model_kv_block_bytes(m, flags);
}

ecs_err_t model_ctx_new_paged(model_kvpool_t *p, int n_ctx, model_ctx_t **out)
{
    *out = NULL;
    model_t *m = p->m;
    if (n_ctx < 1 || n_ctx > m->opts.n_ctx)
        return ecs_error(ECS_ERR_RANGE, "model: context of %d tokens; this model was loaded for "
                         "1..%d", n_ctx, m->opts.n_ctx);
    model_ctx_t *c = calloc(1, sizeof *c);
    if (c)
        c->tab = calloc((size_t)blocks_for(n_ctx), sizeof *c->tab);
    if (!c || !c->tab) {
        free(c);
        return ecs_error(ECS_ERR_NOMEM, "model: out of memory");
    }
    const model_kv_geom_t *g = &p->g;
    *c = (model_ctx_t){.m = m, .flags = g->flags, .n_ctx = n_ctx, .latent = g->latent,
                       .kvt = g->kvt, .n_kv_head = g->n_kv_head, .dk = g->dk, .dv = g->dv,
                       .k_row = g->k_row, .v_row = g->v_row, .elt = g->elt, .pool = p,
                       .tab = c->tab};
    *out = c;
    return ECS_OK;
}

int32_t *model_ctx_table(model_ctx_t *c) { return c->tab; }

void model_ctx_touched(model_ctx_t *c)
{
    if (c->m && c->m->ws.exp_ctx == c)
        c->m->ws.exp_ctx = NULL;
}

ecs_err_t model_ctx_set_blocks(model_ctx_t *c, int n_blk, int n_past)
{
    if (n_blk < 0 || n_blk > blocks_for(c->n_ctx) || n_past < 0 ||
        n_past > n_blk * MODEL_KV_BLOCK || n_past > c->n_ctx)
        return ecs_error(ECS_ERR_RANGE, "model: %d blocks holding %d tokens in a context of %d",
                         n_blk, n_past, c->n_ctx);
    for (int i = 0; i < n_blk; i++)
        if (c->tab[i] < 0 || c->tab[i] >= c->pool->n_blocks)
            return ecs_error(ECS_ERR_RANGE, "model: block %d outside the pool (%d blocks)",
                             c->tab[i], c->pool->n_blocks);
    if (n_past != c->n_past || n_blk < c->n_blk) /* more blocks after the same rows: kept */
        model_ctx_touched(c);
    c->n_blk = n_blk;
    c->n_past = n_past;
    return ECS_OK;
}

ecs_err_t model_ctx_new(model_t *m, int n_ctx, unsigned flags, model_ctx_t **out)
{
    *out = NULL;
    if (n_ctx < 1 || n_ctx > m->opts.n_ctx)
        return ecs_error(ECS_ERR_RANGE, "model: context of %d tokens; this model was loaded for "
                         "1..%d", n_ctx, m->opts.n_ctx);
    model_kvpool_t *p;
    MODEL_TRY(model_kvpool_new(m, blocks_for(n_ctx), flags, &p));
    ecs_err_t e = model_ctx_new_paged(p, n_ctx, out);
    if (e != ECS_OK) {
        model_kvpool_free(p);
        return e;
    }
    (*out)->own_pool = true;
    for (int i = 0; i < p->n_blocks; i++)
        (*out)->tab[i] = i;
    (*out)->n_blk = p->n_blocks;
    return ECS_OK;
}

void model_ctx_free(model_ctx_t *c)
{
    if (!c)
        return;
    model_ctx_touched(c);
    if (c->own_pool)
        model_kvpool_free(c->pool);
    free(c->tab);
    free(c);
}

void model_ctx_reset(model_ctx_t *c)
{
    model_ctx_touched(c);
    c->n_past = 0;
}

ecs_err_t model_ctx_truncate(model_ctx_t *c, int n_keep)
{
    if (n_keep < 0 || n_keep > c->n_past)
        return ecs_error(ECS_ERR_RANGE, "model: cannot keep %d of %d cached tokens", n_keep,
                         c->n_past);
    model_ctx_touched(c);
    c->n_past = n_keep;
    return ECS_OK;
}
int model_ctx_n_past(const model_ctx_t *c) { return c->n_past; }

size_t model_ctx_rows_bytes(const model_ctx_t *c, int n)
{
    size_t per_tok = c->latent ? c->k_row : c->k_row + c->v_row;
    return (size_t)c->m->hp.n_layer * (size_t)(n > 0 ? n : 0) * per_tok * c->elt;
}

/* Copies rows [0, n) of every layer's K (and V) between the cache and a
 * packed buffer, layer by layer (each layer's K rows, then its V rows). */
static void ctx_rows_copy(model_ctx_t *c, int n, char *buf, bool to_buf)
{
    for (int l = 0; l < c->m->hp.n_layer; l++)
        for (int kv = 0; kv < (c->latent ? 1 : 2); kv++) {
            const size_t row = (kv ? c->v_row : c->k_row) * c->elt;
            for (int t = 0; t < n; t++) {
                char *at = kv ? model_kv_vrow(c, l, t) : model_kv_krow(c, l, t);
                memcpy(to_buf ? buf : at, to_buf ? at : buf, row);
                buf += row;
            }
        }
}

ecs_err_t model_ctx_export(const model_ctx_t *c, int n, void *out)
{
    if (n < 0 || n > c->n_past)
        return ecs_error(ECS_ERR_RANGE, "model: cannot export %d of %d cached tokens", n, c->n_past);
    ctx_rows_copy((model_ctx_t *)c, n, out, true);
    return ECS_OK;
}

ecs_err_t model_ctx_import(model_ctx_t *c, int n, const void *in)
{
    if (n < 0 || n > c->n_ctx || n > c->n_blk * MODEL_KV_BLOCK)
        return ecs_error(ECS_ERR_RANGE, "model: cannot import %d tokens into a context of %d", n,
                         c->n_ctx);
    model_ctx_touched(c);
    ctx_rows_copy(c, n, (char *)in, false);
    c->n_past = n;
    return ECS_OK;
}
int model_ctx_n_ctx(const model_ctx_t *c) { return c->n_ctx; }

