/* test_shard.c - the worker's shard (worker/shard.c) with the shared
 * experts (Assign.shared, ExpertCall.shared): a call's shared rows are the
 * coordinator model's own shared FFN bit for bit (model_shared_ffn, the
 * rows a one-process step adds), from f32 or quantized rows; the routed
 * rows beside them are those of the same call without them; a shard not
 * assigned them, or a call asking for bf16 results with them, is refused;
 * the budget counts them; an Assign differing only in them is a change. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/model/model.h"
#include "tests/unit/shard_fixture.h"

enum { ROWS = 3 };

typedef struct {
    shard_model_t m; /* every routed pair in m.a */
    shard_t s;
} fx_t;

/* A shard of every routed expert (shared: and the shared experts). */
static ecs_err_t fx_open(fx_t *x, bool shared, uint64_t budget)
{
    memset(x, 0, sizeof *x);
    shard_model_open(&x->m);
    cr_assert(x->m.hp.n_ff_shexp > 0, "the test model has shared experts");
    x->m.a.shared = shared;
    cr_assert_eq(shard_open(&x->s, x->m.f, &x->m.hp), ECS_OK);
    uint64_t bytes, ns;
    return shard_assign(&x->s, &x->m.a, budget, x->m.tp, NULL, &bytes, &ns);
}

static void fx_close(fx_t *x)
{
    shard_close(&x->s);
    shard_model_close(&x->m);
}

typedef struct {
    uint32_t experts[2], counts[2], rows[2 * ROWS], slots[2 * ROWS];
    float *x;
    void *xq;
    wire_call_t c;
} call_t;

/* Rows 0..ROWS-1 of layer through experts 1 and 3 (every row to both),
 * as f32 (q NULL) or quantized for gate type q. */
static void make_call(call_t *k, const arch_hparams_t *hp, int layer, const gguf_tensor_t *q,
                      bool shared)
{
    memset(k, 0, sizeof *k);
    const size_t E = (size_t)hp->n_embd;
    k->x = malloc(sizeof(float) * ROWS * E);
    cr_assert(k->x);
    for (size_t i = 0; i < ROWS * E; i++)
        k->x[i] = sinf(0.37f * (float)i) * 0.5f;
    size_t n = 0;
    for (int i = 0; i < 2; i++) {
        k->experts[i] = (uint32_t)(1 + 2 * i);
        k->counts[i] = ROWS;
        for (int r = 0; r < ROWS; r++, n++) {
            k->rows[n] = (uint32_t)r;
            k->slots[n] = (uint32_t)i;
        }
    }
    uint32_t dtype = ECS_TYPE_F32;
    const void *payload = k->x;
    size_t bytes = sizeof(float) * ROWS * E;
    if (q) {
        dtype = ecs_type_traits(q->type)->vec_dot_type;
        bytes = ROWS * wire_row_bytes(dtype, (uint32_t)E);
        k->xq = malloc(bytes);
        cr_assert(k->xq);
        kcpu_quantize_rows(NULL, q->type, k->x, (int64_t)E, ROWS, (int64_t)E, k->xq);
        payload = k->xq;
    }
    k->c = (wire_call_t){.request_id = 1, .layer = (uint32_t)layer, .n_rows = ROWS,
                         .n_embd = (uint32_t)E, .dtype = dtype,
                         .k = (uint32_t)hp->n_expert_used, .n_experts = 2,
                         .experts = k->experts, .expert_counts = k->counts, .n_entries = n,
                         .row_index = k->rows, .slot = k->slots, .result_dtype = ECS_TYPE_F32,
                         .shared = shared, .payload = payload, .payload_bytes = bytes};
}

static void free_call(call_t *k)
{
    free(k->x);
    free(k->xq);
}

/* The call's status; its rows in out (wire_call_result_rows of them). */
static wire_status_t run(shard_t *s, const wire_call_t *c, float *out, char *msg)
{
    mux_reply_t r = {.status = WIRE_ST_OK, .rows = out,
                     .rows_bytes = wire_call_result_rows(c) * c->n_embd * sizeof(float)};
    shard_call(s, c, &r);
    if (msg)
        strcpy(msg, r.message);
    return r.status;
}

Test(shard, shared_rows_are_the_models_bit_for_bit)
{
    fx_t x;
    cr_assert_eq(fx_open(&x, true, 0), ECS_OK, "%s", ecs_errmsg());
    const size_t E = (size_t)x.m.hp.n_embd;
    model_opts_t mo = {.n_ctx = 64, .n_threads = 2};
    model_t *m;
    cr_assert_eq(model_load(DS2, &mo, &m), ECS_OK, "%s", ecs_errmsg());
    const gguf_tensor_t *g;
    cr_assert_eq(arch_exps_tensor(x.m.f, &x.m.hp, x.m.l0, ARCH_EXPS_GATE, &g), ECS_OK);
    float *want = malloc(ROWS * E * sizeof *want), *plain = malloc(2 * ROWS * E * sizeof *plain);
    float *got = malloc(3 * ROWS * E * sizeof *got);
    cr_assert(want && plain && got);
    for (int l = x.m.l0; l < x.m.hp.n_layer; l++)
        for (int quantized = 0; quantized < 2; quantized++) {
            call_t k;
            make_call(&k, &x.m.hp, l, quantized ? g : NULL, false);
            cr_assert_eq(run(&x.s, &k.c, plain, NULL), WIRE_ST_OK);
            k.c.shared = true;
            cr_assert_eq(wire_call_result_rows(&k.c), 3 * ROWS);
            char msg[256];
            cr_assert_eq(run(&x.s, &k.c, got, msg), WIRE_ST_OK, "%s", msg);
            model_shared_ffn(m, l, ROWS, k.x, want);
            cr_assert_eq(memcmp(got, plain, 2 * ROWS * E * sizeof *got), 0,
                         "layer %d: the routed rows change with the shared experts", l);
            cr_assert_eq(memcmp(got + 2 * ROWS * E, want, ROWS * E * sizeof *want), 0,
                         "layer %d (%s rows): the shared rows differ from the model's", l,
                         quantized ? "quantized" : "f32");
            free_call(&k);
        }
    free(want), free(plain), free(got);
    model_free(m);
    fx_close(&x);
}

Test(shard, shared_calls_refused_without_them_or_in_bf16)
{
    fx_t x;
    cr_assert_eq(fx_open(&x, false, 0), ECS_OK, "%s", ecs_errmsg());
    call_t k;
    make_call(&k, &x.m.hp, x.m.l0, NULL, true);
    float *out = malloc(3 * ROWS * (size_t)x.m.hp.n_embd * sizeof *out);
    char msg[256];
    cr_assert(out);
    cr_assert_eq(run(&x.s, &k.c, out, msg), WIRE_ST_NOT_ASSIGNED);
    cr_assert(strstr(msg, "shared experts are not held"), "%s", msg);
    /* the same pairs with the shared experts: a change, loaded */
    wire_assign_t a = x.m.a;
    a.shared = true;
    cr_assert_not(shard_holds_exactly(&x.s, &a));
    cr_assert(shard_holds_exactly(&x.s, &x.m.a));
    uint64_t bytes_plain = x.s.bytes, bytes, ns;
    cr_assert_eq(shard_assign(&x.s, &a, 0, x.m.tp, NULL, &bytes, &ns), ECS_OK);
    cr_assert_gt(bytes, bytes_plain, "the shared experts count in the bytes held");
    cr_assert(shard_holds_exactly(&x.s, &a));
    cr_assert_eq(run(&x.s, &k.c, out, msg), WIRE_ST_OK, "%s", msg);
    k.c.result_dtype = ECS_TYPE_BF16;
    cr_assert_eq(run(&x.s, &k.c, out, msg), WIRE_ST_UNSUPPORTED);
    cr_assert(strstr(msg, "f32 only"), "%s", msg);
    /* over a budget that holds the routed experts alone: refused, still held */
    cr_assert_eq(shard_assign(&x.s, &a, bytes_plain, x.m.tp, NULL, &bytes, &ns), ECS_ERR_NOMEM);
    cr_assert(strstr(ecs_errmsg(), "shared experts"), "%s", ecs_errmsg());
    cr_assert(shard_holds_exactly(&x.s, &a), "a refused assignment changes nothing");
    free(out);
    free_call(&k);
    fx_close(&x);
}
