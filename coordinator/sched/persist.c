/* persist.c - the prefix cache on disk (--prefix-cache-dir): at a clean
 * shutdown each slot's cached rows are written as DIR/slot-N.kv (token ids
 * and KV rows, under the model's fingerprint); at start-up they are read
 * back into the slots, so an agent's long conversation is warm again after
 * a restart. A file for another model, geometry or a damaged one is
 * skipped (and overwritten at the next shutdown). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sched_int.h"

#define MAGIC "ECSKVC1"

typedef struct {
    char magic[8];
    uint64_t fingerprint;
    uint32_t n_tok, n_exp;
    uint64_t kv_bytes;
    uint64_t tok_hash;
} file_hdr_t;

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* The GGUF's tensor table and its small float tensors (the norms, which
 * differ between any two trained models), and the KV row geometry. */
static uint64_t fingerprint(const sched_t *s)
{
    const gguf_file_t *f = model_gguf(s->m);
    uint64_t h = 1469598103934665603ull, sz = gguf_file_size(f);
    h = fnv(h, &sz, sizeof sz);
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        h = fnv(h, t->name, strlen(t->name));
        h = fnv(h, &t->type, sizeof t->type);
        h = fnv(h, t->ne, sizeof t->ne);
        if (t->type == ECS_TYPE_F32 && t->nbytes <= 65536)
            h = fnv(h, t->data, t->nbytes);
    }
    uint64_t rb = model_ctx_rows_bytes(s->slots[0], 1);
    return fnv(h, &rb, sizeof rb);
}

static void slot_path(char *out, size_t cap, const char *dir, int i)
{
    snprintf(out, cap, "%s/slot-%d.kv", dir, i);
}

ecs_err_t sched_cache_save(sched_t *s, const char *dir, int *n_saved, long *n_tokens)
{
    *n_saved = 0;
    *n_tokens = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ecs_error(ECS_ERR_IO, "--prefix-cache-dir %s: %s", dir, strerror(errno));
    void *buf = malloc(model_ctx_rows_bytes(s->slots[0], s->o.n_ctx));
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "prefix cache: out of memory");
    uint64_t fp = fingerprint(s);
    char path[4096], tmp[4200];
    ecs_err_t e = ECS_OK;
    for (int i = 0; i < s->n_slots && e == ECS_OK; i++) {
        slot_path(path, sizeof path, dir, i);
        int n = s->slot_n[i];
        if (n == 0) {
            unlink(path);
            continue;
        }
        file_hdr_t h = {.fingerprint = fp, .n_tok = (uint32_t)n, .n_exp = (uint32_t)s->slot_exp[i],
                        .kv_bytes = model_ctx_rows_bytes(s->slots[i], n),
                        .tok_hash = fnv(1469598103934665603ull, s->slot_toks[i], (size_t)n * 4)};
        memcpy(h.magic, MAGIC, sizeof h.magic);
        model_ctx_export(s->slots[i], n, buf);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "wb");
        bool ok = f && fwrite(&h, sizeof h, 1, f) == 1 &&
                  fwrite(s->slot_toks[i], 4, (size_t)n, f) == (size_t)n &&
                  fwrite(buf, 1, h.kv_bytes, f) == h.kv_bytes;
        if (f && fclose(f) != 0)
            ok = false;
        if (!ok || rename(tmp, path) != 0) {
            e = ecs_error(ECS_ERR_IO, "prefix cache: cannot write %s: %s", path, strerror(errno));
            unlink(tmp);
            break;
        }
        (*n_saved)++;
        *n_tokens += n;
    }
    free(buf);
    return e;
}

/* Reads one slot's file; false (slot untouched) if it is not one of ours. */
static bool load_slot(sched_t *s, int i, FILE *f, uint64_t fp, void *buf)
{
    file_hdr_t h;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, MAGIC, sizeof h.magic) != 0 ||
        h.fingerprint != fp || h.n_tok == 0 || h.n_tok > (uint32_t)s->o.n_ctx ||
        h.n_exp > h.n_tok || h.kv_bytes != model_ctx_rows_bytes(s->slots[i], (int)h.n_tok))
        return false;
    if (fread(s->slot_toks[i], 4, h.n_tok, f) != h.n_tok ||
        fnv(1469598103934665603ull, s->slot_toks[i], (size_t)h.n_tok * 4) != h.tok_hash ||
        fread(buf, 1, h.kv_bytes, f) != h.kv_bytes)
        return false;
    for (uint32_t k = 0; k < h.n_tok; k++)
        if (s->slot_toks[i][k] < 0 || s->slot_toks[i][k] >= s->n_vocab)
            return false;
    model_ctx_import(s->slots[i], (int)h.n_tok, buf);
    s->slot_n[i] = (int)h.n_tok;
    s->slot_exp[i] = (int)h.n_exp;
    s->slot_used[i] = ++s->tick;
    return true;
}

ecs_err_t sched_cache_load(sched_t *s, const char *dir, int *n_loaded, int *n_skipped, long *n_tokens)
{
    *n_loaded = *n_skipped = 0;
    *n_tokens = 0;
    void *buf = malloc(model_ctx_rows_bytes(s->slots[0], s->o.n_ctx));
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "prefix cache: out of memory");
    uint64_t fp = fingerprint(s);
    char path[4096];
    for (int i = 0; i < s->n_slots; i++) {
        slot_path(path, sizeof path, dir, i);
        FILE *f = fopen(path, "rb");
        if (!f)
            continue;
        if (load_slot(s, i, f, fp, buf)) {
            (*n_loaded)++;
            *n_tokens += s->slot_n[i];
        } else {
            model_ctx_reset(s->slots[i]);
            s->slot_n[i] = s->slot_exp[i] = 0;
            (*n_skipped)++;
        }
        fclose(f);
    }
    free(buf);
    return ECS_OK;
}
