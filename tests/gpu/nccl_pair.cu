/* nccl_pair.cu - the NCCL data plane's first check: two ranks (one thread
 * each, as the worker and the coordinator will each drive one communicator
 * from one thread) exchange a payload with ncclSend / ncclRecv, both ways,
 * and verify every value. Built and run by tests/gpu/run.sh only (it links
 * libnccl, which nothing else in the tree does). Ranks go on devices 0 and
 * 1; with one GPU both go on device 0, which NCCL may refuse (duplicate
 * GPU): that is reported as SKIP with NCCL's own message.
 * Prints one line: CHECK / SKIP / FAIL nccl_pair ... */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define N_VALUES (1 << 22) /* 16 MiB of f32 each way */

struct rank_t {
    int rank, dev;
    ncclUniqueId id;
    ncclResult_t nr;
    cudaError_t cr;
    long bad;
    double seconds;
};

static float value(int from, long i) { return (float)(from * 1000003L + i % 999983L); }

static void *run_rank(void *arg)
{
    rank_t *r = (rank_t *)arg;
    const int peer = 1 - r->rank;
    ncclComm_t comm = NULL;
    cudaStream_t s = NULL;
    float *send = NULL, *recv = NULL, *host = (float *)malloc(sizeof(float) * N_VALUES);
    struct timespec t0, t1;
    if (!host || (r->cr = cudaSetDevice(r->dev)) != cudaSuccess ||
        (r->cr = cudaStreamCreate(&s)) != cudaSuccess ||
        (r->cr = cudaMalloc((void **)&send, sizeof(float) * N_VALUES)) != cudaSuccess ||
        (r->cr = cudaMalloc((void **)&recv, sizeof(float) * N_VALUES)) != cudaSuccess)
        goto out;
    for (long i = 0; i < N_VALUES; i++)
        host[i] = value(r->rank, i);
    if ((r->cr = cudaMemcpy(send, host, sizeof(float) * N_VALUES, cudaMemcpyHostToDevice)) !=
        cudaSuccess)
        goto out;
    if ((r->nr = ncclCommInitRank(&comm, 2, r->id, r->rank)) != ncclSuccess)
        goto out;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* both directions in one group: no ordering deadlock between the ranks */
    if ((r->nr = ncclGroupStart()) != ncclSuccess ||
        (r->nr = ncclSend(send, N_VALUES, ncclFloat, peer, comm, s)) != ncclSuccess ||
        (r->nr = ncclRecv(recv, N_VALUES, ncclFloat, peer, comm, s)) != ncclSuccess ||
        (r->nr = ncclGroupEnd()) != ncclSuccess)
        goto out;
    if ((r->cr = cudaStreamSynchronize(s)) != cudaSuccess)
        goto out;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    r->seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if ((r->cr = cudaMemcpy(host, recv, sizeof(float) * N_VALUES, cudaMemcpyDeviceToHost)) !=
        cudaSuccess)
        goto out;
    for (long i = 0; i < N_VALUES; i++)
        r->bad += host[i] != value(peer, i);
out:
    if (comm)
        ncclCommDestroy(comm);
    cudaFree(send);
    cudaFree(recv);
    if (s)
        cudaStreamDestroy(s);
    free(host);
    return NULL;
}

int main(void)
{
    int ndev = 0;
    const cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("SKIP nccl_pair: no GPU (cudaGetDeviceCount: %s)\n",
               e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        return 0;
    }
    rank_t r[2];
    memset(r, 0, sizeof r);
    ncclUniqueId id;
    ncclResult_t nr = ncclGetUniqueId(&id);
    if (nr != ncclSuccess) {
        printf("FAIL nccl_pair: ncclGetUniqueId: %s\n", ncclGetErrorString(nr));
        return 1;
    }
    pthread_t th[2];
    for (int i = 0; i < 2; i++) {
        r[i].rank = i;
        r[i].dev = ndev >= 2 ? i : 0;
        r[i].id = id;
        pthread_create(&th[i], NULL, run_rank, &r[i]);
    }
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++) {
        if (r[i].nr == ncclInvalidUsage && ndev < 2) {
            printf("SKIP nccl_pair: one GPU, and NCCL refuses two ranks on it (%s)\n",
                   ncclGetErrorString(r[i].nr));
            return 0;
        }
        if (r[i].nr != ncclSuccess || r[i].cr != cudaSuccess || r[i].bad) {
            printf("FAIL nccl_pair: rank %d on cuda:%d: nccl %s, cuda %s, %ld wrong values\n", i,
                   r[i].dev, ncclGetErrorString(r[i].nr), cudaGetErrorString(r[i].cr), r[i].bad);
            return 1;
        }
    }
    const double mib = sizeof(float) * (double)N_VALUES / (1 << 20);
    const double sec = r[0].seconds > r[1].seconds ? r[0].seconds : r[1].seconds;
    printf("CHECK nccl_pair: ranks on cuda:%d and cuda:%d, %.0f MiB each way verified, %.2f GB/s "
           "per direction (first transfer, setup included)\n",
           r[0].dev, r[1].dev, mib, mib * 1.048576e-3 / sec);
    return 0;
}
