/* repack.c - the row-interleaved copy's cache file (repack.h).
 *
 * File: a header (what the copy was made from), one entry per matrix (where
 * its copy lies), an xxHash64 per KREPACK_CHUNK of the payload, then the
 * payload, each matrix's copy 4096-aligned. A copy is only ever used when
 * the whole header and entry table equal what this load expects, byte for
 * byte, and every chunk's checksum holds. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"
#include "kernels/repack/repack.h"

#define R16_MAGIC "ECSR16\0\2"
#define R16_ALIGN 4096
/* Rows packed per write: bounded memory while making the file. */
#define R16_WRITE_BYTES ((size_t)8 << 20)

typedef struct {
    char magic[8];
    uint64_t layout; /* KCPU_R16_LAYOUT */
    uint8_t fingerprint[GGUF_FINGERPRINT_BYTES];
    uint64_t src_size, src_dev, src_ino;
    int64_t src_ctime_s, src_ctime_ns, src_mtime_s, src_mtime_ns;
    uint64_t n;          /* entries that follow */
    uint64_t chunk;      /* KREPACK_CHUNK */
    uint64_t n_chunks;   /* checksums after the entries */
    uint64_t payload;    /* offset of the first copy */
    uint64_t file_bytes; /* the whole file */
} head_t;

typedef struct {
    uint64_t src;  /* the matrix's offset in the GGUF's tensor data */
    uint64_t type, nrows, ncols;
    uint64_t off;  /* its copy's offset in the cache file */
    uint64_t bytes;
} entry_t;

struct krepack {
    void *map;
    size_t bytes;
    char path[4096];
    char why[160];
    bool made;
    int cleaned;
};

static uint64_t align_up(uint64_t x) { return (x + R16_ALIGN - 1) / R16_ALIGN * R16_ALIGN; }

bool krepack_fits(const kcpu_mat_t *w)
{
    return w->data && kcpu_r16_fits(w->type, w->nrows, w->ncols) && kcpu_gemm(w->type).r16;
}

/* The lowest tensor address of the mapping: matrices are named by their
 * offset from it. */
static const uint8_t *tensor_base(const gguf_file_t *f)
{
    const uint8_t *lo = NULL;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const uint8_t *p = gguf_tensor_at(f, i)->data;
        if (!lo || p < lo)
            lo = p;
    }
    return lo;
}

/* Sizes of the parts of the file for mats: entry table end, checksum count,
 * payload offset, file size. */
typedef struct {
    size_t table; /* header + entries */
    uint64_t n_chunks, payload, file_bytes;
} layout_t;

static layout_t layout_of(kcpu_mat_t *const *mats, int n)
{
    layout_t l = {sizeof(head_t) + (size_t)n * sizeof(entry_t), 0, 0, 0};
    uint64_t rel = 0;
    for (int i = 0; i < n; i++)
        rel = align_up(rel + kcpu_r16_bytes(mats[i]->type, mats[i]->nrows, mats[i]->ncols));
    l.n_chunks = (rel + KREPACK_CHUNK - 1) / KREPACK_CHUNK;
    l.payload = align_up(l.table + l.n_chunks * sizeof(uint64_t));
    l.file_bytes = l.payload + rel;
    return l;
}

size_t krepack_file_bytes(kcpu_mat_t *const *mats, int n)
{
    return (size_t)layout_of(mats, n).file_bytes;
}

/* The header and entries the file must hold (malloc'd, l->table long). */
static void *expected_table(const krepack_opts_t *o, const struct stat *st,
                            kcpu_mat_t *const *mats, int n, const layout_t *l)
{
    uint8_t *h = calloc(1, l->table);
    if (!h)
        return NULL;
    head_t *hd = (head_t *)h;
    entry_t *e = (entry_t *)(h + sizeof *hd);
    memcpy(hd->magic, R16_MAGIC, 8);
    hd->layout = KCPU_R16_LAYOUT;
    gguf_fingerprint(o->src, hd->fingerprint);
    hd->src_size = (uint64_t)st->st_size;
    hd->src_dev = (uint64_t)st->st_dev;
    hd->src_ino = (uint64_t)st->st_ino;
    hd->src_ctime_s = (int64_t)st->st_ctim.tv_sec;
    hd->src_ctime_ns = (int64_t)st->st_ctim.tv_nsec;
    hd->src_mtime_s = (int64_t)st->st_mtim.tv_sec;
    hd->src_mtime_ns = (int64_t)st->st_mtim.tv_nsec;
    hd->n = (uint64_t)n;
    hd->chunk = KREPACK_CHUNK;
    hd->n_chunks = l->n_chunks;
    hd->payload = l->payload;
    hd->file_bytes = l->file_bytes;
    const uint8_t *base = tensor_base(o->src);
    uint64_t off = l->payload;
    for (int i = 0; i < n; i++) {
        const kcpu_mat_t *w = mats[i];
        e[i] = (entry_t){(uint64_t)((const uint8_t *)w->data - base), (uint64_t)w->type,
                         (uint64_t)w->nrows, (uint64_t)w->ncols, off,
                         kcpu_r16_bytes(w->type, w->nrows, w->ncols)};
        off = align_up(off + e[i].bytes);
    }
    return h;
}

/* ------------------------------------------------------------- checksums */

typedef struct {
    const uint8_t *file; /* the mapped file */
    const head_t *hd;
    uint64_t *sums;       /* compute: written; check: NULL */
    const uint64_t *want; /* check: the file's table */
    _Atomic int64_t bad;  /* check: lowest damaged chunk + 1, 0 if none */
} sums_t;

static uint64_t chunk_sum(const sums_t *s, int64_t c)
{
    const uint64_t at = s->hd->payload + (uint64_t)c * s->hd->chunk;
    const uint64_t len = s->hd->file_bytes - at < s->hd->chunk ? s->hd->file_bytes - at : s->hd->chunk;
    return ecs_hash64(s->file + at, (size_t)len, (uint64_t)c);
}

static void sums_item(void *arg, int item, int ith)
{
    sums_t *s = arg;
    (void)ith;
    const uint64_t h = chunk_sum(s, item);
    if (s->sums) {
        s->sums[item] = h;
    } else if (h != s->want[item]) {
        int64_t cur = atomic_load(&s->bad);
        while ((cur == 0 || cur > item + 1) &&
               !atomic_compare_exchange_weak(&s->bad, &cur, (int64_t)item + 1))
            ;
    }
}

/* sums[c] for every chunk of the mapped file (compute), or the first chunk
 * whose sum differs from the file's table + 1 (check; 0: none). */
static int64_t run_sums(ecs_threadpool_t *tp, const uint8_t *file, uint64_t *sums)
{
    const head_t *hd = (const head_t *)file;
    sums_t s = {file, hd, sums, (const uint64_t *)(file + sizeof *hd + hd->n * sizeof(entry_t)), 0};
    kcpu_par_for(tp, (int)hd->n_chunks, sums_item, &s);
    return atomic_load(&s.bad);
}

/* ------------------------------------------------------------ the file */

/* Writes all of buf at off; false (errno set) on failure. */
static bool write_at(int fd, const void *buf, size_t len, off_t off)
{
    const uint8_t *p = buf;
    while (len) {
        const ssize_t k = pwrite(fd, p, len, off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k, len -= (size_t)k, off += k;
    }
    return true;
}

/* A new temporary file for writing (O_EXCL: whatever had the name, a FIFO
 * included, is removed first, never opened). */
static int create_tmp(const char *tmp)
{
    int fd = open(tmp, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlink(tmp) == 0)
        fd = open(tmp, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0644);
    return fd;
}

/* Packs every matrix into fd at its entry's offset; false (errno) on failure. */
static bool write_payload(int fd, const entry_t *e, kcpu_mat_t *const *mats, int n, void *buf)
{
    for (int i = 0; i < n; i++) {
        const kcpu_mat_t *w = mats[i];
        const size_t group = kcpu_r16_bytes(w->type, KCPU_R16_ROWS, w->ncols);
        const int64_t rows = (int64_t)(R16_WRITE_BYTES / group) * KCPU_R16_ROWS;
        if (rows < KCPU_R16_ROWS) { /* cannot happen below 3 M values a row */
            errno = EINVAL;
            return false;
        }
        for (int64_t r = 0; r < w->nrows; r += rows) {
            const int64_t k = w->nrows - r < rows ? w->nrows - r : rows;
            kcpu_r16_pack(w, r, k, buf);
            if (!write_at(fd, buf, (size_t)(k / KCPU_R16_ROWS) * group,
                          (off_t)(e[i].off + (uint64_t)(r / KCPU_R16_ROWS) * group)))
                return false;
        }
    }
    return true;
}

/* The checksums of the written payload, into the file's table. */
static bool write_sums(int fd, ecs_threadpool_t *tp, const head_t *hd)
{
    void *p = mmap(NULL, (size_t)hd->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
    uint64_t *sums = malloc((size_t)hd->n_chunks * sizeof *sums + 1);
    bool ok = p != MAP_FAILED && sums;
    if (ok) {
        run_sums(tp, p, sums);
        ok = write_at(fd, sums, (size_t)hd->n_chunks * sizeof *sums,
                      (off_t)(sizeof *hd + hd->n * sizeof(entry_t)));
    }
    const int err = errno;
    if (p != MAP_FAILED)
        munmap(p, (size_t)hd->file_bytes);
    free(sums);
    errno = ok ? 0 : err ? err : ENOMEM;
    return ok;
}

static ecs_err_t write_copy(const krepack_opts_t *o, const char *path, const void *table,
                            kcpu_mat_t *const *mats, int n)
{
    const head_t *hd = table;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const int fd = create_tmp(tmp);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "repack: cannot create %s: %s", tmp, strerror(errno));
    void *buf = malloc(R16_WRITE_BYTES);
    bool ok = buf && write_at(fd, table, sizeof *hd + (size_t)n * sizeof(entry_t), 0) &&
              write_payload(fd, (const entry_t *)(hd + 1), mats, n, buf) &&
              ftruncate(fd, (off_t)hd->file_bytes) == 0 && write_sums(fd, o->tp, hd);
    /* written pages sit in the page cache in small folios, which decode
     * then reads through 4 KB pages (~20 % slower, docs/benchmarks.md):
     * flush and drop them so that mapping faults them in as the GGUF's */
    ok = ok && fdatasync(fd) == 0;
    if (ok)
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const int err = errno;
    const bool nomem = !buf;
    free(buf);
    if (close(fd) != 0 && ok)
        ok = false;
    if (ok && rename(tmp, path) == 0)
        return ECS_OK;
    const int err2 = ok ? errno : err;
    unlink(tmp);
    return ecs_error(ECS_ERR_IO, "repack: cannot write %s: %s", path,
                     nomem ? "out of memory" : strerror(err2 ? err2 : EIO));
}

/* Why the file's table differs from the expected one. */
static const char *table_diff(const uint8_t *got, const uint8_t *want, size_t table)
{
    const head_t *g = (const head_t *)got, *w = (const head_t *)want;
    if (memcmp(g->magic, w->magic, 8) != 0)
        return "not a copy of this format";
    if (g->layout != w->layout)
        return "made for another layout";
    if (memcmp(g->fingerprint, w->fingerprint, sizeof g->fingerprint) != 0 ||
        g->src_size != w->src_size || g->src_dev != w->src_dev || g->src_ino != w->src_ino ||
        g->src_ctime_s != w->src_ctime_s || g->src_ctime_ns != w->src_ctime_ns ||
        g->src_mtime_s != w->src_mtime_s || g->src_mtime_ns != w->src_mtime_ns)
        return "made from another file, or the GGUF changed since";
    return memcmp(got, want, table) ? "made for other matrices" : NULL;
}

/* Maps path when it is a good copy for table (its checksums checked when
 * check); else NULL with the reason in why. ECS_ERR_IO for a directory at
 * the path. */
static ecs_err_t map_existing(const krepack_opts_t *o, const char *path, const uint8_t *table,
                              bool check, void **out, char *why, size_t why_n)
{
    *out = NULL;
    const head_t *want = (const head_t *)table;
    const size_t tb = sizeof *want + want->n * sizeof(entry_t);
    /* O_NONBLOCK: a FIFO at the path must not block the open */
    const int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, why_n, errno == ENOENT ? "none found" : "cannot open the old one: %s",
                 strerror(errno));
        return ECS_OK;
    }
    struct stat st;
    ecs_err_t e = ECS_OK;
    void *p = NULL;
    if (fstat(fd, &st) != 0) {
        snprintf(why, why_n, "cannot stat the old one: %s", strerror(errno));
    } else if (S_ISDIR(st.st_mode)) {
        e = ecs_error(ECS_ERR_IO, "repack: %s is a directory, not a cache file", path);
    } else if (!S_ISREG(st.st_mode)) {
        snprintf(why, why_n, "a special file (FIFO, device or socket) was in its place");
    } else if ((uint64_t)st.st_size != want->file_bytes) {
        snprintf(why, why_n, "the old one has the wrong size (%lld bytes, %llu expected)",
                 (long long)st.st_size, (unsigned long long)want->file_bytes);
    } else {
        p = mmap(NULL, (size_t)want->file_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            snprintf(why, why_n, "cannot map the old one: %s", strerror(errno));
            p = NULL;
        }
    }
    close(fd);
    if (!p)
        return e;
    /* as the GGUF: 2 MB pages where the kernel can */
    madvise(p, (size_t)want->file_bytes, MADV_HUGEPAGE);
    const char *diff = table_diff(p, table, tb);
    int64_t bad = 0;
    if (diff)
        snprintf(why, why_n, "the old one was %s", diff);
    else if (check && (bad = run_sums(o->tp, p, NULL)) != 0)
        snprintf(why, why_n, "the old one is damaged (chunk %lld of %llu fails its checksum)",
                 (long long)bad - 1, (unsigned long long)want->n_chunks);
    if (diff || bad) {
        munmap(p, (size_t)want->file_bytes);
        return ECS_OK;
    }
    *out = p;
    return ECS_OK;
}

/* mkdir -p dir (0 or -1 with errno). */
static int make_dirs(const char *dir)
{
    char p[4096];
    const size_t n = strlen(dir);
    if (n == 0 || n >= sizeof p) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(p, dir, n + 1);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            return -1;
        *s = '/';
    }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* Removes dir/<name>.tmp.<pid> of processes that no longer exist (a load
 * killed while making the copy); returns how many. A live pid's file may be
 * a copy being made right now: kept. */
static int clean_stale(const char *dir, const char *name)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    char prefix[320];
    const int pl = snprintf(prefix, sizeof prefix, "%s.tmp.", name);
    int n = 0;
    for (struct dirent *de; pl > 0 && (size_t)pl < sizeof prefix && (de = readdir(d));) {
        if (strncmp(de->d_name, prefix, (size_t)pl) != 0)
            continue;
        const char *digits = de->d_name + pl;
        char *end;
        const long pid = strtol(digits, &end, 10);
        if (*digits < '0' || *digits > '9' || *end || pid <= 0 || pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
            continue;
        if (unlinkat(dirfd(d), de->d_name, 0) == 0)
            n++;
    }
    closedir(d);
    return n;
}

/* krepack_open with the directory locked. */
static ecs_err_t open_locked(const krepack_opts_t *o, kcpu_mat_t *const *mats, int n,
                             krepack_t **out)
{
    *out = NULL;
    const struct stat *st = gguf_stat(o->src);
    if (!st)
        return ecs_error(ECS_ERR_INVAL, "repack: %s is not a mapped file", gguf_path(o->src));
    if (n < 1 || !o->name[0] || strchr(o->name, '/'))
        return ecs_error(ECS_ERR_INVAL, "repack: nothing to copy or a bad name '%s'", o->name);
    for (int i = 0; i < n; i++)
        if (!krepack_fits(mats[i]))
            return ecs_error(ECS_ERR_INVAL, "repack: matrix %d has no interleaved layout", i);
    krepack_t *k = calloc(1, sizeof *k);
    if (!k)
        return ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    if ((size_t)snprintf(k->path, sizeof k->path, "%s/%s", o->dir, o->name) >= sizeof k->path) {
        free(k);
        return ecs_error(ECS_ERR_INVAL, "repack: cache path too long (%s)", o->dir);
    }
    const layout_t l = layout_of(mats, n);
    uint8_t *table = expected_table(o, st, mats, n, &l);
    ecs_err_t e = table ? ECS_OK : ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    if (e == ECS_OK) {
        k->cleaned = clean_stale(o->dir, o->name);
        e = map_existing(o, k->path, table, true, &k->map, k->why, sizeof k->why);
    }
    if (e == ECS_OK && !k->map) {
        if (make_dirs(o->dir) != 0)
            e = ecs_error(ECS_ERR_IO, "repack: cannot create %s: %s", o->dir, strerror(errno));
        else if ((e = write_copy(o, k->path, table, mats, n)) == ECS_OK) {
            /* its checksums were computed from these very pages a moment
             * ago: reading it all back from the disk would double the cost */
            char why2[160];
            e = map_existing(o, k->path, table, false, &k->map, why2, sizeof why2);
            if (e == ECS_OK && !k->map)
                e = ecs_error(ECS_ERR_IO, "repack: the copy just made is not usable: %s", why2);
        }
        k->made = e == ECS_OK;
    }
    if (e != ECS_OK) {
        free(table);
        free(k);
        return e;
    }
    k->bytes = (size_t)l.file_bytes;
    const entry_t *en = (const entry_t *)(table + sizeof(head_t));
    for (int i = 0; i < n; i++)
        mats[i]->r16 = (const uint8_t *)k->map + en[i].off;
    free(table);
    *out = k;
    return ECS_OK;
}

/* The cache directory, locked (flock, exclusive) until close: processes
 * opening copies there take turns, so replicated workers assigned the same
 * experts (--replication auto on one host) find the copy the first one
 * made instead of each writing its own at the same time (on a cold start
 * of the full ds2-lite: two copies of ~9 GB, more than this host's page
 * cache holds beside the GGUF). -1 if it cannot be opened or locked: the
 * copies are then made unlocked, as before. */
static int lock_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && make_dirs(dir) == 0)
        fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX) != 0) {
        close(fd);
        fd = -1;
    }
    return fd;
}

ecs_err_t krepack_open(const krepack_opts_t *o, kcpu_mat_t *const *mats, int n, krepack_t **out)
{
    const int lock = lock_dir(o->dir);
    ecs_err_t rc = open_locked(o, mats, n, out);
    if (lock >= 0)
        close(lock); /* and the lock with it */
    return rc;
}

void krepack_close(krepack_t *k)
{
    if (!k)
        return;
    if (k->map)
        munmap(k->map, k->bytes);
    free(k);
}

size_t krepack_bytes(const krepack_t *k) { return k ? k->bytes : 0; }

const void *krepack_map(const krepack_t *k) { return k ? k->map : NULL; }

const char *krepack_path(const krepack_t *k) { return k ? k->path : NULL; }

const char *krepack_made_why(const krepack_t *k) { return k && k->made ? k->why : NULL; }

int krepack_cleaned(const krepack_t *k) { return k ? k->cleaned : 0; }

const char *krepack_default_dir(char *buf, size_t cap)
{
    const char *e = getenv("ECS_CACHE_DIR");
    if (e && *e)
        return e;
    const char *x = getenv("XDG_CACHE_HOME"), *h = getenv("HOME");
    if (x && *x && (size_t)snprintf(buf, cap, "%s/ecs", x) < cap)
        return buf;
    if (h && *h && (size_t)snprintf(buf, cap, "%s/.cache/ecs", h) < cap)
        return buf;
    return NULL;
}
