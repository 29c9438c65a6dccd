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

#endif
