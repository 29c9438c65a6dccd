/* test_gpu_bw.c - the grouped expert FFN's throughput on a GPU against the
 * card's memory bandwidth (docs/benchmarks.md's GPU table): a ds2-lite
 * layer (64 experts, n_embd 2048, n_ff 1408, q4_K gate/up, q5_0 down) in
 * VRAM, 1, 8 and 64 rows through every expert in one call. Decode is
 * bound by reading the weights, so the figure of merit is weight bytes per
 * second, printed next to the device's own copy bandwidth (a D2D copy
 * reads and writes: bytes moved / time); TFLOP/s for the larger row
 * counts. It asserts that the results are finite and that the outputs of
 * the timed calls agree with a first call (no timing threshold); skipped
 * by name without a GPU. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <time.h>

#include "tests/unit/gpu_fixture.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define BW_RUNS 20

/* X experts of E x F in VRAM, 1, 8 and 64 rows through each: prints one
 * CHECK line per row count; the outputs of the timed calls must equal the
 * first call's. */
static void bw_run(kgpu_t *g, int BW_E, int BW_F, int BW_X)
{
    /* ds2-lite q4_k_m: n_ff 1408 is no multiple of 256, so llama.cpp writes
     * ffn_down_exps in its fallback, q5_0 (q8_0 in the layers given more bits) */
    const ecs_type_t tg = ECS_TYPE_Q4_K, td = ECS_TYPE_Q5_0;
    /* one expert's weights, copied to all 64 slots (the values do not
     * matter for speed; quantizing 64 distinct experts would take longer
     * than the measurement) */
    fx_shard_t s = fx_shard(tg, tg, td, BW_E, BW_F, 1, 5);
    const size_t eb = s.bg + s.bu + s.bd, R = 64;
    uint8_t *w;
    float *dx, *dh, *dy, *y0 = fx_alloc(sizeof(float) * R * BW_X * BW_E);
    float *y1 = fx_alloc(sizeof(float) * R * BW_X * BW_E);
    cr_assert_eq(kgpu_alloc(g, eb * BW_X, (void **)&w), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * BW_X * BW_E, (void **)&dx), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * BW_X * BW_F, (void **)&dh), ECS_OK);
    cr_assert_eq(kgpu_alloc(g, sizeof(float) * R * BW_X * BW_E, (void **)&dy), ECS_OK);
    for (int e = 0; e < BW_X; e++) {
        uint8_t *p = w + eb * (size_t)e;
        cr_assert_eq(kgpu_copy(g, p, s.gate, s.bg, KGPU_H2D, KGPU_COMPUTE), ECS_OK);
        cr_assert_eq(kgpu_copy(g, p + s.bg, s.up, s.bu, KGPU_H2D, KGPU_COMPUTE), ECS_OK);
        cr_assert_eq(kgpu_copy(g, p + s.bg + s.bu, s.down, s.bd, KGPU_H2D, KGPU_COMPUTE),
                     ECS_OK);
    }
    float *x = fx_acts((int)(R * BW_X), BW_E, 9);
    cr_assert_eq(kgpu_copy(g, dx, x, sizeof(float) * R * BW_X * BW_E, KGPU_H2D, KGPU_COMPUTE),
                 ECS_OK);
    cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
    /* the copy bandwidth: the weights onto the activations' buffers and back */
    const size_t cb = eb * BW_X / 2;
    double t0 = now_s();
    for (int i = 0; i < BW_RUNS; i++)
        cr_assert_eq(kgpu_copy(g, w + cb, w, cb, KGPU_D2D, KGPU_COMPUTE), ECS_OK);
    cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
    const double copy_gbs = 2.0 * (double)cb * BW_RUNS / (now_s() - t0) / 1e9;
    for (int e = 1; e < BW_X; e++) /* the copy overwrote half the experts: restore */
        cr_assert_eq(kgpu_copy(g, w + eb * (size_t)e, w, eb, KGPU_D2D, KGPU_COMPUTE), ECS_OK);
    static const int rows[3] = {1, 8, 64};
    kgpu_seg_t *segs = fx_alloc(sizeof *segs * (size_t)BW_X);
    for (int k = 0; k < 3; k++) {
        const int n = rows[k];
        for (int e = 0; e < BW_X; e++) {
            uint8_t *p = w + eb * (size_t)e;
            segs[e] = (kgpu_seg_t){p, p + s.bg, p + s.bg + s.bu, e * n, n};
        }
        kgpu_ffn_t f = {tg, tg, td, BW_E, BW_F, segs, BW_X, n * BW_X, dx, dh, dy};
        const size_t yb = sizeof(float) * (size_t)n * BW_X * BW_E;
        cr_assert_eq(kgpu_ffn(g, &f), ECS_OK, "%s", ecs_errmsg());
        cr_assert_eq(kgpu_copy(g, y0, dy, yb, KGPU_D2H, KGPU_COMPUTE), ECS_OK);
        cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
        t0 = now_s();
        for (int i = 0; i < BW_RUNS; i++)
            cr_assert_eq(kgpu_ffn(g, &f), ECS_OK);
        cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK, "%s", ecs_errmsg());
        const double dt = (now_s() - t0) / BW_RUNS;
        cr_assert_eq(kgpu_copy(g, y1, dy, yb, KGPU_D2H, KGPU_COMPUTE), ECS_OK);
        cr_assert_eq(kgpu_sync(g, KGPU_COMPUTE), ECS_OK);
        cr_assert(fx_rel_err(y1, y0, (size_t)n * BW_X * BW_E) == 0.0,
                  "%d rows: outputs not finite or changed between calls", n);
        const double wgbs = (double)eb * BW_X / dt / 1e9;
        const double tflops = 2.0 * 3.0 * BW_E * BW_F * (double)n * BW_X / dt / 1e12;
        fprintf(stderr,
                "CHECK gpu_gemm %s: %d rows x %d experts q4_K/q5_0 %dx%d: %.1f us/call, weights "
                "%.0f GB/s (%.0f%% of the %.0f GB/s copy bandwidth), %.2f TFLOP/s\n",
                kgpu_name(g), n, BW_X, BW_E, BW_F, dt * 1e6, wgbs, 100.0 * wgbs / copy_gbs,
                copy_gbs, tflops);
    }
    kgpu_free(g, w);
    kgpu_free(g, dx);
    kgpu_free(g, dh);
    kgpu_free(g, dy);
    fx_shard_free(&s);
    free(segs);
    free(x);
    free(y0);
    free(y1);
}

Test(gpu_device, gemm_bandwidth, .timeout = 240)
{
    kgpu_t *g;
    kgpu_opts_t o = {.device = 0, .max_segs = 64};
    if (kgpu_open(&o, &g) != ECS_OK)
        cr_skip_test("%s", ecs_errmsg());
    bw_run(g, 2048, 1408, 64);
    kgpu_close(g);
}

/* The same measurement on the host emulation, small: what make test can
 * check without a GPU (segments, copies, repeatability). */
Test(gpu_bw, emulated_small_layer)
{
    kgpu_t *g;
    kgpu_opts_t o = {.max_segs = 4, .emulate = true};
    cr_assert_eq(kgpu_open(&o, &g), ECS_OK, "%s", ecs_errmsg());
    bw_run(g, 256, 64, 4);
    kgpu_close(g);
}
