/* mem.c - huge-page allocations (mem.h). */
#include <stdlib.h>
#include <sys/mman.h>

#include "common/mem.h"

void *ecs_alloc_huge(size_t bytes)
{
    const size_t huge = (size_t)2 << 20, n = (bytes + huge - 1) / huge * huge;
    void *p = aligned_alloc(huge, n ? n : huge);
    if (p)
        madvise(p, n ? n : huge, MADV_HUGEPAGE);
    return p;
}
