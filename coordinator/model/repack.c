/* repack.c - the copy of the weights that decode reads, in the kernels'
 * row-interleaved layout (kcpu_r16_pack), kept in a cache file.
 *
 * Decode products of one activation row against Q4_K rows are compute-bound
 * on a fast memory; the interleaved layout is not (docs/benchmarks.md). The
 * copy must not cost resident memory (the budget is for what is not mapped
 * weights), so it lives in a file that is mapped like the GGUF: made once
 * per model file (a few seconds per GB), found again by the GGUF's size and
 * modification time, checked against the layout this build expects and
 * remade when anything differs. The kernels give the same bits with or
 * without it (tests), so a missing or stale cache only costs speed: every
 * failure here is reported (model_repack_note) and the model runs from the
 * GGUF alone. Products of Q4_K and Q8_0 matrices read only the copy; Q5_0
 * products of many rows keep reading the GGUF where both fit in memory. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "coordinator/model/model_int.h"

#define R16_MAGIC "ECSR16\0\1"
#define R16_ALIGN 4096
/* Rows packed per write: bounded memory while making the file. */
#define R16_CHUNK_BYTES ((size_t)8 << 20)

typedef struct {
    char magic[8];
    uint64_t layout; /* KCPU_R16_LAYOUT */
    uint64_t gguf_size;
    int64_t gguf_mtime_s, gguf_mtime_ns;
    uint64_t n;          /* entries that follow */
    uint64_t file_bytes; /* the whole file */
} r16_head_t;

typedef struct {
    uint64_t src;  /* the matrix's offset in the GGUF's tensor data */
    uint64_t type, nrows, ncols;
    uint64_t off;  /* its copy's offset in the cache file */
    uint64_t bytes;
} r16_entry_t;

static uint64_t align_up(uint64_t x) { return (x + R16_ALIGN - 1) / R16_ALIGN * R16_ALIGN; }

/* Every matrix a decoded token reads that has the layout (a tied output
 * head is the embedding: decode reads it as output). */
static int decode_mats(model_t *m, kcpu_mat_t **out, int cap)
{
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        model_layer_t *l = &m->w.layers[il];
        kcpu_mat_t *all[] = {&l->wq, &l->wq_a, &l->wq_b, &l->wkv_a, &l->wkv_b, &l->wk,
                             &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                             &l->gate_inp, &l->gate_exps, &l->up_exps, &l->down_exps,
                             &l->gate_shexp, &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i]->data && kcpu_r16_fits(all[i]->type, all[i]->nrows, all[i]->ncols) &&
                kcpu_gemm(all[i]->type).r16 && n < cap)
                out[n++] = all[i];
    }
    kcpu_mat_t *o = &m->w.output;
    if (o->data && kcpu_r16_fits(o->type, o->nrows, o->ncols) && kcpu_gemm(o->type).r16 && n < cap)
        out[n++] = o;
    return n;
}

static int mats_cap(const model_t *m) { return 18 * m->hp.n_layer + 1; }

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

/* The header and entries the cache must hold (malloc'd, *bytes long). */
static void *expected_head(const model_t *m, const struct stat *st, kcpu_mat_t *const *mats,
                           int n, size_t *bytes)
{
    const size_t hb = sizeof(r16_head_t) + (size_t)n * sizeof(r16_entry_t);
    uint8_t *h = calloc(1, hb);
    if (!h)
        return NULL;
    r16_head_t *hd = (r16_head_t *)h;
    r16_entry_t *e = (r16_entry_t *)(h + sizeof *hd);
    memcpy(hd->magic, R16_MAGIC, 8);
    hd->layout = KCPU_R16_LAYOUT;
    hd->gguf_size = (uint64_t)st->st_size;
    hd->gguf_mtime_s = (int64_t)st->st_mtim.tv_sec;
    hd->gguf_mtime_ns = (int64_t)st->st_mtim.tv_nsec;
    hd->n = (uint64_t)n;
    const uint8_t *base = tensor_base(m->file);
    uint64_t off = align_up(hb);
    for (int i = 0; i < n; i++) {
        const kcpu_mat_t *w = mats[i];
        e[i] = (r16_entry_t){(uint64_t)((const uint8_t *)w->data - base), (uint64_t)w->type,
                             (uint64_t)w->nrows, (uint64_t)w->ncols, off,
                             kcpu_r16_bytes(w->type, w->nrows, w->ncols)};
        off = align_up(off + e[i].bytes);
    }
    hd->file_bytes = off;
    *bytes = hb;
    return h;
}

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

static ecs_err_t write_cache(const char *path, const void *head, size_t hb, kcpu_mat_t *const *mats,
                             int n)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const int fd = open(tmp, O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
    if (fd < 0)
        return ecs_error(ECS_ERR_IO, "repack: cannot create %s: %s", tmp, strerror(errno));
    const r16_entry_t *e = (const r16_entry_t *)((const uint8_t *)head + sizeof(r16_head_t));
    void *buf = malloc(R16_CHUNK_BYTES);
    bool ok = buf && write_at(fd, head, hb, 0);
    for (int i = 0; ok && i < n; i++) {
        const kcpu_mat_t *w = mats[i];
        const size_t group = kcpu_r16_bytes(w->type, KCPU_R16_ROWS, w->ncols);
        int64_t rows = (int64_t)(R16_CHUNK_BYTES / group) * KCPU_R16_ROWS;
        if (rows < KCPU_R16_ROWS) /* cannot happen below 3 M values a row */
            ok = false;
        for (int64_t r = 0; ok && r < w->nrows; r += rows) {
            const int64_t k = w->nrows - r < rows ? w->nrows - r : rows;
            kcpu_r16_pack(w, r, k, buf);
            ok = write_at(fd, buf, (size_t)(k / KCPU_R16_ROWS) * group,
                          (off_t)(e[i].off + (uint64_t)(r / KCPU_R16_ROWS) * group));
        }
    }
    const r16_head_t *hd = head;
    ok = ok && ftruncate(fd, (off_t)hd->file_bytes) == 0;
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
    unlink(tmp);
    return ecs_error(ECS_ERR_IO, "repack: cannot write %s: %s", path,
                     nomem ? "out of memory" : strerror(err ? err : EIO));
}

/* Maps path if its header is exactly head; NULL otherwise. */
static void *map_cache(const char *path, const void *head, size_t hb, size_t file_bytes)
{
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    void *p = NULL;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == file_bytes) {
        p = mmap(NULL, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED)
            p = NULL;
        if (p) /* as the GGUF (model.c): 2 MB pages where the kernel can */
            madvise(p, file_bytes, MADV_HUGEPAGE);
        if (p && memcmp(p, head, hb) != 0) {
            munmap(p, file_bytes);
            p = NULL;
        }
    }
    close(fd);
    return p;
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

/* dir/<name of the GGUF>.r16 */
static ecs_err_t cache_path(const char *dir, const char *gguf, char *out, size_t cap)
{
    const char *slash = strrchr(gguf, '/');
    const char *name = slash ? slash + 1 : gguf;
    if ((size_t)snprintf(out, cap, "%s/%s.r16", dir, name) >= cap)
        return ecs_error(ECS_ERR_INVAL, "repack: cache path too long (%s)", dir);
    return ECS_OK;
}

/* The copy serves every product of the matrices it holds, so it and the
 * rest of the GGUF must stay in memory together; else no copy: steps
 * would read the disk. */
static ecs_err_t check_ram(const model_t *m, kcpu_mat_t *const *mats, int n, size_t copy)
{
    size_t ram = m->opts.repack_ram;
    if (!ram) {
        const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        ram = pages > 0 && page > 0 ? (size_t)pages / 10 * 9 * (size_t)page : 0;
    }
    const size_t gguf = gguf_file_size(m->file);
    size_t rest = gguf;
    for (int i = 0; i < n; i++)
        rest -= (size_t)mats[i]->nrows * mats[i]->row_bytes;
    if (rest + copy <= ram)
        return ECS_OK;
    return ecs_error(ECS_ERR_NOMEM,
                     "repack: the decode copy (%.1f GB) and the rest of the GGUF (%.1f GB) would "
                     "not stay in memory (%.1f GB for them)",
                     (double)copy / 1e9, (double)rest / 1e9, (double)ram / 1e9);
}

static ecs_err_t repack(model_t *m, const char *dir)
{
    struct stat st;
    const char *gpath = gguf_path(m->file);
    if (stat(gpath, &st) != 0)
        return ecs_error(ECS_ERR_IO, "repack: cannot stat %s: %s", gpath, strerror(errno));
    const int cap = mats_cap(m);
    kcpu_mat_t **mats = calloc((size_t)cap, sizeof *mats);
    if (!mats)
        return ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    const int n = decode_mats(m, mats, cap);
    ecs_err_t e = ECS_OK;
    size_t hb = 0;
    void *head = n ? expected_head(m, &st, mats, n, &hb) : NULL;
    if (n && !head)
        e = ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    if (e == ECS_OK && n)
        e = cache_path(dir, gpath, m->r16_path, sizeof m->r16_path);
    const size_t fb = head ? (size_t)((const r16_head_t *)head)->file_bytes : 0;
    if (e == ECS_OK && n)
        e = check_ram(m, mats, n, fb);
    if (e == ECS_OK && n) {
        m->r16_map = map_cache(m->r16_path, head, hb, fb);
        if (!m->r16_map) {
            if (make_dirs(dir) != 0)
                e = ecs_error(ECS_ERR_IO, "repack: cannot create %s: %s", dir, strerror(errno));
            else if ((e = write_cache(m->r16_path, head, hb, mats, n)) == ECS_OK)
                m->r16_map = map_cache(m->r16_path, head, hb, fb);
            if (e == ECS_OK && !m->r16_map)
                e = ecs_error(ECS_ERR_IO, "repack: %s changed while being mapped", m->r16_path);
            m->r16_made = e == ECS_OK;
        }
    }
    if (m->r16_map && !(m->r16_src = calloc((size_t)n, sizeof *m->r16_src))) {
        munmap(m->r16_map, fb);
        m->r16_map = NULL;
        e = ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    }
    if (m->r16_map) {
        m->r16_bytes = fb;
        m->r16_n = n;
        const r16_entry_t *en = (const r16_entry_t *)((const uint8_t *)head + sizeof(r16_head_t));
        for (int i = 0; i < n; i++) {
            mats[i]->r16 = (const uint8_t *)m->r16_map + en[i].off;
            m->r16_src[i] = kcpu_mat_reads_rows(mats[i]) ? NULL : mats[i]->data;
        }
    }
    free(head);
    free(mats);
    return e;
}

void model_repack(model_t *m, const char *dir)
{
    m->r16_note[0] = 0;
    const ecs_err_t e = repack(m, dir);
    if (e != ECS_OK)
        snprintf(m->r16_note, sizeof m->r16_note, "%s", ecs_errmsg());
}

void model_repack_free(model_t *m)
{
    if (m->r16_map)
        munmap(m->r16_map, m->r16_bytes);
    m->r16_map = NULL;
    free(m->r16_src);
    m->r16_src = NULL;
    m->r16_n = 0;
}

bool model_repack_has(const model_t *m, const void *data)
{
    for (int i = 0; data && i < m->r16_n; i++)
        if (m->r16_src[i] == data)
            return true;
    return false;
}

const void *model_repack_map(const model_t *m) { return m->r16_map; }

const char *model_repack_note(const model_t *m) { return m->r16_note[0] ? m->r16_note : NULL; }

size_t model_repack_bytes(const model_t *m, const char **path, bool *made)
{
    if (path)
        *path = m->r16_map ? m->r16_path : NULL;
    if (made)
        *made = m->r16_made;
    return m->r16_map ? m->r16_bytes : 0;
}
