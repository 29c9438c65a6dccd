/* exec.c - a layer call carried out over the tiers: the policy places each
 * expert, misses worth streaming are uploaded into their VRAM slot on the
 * upload stream, the compute stream waits for the uploads (kgpu_fence) and
 * runs one grouped FFN over every GPU expert, and the CPU experts run on
 * the host meanwhile. A slot holds gate, up and down back to back. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/tier/tier.h"

struct ktier_exec {
    kgpu_t *g;
    ktier_t *t;
    ktier_exec_opts_t o;
    uint8_t *slots;       /* device: n_slots * slot_bytes */
    float *x_dev, *h_dev, *y_dev;
    float *x_pin, *y_pin; /* pinned staging, max_rows rows of n_embd */
    float *h_cpu;         /* the CPU tier's SwiGLU rows */
    kgpu_seg_t *seg_gpu, *seg_cpu;
    ktier_place_t *places;
    ktier_load_t *loads;
};

void ktier_exec_free(ktier_exec_t *ex)
{
    if (!ex)
        return;
    kgpu_free(ex->g, ex->slots);
    kgpu_free(ex->g, ex->x_dev);
    kgpu_free(ex->g, ex->h_dev);
    kgpu_free(ex->g, ex->y_dev);
    kgpu_host_free(ex->g, ex->x_pin);
    kgpu_host_free(ex->g, ex->y_pin);
    free(ex->h_cpu);
    free(ex->seg_gpu);
    free(ex->seg_cpu);
    free(ex->places);
    free(ex->loads);
    free(ex);
}

size_t ktier_exec_fixed_bytes(const ktier_exec_opts_t *o)
{
    const size_t R = (size_t)o->max_rows;
    return R * (2 * (size_t)o->n_embd + (size_t)o->n_ff) * sizeof(float);
}

ecs_err_t ktier_exec_new(kgpu_t *g, ktier_t *policy, const ktier_exec_opts_t *o,
                         ktier_exec_t **out)
{
    *out = NULL;
    if (!g || !policy || !o || !o->expert || o->n_embd < 1 || o->n_ff < 1 || o->max_rows < 1 ||
        o->max_experts < 1 || o->slot_bytes == 0)
        return ecs_error(ECS_ERR_INVAL, "tier exec: bad options");
    if (kgpu_max_segs(g) < o->max_experts)
        return ecs_error(ECS_ERR_INVAL, "tier exec: %d experts per call, the device takes %d "
                         "segments", o->max_experts, kgpu_max_segs(g));
    ktier_exec_t *ex = calloc(1, sizeof *ex);
    if (!ex)
        return ecs_error(ECS_ERR_NOMEM, "tier exec: no memory");
    ex->g = g;
    ex->t = policy;
    ex->o = *o;
    const size_t R = (size_t)o->max_rows, E = (size_t)o->n_embd, F = (size_t)o->n_ff;
    const size_t X = (size_t)o->max_experts, S = (size_t)ktier_n_slots(policy);
    ecs_err_t e;
    if ((S > 0 && (e = kgpu_alloc(g, S * o->slot_bytes, (void **)&ex->slots)) != ECS_OK) ||
        (e = kgpu_alloc(g, R * E * sizeof(float), (void **)&ex->x_dev)) != ECS_OK ||
        (e = kgpu_alloc(g, R * F * sizeof(float), (void **)&ex->h_dev)) != ECS_OK ||
        (e = kgpu_alloc(g, R * E * sizeof(float), (void **)&ex->y_dev)) != ECS_OK ||
        (e = kgpu_host_alloc(g, R * E * sizeof(float), (void **)&ex->x_pin)) != ECS_OK ||
        (e = kgpu_host_alloc(g, R * E * sizeof(float), (void **)&ex->y_pin)) != ECS_OK)
        goto fail;
    ex->h_cpu = malloc(R * F * sizeof(float));
    ex->seg_gpu = malloc(X * sizeof *ex->seg_gpu);
    ex->seg_cpu = malloc(X * sizeof *ex->seg_cpu);
    ex->places = malloc(X * sizeof *ex->places);
    ex->loads = malloc(X * sizeof *ex->loads);
    if (!ex->h_cpu || !ex->seg_gpu || !ex->seg_cpu || !ex->places || !ex->loads) {
        e = ecs_error(ECS_ERR_NOMEM, "tier exec: no host memory for %zu rows", R);
        goto fail;
    }
    *out = ex;
    return ECS_OK;
fail:
    ktier_exec_free(ex);
    return e;
}

/* Bytes of gate, up and down of one expert. */
static void mat_bytes(const ktier_exec_t *ex, const ktier_expert_t *w, size_t b[3])
{
    const int E = ex->o.n_embd, F = ex->o.n_ff;
    b[0] = ecs_row_size(w->gate_type, E) * (size_t)F;
    b[1] = ecs_row_size(w->up_type, E) * (size_t)F;
    b[2] = ecs_row_size(w->down_type, F) * (size_t)E;
}

static ecs_err_t get_expert(ktier_exec_t *ex, int layer, int expert, ktier_expert_t *w)
{
    ecs_err_t e = ex->o.expert(ex->o.ctx, layer, expert, w);
    if (e != ECS_OK)
        return e;
    size_t b[3];
    mat_bytes(ex, w, b);
    if (!b[0] || !b[1] || !b[2] || b[0] + b[1] + b[2] > ex->o.slot_bytes)
        return ecs_error(ECS_ERR_RANGE, "tier exec: expert (%d, %d) needs %zu bytes, slots "
                         "have %zu", layer, expert, b[0] + b[1] + b[2], ex->o.slot_bytes);
    return ECS_OK;
}

/* The device copy of an expert in slot s. */
static kgpu_seg_t slot_seg(const ktier_exec_t *ex, const ktier_expert_t *w, int s)
{
    size_t b[3];
    mat_bytes(ex, w, b);
    const uint8_t *p = ex->slots + (size_t)s * ex->o.slot_bytes;
    return (kgpu_seg_t){p, p + b[0], p + b[0] + b[1], 0, 0};
}

static ecs_err_t upload(ktier_exec_t *ex, const ktier_expert_t *w, int s)
{
    size_t b[3];
    mat_bytes(ex, w, b);
    const kgpu_seg_t d = slot_seg(ex, w, s);
    ecs_err_t e;
    if ((e = kgpu_copy(ex->g, (void *)d.gate, w->gate, b[0], KGPU_H2D, KGPU_UPLOAD)) ||
        (e = kgpu_copy(ex->g, (void *)d.up, w->up, b[1], KGPU_H2D, KGPU_UPLOAD)) ||
        (e = kgpu_copy(ex->g, (void *)d.down, w->down, b[2], KGPU_H2D, KGPU_UPLOAD)))
        ktier_evict(ex->t, s); /* half written: it holds nothing */
    return e;
}

static ecs_err_t cpu_ffn(ktier_exec_t *ex, const kgpu_ffn_t *f)
{
    return ex->o.cpu_ffn ? ex->o.cpu_ffn(ex->o.ctx, f) : kgpu_ffn_ref(f);
}

ecs_err_t ktier_exec_call(ktier_exec_t *ex, int layer, int n, const int32_t *experts,
                          const int32_t *row0, const int32_t *n_rows, int n_rows_total,
                          const float *x, float *y)
{
    if (n < 1 || n > ex->o.max_experts || n_rows_total < 1 || n_rows_total > ex->o.max_rows)
        return ecs_error(ECS_ERR_RANGE, "tier exec: %d experts, %d rows (at most %d, %d)", n,
                         n_rows_total, ex->o.max_experts, ex->o.max_rows);
    for (int i = 0; i < n; i++)
        if (row0[i] < 0 || n_rows[i] < 1 || row0[i] > n_rows_total - n_rows[i])
            return ecs_error(ECS_ERR_RANGE, "tier exec: expert %d rows [%d, +%d) outside %d",
                             experts[i], row0[i], n_rows[i], n_rows_total);
    ecs_err_t e = ktier_plan(ex->t, layer, n, experts, n_rows, ex->places);
    if (e != ECS_OK)
        return e;
    const int E = ex->o.n_embd, F = ex->o.n_ff;
    ktier_expert_t w0 = {0}, w;
    int ng = 0, nc = 0;
    for (int i = 0; i < n; i++) {
        const ktier_place_t *p = &ex->places[i];
        if ((e = get_expert(ex, layer, experts[i], &w)) != ECS_OK)
            goto fail;
        if (i == 0)
            w0 = w;
        else if (w.gate_type != w0.gate_type || w.up_type != w0.up_type ||
                 w.down_type != w0.down_type) {
            e = ecs_error(ECS_ERR_TYPE, "tier exec: layer %d mixes weight types", layer);
            goto fail;
        }
        if (p->where == KTIER_STREAM && (e = upload(ex, &w, p->slot)) != ECS_OK)
            goto fail;
        kgpu_seg_t s = p->where == KTIER_CPU ? (kgpu_seg_t){w.gate, w.up, w.down, 0, 0}
                                             : slot_seg(ex, &w, p->slot);
        s.row0 = row0[i];
        s.n_rows = n_rows[i];
        if (p->where == KTIER_CPU)
            ex->seg_cpu[nc++] = s;
        else
            ex->seg_gpu[ng++] = s;
    }
    kgpu_ffn_t f = {w0.gate_type, w0.up_type, w0.down_type, E, F, ex->seg_gpu, ng,
                    n_rows_total, ex->x_dev, ex->h_dev, ex->y_dev};
    const size_t xb = (size_t)n_rows_total * E * sizeof(float);
    if (ng > 0) {
        memcpy(ex->x_pin, x, xb);
        if ((e = kgpu_copy(ex->g, ex->x_dev, ex->x_pin, xb, KGPU_H2D, KGPU_COMPUTE)) ||
            (e = kgpu_fence(ex->g)) || (e = kgpu_ffn(ex->g, &f)) ||
            (e = kgpu_copy(ex->g, ex->y_pin, ex->y_dev, xb, KGPU_D2H, KGPU_COMPUTE)))
            goto fail;
    }
    if (nc > 0) { /* overlaps the GPU's work */
        const kgpu_ffn_t c = {w0.gate_type, w0.up_type, w0.down_type, E, F, ex->seg_cpu, nc,
                              n_rows_total, x, ex->h_cpu, y};
        if ((e = cpu_ffn(ex, &c)) != ECS_OK)
            goto fail;
    }
    if (ng > 0) {
        if ((e = kgpu_sync(ex->g, KGPU_COMPUTE)) != ECS_OK)
            goto fail;
        for (int i = 0; i < ng; i++) {
            const size_t off = (size_t)ex->seg_gpu[i].row0 * E;
            memcpy(y + off, ex->y_pin + off, (size_t)ex->seg_gpu[i].n_rows * E * sizeof(float));
        }
    }
    return ECS_OK;
fail:
    /* the device may have stopped anywhere: what this call streamed is not trusted */
    kgpu_sync(ex->g, KGPU_UPLOAD);
    kgpu_sync(ex->g, KGPU_COMPUTE);
    for (int i = 0; i < n; i++)
        if (ex->places[i].where == KTIER_STREAM)
            ktier_evict(ex->t, ex->places[i].slot);
    return e;
}

ecs_err_t ktier_exec_prefetch(ktier_exec_t *ex, int layer, int n, const int32_t *experts)
{
    if (n < 0 || n > ex->o.max_experts)
        return ecs_error(ECS_ERR_RANGE, "tier exec: prefetch of %d experts (at most %d)", n,
                         ex->o.max_experts);
    const int nl = ktier_prefetch(ex->t, layer, n, experts, ex->loads);
    if (nl < 0)
        return ECS_ERR_RANGE;
    ecs_err_t e = ECS_OK;
    for (int i = 0; i < nl; i++) {
        ktier_expert_t w;
        if (e == ECS_OK && (e = get_expert(ex, layer, ex->loads[i].expert, &w)) == ECS_OK)
            e = upload(ex, &w, ex->loads[i].slot);
        if (e != ECS_OK)
            ktier_evict(ex->t, ex->loads[i].slot);
    }
    return e;
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

#define CAL_RUNS 3

ecs_err_t ktier_exec_calibrate(ktier_exec_t *ex, int layer, int expert, ktier_cost_t *c)
{
    if (ktier_n_slots(ex->t) < 1)
        return ecs_error(ECS_ERR_INVAL, "tier exec: calibration needs one VRAM slot");
    ktier_expert_t w;
    ecs_err_t e = get_expert(ex, layer, expert, &w);
    if (e != ECS_OK)
        return e;
    const int E = ex->o.n_embd, F = ex->o.n_ff;
    int counts[3] = {1, 8, 64}, nm = 0;
    double up = 1e300, gpu[3], cpu[3];
    ktier_evict(ex->t, 0);
    for (int r = 0; r < CAL_RUNS; r++) {
        const double t0 = now_us();
        if ((e = upload(ex, &w, 0)) || (e = kgpu_sync(ex->g, KGPU_UPLOAD)))
            goto out;
        const double dt = now_us() - t0;
        up = dt < up ? dt : up;
    }
    for (size_t i = 0; i < (size_t)ex->o.max_rows * E; i++)
        ex->x_pin[i] = (float)((int)(i * 7919 % 2001) - 1000) * 1e-3f;
    for (; nm < 3 && counts[nm] <= ex->o.max_rows; nm++) {
        kgpu_seg_t sg = slot_seg(ex, &w, 0), sc = {w.gate, w.up, w.down, 0, counts[nm]};
        sg.n_rows = counts[nm];
        kgpu_ffn_t fg = {w.gate_type, w.up_type, w.down_type, E, F, &sg, 1, counts[nm],
                         ex->x_dev, ex->h_dev, ex->y_dev};
        kgpu_ffn_t fc = {w.gate_type, w.up_type, w.down_type, E, F, &sc, 1, counts[nm],
                         ex->x_pin, ex->h_cpu, ex->y_pin};
        if ((e = kgpu_copy(ex->g, ex->x_dev, ex->x_pin, (size_t)counts[nm] * E * sizeof(float),
                           KGPU_H2D, KGPU_COMPUTE)) ||
            (e = kgpu_sync(ex->g, KGPU_COMPUTE)))
            goto out;
        gpu[nm] = cpu[nm] = 1e300;
        for (int r = 0; r < CAL_RUNS; r++) {
            double t0 = now_us();
            if ((e = kgpu_ffn(ex->g, &fg)) || (e = kgpu_sync(ex->g, KGPU_COMPUTE)))
                goto out;
            const double tg = now_us() - t0;
            t0 = now_us();
            if ((e = cpu_ffn(ex, &fc)) != ECS_OK)
                goto out;
            const double tc = now_us() - t0;
            gpu[nm] = tg < gpu[nm] ? tg : gpu[nm];
            cpu[nm] = tc < cpu[nm] ? tc : cpu[nm];
        }
    }
    if ((e = ktier_cost_fit(nm, counts, gpu, &c->gpu_us0, &c->gpu_us_row)) ||
        (e = ktier_cost_fit(nm, counts, cpu, &c->cpu_us0, &c->cpu_us_row)))
        goto out;
    c->upload_us = up;
    ktier_set_cost(ex->t, c);
out:
    ktier_evict(ex->t, 0);
    return e;
}
