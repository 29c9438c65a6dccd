/* repack.c - the copy of the weights that decode reads, in the kernels'
 * row-interleaved layout, kept in a cache file (kernels/repack: identity,
 * checksums, temporary files).
 *
 * Decode products of one activation row against Q4_K rows are compute-bound
 * on a fast memory; the interleaved layout is not (docs/benchmarks.md). The
 * copy must not cost resident memory (the budget is for what is not mapped
 * weights), so it lives in a file that is mapped like the GGUF. The kernels
 * give the same bits with or without it (tests), so a missing or stale cache
 * only costs speed: every failure here is reported (model_repack_note) and
 * the model runs from the GGUF alone. Products of Q4_K and Q8_0 matrices
 * read only the copy; Q5_0 products of many rows keep reading the GGUF
 * where both fit in memory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "coordinator/model/model_int.h"

/* Every matrix a decoded token reads that has the layout (a tied output
 * head is the embedding: decode reads it as output). */
static int decode_mats(model_t *m, kcpu_mat_t **out, int cap)
{
    int n = 0;
    for (int il = 0; il < m->hp.n_layer; il++) {
        model_layer_t *l = &m->w.layers[il];
        const bool local = !m->opts.experts_remote;
        kcpu_mat_t *none = NULL;
        kcpu_mat_t *all[] = {&l->wq, &l->wq_a, &l->wq_b, &l->wkv_a, &l->wkv_b, &l->wk,
                             &l->wv, &l->wo, &l->ffn_gate, &l->ffn_up, &l->ffn_down,
                             &l->gate_inp, local ? &l->gate_exps : none,
                             local ? &l->up_exps : none, local ? &l->down_exps : none,
                             &l->gate_shexp, &l->up_shexp, &l->down_shexp};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (all[i] && krepack_fits(all[i]) && n < cap)
                out[n++] = all[i];
    }
    kcpu_mat_t *o = &m->w.output;
    if (krepack_fits(o) && n < cap)
        out[n++] = o;
    return n;
}

static int mats_cap(const model_t *m) { return 18 * m->hp.n_layer + 1; }

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
    for (int il = 0; m->opts.experts_remote && il < m->hp.n_layer; il++) {
        const model_layer_t *l = &m->w.layers[il]; /* the workers' bytes */
        const kcpu_mat_t *ex[] = {&l->gate_exps, &l->up_exps, &l->down_exps};
        for (int j = 0; j < 3; j++)
            rest -= ex[j]->data ? (size_t)ex[j]->nrows * ex[j]->row_bytes : 0;
    }
    if (rest + copy <= ram)
        return ECS_OK;
    return ecs_error(ECS_ERR_NOMEM,
                     "repack: the decode copy (%.1f GB) and the rest of the GGUF (%.1f GB) would "
                     "not stay in memory (%.1f GB for them)",
                     (double)copy / 1e9, (double)rest / 1e9, (double)ram / 1e9);
}

static ecs_err_t repack(model_t *m, const char *dir)
{
    const int cap = mats_cap(m);
    kcpu_mat_t **mats = calloc((size_t)cap, sizeof *mats);
    if (!mats)
        return ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    const int n = decode_mats(m, mats, cap);
    /* dir/<name of the GGUF>.r16 */
    const char *gpath = gguf_path(m->file), *slash = strrchr(gpath, '/');
    char name[512];
    ecs_err_t e = ECS_OK;
    const char *kind = m->opts.experts_remote ? ".coord" : ""; /* another list of matrices */
    if ((size_t)snprintf(name, sizeof name, "%s%s.r16", slash ? slash + 1 : gpath, kind) >=
        sizeof name)
        e = ecs_error(ECS_ERR_INVAL, "repack: file name too long (%s)", gpath);
    if (e == ECS_OK && n)
        e = check_ram(m, mats, n, krepack_file_bytes(mats, n));
    const krepack_opts_t o = {.dir = dir, .name = name, .src = m->file, .tp = m->tp};
    if (e == ECS_OK && n)
        e = krepack_open(&o, mats, n, &m->r16);
    if (m->r16 && !(m->r16_src = calloc((size_t)n, sizeof *m->r16_src))) {
        krepack_close(m->r16);
        m->r16 = NULL;
        for (int i = 0; i < n; i++)
            mats[i]->r16 = NULL;
        e = ecs_error(ECS_ERR_NOMEM, "repack: out of memory");
    }
    if (m->r16) {
        model_pages_refresh(m, krepack_map(m->r16), krepack_bytes(m->r16), krepack_path(m->r16));
        m->r16_n = n;
        for (int i = 0; i < n; i++)
            m->r16_src[i] = kcpu_mat_reads_rows(mats[i]) ? NULL : mats[i]->data;
    }
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
    krepack_close(m->r16);
    m->r16 = NULL;
    free(m->r16_src);
    m->r16_src = NULL;
    m->r16_n = 0;
}

bool model_is_routed_expert(const model_t *m, const void *data)
{
    for (int il = 0; data && il < m->hp.n_layer; il++) {
        const model_layer_t *l = &m->w.layers[il];
        if (data == l->gate_exps.data || data == l->up_exps.data || data == l->down_exps.data)
            return true;
    }
    return false;
}

bool model_repack_has(const model_t *m, const void *data)
{
    for (int i = 0; data && i < m->r16_n; i++)
        if (m->r16_src[i] == data)
            return true;
    return false;
}

const void *model_repack_map(const model_t *m) { return krepack_map(m->r16); }

double model_prefault(const model_t *m, bool skip_routed)
{
    const gguf_file_t *f = model_gguf(m);
    volatile unsigned char sink = 0;
    unsigned char acc = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const unsigned char *p = t->data;
        if (model_repack_has(m, t->data)) /* read from the copy instead */
            continue;
        if (skip_routed && model_is_routed_expert(m, t->data)) /* the workers' */
            continue;
        for (size_t o = 0; o < t->nbytes; o += 4096)
            acc ^= p[o];
    }
    const unsigned char *r = model_repack_map(m); /* the decode copy */
    for (size_t o = 0, n = model_repack_bytes(m, NULL, NULL); r && o < n; o += 4096)
        acc ^= r[o];
    sink = acc;
    (void)sink;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
}

const char *model_repack_note(const model_t *m) { return m->r16_note[0] ? m->r16_note : NULL; }

size_t model_repack_bytes(const model_t *m, const char **path, bool *made)
{
    if (path)
        *path = krepack_path(m->r16);
    if (made)
        *made = krepack_made_why(m->r16) != NULL;
    return krepack_bytes(m->r16);
}

const char *model_repack_made_why(const model_t *m) { return krepack_made_why(m->r16); }

int model_repack_cleaned(const model_t *m) { return krepack_cleaned(m->r16); }
