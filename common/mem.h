/* mem.h - memory for hot buffers.
 *
 * ecs_alloc_huge gives step buffers (workspaces, expert scratch) whole
 * 2 MB pages where the kernel has them: a prompt step reads tens of MB of
 * them in scattered rows, a TLB miss every 4 KB otherwise.
 *
 *     float *buf = ecs_alloc_huge(n * sizeof *buf);
 *     if (!buf) return ecs_error(ECS_ERR_NOMEM, "...");
 *     ...
 *     free(buf);
 */
#ifndef ECS_MEM_H
#define ECS_MEM_H

#include <stddef.h>

/* At least bytes of memory (not zeroed), 2 MB aligned, transparent huge
 * pages advised; NULL when out of memory. free() releases it. */
void *ecs_alloc_huge(size_t bytes);

/* Keeps large freed blocks in the process (glibc: mmap threshold 64 MB,
 * trim threshold 512 MB). The daemons move multi-MB messages every layer
 * (a 512-row call's f32 results: ~8 MB per worker with 3 workers); with
 * glibc's defaults such a block may come from mmap, or the heap top be
 * given back, and every message is then faulted in again page by page.
 * Measured (docs/benchmarks.md, "Capacity planner against the measured
 * runs"): 3 workers' pp512 ran in one of two states per process, 92k
 * page faults and ~600 tok/s or 51k and ~1000; with this, 28k and
 * 830-1050 in 3 of 3. Call once at the start of main, before threads. */
void ecs_mem_keep_large(void);

#endif
