/* resident.c - page-cache residency and warming of files (resident.h). */
#include "common/resident.h"

#include <errno.h>
#include <fcntl.h>
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
