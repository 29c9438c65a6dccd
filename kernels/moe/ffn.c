/* ffn.c - a layer's shared experts (one dense SwiGLU FFN on every row) as
 * jobs beside the routed experts' in the caller's two regions: what a
 * worker computes when a call asks for them (ExpertCall.shared). The
 * products are the model's: each matrix's rows quantized once for its
 * vec_dot type, gate and up fused in one job that quantizes the hidden
 * row for down where its chunks can; a row's bits depend neither on the
 * other rows nor on the threads (kcpu), so they equal the coordinator's. */
#include <stdlib.h>
#include <string.h>

#include "kernels/moe/moe.h"

struct kmoe_ffn {
    int n_embd, n_ff, max_rows;
    const kmoe_expert_t *e;    /* this call's matrices */
    int n;                     /* this call's rows */
    float *out;
    float *y, *y2;             /* [max_rows * n_ff] hidden rows, up's scratch */
    void *act, *act_up, *hq;   /* quantized rows for gate, up (another type), down */
    kcpu_job_t gu;             /* this call's gate/up job (hq NULL: down quantizes y) */
    ecs_threadpool_t *tp;
};

/* The widest activation row of ncols values: f32's (every vec_dot type
 * packs them in at most 4 bytes each). */
static size_t widest_act(int64_t ncols) { return (size_t)ncols * sizeof(float); }

ecs_err_t kmoe_ffn_new(int n_embd, int n_ff, int max_rows, ecs_threadpool_t *tp,
                       kmoe_ffn_t **out)
{
    *out = NULL;
    if (n_embd < 1 || n_ff < 1 || max_rows < 1 || max_rows > KCPU_MAX_BATCH)
        return ecs_error(ECS_ERR_INVAL, "kmoe: shared experts of %d x %d for %d rows", n_embd,
                         n_ff, max_rows);
    kmoe_ffn_t *f = calloc(1, sizeof *f);
    if (!f)
        return ecs_error(ECS_ERR_NOMEM, "kmoe: out of memory for the shared experts");
    f->n_embd = n_embd;
    f->n_ff = n_ff;
    f->max_rows = max_rows;
    f->tp = tp;
    const size_t hid = (size_t)max_rows * (size_t)n_ff;
    f->y = malloc(hid * sizeof *f->y);
    f->y2 = malloc(hid * sizeof *f->y2);
    f->act = malloc(widest_act(n_embd) * (size_t)max_rows);
    f->act_up = malloc(widest_act(n_embd) * (size_t)max_rows);
    f->hq = malloc(widest_act(n_ff) * (size_t)max_rows);
    if (!f->y || !f->y2 || !f->act || !f->act_up || !f->hq) {
        kmoe_ffn_free(f);
        return ecs_error(ECS_ERR_NOMEM, "kmoe: out of memory for the shared experts' scratch");
    }
    *out = f;
    return ECS_OK;
}

void kmoe_ffn_free(kmoe_ffn_t *f)
{
    if (!f)
        return;
    free(f->y);
    free(f->y2);
    free(f->act);
    free(f->act_up);
    free(f->hq);
    free(f);
}

static ecs_type_t vdt(const kcpu_mat_t *w) { return ecs_type_traits(w->type)->vec_dot_type; }

/* w's activation rows: xq when it already holds them (quantized for
 * xq_type's vec_dot type), else x quantized into buf (NULL: no f32 rows). */
static const void *rows_for(kmoe_ffn_t *f, const kcpu_mat_t *w, const float *x, const void *xq,
                            ecs_type_t xq_type, void *buf)
{
    if (xq && xq_type == vdt(w))
        return xq;
    if (!x)
        return NULL;
    if (vdt(w) == ECS_TYPE_F32)
        return x;
    kcpu_quantize_rows(f->n >= 8 ? f->tp : NULL, w->type, x, f->n_embd, f->n, f->n_embd, buf);
    return buf;
}

ecs_err_t kmoe_ffn_prepare(kmoe_ffn_t *f, const kmoe_expert_t *e, int n, const float *x,
                           const void *xq, ecs_type_t xq_type, float *out)
{
    if (!e->gate.nrows || e->gate.nrows != f->n_ff || e->gate.ncols != f->n_embd ||
        e->up.nrows != f->n_ff || e->down.ncols != f->n_ff || e->down.nrows != f->n_embd)
        return ecs_error(ECS_ERR_INVAL, "kmoe: shared experts' matrices are not %d x %d",
                         f->n_embd, f->n_ff);
    if (n < 1 || n > f->max_rows)
        return ecs_error(ECS_ERR_RANGE, "kmoe: %d rows for the shared experts (1..%d)", n,
                         f->max_rows);
    f->e = e;
    f->n = n;
    f->out = out;
    const void *a = rows_for(f, &e->gate, x, xq, xq_type, f->act);
    const void *au = vdt(&e->up) == vdt(&e->gate) ? a
                                                   : rows_for(f, &e->up, x, xq, xq_type, f->act_up);
    if (!a || !au)
        return ecs_error(ECS_ERR_UNSUPPORTED, "kmoe: shared experts take %s / %s rows, the call "
                         "has %s", ecs_type_name(vdt(&e->gate)), ecs_type_name(vdt(&e->up)),
                         ecs_type_name(xq_type));
    f->gu = kcpu_job_swiglu(&e->gate, &e->up, &e->down, a, au, n, f->y, f->y2, f->n_ff, f->hq);
    return ECS_OK;
}

void kmoe_ffn_gate_up(kmoe_ffn_t *f, kcpu_jobs_t *j) { j->jobs[j->n++] = f->gu; }

void kmoe_ffn_down(kmoe_ffn_t *f, kcpu_jobs_t *j)
{
    const void *h = f->gu.hq;
    if (!h) {
        if (vdt(&f->e->down) == ECS_TYPE_F32) {
            h = f->y;
        } else {
            kcpu_quantize_rows(f->n >= 8 ? f->tp : NULL, f->e->down.type, f->y, f->n_ff, f->n,
                               f->n_ff, f->hq);
            h = f->hq;
        }
    }
    j->jobs[j->n++] = kcpu_job_mm(&f->e->down, h, f->n, f->out, f->n_embd);
}
