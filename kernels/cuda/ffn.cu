/* ffn.cu - libecs_cuda.so: the grouped expert FFN on an NVIDIA GPU and the
 * device services kgpu_api_t lists (kernels/gpu/gpu.h), behind one exported
 * C symbol, kcuda_api, that kernels/gpu/gpu.c resolves with dlsym.
 *
 * A layer call is two grouped launches on the compute stream, each covering
 * every segment of the call (grid.y = segment): gate and up with SwiGLU
 * fused into h, then down into y. One warp owns one output feature of one
 * segment: per pass its lanes run kgpu_lane_pass (kernels/gpu/deq.h: the
 * weight row lane-strided, decoded by kgpu_deq, against up to
 * KGPU_PASS_ROWS activation rows, so a weight row is decoded once per 8
 * rows), a butterfly of shuffles sums the lanes and lane 0 writes. The host
 * tests run the same lane passes and the same butterfly on the CPU. Sums differ from the CPU reference
 * only in order (lane-strided partial sums, FMA): the GPU check states its
 * tolerance. No shared memory and no __syncthreads, so any block shape is
 * safe and an idle warp simply returns. */
#include <cuda_runtime.h>
#include <stdio.h>
#include <string.h>

extern "C" {
#include "kernels/gpu/gpu.h"
}
#include "kernels/gpu/deq.h"

#define KC_WARPS 8 /* warps (output features) per block */

struct kc_ctx {
    int dev;
    int max_segs;
    cudaStream_t s[2];      /* KGPU_COMPUTE, KGPU_UPLOAD */
    cudaEvent_t up_done;    /* the uploads queued before the last fence */
    cudaEvent_t seg_done;   /* the last segment table copy has left seg_host */
    kgpu_seg_t *seg_host;   /* pinned staging for the segment table */
    kgpu_seg_t *seg_dev;
};

static int fail(cudaError_t e, const char *what, char *msg, size_t n)
{
    snprintf(msg, n, "%s: error %d (%s)", what, (int)e, cudaGetErrorString(e));
    return e == cudaSuccess ? 9 : (int)e;
}

#define KC_TRY(call, what)                                                                         \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return fail(e_, what, msg, n);                                                         \
    } while (0)

template <bool GLU>
__global__ void __launch_bounds__(KC_WARPS * 32)
    kc_grouped(const kgpu_seg_t *segs, ecs_type_t ta, ecs_type_t tb, int64_t ra, int64_t rb,
               int n_out, int n_in, const float *in, float *out)
{
    const int lane = threadIdx.x & 31;
    const int o = blockIdx.x * KC_WARPS + (threadIdx.x >> 5);
    if (o >= n_out)
        return;
    const kgpu_seg_t s = segs[blockIdx.y];
    const uint8_t *wa = (const uint8_t *)(GLU ? s.gate : s.down) + (size_t)o * ra;
    const uint8_t *wb = GLU ? (const uint8_t *)s.up + (size_t)o * rb : wa;
    for (int r0 = 0; r0 < s.n_rows; r0 += KGPU_PASS_ROWS) {
        const int nr = min(KGPU_PASS_ROWS, s.n_rows - r0);
        const float *x = in + (size_t)(s.row0 + r0) * n_in;
        float acc_a[KGPU_PASS_ROWS], acc_b[KGPU_PASS_ROWS];
        kgpu_lane_pass(ta, wa, tb, wb, GLU, n_in, x, nr, lane, acc_a, acc_b);
#pragma unroll
        for (int r = 0; r < KGPU_PASS_ROWS; r++) {
            for (int off = 16; off > 0; off >>= 1) {
                acc_a[r] += __shfl_xor_sync(0xffffffffu, acc_a[r], off);
                if (GLU)
                    acc_b[r] += __shfl_xor_sync(0xffffffffu, acc_b[r], off);
            }
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < KGPU_PASS_ROWS; r++) {
                if (r < nr) {
                    out[(size_t)(s.row0 + r0 + r) * n_out + o] =
                        GLU ? kgpu_swiglu(acc_a[r], acc_b[r]) : acc_a[r];
                }
            }
        }
    }
}

static int kc_init(int device, int max_segs, void **out, char *msg, size_t n)
{
    *out = NULL;
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
        snprintf(msg, n, "no GPU: cudaGetDeviceCount: error %d (%s)", (int)e,
                 cudaGetErrorString(e));
        return (int)e;
    }
    if (count == 0) {
        snprintf(msg, n, "no GPU: cudaGetDeviceCount found no device");
        return 100; /* cudaErrorNoDevice */
    }
    if (device >= count) {
        snprintf(msg, n, "no GPU cuda:%d: this machine has %d device%s", device, count,
                 count == 1 ? "" : "s");
        return 101; /* cudaErrorInvalidDevice */
    }
    kc_ctx *c = (kc_ctx *)calloc(1, sizeof *c);
    if (!c) {
        snprintf(msg, n, "cuda: no host memory");
        return 2;
    }
    c->dev = device;
    c->max_segs = max_segs;
    cudaError_t r;
    const char *what = "cudaSetDevice";
    if ((r = cudaSetDevice(device)) != cudaSuccess)
        goto fail;
    what = "cudaStreamCreate";
    for (int i = 0; i < 2; i++)
        if ((r = cudaStreamCreateWithFlags(&c->s[i], cudaStreamNonBlocking)) != cudaSuccess)
            goto fail;
    what = "cudaEventCreate";
    if ((r = cudaEventCreateWithFlags(&c->up_done, cudaEventDisableTiming)) != cudaSuccess ||
        (r = cudaEventCreateWithFlags(&c->seg_done, cudaEventDisableTiming)) != cudaSuccess)
        goto fail;
    what = "segment table";
    if ((r = cudaMallocHost((void **)&c->seg_host, sizeof(kgpu_seg_t) * max_segs)) !=
            cudaSuccess ||
        (r = cudaMalloc((void **)&c->seg_dev, sizeof(kgpu_seg_t) * max_segs)) != cudaSuccess)
        goto fail;
    *out = c;
    return 0;
fail:
    fail(r, what, msg, n);
    cudaFreeHost(c->seg_host);
    cudaFree(c->seg_dev);
    for (int i = 0; i < 2; i++)
        if (c->s[i])
            cudaStreamDestroy(c->s[i]);
    if (c->up_done)
        cudaEventDestroy(c->up_done);
    if (c->seg_done)
        cudaEventDestroy(c->seg_done);
    free(c);
    return (int)r;
}

static void kc_fini(void *ctx)
{
    kc_ctx *c = (kc_ctx *)ctx;
    if (!c)
        return;
    cudaSetDevice(c->dev);
    for (int i = 0; i < 2; i++) {
        cudaStreamSynchronize(c->s[i]);
        cudaStreamDestroy(c->s[i]);
    }
    cudaEventDestroy(c->up_done);
    cudaEventDestroy(c->seg_done);
    cudaFreeHost(c->seg_host);
    cudaFree(c->seg_dev);
    free(c);
}

static int kc_info(void *ctx, char *name, size_t n, size_t *mem_free)
{
    kc_ctx *c = (kc_ctx *)ctx;
    cudaDeviceProp p;
    size_t fr = 0, total = 0;
    char *msg = name;
    KC_TRY(cudaSetDevice(c->dev), "cudaSetDevice");
    KC_TRY(cudaGetDeviceProperties(&p, c->dev), "cudaGetDeviceProperties");
    KC_TRY(cudaMemGetInfo(&fr, &total), "cudaMemGetInfo");
    snprintf(name, n, "%s (sm_%d%d, %.0f GiB)", p.name, p.major, p.minor,
             (double)total / (1u << 30));
    *mem_free = fr;
    return 0;
}

static int kc_alloc(void *ctx, size_t bytes, void **dev, char *msg, size_t n)
{
    KC_TRY(cudaSetDevice(((kc_ctx *)ctx)->dev), "cudaSetDevice");
    KC_TRY(cudaMalloc(dev, bytes), "cudaMalloc");
    return 0;
}

static void kc_free(void *ctx, void *dev)
{
    cudaSetDevice(((kc_ctx *)ctx)->dev);
    cudaFree(dev);
}

static int kc_host_alloc(void *ctx, size_t bytes, void **host, char *msg, size_t n)
{
    KC_TRY(cudaSetDevice(((kc_ctx *)ctx)->dev), "cudaSetDevice");
    KC_TRY(cudaMallocHost(host, bytes), "cudaMallocHost");
    return 0;
}

static void kc_host_free(void *ctx, void *host)
{
    (void)ctx;
    cudaFreeHost(host);
}

static int kc_copy(void *ctx, void *dst, const void *src, size_t bytes, int dir, int stream,
                   char *msg, size_t n)
{
    kc_ctx *c = (kc_ctx *)ctx;
    const cudaMemcpyKind kind = dir == KGPU_H2D   ? cudaMemcpyHostToDevice
                                : dir == KGPU_D2H ? cudaMemcpyDeviceToHost
                                                  : cudaMemcpyDeviceToDevice;
    KC_TRY(cudaSetDevice(c->dev), "cudaSetDevice");
    KC_TRY(cudaMemcpyAsync(dst, src, bytes, kind, c->s[stream ? 1 : 0]), "cudaMemcpyAsync");
    return 0;
}

static int kc_fence(void *ctx, char *msg, size_t n)
{
    kc_ctx *c = (kc_ctx *)ctx;
    KC_TRY(cudaSetDevice(c->dev), "cudaSetDevice");
    KC_TRY(cudaEventRecord(c->up_done, c->s[KGPU_UPLOAD]), "cudaEventRecord");
    KC_TRY(cudaStreamWaitEvent(c->s[KGPU_COMPUTE], c->up_done, 0), "cudaStreamWaitEvent");
    return 0;
}

static int kc_sync(void *ctx, int stream, char *msg, size_t n)
{
    kc_ctx *c = (kc_ctx *)ctx;
    KC_TRY(cudaSetDevice(c->dev), "cudaSetDevice");
    KC_TRY(cudaStreamSynchronize(c->s[stream ? 1 : 0]), "cudaStreamSynchronize");
    return 0;
}

static int kc_ffn(void *ctx, const kgpu_ffn_t *f, char *msg, size_t n)
{
    kc_ctx *c = (kc_ctx *)ctx;
    cudaStream_t s = c->s[KGPU_COMPUTE];
    KC_TRY(cudaSetDevice(c->dev), "cudaSetDevice");
    /* the previous call's table may still be on its way to the device */
    KC_TRY(cudaEventSynchronize(c->seg_done), "cudaEventSynchronize");
    memcpy(c->seg_host, f->segs, sizeof(kgpu_seg_t) * f->n_segs);
    KC_TRY(cudaMemcpyAsync(c->seg_dev, c->seg_host, sizeof(kgpu_seg_t) * f->n_segs,
                           cudaMemcpyHostToDevice, s),
           "cudaMemcpyAsync");
    KC_TRY(cudaEventRecord(c->seg_done, s), "cudaEventRecord");
    const dim3 blk(KC_WARPS * 32);
    const dim3 g1((f->n_ff + KC_WARPS - 1) / KC_WARPS, f->n_segs);
    kc_grouped<true><<<g1, blk, 0, s>>>(c->seg_dev, f->gate_type, f->up_type,
                                        kgpu_row_bytes(f->gate_type, f->n_embd),
                                        kgpu_row_bytes(f->up_type, f->n_embd), f->n_ff,
                                        f->n_embd, f->x, f->h);
    KC_TRY(cudaGetLastError(), "gate/up kernel launch");
    const dim3 g2((f->n_embd + KC_WARPS - 1) / KC_WARPS, f->n_segs);
    kc_grouped<false><<<g2, blk, 0, s>>>(c->seg_dev, f->down_type, f->down_type,
                                         kgpu_row_bytes(f->down_type, f->n_ff), 0, f->n_embd,
                                         f->n_ff, f->h, f->y);
    KC_TRY(cudaGetLastError(), "down kernel launch");
    return 0;
}

static const kgpu_api_t kc_api = {
    KGPU_ABI, kc_init,       kc_fini,      kc_info,  kc_alloc, kc_free,
    kc_host_alloc, kc_host_free, kc_copy, kc_fence, kc_sync,  kc_ffn,
};

extern "C" __attribute__((visibility("default"))) const kgpu_api_t *kcuda_api(void)
{
    return &kc_api;
}
