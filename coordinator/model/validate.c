/* validate.c - load-time checks beyond the loader's shape checks, so that a
 * plausible but inconsistent model gets an error naming the key or tensor
 * instead of running and printing garbage. After the tensor views are
 * made: no two tensors share bytes, every tensor in the file is used by the
 * architecture (else a warning naming the unused ones), and tensors at
 * addresses the kernels do not expect (GGUF allows general.alignment = 1,
 * the kernels read blocks in place and assume GGUF_DEFAULT_ALIGNMENT) are
 * copied to aligned memory. The metadata's numeric ranges are checked where
 * the hyperparameters are read (common/arch.c), so that ecs-worker refuses
 * the same files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model_int.h"

/* ---------------------------------------------------------------- tensors */

static int cmp_offset(const void *a, const void *b)
{
    const gguf_tensor_t *x = *(const gguf_tensor_t *const *)a, *y = *(const gguf_tensor_t *const *)b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static ecs_err_t check_overlap(const gguf_file_t *f)
{
    const uint64_t n = gguf_n_tensors(f);
    if (n < 2)
        return ECS_OK;
    const gguf_tensor_t **by = malloc(n * sizeof *by);
    if (!by)
        return ecs_error(ECS_ERR_NOMEM, "model: out of memory checking %llu tensors",
                         (unsigned long long)n);
    for (uint64_t i = 0; i < n; i++)
        by[i] = gguf_tensor_at(f, i);
    qsort(by, n, sizeof *by, cmp_offset);
    ecs_err_t e = ECS_OK;
    for (uint64_t i = 1; i < n && e == ECS_OK; i++) {
        const gguf_tensor_t *a = by[i - 1], *b = by[i];
        if (a->offset + a->nbytes > b->offset)
            e = ecs_error(ECS_ERR_FORMAT,
                          "%s: tensors %s (data bytes %llu..%llu) and %s (from %llu) overlap",
                          gguf_path(f), a->name, (unsigned long long)a->offset,
                          (unsigned long long)(a->offset + a->nbytes), b->name,
                          (unsigned long long)b->offset);
    }
    free(by);
    return e;
}

/* Every weight view of the model: matrices and vectors (absent ones are
 * NULL) of n bytes, through one callback. */
typedef void (*visit_fn)(void *ctx, const void **data, size_t n);

static size_t mat_bytes(const kcpu_mat_t *w) { return (size_t)w->nrows * w->row_bytes; }

static void visit_weights(model_t *m, visit_fn fn, void *ctx)
{
    const arch_hparams_t *hp = &m->hp;
    model_weights_t *w = &m->w;
    fn(ctx, &w->token_embd.data, mat_bytes(&w->token_embd));
    fn(ctx, &w->output.data, mat_bytes(&w->output));
    fn(ctx, (const void **)&w->output_norm, (size_t)hp->n_embd * sizeof(float));
    for (int il = 0; il < hp->n_layer && w->layers; il++) {
        model_layer_t *l = &w->layers[il];
        kcpu_mat_t *mats[] = {&l->wq,       &l->wq_a,      &l->wq_b,     &l->wkv_a,
                              &l->wkv_b,    &l->wk,        &l->wv,       &l->wo,
                              &l->ffn_gate, &l->ffn_up,    &l->ffn_down, &l->gate_inp,
                              &l->gate_exps, &l->up_exps,  &l->down_exps, &l->gate_shexp,
                              &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++)
            fn(ctx, &mats[i]->data, mat_bytes(mats[i]));
        struct {
            const float **p;
            int n;
        } vecs[] = {{&l->attn_norm, hp->n_embd},     {&l->q_a_norm, hp->q_lora_rank},
                    {&l->kv_a_norm, hp->kv_lora_rank}, {&l->q_norm, hp->head_k},
                    {&l->k_norm, hp->head_k},         {&l->ffn_norm, hp->n_embd},
                    {&l->exp_probs_b, hp->n_expert}};
        for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++)
            fn(ctx, (const void **)vecs[i].p, (size_t)vecs[i].n * sizeof(float));
    }
}

typedef struct {
    const void **used;
    size_t n;
    size_t copy_bytes; /* misaligned tensors' bytes (an upper bound) */
    char *copy;        /* where they go (second pass) */
    const void *last_src, *last_dst; /* the tied output reuses the embedding's copy */
} walk_t;

static bool misaligned(const void *p) { return (uintptr_t)p % GGUF_DEFAULT_ALIGNMENT != 0; }

static void collect(void *ctx, const void **data, size_t n)
{
    walk_t *w = ctx;
    if (!*data)
        return;
    if (w->used)
        w->used[w->n] = *data;
    w->n++;
    if (misaligned(*data))
        w->copy_bytes += (n + 63) & ~(size_t)63;
}

static void realign(void *ctx, const void **data, size_t n)
{
    walk_t *w = ctx;
    if (!*data || !misaligned(*data))
        return;
    if (*data == w->last_src) {
        *data = w->last_dst;
        return;
    }
    memcpy(w->copy, *data, n);
    w->last_src = *data;
    *data = w->last_dst = w->copy;
    w->copy += (n + 63) & ~(size_t)63;
}

static int cmp_ptr(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Names the tensors no view points at, in m->warn. */
static void note_unused(model_t *m, const void **used, size_t n_used)
{
    const gguf_file_t *f = m->file;
    qsort(used, n_used, sizeof *used, cmp_ptr);
    char list[384] = "";
    size_t len = 0;
    int n_unused = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const void *key = t->data;
        if (bsearch(&key, used, n_used, sizeof *used, cmp_ptr))
            continue;
        if (n_unused++ < 8 && len < sizeof list)
            len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", n_unused > 1 ? ", " : "",
                                    t->name);
    }
    if (n_unused == 0)
        return;
    snprintf(m->warn, sizeof m->warn,
             "%s: %d tensor%s not used by %s with block_count %d (a damaged or mislabelled "
             "model?): %s%s",
             gguf_path(f), n_unused, n_unused > 1 ? "s are" : " is",
             m->hp.arch == ARCH_DEEPSEEK2 ? "deepseek2" : "qwen3moe", m->hp.n_layer, list,
             n_unused > 8 ? ", ..." : "");
}

ecs_err_t model_validate_tensors(model_t *m)
{
    MODEL_TRY(check_overlap(m->file));
    walk_t w = {0};
    visit_weights(m, collect, &w);
    w.used = malloc((w.n ? w.n : 1) * sizeof *w.used);
    if (!w.used)
        return ecs_error(ECS_ERR_NOMEM, "model: out of memory checking the tensors");
    w.n = 0;
    w.copy_bytes = 0;
    visit_weights(m, collect, &w);
    note_unused(m, w.used, w.n);
    free(w.used);
    if (w.copy_bytes == 0)
        return ECS_OK;
    m->align_copy = aligned_alloc(64, w.copy_bytes);
    if (!m->align_copy)
        return ecs_error(ECS_ERR_NOMEM, "%s: cannot allocate %zu bytes to align tensors that "
                         "general.alignment %u leaves misaligned", gguf_path(m->file),
                         w.copy_bytes, gguf_alignment(m->file));
    w.copy = m->align_copy;
    visit_weights(m, realign, &w);
    m->align_bytes = w.copy_bytes;
    return ECS_OK;
}

const char *model_load_warning(const model_t *m) { return m->warn[0] ? m->warn : NULL; }
