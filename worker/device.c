/* device.c - a worker's experts on a GPU (--device cuda:N): the tiers of
 * kernels/tier carry each call out. Experts that fit the VRAM budget are
 * uploaded at assignment and stay resident; a call's other experts are
 * streamed into a slot or computed on the host, whichever the cost model
 * measured at assignment says is faster for their row count.
 *
 * The host tier is kernels/moe on the worker's pool (the CPU worker's code,
 * so an expert computed there has the CPU worker's bits); the device tier
 * computes from f32 activations and dequantized weights, so its rows agree
 * with the CPU worker's within quantization noise, not bit for bit.
 *
 * Everything (slots, activation buffers, gather buffers) is allocated when
 * an assignment is loaded and checked against the VRAM budget then; a call
 * allocates nothing. "--device emu" runs the same path on kgpu's host
 * emulation, so make test covers the tiering without a GPU. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/worker_int.h"

struct shard_dev {
    kgpu_t *g;
    char name[96];
    uint64_t budget;          /* VRAM bytes for experts and buffers */
    ktier_t *pol;
    ktier_exec_t *ex;
    shard_t *s;               /* the shard being served (for the callbacks) */
    size_t max_entries;
    float *x;                 /* gathered rows: [max_entries][n_embd] */
    int32_t *experts, *row0, *count, *pf;
    const wire_call_t *call;  /* the call in hand, for the host tier's rows */
    int layer;
    uint64_t dev_bytes;       /* what the current tiers hold on the device */
    int n_slots, n_resident;
};

ecs_err_t shard_dev_open(const char *device, uint64_t vram_budget, int n_expert,
                         shard_dev_t **out)
{
    *out = NULL;
    kgpu_opts_t o = {.max_segs = n_expert < 1 ? 1 : n_expert};
    char *end = NULL;
    if (!strcmp(device, "emu")) {
        o.emulate = true;
    } else if (!strncmp(device, "cuda:", 5)) {
        long n = strtol(device + 5, &end, 10);
        if (end == device + 5 || *end || n < 0 || n > 1023)
            return ecs_error(ECS_ERR_INVAL, "worker: --device %s: want cuda:N", device);
        o.device = (int)n;
    } else {
        return ecs_error(ECS_ERR_INVAL, "worker: --device %s: want cpu, cuda:N or emu", device);
    }
    shard_dev_t *d = calloc(1, sizeof *d);
    if (!d)
        return ecs_error(ECS_ERR_NOMEM, "worker: out of memory");
    ecs_err_t rc = kgpu_open(&o, &d->g);
    if (rc != ECS_OK) {
        free(d);
        return ecs_error(rc, "worker: --device %s: %s; run it with --device cpu", device,
                         ecs_errmsg());
    }
    /* without a budget: nine tenths of what is free now, the rest left to
     * the CUDA context and the kernels' own needs */
    const size_t free_now = kgpu_mem_free(d->g);
    d->budget = vram_budget ? vram_budget : free_now / 10 * 9;
    if (vram_budget && vram_budget > free_now) {
        kgpu_close(d->g);
        free(d);
        return ecs_error(ECS_ERR_NOMEM, "worker: --vram-budget %.1f MiB, but %s has %.1f MiB free",
                         vram_budget / 1048576.0, device, free_now / 1048576.0);
    }
    snprintf(d->name, sizeof d->name, "%s", kgpu_name(d->g));
    *out = d;
    return ECS_OK;
}

const char *shard_dev_name(const shard_dev_t *d) { return d->name; }
uint64_t shard_dev_budget(const shard_dev_t *d) { return d->budget; }

static void free_tiers(shard_dev_t *d)
{
    ktier_exec_free(d->ex);
    ktier_free(d->pol);
    free(d->x);
    free(d->experts);
    free(d->row0);
    free(d->count);
    free(d->pf);
    d->ex = NULL;
    d->pol = NULL;
    d->x = NULL;
    d->experts = d->row0 = d->count = d->pf = NULL;
    d->dev_bytes = 0;
    d->n_slots = d->n_resident = 0;
}

void shard_dev_close(shard_dev_t *d)
{
    if (!d)
        return;
    free_tiers(d);
    kgpu_close(d->g);
    free(d);
}

static ecs_err_t expert_cb(void *ctx, int layer, int expert, ktier_expert_t *out)
{
    const shard_dev_t *d = ctx;
    const shard_t *s = d->s;
    if (layer < 0 || layer >= s->hp.n_layer || expert < 0 || expert >= s->hp.n_expert ||
        !s->layers[layer] || !s->layers[layer][expert].gate.nrows)
        return ecs_error(ECS_ERR_RANGE, "worker: expert (%d, %d) is not held", layer, expert);
    const kmoe_expert_t *e = &s->layers[layer][expert];
    *out = (ktier_expert_t){e->gate.type, e->up.type, e->down.type, e->gate.data, e->up.data,
                            e->down.data};
    return ECS_OK;
}

/* The host tier: kernels/moe on the segments' experts. During a call the
 * rows are the call's own (the CPU worker's bits); during calibration they
 * are f's rows. */
static ecs_err_t cpu_cb(void *ctx, const kgpu_ffn_t *f)
{
    shard_dev_t *d = ctx;
    shard_t *s = d->s;
    const int l = d->layer, E = s->hp.n_embd;
    const kmoe_expert_t *held = s->layers[l];
    int np = 0;
    for (int i = 0; i < f->n_segs; i++) {
        const kgpu_seg_t *g = &f->segs[i];
        int e = 0;
        while (e < s->hp.n_expert && held[e].gate.data != g->gate)
            e++;
        if (e == s->hp.n_expert)
            return ecs_error(ECS_ERR_INTERNAL, "worker: a host segment of no held expert");
        for (int r = 0; r < g->n_rows; r++, np++) {
            const int entry = g->row0 + r;
            s->expert[np] = e;
            s->row[np] = d->call ? (int32_t)d->call->row_index[entry] : entry;
        }
    }
    const int n_rows = d->call ? (int)d->call->n_rows : f->n_rows;
    const float *x = d->call ? d->call->payload : f->x;
    ecs_err_t rc = kmoe_prepare(s->moe, l, n_rows, x, np, s->row, s->expert);
    if (rc != ECS_OK)
        return rc;
    kmoe_compute(s->moe);
    const float *outs = kmoe_outs(s->moe);
    const int32_t *where = kmoe_where(s->moe);
    np = 0;
    for (int i = 0; i < f->n_segs; i++)
        for (int r = 0; r < f->segs[i].n_rows; r++, np++)
            memcpy(f->y + (size_t)(f->segs[i].row0 + r) * E, outs + (size_t)where[np] * E,
                   (size_t)E * sizeof(float));
    return ECS_OK;
}

ecs_err_t shard_dev_assign(shard_dev_t *d, shard_t *s, char *info, size_t info_n)
{
    free_tiers(d);
    d->s = s;
    const arch_hparams_t *hp = &s->hp;
    size_t slot_bytes = 0;
    int cal_l = -1, cal_e = -1;
    for (int l = 0; l < hp->n_layer; l++)
        for (int e = 0; s->layers[l] && e < hp->n_expert; e++)
            if (s->layers[l][e].gate.nrows) {
                const size_t b = shard_expert_bytes(&s->layers[l][e]);
                slot_bytes = b > slot_bytes ? b : slot_bytes;
                if (cal_l < 0)
                    cal_l = l, cal_e = e;
            }
    if (!slot_bytes)
        return ECS_OK; /* nothing held: nothing on the device */
    d->max_entries = (size_t)KCPU_MAX_BATCH * (size_t)hp->n_expert_used;
    ktier_exec_opts_t eo = {.n_embd = hp->n_embd, .n_ff = hp->n_ff_exp,
                            .max_rows = (int)d->max_entries, .max_experts = hp->n_expert,
                            .slot_bytes = slot_bytes, .expert = expert_cb, .cpu_ffn = cpu_cb,
                            .ctx = d};
    const size_t fixed = ktier_exec_fixed_bytes(&eo);
    if (fixed > d->budget)
        return ecs_error(ECS_ERR_NOMEM,
                         "the VRAM budget of %.1f MiB is below the %.1f MiB of activation "
                         "buffers (--vram-budget)", d->budget / 1048576.0, fixed / 1048576.0);
    int slots = ktier_slots(d->budget, fixed, slot_bytes);
    if ((size_t)slots > s->n_held)
        slots = (int)s->n_held;
    ktier_opts_t to = {.n_layers = hp->n_layer, .n_experts = hp->n_expert, .n_slots = slots,
                       .max_prefetch = slots > 0 ? slots : 1};
    ecs_err_t rc;
    const size_t E = (size_t)hp->n_embd, X = (size_t)hp->n_expert;
    d->x = malloc(d->max_entries * E * sizeof(float));
    d->experts = malloc(X * sizeof(int32_t));
    d->row0 = malloc(X * sizeof(int32_t));
    d->count = malloc(X * sizeof(int32_t));
    d->pf = malloc(X * sizeof(int32_t));
    if (!d->x || !d->experts || !d->row0 || !d->count || !d->pf) {
        rc = ecs_error(ECS_ERR_NOMEM, "worker: no host memory for %zu gathered rows",
                       d->max_entries);
        goto fail;
    }
    if ((rc = ktier_new(&to, &d->pol)) != ECS_OK ||
        (rc = ktier_exec_new(d->g, d->pol, &eo, &d->ex)) != ECS_OK)
        goto fail;
    d->dev_bytes = fixed + (size_t)slots * slot_bytes;
    d->n_slots = slots;
    ktier_cost_t cost = {0};
    if (slots > 0) {
        d->layer = cal_l;
        d->call = NULL;
        if ((rc = ktier_exec_calibrate(d->ex, cal_l, cal_e, &cost)) != ECS_OK)
            goto fail;
    }
    /* the first experts in (layer, expert) order become resident: with no
     * history yet, any choice is as good, and calls then keep the hot ones */
    for (int l = 0; l < hp->n_layer && slots > 0; l++) {
        int n = 0;
        for (int e = 0; s->layers[l] && e < hp->n_expert; e++)
            if (s->layers[l][e].gate.nrows)
                d->pf[n++] = e;
        if (n && (rc = ktier_exec_prefetch(d->ex, l, n, d->pf)) != ECS_OK)
            goto fail;
    }
    if ((rc = kgpu_sync(d->g, KGPU_UPLOAD)) != ECS_OK)
        goto fail;
    for (int l = 0; l < hp->n_layer; l++)
        for (int e = 0; s->layers[l] && e < hp->n_expert; e++)
            d->n_resident += s->layers[l][e].gate.nrows && ktier_slot_of(d->pol, l, e) >= 0;
    snprintf(info, info_n,
             "%s: %d of %zu experts resident in %.1f MiB of VRAM (budget %.1f MiB: buffers "
             "%zu bytes, %zu per expert); the rest %s (cost: cpu %.0f+%.1f/row us, gpu "
             "%.0f+%.1f/row us, upload %.0f us)",
             d->name, d->n_resident, s->n_held, d->dev_bytes / 1048576.0, d->budget / 1048576.0,
             fixed, slot_bytes,
             slots ? "streamed or on the host" : "on the host", cost.cpu_us0, cost.cpu_us_row,
             cost.gpu_us0, cost.gpu_us_row, cost.upload_us);
    return ECS_OK;
fail:
    free_tiers(d);
    return rc;
}

void shard_dev_call(shard_dev_t *d, const wire_call_t *c, mux_reply_t *r)
{
    shard_t *s = d->s;
    const size_t E = (size_t)s->hp.n_embd, row = E * sizeof(float);
    const int l = (int)c->layer;
    size_t p = 0;
    for (size_t i = 0; i < c->n_experts; i++) {
        d->experts[i] = (int32_t)c->experts[i];
        d->row0[i] = (int32_t)p;
        d->count[i] = (int32_t)c->expert_counts[i];
        for (uint32_t j = 0; j < c->expert_counts[i]; j++, p++)
            memcpy(d->x + p * E, (const float *)c->payload + (size_t)c->row_index[p] * E, row);
    }
    d->call = c;
    d->layer = l;
    ecs_err_t rc = ktier_exec_call(d->ex, l, (int)c->n_experts, d->experts, d->row0, d->count,
                                   (int)p, d->x, r->rows);
    d->call = NULL;
    if (rc != ECS_OK) {
        r->status = WIRE_ST_INTERNAL;
        snprintf(r->message, sizeof r->message, "device: %s", ecs_errmsg());
        return;
    }
    /* the hint after the call: its plan pinned the slots it used, so the
     * uploads cannot evict them, and they run on the upload stream while
     * the reply travels and the coordinator gets to the next layer */
    if (c->n_prefetch && c->prefetch_layer < (uint32_t)s->hp.n_layer &&
        s->layers[c->prefetch_layer]) {
        int n = 0;
        for (size_t i = 0; i < c->n_prefetch; i++)
            if (c->prefetch[i] < (uint32_t)s->hp.n_expert &&
                s->layers[c->prefetch_layer][c->prefetch[i]].gate.nrows)
                d->pf[n++] = (int32_t)c->prefetch[i];
        if (n && ktier_exec_prefetch(d->ex, (int)c->prefetch_layer, n, d->pf) != ECS_OK)
            fprintf(stderr, "ecs-worker: prefetch ignored: %s\n", ecs_errmsg());
    }
}

void shard_dev_stats(const shard_dev_t *d, wire_stats_t *w)
{
    if (!d->pol)
        return;
    ktier_stats_t t;
    ktier_stats(d->pol, &t);
    w->tier_uses = t.uses;
    w->tier_hits = t.hits;
    w->tier_streamed = t.streamed;
    w->tier_cpu = t.cpu;
    w->tier_prefetched = t.prefetched;
    w->tier_prefetch_used = t.prefetch_used;
    w->tier_slots = (uint32_t)d->n_slots;
}

void shard_dev_usage(const shard_dev_t *d, uint64_t *dev_bytes, size_t *n_allocs)
{
    size_t dv; /* every allocation ever made: the current tiers' share is dev_bytes */
    kgpu_alloc_stats(d->g, n_allocs, &dv);
    (void)dv;
    *dev_bytes = d->dev_bytes;
}
