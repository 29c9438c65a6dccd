/* moe_only.c - a worker's expert path built from kernels/ and common/ alone
 * (the Makefile links nothing else; test_deps.sh checks with nm that no
 * coordinator symbol is in it).
 *
 * usage: moe_only MODEL.gguf CACHE_DIR
 * For the model's last layer: the fingerprint and hyperparameters, the
 * stacked expert tensors by name, two holders with disjoint expert sets
 * (even ids with the interleaved copy of just their slices in CACHE_DIR, odd
 * ids without), each given only its (row, expert) pairs; their rows, summed
 * with kmoe_sum, must equal a holder of every expert bit for bit. Prints
 * one line and exits 0 when they do, 1 otherwise. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/arch.h"
#include "common/hash.h"
#include "kernels/moe/moe.h"
#include "kernels/repack/repack.h"

#define ROWS 13

static int fail(const char *what)
{
    fprintf(stderr, "moe_only: %s: %s\n", what, ecs_errmsg());
    return 1;
}

static ecs_err_t stack(const gguf_file_t *f, const arch_hparams_t *hp, int il, arch_exps_t w,
                       kcpu_mat_t *m)
{
    const gguf_tensor_t *t;
    ecs_err_t e = arch_exps_tensor(f, hp, il, w, &t);
    if (e != ECS_OK)
        return e;
    *m = (kcpu_mat_t){.type = t->type, .ncols = t->ne[0], .nrows = t->ne[1] * t->ne[2],
                      .row_bytes = ecs_row_size(t->type, t->ne[0]), .data = t->data};
    return ECS_OK;
}

/* One holder: only experts e with e % 2 == part (part -1: all). */
static void hold(const kmoe_expert_t *all, int n_expert, int part, kmoe_expert_t *out)
{
    memset(out, 0, (size_t)n_expert * sizeof *out);
    for (int e = 0; e < n_expert; e++)
        if (part < 0 || e % 2 == part)
            out[e] = all[e];
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: moe_only MODEL.gguf CACHE_DIR\n");
        return 2;
    }
    gguf_file_t *f;
    arch_hparams_t hp;
    if (gguf_open(argv[1], &f) != ECS_OK || arch_read_hparams(f, &hp) != ECS_OK)
        return fail("model");
    const int il = hp.n_layer - 1, X = hp.n_expert, K = hp.n_expert_used, E = hp.n_embd;
    kcpu_mat_t g, u, d;
    if (stack(f, &hp, il, ARCH_EXPS_GATE, &g) || stack(f, &hp, il, ARCH_EXPS_UP, &u) ||
        stack(f, &hp, il, ARCH_EXPS_DOWN, &d))
        return fail("expert tensors");
    ecs_threadpool_t *tp;
    if (ecs_threadpool_create(2, &tp) != ECS_OK)
        return fail("pool");
    kmoe_expert_t *all = calloc((size_t)X, sizeof *all), *h[3];
    const kmoe_expert_t **layers = calloc((size_t)hp.n_layer, sizeof *layers);
    kcpu_mat_t **mats = calloc(3 * (size_t)X, sizeof *mats);
    for (int i = 0; i < 3; i++)
        h[i] = calloc((size_t)X, sizeof *h[i]);
    float *x = malloc(ROWS * (size_t)E * sizeof *x), *w = malloc(ROWS * (size_t)K * sizeof *w);
    float *ref = malloc(ROWS * (size_t)E * sizeof *ref), *got = malloc(ROWS * (size_t)E * sizeof *got);
    float *buf = malloc(ROWS * (size_t)K * E * sizeof *buf);
    int32_t ids[ROWS * 64], where[ROWS * 64], prow[ROWS * 64], pexp[ROWS * 64], pidx[ROWS * 64];
    if (!all || !layers || !mats || !h[0] || !h[1] || !h[2] || !x || !w || !ref || !got || !buf ||
        K > 64)
        return fprintf(stderr, "moe_only: out of memory\n"), 1;
    kmoe_split(&g, &u, &d, X, all);
    hold(all, X, -1, h[0]); /* every expert */
    hold(all, X, 0, h[1]);  /* even ids, with a copy of just their slices */
    hold(all, X, 1, h[2]);  /* odd ids */
    int nm = 0;
    for (int e = 0; e < X; e += 2) {
        kcpu_mat_t *m3[] = {&h[1][e].gate, &h[1][e].up, &h[1][e].down};
        for (int i = 0; i < 3; i++)
            if (krepack_fits(m3[i]))
                mats[nm++] = m3[i];
    }
    krepack_t *copy = NULL;
    char name[64];
    snprintf(name, sizeof name, "moe_only.L%d.even.r16", il);
    const krepack_opts_t ro = {.dir = argv[2], .name = name, .src = f, .tp = tp};
    if (nm && krepack_open(&ro, mats, nm, &copy) != ECS_OK)
        return fail("interleaved copy");
    uint64_t seed = 12345;
    for (int i = 0; i < ROWS * E; i++) {
        seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
        x[i] = (float)((seed >> 40) & 0xFFFF) / 32768.0f - 1.0f;
    }
    for (int t = 0; t < ROWS; t++)
        for (int j = 0; j < K; j++) {
            ids[t * K + j] = (7 * t + 5 * j + 3) % X; /* distinct per row when gcd(5, X) = 1 */
            w[t * K + j] = 0.25f + 0.125f * (float)j;
        }
    const kmoe_shape_t s = {.n_embd = E, .n_ff_exp = hp.n_ff_exp, .n_expert = X, .k = K,
                            .max_rows = ROWS};
    kmoe_t *moe[3];
    for (int i = 0; i < 3; i++) {
        layers[il] = h[i];
        if (kmoe_new(&s, layers, hp.n_layer, tp, &moe[i]) != ECS_OK)
            return fail("kmoe_new");
    }
    if (kmoe_prepare(moe[0], il, ROWS, x, ROWS * K, NULL, ids) != ECS_OK)
        return fail("prepare (all)");
    kmoe_compute(moe[0]);
    kmoe_sum(tp, ROWS, K, E, kmoe_outs(moe[0]), kmoe_where(moe[0]), w, ref);
    int next = 0;
    for (int part = 0; part < 2; part++) {
        int np = 0;
        for (int e = part; e < X; e += 2)
            for (int p = 0; p < ROWS * K; p++)
                if (ids[p] == e)
                    prow[np] = p / K, pexp[np] = e, pidx[np++] = p;
        if (kmoe_prepare(moe[1 + part], il, ROWS, x, np, prow, pexp) != ECS_OK)
            return fail("prepare (subset)");
        kmoe_compute(moe[1 + part]);
        for (int q = 0; q < np; q++, next++) {
            memcpy(buf + (size_t)next * E, kmoe_outs(moe[1 + part]) + (size_t)q * E,
                   (size_t)E * sizeof *buf);
            where[pidx[q]] = next;
        }
    }
    kmoe_sum(tp, ROWS, K, E, buf, where, w, got);
    const bool same = next == ROWS * K && memcmp(ref, got, ROWS * (size_t)E * sizeof *ref) == 0;
    uint8_t fp[GGUF_FINGERPRINT_BYTES];
    char hex[2 * GGUF_FINGERPRINT_BYTES + 1];
    gguf_fingerprint(f, fp);
    ecs_hex(fp, sizeof fp, hex);
    printf("moe_only: model %s, layer %d, %d pairs over two holders (%d matrices copied, %zu "
           "bytes): %s\n",
           hex, il, next, nm, krepack_bytes(copy), same ? "same bits" : "DIFFERENT");
    for (int i = 0; i < 3; i++)
        kmoe_free(moe[i]);
    krepack_close(copy);
    ecs_threadpool_destroy(tp);
    gguf_close(f);
    free(all), free(layers), free(mats), free(x), free(w), free(ref), free(got), free(buf);
    for (int i = 0; i < 3; i++)
        free(h[i]);
    return same ? 0 : 1;
}
