/* tier.c - the expert cache and tier policy: a key -> slot map over every
 * (layer, expert), an intrusive LRU list over the slots, per-slot pin marks
 * (the epoch of the last plan that used the slot), the cost model. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/tier/tier.h"

typedef struct {
    int32_t key;       /* layer * n_experts + expert, -1 when empty */
    int32_t prev, next; /* LRU list: head = least recently used */
    uint32_t pin;      /* epoch of the last plan / prefetch that used the slot */
    bool prefetched;   /* loaded by a prefetch and not used since */
} slot_t;

struct ktier {
    ktier_opts_t o;
    slot_t *slots;
    int32_t *map;    /* key -> slot or -1 */
    uint32_t *seen;  /* key -> epoch of the plan that last listed it (duplicate check) */
    int32_t head, tail;
    uint32_t epoch;
    ktier_stats_t st;
};

int ktier_slots(size_t budget, size_t fixed, size_t expert_bytes)
{
    if (expert_bytes == 0 || budget <= fixed)
        return 0;
    const size_t n = (budget - fixed) / expert_bytes;
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

bool ktier_stream_pays(const ktier_cost_t *c, int rows)
{
    const double cpu = c->cpu_us0 + c->cpu_us_row * rows;
    const double gpu = c->upload_us + c->gpu_us0 + c->gpu_us_row * rows;
    return gpu < cpu;
}

ecs_err_t ktier_cost_fit(int n, const int *rows, const double *us, double *us0, double *us_row)
{
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (int i = 0; i < n; i++) {
        if (rows[i] < 0 || !isfinite(us[i]))
            return ecs_error(ECS_ERR_INVAL, "tier: measurement %d (%d rows, %g us) is invalid", i,
                             rows[i], us[i]);
        sx += rows[i];
        sy += us[i];
        sxx += (double)rows[i] * rows[i];
        sxy += rows[i] * us[i];
    }
    const double den = n * sxx - sx * sx;
    if (n < 2 || den <= 0)
        return ecs_error(ECS_ERR_INVAL, "tier: a cost line needs two distinct row counts (%d "
                         "measurements)", n);
    *us_row = (n * sxy - sx * sy) / den;
    *us0 = (sy - *us_row * sx) / n;
    return ECS_OK;
}

static void lru_unlink(ktier_t *t, int s)
{
    slot_t *v = &t->slots[s];
    if (v->prev >= 0)
        t->slots[v->prev].next = v->next;
    else
        t->head = v->next;
    if (v->next >= 0)
        t->slots[v->next].prev = v->prev;
    else
        t->tail = v->prev;
    v->prev = v->next = -1;
}

static void lru_push_tail(ktier_t *t, int s)
{
    slot_t *v = &t->slots[s];
    v->prev = t->tail;
    v->next = -1;
    if (t->tail >= 0)
        t->slots[t->tail].next = s;
    else
        t->head = s;
    t->tail = s;
}

static void touch(ktier_t *t, int s)
{
    lru_unlink(t, s);
    lru_push_tail(t, s);
    t->slots[s].pin = t->epoch;
}

void ktier_evict(ktier_t *t, int s)
{
    if (s < 0 || s >= t->o.n_slots || t->slots[s].key < 0)
        return;
    t->map[t->slots[s].key] = -1;
    t->slots[s].key = -1;
    t->slots[s].prefetched = false;
    /* an empty slot is the first to reuse */
    lru_unlink(t, s);
    t->slots[s].next = t->head;
    if (t->head >= 0)
        t->slots[t->head].prev = s;
    else
        t->tail = s;
    t->head = s;
}

/* The least recently used slot the current epoch does not pin, now mapped
 * to key; -1 if every slot is pinned. */
static int take_victim(ktier_t *t, int32_t key)
{
    int s = t->head;
    while (s >= 0 && t->slots[s].pin == t->epoch)
        s = t->slots[s].next;
    if (s < 0)
        return -1;
    slot_t *v = &t->slots[s];
    if (v->key >= 0) {
        t->map[v->key] = -1;
        t->st.evicted++;
    }
    v->key = key;
    v->prefetched = false;
    t->map[key] = s;
    touch(t, s);
    return s;
}

ecs_err_t ktier_new(const ktier_opts_t *o, ktier_t **out)
{
    *out = NULL;
    if (!o || o->n_layers < 1 || o->n_experts < 1 || o->n_slots < 0 || o->max_prefetch < 0 ||
        (int64_t)o->n_layers * o->n_experts > INT32_MAX)
        return ecs_error(ECS_ERR_INVAL, "tier: bad options (%d layers x %d experts, %d slots)",
                         o ? o->n_layers : 0, o ? o->n_experts : 0, o ? o->n_slots : 0);
    const size_t keys = (size_t)o->n_layers * (size_t)o->n_experts;
    ktier_t *t = calloc(1, sizeof *t);
    if (!t)
        goto nomem;
    t->o = *o;
    if (t->o.max_prefetch == 0)
        t->o.max_prefetch = o->n_slots / 4 > 0 ? o->n_slots / 4 : 1;
    t->slots = calloc(o->n_slots > 0 ? (size_t)o->n_slots : 1, sizeof *t->slots);
    t->map = malloc(keys * sizeof *t->map);
    t->seen = calloc(keys, sizeof *t->seen);
    if (!t->slots || !t->map || !t->seen)
        goto nomem;
    memset(t->map, 0xff, keys * sizeof *t->map);
    t->head = t->tail = -1;
    t->epoch = 1; /* pin 0: never used */
    for (int s = 0; s < o->n_slots; s++) {
        t->slots[s].key = -1;
        lru_push_tail(t, s);
    }
    *out = t;
    return ECS_OK;
nomem:
    ktier_free(t);
    return ecs_error(ECS_ERR_NOMEM, "tier: no memory for %d slots and %zu keys",
                     o->n_slots, keys);
}

void ktier_free(ktier_t *t)
{
    if (!t)
        return;
    free(t->slots);
    free(t->map);
    free(t->seen);
    free(t);
}

void ktier_set_cost(ktier_t *t, const ktier_cost_t *c) { t->o.cost = *c; }

static ecs_err_t check_key(const ktier_t *t, int layer, int expert)
{
    if (layer < 0 || layer >= t->o.n_layers || expert < 0 || expert >= t->o.n_experts)
        return ecs_error(ECS_ERR_RANGE, "tier: expert (%d, %d) outside %d layers x %d experts",
                         layer, expert, t->o.n_layers, t->o.n_experts);
    return ECS_OK;
}

/* A new epoch: the previous call's compute is finished, its slots free to go. */
static void next_epoch(ktier_t *t)
{
    if (++t->epoch == 0) { /* wrapped: clear every mark so none looks current */
        for (int s = 0; s < t->o.n_slots; s++)
            t->slots[s].pin = 0;
        memset(t->seen, 0, (size_t)t->o.n_layers * t->o.n_experts * sizeof *t->seen);
        t->epoch = 1;
    }
}

ecs_err_t ktier_plan(ktier_t *t, int layer, int n, const int32_t *experts, const int32_t *rows,
                     ktier_place_t *out)
{
    if (n < 0 || (n > 0 && (!experts || !rows || !out)))
        return ecs_error(ECS_ERR_INVAL, "tier: bad plan call (%d experts)", n);
    next_epoch(t);
    const int32_t base = layer * t->o.n_experts;
    for (int i = 0; i < n; i++) {
        ecs_err_t e = check_key(t, layer, experts[i]);
        if (e != ECS_OK)
            return e;
        if (rows[i] < 1)
            return ecs_error(ECS_ERR_INVAL, "tier: expert %d has %d rows", experts[i], rows[i]);
        if (t->seen[base + experts[i]] == t->epoch)
            return ecs_error(ECS_ERR_INVAL, "tier: expert %d listed twice in one call",
                             experts[i]);
        t->seen[base + experts[i]] = t->epoch;
    }
    /* hits first, so that a miss can never evict an expert this call uses */
    for (int i = 0; i < n; i++) {
        const int s = t->map[base + experts[i]];
        out[i].where = KTIER_CPU;
        out[i].slot = -1;
        if (s >= 0) {
            out[i].where = KTIER_HIT;
            out[i].slot = s;
            if (t->slots[s].prefetched) {
                t->st.prefetch_used++;
                t->slots[s].prefetched = false;
            }
            touch(t, s);
        }
    }
    for (int i = 0; i < n; i++) {
        if (out[i].where == KTIER_HIT) {
            t->st.hits++;
            continue;
        }
        t->st.misses++;
        if (t->o.n_slots > 0 && ktier_stream_pays(&t->o.cost, rows[i])) {
            const int s = take_victim(t, base + experts[i]);
            if (s >= 0) {
                out[i].where = KTIER_STREAM;
                out[i].slot = s;
                t->st.streamed++;
                continue;
            }
        }
        t->st.cpu++;
    }
    t->st.calls++;
    t->st.uses += (uint64_t)n;
    return ECS_OK;
}

int ktier_prefetch(ktier_t *t, int layer, int n, const int32_t *experts, ktier_load_t *loads)
{
    if (n < 0 || (n > 0 && (!experts || !loads))) {
        ecs_error(ECS_ERR_INVAL, "tier: bad prefetch call (%d experts)", n);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (check_key(t, layer, experts[i]) != ECS_OK)
            return -1;
    int nl = 0;
    for (int i = 0; i < n; i++) {
        const int32_t key = layer * t->o.n_experts + experts[i];
        if (t->map[key] >= 0) {
            touch(t, t->map[key]);
            continue;
        }
        if (nl >= t->o.max_prefetch)
            continue;
        const int s = take_victim(t, key);
        if (s < 0)
            break;
        t->slots[s].prefetched = true;
        loads[nl++] = (ktier_load_t){s, layer, experts[i]};
        t->st.prefetched++;
    }
    return nl;
}

int ktier_slot_of(const ktier_t *t, int layer, int expert)
{
    if (check_key(t, layer, expert) != ECS_OK)
        return -1;
    return t->map[layer * t->o.n_experts + expert];
}

int ktier_n_slots(const ktier_t *t) { return t->o.n_slots; }

void ktier_stats(const ktier_t *t, ktier_stats_t *s)
{
    *s = t->st;
    s->hit_rate = s->uses ? (double)s->hits / (double)s->uses : 0.0;
}
