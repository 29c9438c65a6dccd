/* resident.h - which pages of a file or mapping are in memory, and moving
 * a file into or out of the page cache.
 *
 * A timing that reads weights through the page cache is a timing of the
 * disk when the pages are not there: ecs-plan's phase timing on the full
 * model read cold worker copies (the GGUF, the one-process copy and the
 * layouts' worker copies exceed the page cache together) and took 50 ms a
 * layer call instead of ~1.5 (docs/benchmarks.md, "Quiet run of
 * 2026-12-02"). These let a measuring tool bring what it times in first,
 * say how much of it was resident (mincore), and drop what it no longer
 * reads when everything does not fit.
 *
 *     uint64_t res, bytes;
 *     if (ecs_file_warm(path, NULL) == ECS_OK &&
 *         ecs_file_resident(path, &res, &bytes) == ECS_OK)
 *         printf("%.0f %% resident\n", 100.0 * res / bytes);
 *
 * Page-cache state on tmpfs (and other memory file systems) cannot be
 * dropped: ecs_file_evict succeeds there and the pages stay resident. */
#ifndef ECS_RESIDENT_H
#define ECS_RESIDENT_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"

/* Bytes of [p, p + n) in memory (those of its bytes whose page is
 * resident; file-backed mappings report the page cache, mapped here or
 * not). n == 0: 0. */
ecs_err_t ecs_resident(const void *p, size_t n, uint64_t *resident);

/* Reads one byte a page of [p, p + n) (advised WILLNEED first), so that
 * the range is resident. */
void ecs_touch(const void *p, size_t n);

/* Bytes of the file at path in the page cache, and its size (either
 * pointer may be NULL). */
ecs_err_t ecs_file_resident(const char *path, uint64_t *resident, uint64_t *bytes);

/* Reads every page of the file through a shared mapping advised for huge
 * pages, as the programs that map weights read them (the page cache then
 * holds the same folio sizes as their own faults would bring); *secs, if
 * not NULL: how long it took. */
ecs_err_t ecs_file_warm(const char *path, double *secs);

/* Asks the kernel to drop the file's clean pages in [off, off + len)
 * (len 0: to the end) from the page cache. Pages a process has mapped
 * stay: see ecs_unmap_pages for this process's own mapping. */
ecs_err_t ecs_file_evict(const char *path, uint64_t off, uint64_t len);

/* Drops this process's page-table entries of [p, p + n) of a read-only
 * shared file mapping (the whole pages inside the range), so that
 * ecs_file_evict can drop the pages; a later read faults them in again. */
void ecs_unmap_pages(const void *p, size_t n);

/* Bytes of the mapping holding p that are mapped with 2 MB pages of a
 * file (FilePmdMapped of its entry in /proc/self/smaps), -1 if unknown. */
int64_t ecs_huge_mapped(const void *p);

/* What ecs_huge_refresh found: 2 MB regions of the range that were in
 * the page cache (regions), those mapped through small pages (small), and
 * those of them read back into 2 MB pages (refreshed). */
typedef struct {
    uint64_t regions, small, refreshed;
    double secs;
} ecs_huge_refresh_t;

/* For a read-only shared or private mapping [base, base + n) of the whole
 * file at path, advised MADV_HUGEPAGE: finds its resident 2 MB regions
 * that the page cache holds in folios smaller than 2 MB (a file written,
 * read in small pieces, or partly evicted and read back), which every
 * read then reaches through 4 KB pages, and drops and reads those back so
 * that they are mapped with 2 MB pages. Touches no region that is not
 * resident (a model larger than memory stays as it is); drops no page
 * another process maps; stops after two chunks that did not get better
 * (a kernel or file system without large folios for files, or tmpfs).
 * Leaves the range unmapped in this process (a later read faults it in).
 * Best effort: the result says what happened. */
void ecs_huge_refresh(const void *base, size_t n, const char *path, ecs_huge_refresh_t *out);

/* One line for the user: what ecs_huge_refresh did to path (snprintf's
 * result). */
int ecs_huge_refresh_say(const ecs_huge_refresh_t *hr, const char *path, char *buf, size_t n);

/* MemAvailable of /proc/meminfo in bytes (what the page cache and new
 * allocations can have without swapping), 0 if unknown. */
uint64_t ecs_mem_available(void);

#endif
