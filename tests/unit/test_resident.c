/* test_resident.c - page residency (common/resident.h): mincore's count
 * on memory whose pages are known to be in or out, a file read in by
 * ecs_file_warm, and dropped by ecs_file_evict (on a file system whose
 * page cache can drop pages; on tmpfs the pages must stay). */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/resident.h"

static size_t pg(void) { return (size_t)sysconf(_SC_PAGESIZE); }

Test(resident, counts_the_touched_pages_of_anonymous_memory)
{
    const size_t P = pg(), n = 64 * P;
    unsigned char *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(m != MAP_FAILED);
    madvise(m, n, MADV_NOHUGEPAGE); /* one huge page would make all 64 resident */
    uint64_t r = 1;
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(r, 0, "untouched: %llu", (unsigned long long)r);
    for (size_t i = 0; i < 16; i++)
        m[i * 4 * P] = 1; /* every 4th page */
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK);
    cr_assert_eq(r, 16 * P, "%llu", (unsigned long long)r);
    /* a range inside a page counts that page, capped at the range */
    cr_assert_eq(ecs_resident(m + 10, 100, &r), ECS_OK);
    cr_assert_eq(r, 100);
    cr_assert_eq(ecs_resident(m + P + 10, 100, &r), ECS_OK);
    cr_assert_eq(r, 0);
    cr_assert_eq(ecs_resident(m, 0, &r), ECS_OK);
    cr_assert_eq(r, 0);
    /* ecs_touch brings in a range not written yet */
    ecs_touch(m + P, 2 * P);
    cr_assert_eq(ecs_resident(m + P, 2 * P, &r), ECS_OK);
    cr_assert_eq(r, 2 * P, "%llu", (unsigned long long)r);
    munmap(m, n);
}

/* A file of n bytes on disk, written and synced (clean pages). */
static void make_file(char *path, size_t cap, size_t n)
{
    snprintf(path, cap, "%s/ecs-resident-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    const int fd = mkstemp(path);
    cr_assert(fd >= 0);
    unsigned char *buf = malloc(n);
    cr_assert(buf);
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)(i * 7);
    cr_assert_eq(write(fd, buf, n), (ssize_t)n);
    cr_assert_eq(fdatasync(fd), 0);
    free(buf);
    close(fd);
}

static bool pages_stay(const char *path)
{
    struct statfs s;
    cr_assert_eq(statfs(path, &s), 0);
    return s.f_type == TMPFS_MAGIC || s.f_type == RAMFS_MAGIC;
}

Test(resident, a_file_read_in_dropped_and_read_in_again)
{
    char path[4096];
    const size_t n = 256 * pg() + 123;
    make_file(path, sizeof path, n);
    const bool stay = pages_stay(path);
    uint64_t r = 0, b = 0;
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(ecs_file_resident(path, &r, &b), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(b, n);
    cr_assert_eq(r, stay ? n : 0, "after evict: %llu of %zu", (unsigned long long)r, n);
    double s = -1;
    cr_assert_eq(ecs_file_warm(path, &s), ECS_OK, "%s", ecs_errmsg());
    cr_assert(s >= 0);
    cr_assert_eq(ecs_file_resident(path, &r, &b), ECS_OK);
    cr_assert_eq(r, n, "after warm: %llu of %zu", (unsigned long long)r, n);
    /* half of it dropped: the other half stays */
    cr_assert_eq(ecs_file_evict(path, 0, 128 * pg()), ECS_OK);
    cr_assert_eq(ecs_file_resident(path, &r, NULL), ECS_OK);
    cr_assert_eq(r, stay ? n : n - 128 * pg(), "%llu", (unsigned long long)r);
    unlink(path);
}

Test(resident, pages_this_process_maps_are_dropped_after_unmap_pages)
{
    char path[4096];
    const size_t n = 64 * pg();
    make_file(path, sizeof path, n);
    const bool stay = pages_stay(path);
    const int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    const unsigned char *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert(m != MAP_FAILED);
    ecs_touch(m, n);
    uint64_t r = 0;
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK);
    cr_assert_eq(r, n);
    /* mapped here, evicting the file leaves the mapped pages */
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK);
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK);
    cr_assert_eq(r, n, "mapped pages were dropped: %llu", (unsigned long long)r);
    /* after the page-table entries go, they can */
    ecs_unmap_pages(m, n);
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK);
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK);
    cr_assert_eq(r, stay ? n : 0, "%llu", (unsigned long long)r);
    /* and a read faults them in again, the same bytes */
    cr_assert_eq(m[5 * pg() + 3], (unsigned char)((5 * pg() + 3) * 7));
    munmap((void *)m, n);
    unlink(path);
}

Test(resident, errors_name_the_file)
{
    uint64_t r, b;
    cr_assert_eq(ecs_file_resident("/nonexistent/ecs-x", &r, &b), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "/nonexistent/ecs-x"));
    cr_assert_eq(ecs_file_warm("/nonexistent/ecs-x", NULL), ECS_ERR_IO);
    cr_assert_eq(ecs_file_evict("/nonexistent/ecs-x", 0, 0), ECS_ERR_IO);
    cr_assert_eq(ecs_file_resident("/tmp", &r, &b), ECS_ERR_IO); /* a directory */
    cr_assert(ecs_mem_available() > 0);
}

/* A file of n bytes mapped shared and advised for 2 MB pages (NULL when
 * the kernel did not place it at a 2 MB boundary). */
static const unsigned char *map_huge(const char *path, size_t n)
{
    const int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    unsigned char *m = mmap(NULL, n, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    cr_assert(m != MAP_FAILED);
    if ((uintptr_t)m & ((2u << 20) - 1)) {
        munmap(m, n);
        return NULL;
    }
    madvise(m, n, MADV_HUGEPAGE);
    return m;
}

/* The page cache of the whole file in 4 KB folios: dropped, then read
 * 4 KB at a time without read-ahead. */
static void cache_small(const char *path, size_t n)
{
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK);
    const int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0);
    posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    char buf[4096];
    for (size_t o = 0; o < n; o += sizeof buf)
        cr_assert_eq(pread(fd, buf, sizeof buf, (off_t)o), (ssize_t)sizeof buf);
    close(fd);
}

/* A file cached in 4 KB folios (as a partly evicted and re-read one)
 * reads through 4 KB pages; ecs_huge_refresh reads it back in 2 MB ones,
 * the same bytes, and leaves a file that is not resident unread. Skipped
 * by name where the kernel or file system gives files no 2 MB pages. */
Test(resident, huge_refresh_maps_a_fragmented_cache_with_2mb_pages)
{
    char path[4096];
    const size_t H = 2u << 20, n = 16 * H;
    make_file(path, sizeof path, n);
    /* can this file be mapped with 2 MB pages at all? */
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK);
    const unsigned char *m = map_huge(path, n);
    if (m) {
        (void)*(const volatile unsigned char *)m;
        if (ecs_huge_mapped(m) < (int64_t)H) {
            munmap((void *)m, n);
            m = NULL;
        }
    }
    if (!m) {
        unlink(path);
        cr_skip_test("no 2 MB pages for files here (kernel, file system or placement)");
    }
    munmap((void *)m, n);
    cache_small(path, n);
    m = map_huge(path, n);
    cr_assert(m);
    ecs_touch(m, n);
    cr_assert_eq(ecs_huge_mapped(m), 0, "4 KB folios mapped with 2 MB pages");
    ecs_huge_refresh_t hr;
    ecs_huge_refresh(m, n, path, &hr);
    cr_assert_eq(hr.regions, 16, "%llu regions", (unsigned long long)hr.regions);
    cr_assert_eq(hr.small, 16);
    cr_assert_eq(hr.refreshed, 16, "%llu refreshed", (unsigned long long)hr.refreshed);
    ecs_touch(m, n);
    cr_assert_eq(ecs_huge_mapped(m), (int64_t)n, "%lld bytes in 2 MB pages",
                 (long long)ecs_huge_mapped(m));
    for (size_t o = 0; o < n; o += 4099)
        cr_assert_eq(m[o], (unsigned char)(o * 7));
    /* in 2 MB folios now: nothing to do */
    ecs_huge_refresh(m, n, path, &hr);
    cr_assert(hr.regions == 16 && hr.small == 0 && hr.refreshed == 0);
    /* not resident: nothing read */
    ecs_unmap_pages(m, n);
    cr_assert_eq(ecs_file_evict(path, 0, 0), ECS_OK);
    ecs_huge_refresh(m, n, path, &hr);
    uint64_t r = 1;
    cr_assert_eq(ecs_resident(m, n, &r), ECS_OK);
    cr_assert(hr.regions == 0 && r == 0, "%llu regions, %llu bytes read",
              (unsigned long long)hr.regions, (unsigned long long)r);
    munmap((void *)m, n);
    unlink(path);
}
