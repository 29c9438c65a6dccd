/* gpu.h - the CUDA expert backend, seen from plain C: the grouped expert FFN
 * call, its CPU reference, and a loader for the CUDA shared object.
 *
 * Contract
 * - One call computes y = down(silu(gate x) * up x) for every row of every
 *   segment; a segment is one expert's weights and a contiguous range of
 *   rows of x / y (the caller gathers rows by expert, as the local backend
 *   does). All segments of a call share the three weight types and shapes.
 *   Outputs are per row and unweighted: the caller sums routing slots.
 * - Weights are in the GGUF block layouts of common/quant.h (Q4_K, Q5_K,
 *   Q6_K, Q5_0, Q8_0, F16, BF16) and are dequantized inside the kernel;
 *   activations and math are f32.
 * - kgpu_ffn_ref is the reference every GPU result is compared with: weights
 *   dequantized by common/quant.h's reference code, f32 sums in index order.
 * - libecs_cuda.so (built only where nvcc exists) is loaded with dlopen by
 *   kgpu_open, so a binary that never opens a device does not need CUDA at
 *   all. Every failure (no .so, no libcudart, no driver, no device:
 *   cudaGetDeviceCount's error or a count of 0) is an ecs_err_t with a
 *   message naming the cause.
 * - kgpu_open with opts.emulate runs the same interface on the host (device
 *   memory is host memory, the FFN is kgpu_ffn_ref): callers of the device
 *   API, such as the tiered executor, are tested on machines without a GPU.
 * - Device memory and pinned host memory are allocated at start-up by the
 *   caller through kgpu_alloc / kgpu_host_alloc; kgpu_ffn allocates nothing.
 *
 * Usage
 *   kgpu_opts_t o = {.device = 0, .max_segs = 64};
 *   kgpu_t *g;
 *   if (kgpu_open(&o, &g) != ECS_OK) { warn("%s", ecs_errmsg()); use the CPU; }
 *   kgpu_alloc(g, bytes, &dw);  kgpu_copy(g, dw, host_w, bytes, KGPU_H2D, KGPU_UPLOAD);
 *   kgpu_fence(g);  // compute stream waits for the uploads queued so far
 *   kgpu_ffn_t f = {types, n_embd, n_ff, segs, n_segs, n_rows, dx, dh, dy};
 *   kgpu_ffn(g, &f);  kgpu_copy(g, y, dy, ..., KGPU_D2H, KGPU_COMPUTE);
 *   kgpu_sync(g, KGPU_COMPUTE);  kgpu_close(g);
 */
#ifndef ECS_KGPU_H
#define ECS_KGPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "common/quant.h"

/* Version of kgpu_api_t; the loader refuses a .so built for another. */
#define KGPU_ABI 1
/* The symbol libecs_cuda.so exports: const kgpu_api_t *kcuda_api(void). */
#define KGPU_ENTRY "kcuda_api"

typedef struct {
    const void *gate, *up, *down; /* this expert's matrices: [n_ff][n_embd] x2, [n_embd][n_ff] */
    int32_t row0, n_rows;         /* rows [row0, row0 + n_rows) of x, h and y */
} kgpu_seg_t;

typedef struct {
    ecs_type_t gate_type, up_type, down_type;
    int n_embd, n_ff;
    const kgpu_seg_t *segs; /* host array; weight pointers on the device (the reference: host) */
    int n_segs;
    int n_rows;             /* rows of x, h, y; every segment lies inside */
    const float *x;         /* [n_rows][n_embd] */
    float *h;               /* [n_rows][n_ff] scratch (the SwiGLU output) */
    float *y;               /* [n_rows][n_embd] */
} kgpu_ffn_t;

/* Checks types, shapes and segment ranges (the same checks for the GPU and
 * the reference). */
ecs_err_t kgpu_ffn_check(const kgpu_ffn_t *f);
/* True for the weight types the kernels decode. */
bool kgpu_type_supported(ecs_type_t t);

/* CPU reference of the call, every pointer a host pointer. */
ecs_err_t kgpu_ffn_ref(const kgpu_ffn_t *f);

/* ---- the device ---- */

typedef enum { KGPU_COMPUTE = 0, KGPU_UPLOAD = 1 } kgpu_stream_t;
typedef enum { KGPU_H2D = 0, KGPU_D2H = 1, KGPU_D2D = 2 } kgpu_dir_t;

/* Segments of one call: a grid dimension of the kernels. */
#define KGPU_MAX_SEGS 65535

typedef struct {
    int device;           /* cuda:N */
    int max_segs;         /* the most segments one kgpu_ffn call may have (<= KGPU_MAX_SEGS) */
    const char *lib;      /* libecs_cuda.so to load; NULL: $ECS_CUDA_LIB, then
                           * ../lib/ next to the executable, then the loader's path */
    bool emulate;         /* host emulation (no CUDA needed) */
} kgpu_opts_t;

typedef struct kgpu kgpu_t;

ecs_err_t kgpu_open(const kgpu_opts_t *o, kgpu_t **out);
void kgpu_close(kgpu_t *g);
/* "NVIDIA H200 (sm_90, 139 GiB)" or "host emulation". */
const char *kgpu_name(const kgpu_t *g);
/* The max_segs it was opened with. */
int kgpu_max_segs(const kgpu_t *g);
/* Bytes of device memory free now (the budget is taken from this at start-up). */
size_t kgpu_mem_free(const kgpu_t *g);

/* Allocations made through g so far (device and pinned host; frees not
 * counted) and the device bytes among them: the budget check at start-up,
 * and the proof that the request path allocates nothing. */
void kgpu_alloc_stats(const kgpu_t *g, size_t *n_allocs, size_t *dev_bytes);

ecs_err_t kgpu_alloc(kgpu_t *g, size_t bytes, void **dev);
void kgpu_free(kgpu_t *g, void *dev);
ecs_err_t kgpu_host_alloc(kgpu_t *g, size_t bytes, void **host); /* pinned */
void kgpu_host_free(kgpu_t *g, void *host);
/* Asynchronous on stream s; host memory must be pinned to overlap. */
ecs_err_t kgpu_copy(kgpu_t *g, void *dst, const void *src, size_t bytes, kgpu_dir_t dir,
                    kgpu_stream_t s);
/* The compute stream waits (on the device) for what the upload stream has queued. */
ecs_err_t kgpu_fence(kgpu_t *g);
ecs_err_t kgpu_sync(kgpu_t *g, kgpu_stream_t s);
/* Queues the grouped FFN on the compute stream (x, h, y and the weights in
 * device memory; f->segs on the host, n_segs <= max_segs). */
ecs_err_t kgpu_ffn(kgpu_t *g, const kgpu_ffn_t *f);

/* ---- the shared object's interface (what libecs_cuda.so implements) ----
 * Every function returns 0 or a CUDA error code and then writes a message
 * into msg. */
typedef struct {
    uint32_t abi; /* KGPU_ABI */
    int (*init)(int device, int max_segs, void **ctx, char *msg, size_t n);
    void (*fini)(void *ctx);
    int (*info)(void *ctx, char *name, size_t n, size_t *mem_free);
    int (*alloc)(void *ctx, size_t bytes, void **dev, char *msg, size_t n);
    void (*free)(void *ctx, void *dev);
    int (*host_alloc)(void *ctx, size_t bytes, void **host, char *msg, size_t n);
    void (*host_free)(void *ctx, void *host);
    int (*copy)(void *ctx, void *dst, const void *src, size_t bytes, int dir, int stream,
                char *msg, size_t n);
    int (*fence)(void *ctx, char *msg, size_t n);
    int (*sync)(void *ctx, int stream, char *msg, size_t n);
    int (*ffn)(void *ctx, const kgpu_ffn_t *f, char *msg, size_t n); /* checked by the caller */
} kgpu_api_t;

#endif
