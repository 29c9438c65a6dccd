/* persist.c - the prefix cache on disk (--prefix-cache-dir): at a clean
 * shutdown every published KV block is written to DIR/kv-blocks.ecs (its
 * key, the key before it, its token ids, a checksum and its rows); at
 * start-up they are read back into free blocks of the pool as cached
 * blocks, so an agent's long conversation is warm again after a restart.
 * The file names the model identity the keys chain from (GGUF fingerprint
 * and row layout): another model's file is skipped whole, a damaged record
 * is skipped alone (its key, tokens or checksum do not match), and the
 * file is replaced at the next shutdown. Written to a temporary name and
 * renamed, so a crash mid-write leaves the old file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/hash.h"
#include "sched_int.h"

#define MAGIC "ECSKVB1"
#define FILE_NAME "kv-blocks.ecs"

typedef struct {
    char magic[8];
    uint64_t seed, block_bytes;
    uint32_t block_tokens, n_blocks;
} file_hdr_t;

typedef struct {
    uint64_t key, parent, sum;
    int32_t toks[MODEL_KV_BLOCK];
} rec_hdr_t;

static void file_path(char *out, size_t cap, const char *dir, const char *suffix)
{
    snprintf(out, cap, "%s/%s%s", dir, FILE_NAME, suffix);
}

static bool write_all(sched_t *s, FILE *f, int *n_saved, void *data)
{
    file_hdr_t h = {.seed = s->seed, .block_bytes = s->block_bytes,
                    .block_tokens = MODEL_KV_BLOCK};
    memcpy(h.magic, MAGIC, sizeof h.magic);
    for (int b = 0; b < s->n_blocks; b++) {
        uint64_t key;
        h.n_blocks += kvc_key(s->kvc, b, &key);
    }
    if (fwrite(&h, sizeof h, 1, f) != 1)
        return false;
    for (int b = 0; b < s->n_blocks; b++) {
        rec_hdr_t r;
        if (!kvc_key(s->kvc, b, &r.key))
            continue;
        model_kvpool_block_get(s->pool, b, data);
        r.parent = s->blk_parent[b];
        r.sum = ecs_hash64(data, s->block_bytes, r.key);
        memcpy(r.toks, s->blk_toks + (size_t)b * MODEL_KV_BLOCK, sizeof r.toks);
        if (fwrite(&r, sizeof r, 1, f) != 1 || fwrite(data, 1, s->block_bytes, f) != s->block_bytes)
            return false;
        (*n_saved)++;
    }
    return true;
}

ecs_err_t sched_cache_save(sched_t *s, const char *dir, int *n_saved, long *n_tokens)
{
    *n_saved = 0;
    *n_tokens = 0;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return ecs_error(ECS_ERR_IO, "--prefix-cache-dir %s: %s", dir, strerror(errno));
    char path[4096], tmp[4200];
    file_path(path, sizeof path, dir, "");
    file_path(tmp, sizeof tmp, dir, ".tmp");
    void *data = malloc(s->block_bytes);
    FILE *f = data ? fopen(tmp, "wb") : NULL;
    bool ok = f && write_all(s, f, n_saved, data);
    if (f && fclose(f) != 0)
        ok = false;
    free(data);
    if (!ok || rename(tmp, path) != 0) {
        ecs_err_t e = ecs_error(ECS_ERR_IO, "prefix cache: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        *n_saved = 0;
        return e;
    }
    *n_tokens = (long)*n_saved * MODEL_KV_BLOCK;
    return ECS_OK;
}

/* One record into a free block, cached; false if it is not sound. */
static bool load_block(sched_t *s, const rec_hdr_t *r, const void *data)
{
    if (kvc_chain(r->parent, r->toks, MODEL_KV_BLOCK) != r->key ||
        ecs_hash64(data, s->block_bytes, r->key) != r->sum)
        return false;
    for (int i = 0; i < MODEL_KV_BLOCK; i++)
        if (r->toks[i] < 0 || r->toks[i] >= s->n_vocab)
            return false;
    if (kvc_lookup(s->kvc, r->key) >= 0)
        return true; /* already there */
    const int b = kvc_alloc(s->kvc);
    if (b < 0)
        return false;
    model_kvpool_block_put(s->pool, b, data);
    memcpy(s->blk_toks + (size_t)b * MODEL_KV_BLOCK, r->toks, sizeof r->toks);
    s->blk_parent[b] = r->parent;
    kvc_publish(s->kvc, b, r->key);
    kvc_unref(s->kvc, b);
    return true;
}

ecs_err_t sched_cache_load(sched_t *s, const char *dir, int *n_loaded, int *n_skipped, long *n_tokens)
{
    *n_loaded = *n_skipped = 0;
    *n_tokens = 0;
    char path[4096];
    file_path(path, sizeof path, dir, "");
    FILE *f = fopen(path, "rb");
    if (!f)
        return ECS_OK; /* nothing kept yet */
    void *buf = malloc(s->block_bytes);
    if (!buf) {
        fclose(f);
        return ecs_error(ECS_ERR_NOMEM, "prefix cache: out of memory");
    }
    file_hdr_t h;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, MAGIC, sizeof h.magic) != 0 ||
        h.seed != s->seed || h.block_bytes != s->block_bytes || h.block_tokens != MODEL_KV_BLOCK) {
        *n_skipped = 1; /* another model's (or layout's) file, or not ours */
        h.n_blocks = 0;
    }
    rec_hdr_t r;
    /* the free blocks only: a restart with a smaller pool keeps what fits,
     * and the warm-up step still finds blocks */
    for (uint32_t i = 0; i < h.n_blocks && kvc_n_free(s->kvc) > sched_blocks_for(s->o.n_ctx); i++) {
        if (fread(&r, sizeof r, 1, f) != 1 || fread(buf, 1, s->block_bytes, f) != s->block_bytes) {
            (*n_skipped)++;
            break;
        }
        if (load_block(s, &r, buf))
            (*n_loaded)++;
        else
            (*n_skipped)++;
    }
    free(buf);
    fclose(f);
    *n_tokens = (long)*n_loaded * MODEL_KV_BLOCK;
    pthread_mutex_lock(&s->mu);
    s->stats.kv_blocks_cached = kvc_n_cached(s->kvc);
    pthread_mutex_unlock(&s->mu);
    return ECS_OK;
}
