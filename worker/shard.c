/* shard.c - the experts a worker holds and the one thing it computes.
 *
 * The whole GGUF is mapped, but a worker only ever reads the pages of the
 * experts it was assigned: resident memory is its shard (plus the page
 * tables of the mapping). An assignment is checked against the budget
 * before anything is touched, then its bytes are prefaulted (madvise and a
 * read per page) so that the first call does not pay the page faults. The
 * calls run kernels/moe, the code of the coordinator's local backend:
 * the same bits for the same rows. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/hash.h"
#include "common/resident.h"
#include "worker/worker_int.h"

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static kcpu_mat_t stack_mat(const gguf_tensor_t *t)
{
    kcpu_mat_t m = {.type = t->type,
                    .ncols = t->ne[0],
                    .nrows = t->ne[1] * t->ne[2],
                    .row_bytes = ecs_row_size(t->type, t->ne[0]),
                    .data = t->data};
    return m;
}

static size_t mat_bytes(const kcpu_mat_t *m) { return (size_t)m->nrows * m->row_bytes; }

size_t shard_expert_bytes(const kmoe_expert_t *e)
{
    return mat_bytes(&e->gate) + mat_bytes(&e->up) + mat_bytes(&e->down);
}

ecs_err_t shard_open(shard_t *s, const gguf_file_t *f, const arch_hparams_t *hp)
{
    memset(s, 0, sizeof *s);
    s->hp = *hp;
    s->f = f;
    const size_t cells = (size_t)hp->n_layer * (size_t)hp->n_expert;
    s->all = calloc(cells, sizeof *s->all);
    s->held = calloc(cells, sizeof *s->held);
    s->layers = calloc((size_t)hp->n_layer, sizeof *s->layers);
    s->row = malloc((size_t)KCPU_MAX_BATCH * (size_t)hp->n_expert_used * sizeof *s->row);
    s->expert = malloc((size_t)KCPU_MAX_BATCH * (size_t)hp->n_expert_used * sizeof *s->expert);
    s->jobs = calloc((size_t)hp->n_expert + 1, sizeof *s->jobs);
    s->shexp = calloc((size_t)hp->n_layer, sizeof *s->shexp);
    s->plan.cap = KCPU_PLAN_CHUNKS(SHARD_REGION_JOBS);
    s->plan.chunks = calloc((size_t)s->plan.cap, sizeof *s->plan.chunks);
    if (!s->all || !s->held || !s->layers || !s->row || !s->expert || !s->jobs || !s->shexp ||
        !s->plan.chunks) {
        shard_close(s);
        return ecs_error(ECS_ERR_NOMEM, "worker: out of memory for the expert table");
    }
    for (int il = 0; il < hp->n_layer; il++) {
        if (!arch_layer_moe(hp, il))
            continue;
        const gguf_tensor_t *t[3];
        for (int which = 0; which < 3; which++) {
            ecs_err_t rc = arch_exps_tensor(f, hp, il, (arch_exps_t)which, &t[which]);
            if (rc != ECS_OK) {
                shard_close(s);
                return rc;
            }
        }
        const kcpu_mat_t g = stack_mat(t[0]), u = stack_mat(t[1]), d = stack_mat(t[2]);
        kmoe_split(&g, &u, &d, hp->n_expert, s->all + (size_t)il * (size_t)hp->n_expert);
    }
    return ECS_OK;
}

void shard_close(shard_t *s)
{
    kmoe_free(s->moe);
    krepack_close(s->copy);
    krepack_close(s->sh_copy);
    free(s->all);
    free(s->held);
    free(s->layers);
    free(s->row);
    free(s->expert);
    free(s->jobs);
    free(s->shexp);
    kmoe_ffn_free(s->ffn);
    free(s->plan.chunks);
    memset(s, 0, sizeof *s);
}

/* Reads one byte a page so the pages are resident before the first call. */
static void prefault(const void *p, size_t n)
{
    const long page = sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(page - 1);
    const uintptr_t end = (uintptr_t)p + n;
    madvise((void *)a, end - a, MADV_WILLNEED);
    volatile unsigned char sink = 0;
    for (; a < end; a += (uintptr_t)page)
        sink ^= *(const volatile unsigned char *)(a < (uintptr_t)p ? (uintptr_t)p : a);
    (void)sink;
}

/* The interleaved copy of mats[0, n) in dir/name into *out (none: a
 * warning, and the products read the GGUF's rows: the same bits, slower
 * decode). */
static void copy_open(const shard_t *s, const char *dir, ecs_threadpool_t *tp,
                      kcpu_mat_t *const *mats, int n, const char *name, krepack_t **out)
{
    krepack_opts_t o = {.dir = dir, .name = name, .src = s->f, .tp = tp};
    if (krepack_open(&o, mats, n, out) != ECS_OK)
        fprintf(stderr, "ecs-worker: warning: no interleaved copy (%s); running from the GGUF "
                "alone\n", ecs_errmsg());
    else if (krepack_made_why(*out))
        fprintf(stderr, "ecs-worker: made %s (%.1f MiB): %s\n", krepack_path(*out),
                krepack_bytes(*out) / 1048576.0, krepack_made_why(*out));
}

/* A copy that the page cache holds in small folios (partly evicted and
 * read back) read back in 2 MB ones (ecs_huge_refresh), said on stderr. */
static void refresh_copies(const shard_t *s)
{
    krepack_t *copies[2] = {s->copy, s->sh_copy};
    for (int i = 0; i < 2; i++) {
        if (!copies[i])
            continue;
        ecs_huge_refresh_t hr;
        ecs_huge_refresh(krepack_map(copies[i]), krepack_bytes(copies[i]),
                         krepack_path(copies[i]), &hr);
        char line[600];
        if (hr.refreshed && ecs_huge_refresh_say(&hr, krepack_path(copies[i]), line, sizeof line) > 0)
            fprintf(stderr, "ecs-worker: note: %s\n", line);
    }
}

/* Appends x's matrices that have an interleaved layout to mats. */
static int add_mats(kmoe_expert_t *x, kcpu_mat_t **mats, int n)
{
    kcpu_mat_t *m3[3] = {&x->gate, &x->up, &x->down};
    for (int i = 0; i < 3; i++)
        if (krepack_fits(m3[i]))
            mats[n++] = m3[i];
    return n;
}

/* The interleaved copies: of the held experts, in a file named after the
 * GGUF and a hash of the assignment (another assignment, another file),
 * and of the shared experts when held, in one file of their own (the same
 * for every worker, and the experts' copy the same with or without them). */
static void open_copy(shard_t *s, const char *dir, ecs_threadpool_t *tp)
{
    const size_t cells = (size_t)s->hp.n_layer * (size_t)s->hp.n_expert;
    const size_t n_mats = s->n_held > (size_t)s->hp.n_layer ? s->n_held : (size_t)s->hp.n_layer;
    kcpu_mat_t **mats = malloc(3 * n_mats * sizeof *mats);
    int32_t *ids = malloc((s->n_held + 1) * sizeof *ids);
    if (!mats || !ids)
        goto done;
    const char *base = strrchr(gguf_path(s->f), '/');
    base = base ? base + 1 : gguf_path(s->f);
    char name[256];
    int n = 0, n_ids = 0;
    for (size_t c = 0; c < cells; c++)
        if (s->held[c].gate.nrows) {
            ids[n_ids++] = (int32_t)c;
            n = add_mats(&s->held[c], mats, n);
        }
    if (n) {
        uint8_t h[32];
        char hex[17];
        ecs_sha256(ids, (size_t)n_ids * sizeof *ids, h);
        ecs_hex(h, 8, hex);
        snprintf(name, sizeof name, "%.200s.%s.r16", base, hex);
        copy_open(s, dir, tp, mats, n, name, &s->copy);
    }
    n = 0;
    for (int il = 0; il < s->hp.n_layer; il++)
        if (s->shexp[il].gate.nrows)
            n = add_mats(&s->shexp[il], mats, n);
    if (n) {
        snprintf(name, sizeof name, "%.200s.shexp.r16", base);
        copy_open(s, dir, tp, mats, n, name, &s->sh_copy);
    }
done:
    free(mats);
    free(ids);
}

/* Every MoE layer's shared experts into shexp (views of the GGUF; NULL:
 * only counted), their bytes to *bytes. A model without any: none. */
static ecs_err_t load_shexp(const shard_t *s, kmoe_expert_t *shexp, uint64_t *bytes)
{
    const arch_hparams_t *hp = &s->hp;
    *bytes = 0;
    for (int il = 0; il < hp->n_layer && hp->n_ff_shexp > 0; il++) {
        if (!arch_layer_moe(hp, il))
            continue;
        const gguf_tensor_t *t[3];
        for (int which = 0; which < 3; which++) {
            const ecs_err_t rc = arch_shexp_tensor(s->f, hp, il, (arch_exps_t)which, &t[which]);
            if (rc != ECS_OK)
                return rc;
        }
        const kmoe_expert_t x = {stack_mat(t[0]), stack_mat(t[1]), stack_mat(t[2])};
        *bytes += shard_expert_bytes(&x);
        if (shexp)
            shexp[il] = x;
    }
    return ECS_OK;
}

/* Drops the shared experts (and their scratch). */
static void drop_shexp(shard_t *s)
{
    krepack_close(s->sh_copy);
    s->sh_copy = NULL;
    memset(s->shexp, 0, (size_t)s->hp.n_layer * sizeof *s->shexp);
    kmoe_ffn_free(s->ffn);
    s->ffn = NULL;
    s->shared = false;
}

ecs_err_t shard_assign(shard_t *s, const wire_assign_t *a, uint64_t budget, ecs_threadpool_t *tp,
                       const char *repack_dir, uint64_t *bytes, uint64_t *load_ns)
{
    const arch_hparams_t *hp = &s->hp;
    const uint64_t t0 = now_ns();
    uint64_t need = 0;
    for (size_t i = 0; i < a->n; i++) {
        const int l = (int)a->layers[i], e = (int)a->experts[i];
        if (l >= hp->n_layer || !arch_layer_moe(hp, l) || e >= hp->n_expert)
            return ecs_error(ECS_ERR_RANGE,
                             "assignment names layer %d expert %d: the model has %d layers "
                             "(routed from %d) of %d experts",
                             l, e, hp->n_layer, hp->n_layer_dense, hp->n_expert);
        need += shard_expert_bytes(&s->all[(size_t)l * (size_t)hp->n_expert + (size_t)e]);
    }
    uint64_t shared = 0;
    if (a->shared) {
        const ecs_err_t rc = load_shexp(s, NULL, &shared);
        if (rc != ECS_OK)
            return rc;
    }
    if (budget && need + shared > budget)
        return ecs_error(ECS_ERR_NOMEM,
                         "assignment of %zu experts%s needs %.1f MiB, over the memory budget of "
                         "%.1f MiB (--mem-budget)", a->n,
                         shared ? " and the shared experts" : "", (need + shared) / 1048576.0,
                         budget / 1048576.0);
    need += shared;
    kmoe_free(s->moe);
    s->moe = NULL;
    s->tp = tp;
    krepack_close(s->copy);
    krepack_close(s->sh_copy);
    s->copy = s->sh_copy = NULL;
    drop_shexp(s);
    const size_t cells = (size_t)hp->n_layer * (size_t)hp->n_expert;
    memset(s->held, 0, cells * sizeof *s->held);
    for (int il = 0; il < hp->n_layer; il++)
        s->layers[il] = NULL;
    if (shared) {
        ecs_err_t rc = load_shexp(s, s->shexp, &shared);
        if (rc == ECS_OK)
            rc = kmoe_ffn_new(hp->n_embd, hp->n_ff_shexp, KCPU_MAX_BATCH, tp, &s->ffn);
        if (rc != ECS_OK) {
            drop_shexp(s);
            s->n_held = 0;
            return rc;
        }
    }
    s->shared = a->shared;
    for (size_t i = 0; i < a->n; i++) {
        const size_t c = (size_t)a->layers[i] * (size_t)hp->n_expert + a->experts[i];
        s->held[c] = s->all[c];
        s->layers[a->layers[i]] = s->held + (size_t)a->layers[i] * (size_t)hp->n_expert;
    }
    s->n_held = a->n;
    if (repack_dir) {
        open_copy(s, repack_dir, tp);
        refresh_copies(s);
    }
    kmoe_shape_t shape = {.n_embd = hp->n_embd, .n_ff_exp = hp->n_ff_exp,
                          .n_expert = hp->n_expert, .k = hp->n_expert_used,
                          .max_rows = KCPU_MAX_BATCH};
    ecs_err_t rc = kmoe_new(&shape, (const kmoe_expert_t *const *)s->layers, hp->n_layer, tp,
                            &s->moe);
    if (rc != ECS_OK) {
        drop_shexp(s);
        s->n_held = 0;
        return rc;
    }
    /* what the calls will read: the GGUF's rows of a matrix its copy
     * does not serve (kcpu_mat_reads_rows), and a copy made just now
     * (written, then dropped from the page cache so that it comes back in
     * large folios: repack.c); a copy found on the disk was read whole by
     * its checksums when it was opened */
    for (size_t c = 0; c < cells + (size_t)hp->n_layer; c++) {
        const kmoe_expert_t *x = c < cells ? &s->held[c] : &s->shexp[c - cells];
        if (x->gate.nrows) {
            const kcpu_mat_t *m3[3] = {&x->gate, &x->up, &x->down};
            for (int i = 0; i < 3; i++)
                if (kcpu_mat_reads_rows(m3[i]))
                    prefault(m3[i]->data, mat_bytes(m3[i]));
        }
    }
    krepack_t *copies[2] = {s->copy, s->sh_copy};
    for (int i = 0; i < 2; i++)
        if (copies[i] && krepack_made_why(copies[i]))
            prefault(krepack_map(copies[i]), krepack_bytes(copies[i]));
    s->n_held = a->n;
    s->bytes = need;
    *bytes = need;
    *load_ns = now_ns() - t0;
    return ECS_OK;
}

bool shard_holds_exactly(const shard_t *s, const wire_assign_t *a)
{
    const arch_hparams_t *hp = &s->hp;
    if (!s->moe || a->n != s->n_held || a->shared != s->shared)
        return false;
    for (size_t i = 0; i < a->n; i++) {
        const uint32_t l = a->layers[i], e = a->experts[i];
        if (l >= (uint32_t)hp->n_layer || e >= (uint32_t)hp->n_expert ||
            !s->held[(size_t)l * (size_t)hp->n_expert + e].gate.nrows)
            return false;
    }
    return true;
}

/* The quantized activation type layer l's calls may carry (wire_act_type;
 * the coordinator decides from the same tensors), F32: only f32. */
uint32_t shard_act_type(const shard_t *s, int l)
{
    for (int e = 0; s->layers[l] && e < s->hp.n_expert; e++) {
        const kmoe_expert_t *x = &s->layers[l][e];
        if (x->gate.nrows)
            return wire_act_type(x->gate.type, x->up.type, (uint32_t)s->hp.n_embd);
    }
    return ECS_TYPE_F32;
}

/* kmoe_compute in regions of at most SHARD_REGION_JOBS experts (each job's
 * bits do not depend on its region), ticking between them. */
static void run_regions(shard_t *s, const kcpu_jobs_t *j)
{
    for (int i = 0; i < j->n; i += SHARD_REGION_JOBS) {
        if (i && s->tick)
            s->tick(s->tick_ctx);
        const int n = j->n - i < SHARD_REGION_JOBS ? j->n - i : SHARD_REGION_JOBS;
        kcpu_run_jobs(s->tp, &s->plan, j->jobs + i, n);
    }
}

/* The call's experts, with the shared ones first when it asks for them
 * (as the coordinator's one-process step orders them). */
static void compute(shard_t *s, bool shared)
{
    kcpu_jobs_t j = {s->jobs, 0};
    if (shared)
        kmoe_ffn_gate_up(s->ffn, &j);
    kmoe_gate_up(s->moe, &j);
    run_regions(s, &j);
    if (s->tick)
        s->tick(s->tick_ctx);
    j.n = 0;
    if (shared)
        kmoe_ffn_down(s->ffn, &j);
    kmoe_down(s->moe, &j);
    run_regions(s, &j);
}

/* Fills reply with the call's result rows, or an error status. */
void shard_call(shard_t *s, const wire_call_t *c, mux_reply_t *r)
{
    const arch_hparams_t *hp = &s->hp;
#define REFUSE(st, ...)                                                 \
    do {                                                                \
        r->status = (st);                                               \
        snprintf(r->message, sizeof r->message, __VA_ARGS__);           \
        return;                                                         \
    } while (0)
    if (!s->moe)
        REFUSE(WIRE_ST_NOT_READY, "no assignment loaded yet");
    if (c->result_dtype != ECS_TYPE_F32 && c->result_dtype != ECS_TYPE_BF16)
        REFUSE(WIRE_ST_UNSUPPORTED, "results in %s: this worker returns f32 or bf16",
               ecs_type_name((ecs_type_t)c->result_dtype));
    if ((int)c->n_embd != hp->n_embd || (int)c->k != hp->n_expert_used)
        REFUSE(WIRE_ST_BAD_MESSAGE, "rows of %u values with k %u: the model has %d and %d",
               c->n_embd, c->k, hp->n_embd, hp->n_expert_used);
    if (c->n_rows > KCPU_MAX_BATCH)
        REFUSE(WIRE_ST_UNSUPPORTED, "%u rows in one call (at most %d)", c->n_rows,
               KCPU_MAX_BATCH);
    const int l = (int)c->layer;
    if (l >= hp->n_layer || !s->layers[l])
        REFUSE(WIRE_ST_NOT_ASSIGNED, "layer %d: no expert of it is held here", l);
    /* the device path takes f32 rows only (its Hello offers no quantized input) */
    const uint32_t want =
        c->dtype == ECS_TYPE_F32 || s->dev ? ECS_TYPE_F32 : shard_act_type(s, l);
    if (c->dtype != want)
        REFUSE(WIRE_ST_UNSUPPORTED, "layer %d: activations in %s: this worker takes f32%s%s", l,
               ecs_type_name((ecs_type_t)c->dtype), want == ECS_TYPE_F32 ? "" : " or ",
               want == ECS_TYPE_F32 ? "" : ecs_type_name((ecs_type_t)want));
    size_t p = 0;
    for (size_t i = 0; i < c->n_experts; i++) {
        const uint32_t e = c->experts[i];
        if ((int)e >= hp->n_expert || !s->layers[l][e].gate.nrows)
            REFUSE(WIRE_ST_NOT_ASSIGNED, "layer %d expert %u is not held here", l, e);
        for (uint32_t j = 0; j < c->expert_counts[i]; j++, p++) {
            s->expert[p] = (int32_t)e;
            s->row[p] = (int32_t)c->row_index[p];
        }
    }
    if (c->shared && (!s->shared || !s->shexp[l].gate.nrows))
        REFUSE(WIRE_ST_NOT_ASSIGNED, "layer %d: the shared experts are not held here (%s)", l,
               s->shared ? "the model has none" : "the assignment did not ask for them");
    if (c->shared && c->result_dtype != ECS_TYPE_F32)
        REFUSE(WIRE_ST_UNSUPPORTED, "shared experts with %s results: they come back in f32 only",
               ecs_type_name((ecs_type_t)c->result_dtype));
    if (s->dev) {
        shard_dev_call(s->dev, c, r);
        if (r->status == WIRE_ST_OK) {
            s->calls++;
            s->rows += c->n_rows;
        }
        return;
    }
    const ecs_err_t rc =
        c->dtype == ECS_TYPE_F32
            ? kmoe_prepare(s->moe, l, (int)c->n_rows, c->payload, (int)p, s->row, s->expert)
            : kmoe_prepare_q(s->moe, l, (int)c->n_rows, c->payload, NULL, (int)p, s->row,
                             s->expert);
    if (rc != ECS_OK)
        REFUSE(WIRE_ST_BAD_MESSAGE, "%s", ecs_errmsg());
    const size_t E = (size_t)hp->n_embd, row = E * sizeof(float);
    if (c->shared) {
        const bool f32 = c->dtype == ECS_TYPE_F32;
        if (kmoe_ffn_prepare(s->ffn, &s->shexp[l], (int)c->n_rows, f32 ? c->payload : NULL,
                             f32 ? NULL : c->payload, (ecs_type_t)c->dtype,
                             (float *)((char *)r->rows + p * row)) != ECS_OK)
            REFUSE(WIRE_ST_UNSUPPORTED, "layer %d: %s", l, ecs_errmsg());
    }
    compute(s, c->shared);
    const float *outs = kmoe_outs(s->moe);
    const int32_t *where = kmoe_where(s->moe);
    ecs_bf16_t *b = r->rows;
    if (c->result_dtype == ECS_TYPE_BF16) /* the inexact option: half the bytes */
        for (size_t q = 0; q < p; q++)
            for (size_t i = 0; i < E; i++)
                b[q * E + i] = ecs_f32_to_bf16(outs[(size_t)where[q] * E + i]);
    else
        for (size_t q = 0; q < p; q++)
            memcpy((char *)r->rows + q * row, outs + (size_t)where[q] * E, row);
    s->calls++;
    s->rows += c->n_rows;
#undef REFUSE
}
