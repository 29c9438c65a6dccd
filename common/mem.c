/* mem.c - huge-page allocations and malloc settings (mem.h). */
#include <malloc.h>
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

void ecs_mem_keep_large(void)
{
    /* fixed values also stop glibc's dynamic threshold from moving */
    mallopt(M_MMAP_THRESHOLD, 64 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
}
