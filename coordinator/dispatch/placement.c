/* placement.c - which workers hold which (layer, expert).
 *
 * Made placements deal the (layer, expert, replica) slots to workers by
 * smooth weighted round robin (nginx's): each pick adds every worker's
 * weight to its credit and takes the worker with the most credit that does
 * not already hold the expert, then charges it the total weight. Shares
 * come out proportional to the weights within every layer (so each layer's
 * routed rows spread over all workers), and the credits carry from layer to
 * layer, so rounding never piles up on one worker: the seeds' 108/92/92/92
 * lesson is that capacity, not a count, must set the share.
 *
 * A placement file names the holders explicitly; see dispatch.h. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch.h"

struct placement {
    dispatch_shape_t shape;
    int n_workers;
    int replication;                  /* the least holders of any expert */
    uint8_t *n_holders;               /* [n_layer * n_expert] */
    int16_t *holders;                 /* [n_layer * n_expert][PLACEMENT_MAX_HOLDERS] */
    int *held;                        /* [n_workers] (layer, expert) pairs held */
    char (*ids)[PLACEMENT_ID_MAX];    /* [n_workers] */
    bool *mask;                       /* [n_layer + n_expert] scratch for files */
};

static size_t cell(const placement_t *p, int layer, int expert)
{
    return (size_t)layer * (size_t)p->shape.n_expert + (size_t)expert;
}

static ecs_err_t check_shape(const dispatch_shape_t *s)
{
    if (s->n_layer < 1 || s->n_layer > 4096 || s->n_expert < 1 || s->n_expert > 65536 ||
        s->first_moe < 0 || s->first_moe >= s->n_layer)
        return ecs_error(ECS_ERR_INVAL, "placement: bad model shape (%d layers from %d, %d experts)",
                         s->n_layer, s->first_moe, s->n_expert);
    return ECS_OK;
}

static ecs_err_t check_workers(const placement_worker_t *w, int n)
{
    if (n < 1 || n > PLACEMENT_MAX_WORKERS)
        return ecs_error(ECS_ERR_RANGE, "placement: %d workers (1 to %d)", n,
                         PLACEMENT_MAX_WORKERS);
    for (int i = 0; i < n; i++) {
        if (!w[i].id || !w[i].id[0] || strlen(w[i].id) >= PLACEMENT_ID_MAX)
            return ecs_error(ECS_ERR_INVAL, "placement: worker %d has no id or one over %d bytes",
                             i, PLACEMENT_ID_MAX - 1);
        if (!(w[i].weight > 0 && w[i].weight <= 1e6))
            return ecs_error(ECS_ERR_RANGE, "placement: worker %s has weight %g (0 to 1e6]",
                             w[i].id, w[i].weight);
        for (int j = 0; j < i; j++)
            if (!strcmp(w[i].id, w[j].id))
                return ecs_error(ECS_ERR_INVAL, "placement: worker id '%s' given twice", w[i].id);
    }
    return ECS_OK;
}

static ecs_err_t alloc_placement(const dispatch_shape_t *s, const placement_worker_t *w, int n,
                                 placement_t **out)
{
    *out = NULL;
    ecs_err_t rc = check_shape(s);
    if (rc == ECS_OK)
        rc = check_workers(w, n);
    if (rc != ECS_OK)
        return rc;
    const size_t cells = (size_t)s->n_layer * (size_t)s->n_expert;
    placement_t *p = calloc(1, sizeof *p);
    if (!p)
        goto fail;
    p->shape = *s;
    p->n_workers = n;
    p->n_holders = calloc(cells, 1);
    p->holders = calloc(cells * PLACEMENT_MAX_HOLDERS, sizeof *p->holders);
    p->held = calloc((size_t)n, sizeof *p->held);
    p->ids = calloc((size_t)n, sizeof *p->ids);
    p->mask = calloc((size_t)s->n_layer + (size_t)s->n_expert, 1);
    if (!p->n_holders || !p->holders || !p->held || !p->ids || !p->mask)
        goto fail;
    for (int i = 0; i < n; i++)
        snprintf(p->ids[i], PLACEMENT_ID_MAX, "%s", w[i].id);
    *out = p;
    return ECS_OK;
fail:
    placement_free(p);
    return ecs_error(ECS_ERR_NOMEM, "placement: out of memory for %zu cells", cells);
}

void placement_free(placement_t *p)
{
    if (!p)
        return;
    free(p->n_holders);
    free(p->holders);
    free(p->held);
    free(p->ids);
    free(p->mask);
    free(p);
}

static bool holds(const placement_t *p, size_t c, int wi)
{
    for (int h = 0; h < p->n_holders[c]; h++)
        if (p->holders[c * PLACEMENT_MAX_HOLDERS + (size_t)h] == wi)
            return true;
    return false;
}

static ecs_err_t add_holder(placement_t *p, int layer, int expert, int wi)
{
    const size_t c = cell(p, layer, expert);
    if (holds(p, c, wi))
        return ECS_OK;
    if (p->n_holders[c] >= PLACEMENT_MAX_HOLDERS)
        return ecs_error(ECS_ERR_RANGE, "placement: layer %d expert %d has more than %d holders",
                         layer, expert, PLACEMENT_MAX_HOLDERS);
    p->holders[c * PLACEMENT_MAX_HOLDERS + p->n_holders[c]++] = (int16_t)wi;
    p->held[wi]++;
    return ECS_OK;
}

/* The worker with the most credit not yet holding cell c (lowest index on
 * ties, so the deal is deterministic). */
static int pick(const placement_t *p, const double *credit, size_t c)
{
    int best = -1;
    for (int i = 0; i < p->n_workers; i++)
        if (!holds(p, c, i) && (best < 0 || credit[i] > credit[best]))
            best = i;
    return best;
}

ecs_err_t placement_make(const dispatch_shape_t *s, const placement_worker_t *w, int n_workers,
                         int replication, placement_t **out)
{
    *out = NULL;
    if (replication < 1 || replication > n_workers || replication > PLACEMENT_MAX_HOLDERS) {
        return ecs_error(ECS_ERR_RANGE,
                         "placement: replication %d needs 1 to min(%d workers, %d)", replication,
                         n_workers, PLACEMENT_MAX_HOLDERS);
    }
    placement_t *p;
    ecs_err_t rc = alloc_placement(s, w, n_workers, &p);
    if (rc != ECS_OK)
        return rc;
    double *credit = calloc((size_t)n_workers, sizeof *credit);
    if (!credit) {
        placement_free(p);
        return ecs_error(ECS_ERR_NOMEM, "placement: out of memory");
    }
    double total = 0;
    for (int i = 0; i < n_workers; i++)
        total += w[i].weight;
    for (int l = s->first_moe; l < s->n_layer; l++)
        for (int e = 0; e < s->n_expert; e++)
            for (int r = 0; r < replication; r++) {
                for (int i = 0; i < n_workers; i++)
                    credit[i] += w[i].weight;
                const int wi = pick(p, credit, cell(p, l, e));
                credit[wi] -= total;
                add_holder(p, l, e, wi); /* cannot fail: replication <= MAX_HOLDERS */
            }
    free(credit);
    p->replication = replication;
    *out = p;
    return ECS_OK;
}

ecs_err_t placement_auto_replication(const dispatch_shape_t *s, const placement_worker_t *w,
                                     int n_workers, bool spawned, const uint64_t *budget,
                                     const uint64_t *expert_bytes, int *out)
{
    *out = 1;
    int most = spawned ? n_workers : 1;
    if (most > PLACEMENT_MAX_HOLDERS)
        most = PLACEMENT_MAX_HOLDERS;
    /* the deal itself, not R/n of the bytes: the shares are rounded per
     * layer and the layers' experts may differ in size */
    for (int r = most; r > 1; r--) {
        placement_t *p;
        ecs_err_t rc = placement_make(s, w, n_workers, r, &p);
        if (rc != ECS_OK)
            return rc;
        bool fits = true;
        for (int wi = 0; fits && wi < n_workers; wi++) {
            uint64_t need = 0;
            for (int l = s->first_moe; l < s->n_layer; l++)
                for (int e = 0; e < s->n_expert; e++)
                    need += holds(p, cell(p, l, e), wi) ? expert_bytes[l] : 0;
            fits = !budget[wi] || need <= budget[wi];
        }
        placement_free(p);
        if (fits) {
            *out = r;
            break;
        }
    }
    return ECS_OK;
}

/* ---- placement files ---- */

/* Parses one item "a", "a-b" or "*" of a list (inclusive; limit exclusive). */
static bool parse_item(const char *t, int limit, int *lo, int *hi)
{
    if (!strcmp(t, "*")) {
        *lo = 0;
        *hi = limit - 1;
        return true;
    }
    char *end;
    errno = 0;
    long a = strtol(t, &end, 10), b = a;
    if (errno || end == t || a < 0 || !isdigit((unsigned char)t[0]))
        return false;
    if (*end == '-') {
        const char *t2 = end + 1;
        b = strtol(t2, &end, 10);
        if (errno || end == t2 || b < a)
            return false;
    }
    if (*end || b >= limit)
        return false;
    *lo = (int)a;
    *hi = (int)b;
    return true;
}

/* Parses a comma list of items into a mask of limit entries. */
static bool parse_list(char *t, int limit, bool *mask)
{
    memset(mask, 0, (size_t)limit);
    char *save = NULL;
    int n = 0;
    for (char *it = strtok_r(t, ",", &save); it; it = strtok_r(NULL, ",", &save), n++) {
        int lo, hi;
        if (!parse_item(it, limit, &lo, &hi))
            return false;
        for (int i = lo; i <= hi; i++)
            mask[i] = true;
    }
    return n > 0;
}

static int worker_index(const placement_t *p, const char *id)
{
    for (int i = 0; i < p->n_workers; i++)
        if (!strcmp(p->ids[i], id))
            return i;
    return -1;
}

/* One line "WORKER LAYERS EXPERTS", comments and blank lines skipped. */
static ecs_err_t parse_line(placement_t *p, char *line, const char *path, int lineno)
{
    char *hash = strchr(line, '#');
    if (hash)
        *hash = 0;
    char *save = NULL, *tok[4] = {0};
    int nt = 0;
    for (char *t = strtok_r(line, " \t\r\n", &save); t; t = strtok_r(NULL, " \t\r\n", &save))
        if (nt < 4)
            tok[nt++] = t;
        else
            nt++;
    if (nt == 0)
        return ECS_OK;
    if (nt != 3)
        return ecs_error(ECS_ERR_FORMAT, "%s:%d: want 'WORKER LAYERS EXPERTS', got %d fields",
                         path, lineno, nt);
    const int wi = worker_index(p, tok[0]);
    if (wi < 0)
        return ecs_error(ECS_ERR_NOTFOUND, "%s:%d: unknown worker '%s'", path, lineno, tok[0]);
    bool *lm = p->mask, *em = p->mask + p->shape.n_layer;
    if (!parse_list(tok[1], p->shape.n_layer, lm))
        return ecs_error(ECS_ERR_FORMAT, "%s:%d: bad layers '%s' (0 to %d: a, a-b, *, commas)",
                         path, lineno, tok[1], p->shape.n_layer - 1);
    if (!parse_list(tok[2], p->shape.n_expert, em))
        return ecs_error(ECS_ERR_FORMAT, "%s:%d: bad experts '%s' (0 to %d: a, a-b, *, commas)",
                         path, lineno, tok[2], p->shape.n_expert - 1);
    /* dense layers (below first_moe) have no routed experts: skipped */
    for (int l = p->shape.first_moe; l < p->shape.n_layer; l++)
        for (int e = 0; lm[l] && e < p->shape.n_expert; e++) {
            if (!em[e])
                continue;
            ecs_err_t rc = add_holder(p, l, e, wi);
            if (rc != ECS_OK)
                return ecs_error(rc, "%s:%d: %s", path, lineno, ecs_errmsg());
        }
    return ECS_OK;
}

ecs_err_t placement_read(const dispatch_shape_t *s, FILE *f, const char *name,
                         const placement_worker_t *w, int n_workers, placement_t **out)
{
    placement_t *p;
    ecs_err_t rc = alloc_placement(s, w, n_workers, &p);
    *out = NULL;
    if (rc != ECS_OK)
        return rc;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        if (len > PLACEMENT_LINE_MAX) {
            rc = ecs_error(ECS_ERR_FORMAT, "%s:%d: line longer than %d bytes", name, lineno,
                           PLACEMENT_LINE_MAX);
            goto fail;
        }
        if (strlen(line) != (size_t)len) {
            rc = ecs_error(ECS_ERR_FORMAT, "%s:%d: a NUL byte in the line", name, lineno);
            goto fail;
        }
        if ((rc = parse_line(p, line, name, lineno)) != ECS_OK)
            goto fail;
    }
    if (ferror(f)) {
        rc = ecs_error(ECS_ERR_IO, "placement: reading %s failed", name);
        goto fail;
    }
    free(line);
    line = NULL;
    if ((rc = placement_check(p)) != ECS_OK) {
        rc = ecs_error(rc, "%s: %s", name, ecs_errmsg());
        goto fail;
    }
    *out = p;
    return ECS_OK;
fail:
    free(line);
    placement_free(p);
    return rc;
}

ecs_err_t placement_load(const dispatch_shape_t *s, const char *path,
                         const placement_worker_t *w, int n_workers, placement_t **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return ecs_error(ECS_ERR_IO, "placement: cannot open %s: %s", path, strerror(errno));
    const ecs_err_t rc = placement_read(s, f, path, w, n_workers, out);
    fclose(f);
    return rc;
}

ecs_err_t placement_check(placement_t *p)
{
    int missing = 0, least = PLACEMENT_MAX_HOLDERS;
    char first[64] = "";
    for (int l = p->shape.first_moe; l < p->shape.n_layer; l++)
        for (int e = 0; e < p->shape.n_expert; e++) {
            const int n = p->n_holders[cell(p, l, e)];
            if (n < least)
                least = n;
            if (n == 0 && missing++ == 0)
                snprintf(first, sizeof first, "layer %d expert %d", l, e);
        }
    if (missing)
        return ecs_error(ECS_ERR_NOTFOUND, "%d (layer, expert) pairs have no holder, first %s",
                         missing, first);
    p->replication = least;
    return ECS_OK;
}

int placement_holders(const placement_t *p, int layer, int expert, const int16_t **workers)
{
    if (layer < 0 || layer >= p->shape.n_layer || expert < 0 || expert >= p->shape.n_expert) {
        *workers = NULL;
        return 0;
    }
    const size_t c = cell(p, layer, expert);
    *workers = p->holders + c * PLACEMENT_MAX_HOLDERS;
    return p->n_holders[c];
}

int placement_n_workers(const placement_t *p) { return p->n_workers; }

int placement_replication(const placement_t *p) { return p->replication; }

const char *placement_worker_id(const placement_t *p, int wi)
{
    return wi >= 0 && wi < p->n_workers ? p->ids[wi] : NULL;
}

int placement_held(const placement_t *p, int wi)
{
    return wi >= 0 && wi < p->n_workers ? p->held[wi] : 0;
}

int placement_worker_pairs(const placement_t *p, int wi, int32_t *pairs, int cap)
{
    int n = 0;
    for (int l = p->shape.first_moe; l < p->shape.n_layer; l++)
        for (int e = 0; e < p->shape.n_expert; e++)
            if (holds(p, cell(p, l, e), wi)) {
                if (n < cap) {
                    pairs[2 * n] = l;
                    pairs[2 * n + 1] = e;
                }
                n++;
            }
    return n;
}

/* w's experts of layer l as a comma list of runs ("0-3,9,12-15") into
 * buf; returns false when it holds none. */
static bool layer_list(const placement_t *p, int wi, int l, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = 0;
    for (int e = 0; e < p->shape.n_expert;) {
        if (!holds(p, cell(p, l, e), wi)) {
            e++;
            continue;
        }
        int e1 = e;
        while (e1 + 1 < p->shape.n_expert && holds(p, cell(p, l, e1 + 1), wi))
            e1++;
        int w = e1 > e ? snprintf(buf + n, cap - n, "%s%d-%d", n ? "," : "", e, e1)
                       : snprintf(buf + n, cap - n, "%s%d", n ? "," : "", e);
        if (w > 0 && (size_t)w < cap - n)
            n += (size_t)w;
        e = e1 + 1;
    }
    return n > 0;
}

/* One line per run of layers with the same expert list, so the output
 * is short and loads back as is. */
ecs_err_t placement_write(const placement_t *p, FILE *f)
{
    const size_t cap = (size_t)p->shape.n_expert * 12 + 16;
    char *a = malloc(cap), *b = malloc(cap);
    if (!a || !b) {
        free(a);
        free(b);
        return ecs_error(ECS_ERR_NOMEM, "placement: out of memory");
    }
    fprintf(f, "# ecs placement: WORKER LAYERS EXPERTS (lists of a, a-b or *); %d workers, "
               "replication %d\n", p->n_workers, p->replication);
    for (int wi = 0; wi < p->n_workers; wi++) {
        fprintf(f, "# %s holds %d (layer, expert) pairs\n", p->ids[wi], p->held[wi]);
        for (int l = p->shape.first_moe; l < p->shape.n_layer;) {
            if (!layer_list(p, wi, l, a, cap)) {
                l++;
                continue;
            }
            int l1 = l;
            while (l1 + 1 < p->shape.n_layer && layer_list(p, wi, l1 + 1, b, cap) &&
                   !strcmp(a, b))
                l1++;
            if (l1 > l)
                fprintf(f, "%s %d-%d %s\n", p->ids[wi], l, l1, a);
            else
                fprintf(f, "%s %d %s\n", p->ids[wi], l, a);
            l = l1 + 1;
        }
    }
    free(a);
    free(b);
    if (fflush(f) != 0 || ferror(f))
        return ecs_error(ECS_ERR_IO, "placement: write failed: %s", strerror(errno));
    return ECS_OK;
}

/* ---- changing a placement (drain, undrain): new placements, the old one untouched ---- */

ecs_err_t placement_clone(const placement_t *p, placement_t **out)
{
    placement_worker_t w[PLACEMENT_MAX_WORKERS];
    for (int i = 0; i < p->n_workers; i++)
        w[i] = (placement_worker_t){.id = p->ids[i], .weight = 1};
    ecs_err_t rc = alloc_placement(&p->shape, w, p->n_workers, out);
    if (rc != ECS_OK)
        return rc;
    const size_t cells = (size_t)p->shape.n_layer * (size_t)p->shape.n_expert;
    memcpy((*out)->n_holders, p->n_holders, cells);
    memcpy((*out)->holders, p->holders, cells * PLACEMENT_MAX_HOLDERS * sizeof *p->holders);
    memcpy((*out)->held, p->held, (size_t)p->n_workers * sizeof *p->held);
    (*out)->replication = p->replication;
    return ECS_OK;
}

static void remove_holder(placement_t *p, size_t c, int wi)
{
    int16_t *h = p->holders + c * PLACEMENT_MAX_HOLDERS;
    for (int i = 0; i < p->n_holders[c]; i++)
        if (h[i] == wi) {
            memmove(h + i, h + i + 1, (size_t)(p->n_holders[c] - i - 1) * sizeof *h);
            p->n_holders[c]--;
            p->held[wi]--;
            return;
        }
}

ecs_err_t placement_union(const placement_t *a, const placement_t *b, placement_t **out)
{
    if (a->n_workers != b->n_workers || a->shape.n_layer != b->shape.n_layer ||
        a->shape.n_expert != b->shape.n_expert)
        return ecs_error(ECS_ERR_INVAL, "placement: union of placements of other shapes");
    ecs_err_t rc = placement_clone(a, out);
    for (int l = b->shape.first_moe; rc == ECS_OK && l < b->shape.n_layer; l++)
        for (int e = 0; rc == ECS_OK && e < b->shape.n_expert; e++) {
            const size_t c = cell(b, l, e);
            for (int i = 0; rc == ECS_OK && i < b->n_holders[c]; i++)
                rc = add_holder(*out, l, e, b->holders[c * PLACEMENT_MAX_HOLDERS + (size_t)i]);
        }
    if (rc != ECS_OK) {
        placement_free(*out);
        *out = NULL;
    }
    return rc;
}

/* How many experts of layer l each worker holds, into cnt[n_workers]. */
static void layer_counts(const placement_t *p, int l, int *cnt)
{
    memset(cnt, 0, (size_t)p->n_workers * sizeof *cnt);
    for (int e = 0; e < p->shape.n_expert; e++) {
        const size_t c = cell(p, l, e);
        for (int i = 0; i < p->n_holders[c]; i++)
            cnt[p->holders[c * PLACEMENT_MAX_HOLDERS + (size_t)i]]++;
    }
}

/* Worker wi's pairs of layer l go to the usable workers not holding them. */
static ecs_err_t drain_layer(placement_t *q, int l, int wi, const bool *usable, int *cnt)
{
    for (int e = 0; e < q->shape.n_expert; e++) {
        const size_t c = cell(q, l, e);
        if (!holds(q, c, wi))
            continue;
        int best = -1; /* fewest of this layer, then fewest in all */
        for (int i = 0; i < q->n_workers; i++)
            if (i != wi && usable[i] && !holds(q, c, i) &&
                (best < 0 || cnt[i] < cnt[best] ||
                 (cnt[i] == cnt[best] && q->held[i] < q->held[best])))
                best = i;
        remove_holder(q, c, wi);
        if (best >= 0) {
            add_holder(q, l, e, best); /* cannot overflow: wi's place was freed */
            cnt[best]++;
        } else if (q->n_holders[c] == 0) {
            return ecs_error(ECS_ERR_NOTFOUND, "no other live worker can take layer %d "
                             "expert %d of worker %s", l, e, q->ids[wi]);
        }
    }
    return ECS_OK;
}

/* Worker wi takes its even share of layer l from the usable holders. */
static ecs_err_t fill_layer(placement_t *q, int l, int wi, const bool *usable, int *cnt)
{
    /* first the pairs its drain left below the replication (every other
     * worker held them already, as when each spawned worker holds every
     * expert, --replication auto): wi holds them again, as copies */
    for (int e = 0; e < q->shape.n_expert; e++) {
        const size_t c = cell(q, l, e);
        if (!holds(q, c, wi) && q->n_holders[c] < q->replication &&
            add_holder(q, l, e, wi) == ECS_OK)
            cnt[wi]++;
    }
    int total = cnt[wi], n = 1;
    for (int i = 0; i < q->n_workers; i++)
        if (i != wi && usable[i]) {
            total += cnt[i];
            n++;
        }
    const int target = total / n;
    /* first from the holders above the share, then from any holder two or
     * more above wi: the layer ends as even as it can */
    for (int pass = 0; pass < 2; pass++)
        for (int e = 0; e < q->shape.n_expert && cnt[wi] < target; e++) {
            const size_t c = cell(q, l, e);
            if (holds(q, c, wi))
                continue;
            int donor = -1; /* the usable holder with the most of this layer */
            for (int i = 0; i < q->n_holders[c]; i++) {
                const int h = q->holders[c * PLACEMENT_MAX_HOLDERS + (size_t)i];
                if (h != wi && usable[h] && (donor < 0 || cnt[h] > cnt[donor]))
                    donor = h;
            }
            if (donor < 0 || (pass == 0 ? cnt[donor] <= target : cnt[donor] <= cnt[wi] + 1))
                continue;
            remove_holder(q, c, donor);
            add_holder(q, l, e, wi);
            cnt[donor]--;
            cnt[wi]++;
        }
    return ECS_OK;
}

typedef ecs_err_t (*layer_fn)(placement_t *q, int l, int wi, const bool *usable, int *cnt);

/* A copy of p with fn applied to every MoE layer for worker wi. */
static ecs_err_t change_layers(const placement_t *p, int wi, const bool *usable, layer_fn fn,
                               placement_t **out)
{
    *out = NULL;
    if (wi < 0 || wi >= p->n_workers)
        return ecs_error(ECS_ERR_RANGE, "placement: no worker %d", wi);
    placement_t *q;
    ecs_err_t rc = placement_clone(p, &q);
    int cnt[PLACEMENT_MAX_WORKERS];
    for (int l = p->shape.first_moe; rc == ECS_OK && l < p->shape.n_layer; l++) {
        layer_counts(q, l, cnt);
        rc = fn(q, l, wi, usable, cnt);
    }
    if (rc != ECS_OK) {
        placement_free(q);
        return rc;
    }
    *out = q;
    return ECS_OK;
}

ecs_err_t placement_without(const placement_t *p, int wi, const bool *usable, placement_t **out)
{
    return change_layers(p, wi, usable, drain_layer, out);
}

ecs_err_t placement_with(const placement_t *p, int wi, const bool *usable, placement_t **out)
{
    return change_layers(p, wi, usable, fill_layer, out);
}

bool placement_same_share(const placement_t *a, const placement_t *b, int wi)
{
    if (a->held[wi] != b->held[wi])
        return false;
    for (int l = a->shape.first_moe; l < a->shape.n_layer; l++)
        for (int e = 0; e < a->shape.n_expert; e++)
            if (holds(a, cell(a, l, e), wi) != holds(b, cell(b, l, e), wi))
                return false;
    return true;
}
