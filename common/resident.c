/* resident.c - page-cache residency and warming of files (resident.h). */
#include "common/resident.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static size_t page_size(void)
{
    const long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* mincore's vector for this many pages at a time (64 MB of 4 KB pages) */
#define RES_CHUNK_PAGES 16384

ecs_err_t ecs_resident(const void *p, size_t n, uint64_t *resident)
{
    *resident = 0;
    if (n == 0)
        return ECS_OK;
    const size_t pg = page_size();
    const uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    const uintptr_t hi = ((uintptr_t)p + n + pg - 1) & ~(uintptr_t)(pg - 1);
    unsigned char vec[RES_CHUNK_PAGES];
    for (uintptr_t a = lo; a < hi;) {
        const size_t pages = (hi - a) / pg < RES_CHUNK_PAGES ? (hi - a) / pg : RES_CHUNK_PAGES;
        if (mincore((void *)a, pages * pg, vec) != 0)
            return ecs_error(ECS_ERR_IO, "mincore of %zu bytes: %s", pages * pg,
                             strerror(errno));
        /* the bytes of the range in each resident page */
        const uintptr_t s = (uintptr_t)p, e = (uintptr_t)p + n;
        for (size_t i = 0; i < pages; i++) {
            const uintptr_t b0 = a + i * pg, b1 = b0 + pg;
            if (vec[i] & 1)
                *resident += (b1 < e ? b1 : e) - (b0 > s ? b0 : s);
        }
        a += pages * pg;
    }
    return ECS_OK;
}

void ecs_touch(const void *p, size_t n)
{
    if (n == 0)
        return;
    const size_t pg = page_size();
    const uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(pg - 1);
    madvise((void *)lo, (uintptr_t)p + n - lo, MADV_WILLNEED);
    const volatile unsigned char *b = p;
    unsigned char acc = b[0];
    /* the first byte of every page the range overlaps */
    for (uintptr_t a = lo + pg; a < (uintptr_t)p + n; a += pg)
        acc ^= *(const volatile unsigned char *)a;
    volatile unsigned char sink = acc;
    (void)sink;
}

/* Maps path read-only and shared; *len its size (a 0-byte file: NULL, OK). */
static ecs_err_t map_file(const char *path, void **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    ecs_err_t e = ECS_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        e = ecs_error(ECS_ERR_IO, "%s: not a regular file", path);
    } else if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            e = ecs_error(ECS_ERR_IO, "%s: mmap: %s", path, strerror(errno));
        else
            *out = p, *len = (size_t)st.st_size;
    }
    close(fd);
    return e;
}

ecs_err_t ecs_file_resident(const char *path, uint64_t *resident, uint64_t *bytes)
{
    void *p;
    size_t n;
    uint64_t r = 0;
    ecs_err_t e = map_file(path, &p, &n);
    if (e == ECS_OK && p) {
        e = ecs_resident(p, n, &r);
        munmap(p, n);
    }
    if (resident)
        *resident = r;
    if (bytes)
        *bytes = n;
    return e;
}

ecs_err_t ecs_file_warm(const char *path, double *secs)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    void *p;
    size_t n;
    ecs_err_t e = map_file(path, &p, &n);
    if (e != ECS_OK)
        return e;
    if (p) {
        madvise(p, n, MADV_HUGEPAGE);
        ecs_touch(p, n);
        munmap(p, n);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (secs)
        *secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    return ECS_OK;
}

ecs_err_t ecs_file_evict(const char *path, uint64_t off, uint64_t len)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "%s: %s", path, strerror(errno));
    const int rc = posix_fadvise(fd, (off_t)off, (off_t)len, POSIX_FADV_DONTNEED);
    close(fd);
    if (rc != 0)
        return ecs_error(ECS_ERR_IO, "%s: posix_fadvise: %s", path, strerror(rc));
    return ECS_OK;
}

void ecs_unmap_pages(const void *p, size_t n)
{
    const size_t pg = page_size();
    const uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(uintptr_t)(pg - 1);
    const uintptr_t hi = ((uintptr_t)p + n) & ~(uintptr_t)(pg - 1);
    if (hi > lo)
        madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

/* ----------------------------------------------- 2 MB pages of a file */

#define HUGE_BYTES ((uintptr_t)2 << 20)

/* Bytes mapped with 2 MB pages of a file (FilePmdMapped in
 * /proc/self/smaps) in the mappings that overlap [lo, hi), -1 if none
 * says. */
static int64_t huge_mapped_range(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f)
        return -1;
    char line[512];
    bool in = false, seen = false;
    int64_t sum = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long a, b;
        long kb;
        if (sscanf(line, "%lx-%lx ", &a, &b) == 2)
            in = a < hi && b > lo;
        else if (in && sscanf(line, "FilePmdMapped: %ld kB", &kb) == 1)
            sum += (int64_t)kb * 1024, seen = true;
    }
    fclose(f);
    return seen ? sum : -1;
}

int64_t ecs_huge_mapped(const void *p)
{
    return huge_mapped_range((uintptr_t)p, (uintptr_t)p + 1);
}

/* Regions tested with one read of smaps: 64 MB (a bit each in a mask). */
#define REFRESH_REGIONS 32
#define REFRESH_CHUNK (REFRESH_REGIONS * HUGE_BYTES)

/* The 2 MB regions of [c, c + len) with a resident page (a bit each). */
static uint32_t chunk_resident(uintptr_t c, size_t len)
{
    const size_t pg = page_size(), per = HUGE_BYTES / pg;
    unsigned char vec[RES_CHUNK_PAGES];
    uint32_t mask = 0;
    for (size_t k = 0; k * HUGE_BYTES < len; k++) {
        if (per > RES_CHUNK_PAGES || mincore((void *)(c + k * HUGE_BYTES), HUGE_BYTES, vec) != 0)
            return 0;
        for (size_t i = 0; i < per; i++)
            if (vec[i] & 1) {
                mask |= 1u << k;
                break;
            }
    }
    return mask;
}

/* Reads a byte of each region in mask (a resident page where the region
 * has one: the fault maps what the page cache holds there); how many of
 * them are then mapped with a 2 MB page (the chunk being the mapping's
 * only part mapped here). */
static uint64_t chunk_huge(uintptr_t c, size_t len, uint32_t mask)
{
    const size_t pg = page_size(), per = HUGE_BYTES / pg;
    unsigned char vec[RES_CHUNK_PAGES];
    for (size_t k = 0; k < REFRESH_REGIONS; k++) {
        if (!(mask >> k & 1))
            continue;
        const uintptr_t r = c + k * HUGE_BYTES;
        size_t i = 0;
        if (per <= RES_CHUNK_PAGES && mincore((void *)r, HUGE_BYTES, vec) == 0)
            while (i < per && !(vec[i] & 1))
                i++;
        (void)*(const volatile unsigned char *)(r + (i < per ? i : 0) * pg);
    }
    const int64_t h = huge_mapped_range(c, c + len);
    return h > 0 ? (uint64_t)h / HUGE_BYTES : 0;
}

static uint64_t popcount32(uint32_t x) { return (uint64_t)__builtin_popcount(x); }

void ecs_huge_refresh(const void *base, size_t n, const char *path, ecs_huge_refresh_t *out)
{
    *out = (ecs_huge_refresh_t){0};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const uintptr_t b = (uintptr_t)base;
    const uintptr_t lo = (b + HUGE_BYTES - 1) & ~(HUGE_BYTES - 1);
    const uintptr_t hi = (b + n) & ~(HUGE_BYTES - 1);
    /* 2 MB pages map file offsets that are multiples of 2 MB at addresses
     * that are (the kernel places large file mappings so) */
    if ((b & (HUGE_BYTES - 1)) || hi <= lo || ecs_huge_mapped(base) < 0)
        return;
    ecs_unmap_pages((const void *)lo, hi - lo); /* smaps then counts one chunk */
    for (uintptr_t c = lo, fails = 0; c < hi && fails < 2; c += REFRESH_CHUNK) {
        const size_t len = hi - c < REFRESH_CHUNK ? hi - c : REFRESH_CHUNK;
        const uint32_t mask = chunk_resident(c, len);
        const uint64_t want = popcount32(mask), huge = mask ? chunk_huge(c, len, mask) : 0;
        out->regions += want;
        if (huge < want) {
            out->small += want - huge;
            ecs_unmap_pages((const void *)c, len);
            /* the regions that were resident, read back in 2 MB folios */
            const uint64_t huge2 = ecs_file_evict(path, c - b, len) == ECS_OK
                                       ? chunk_huge(c, len, mask) : 0;
            out->refreshed += huge2 > huge ? huge2 - huge : 0;
            fails = huge2 > huge ? 0 : fails + 1;
        }
        ecs_unmap_pages((const void *)c, len);
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    out->secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

int ecs_huge_refresh_say(const ecs_huge_refresh_t *hr, const char *path, char *buf, size_t n)
{
    return snprintf(buf, n, "%s: %llu of %llu resident 2 MB regions were cached in small pages, "
                    "%llu read back in 2 MB pages (%.2f s)", path, (unsigned long long)hr->small,
                    (unsigned long long)hr->regions, (unsigned long long)hr->refreshed, hr->secs);
}

uint64_t ecs_mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            break;
    fclose(f);
    return (uint64_t)kb * 1024;
}
