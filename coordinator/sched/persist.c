/* persist.c - the prefix cache on disk (--prefix-cache-dir): at a clean
 * shutdown every published KV block is written to DIR/kv-blocks.ecs (its
 * key, the key before it, its token ids, a checksum and its rows: the
 * format is kvfile.c's); at start-up they are read back into free blocks
 * of the pool as cached blocks, so an agent's long conversation is warm
 * again after a restart. The file names the model identity the keys chain
 * from (GGUF fingerprint and row layout): another model's file is skipped
 * whole, a damaged record is skipped alone (its key, tokens or checksum do
 * not match), and the file is replaced at the next shutdown. Written to a
 * temporary name and renamed, so a crash mid-write leaves the old file. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sched_int.h"

#define FILE_NAME "kv-blocks.ecs"

static void file_path(char *out, size_t cap, const char *dir, const char *suffix)
{
    snprintf(out, cap, "%s/%s%s", dir, FILE_NAME, suffix);
}

static sched_kvfile_id_t file_id(const sched_t *s)
{
    return (sched_kvfile_id_t){.seed = s->seed, .block_bytes = s->block_bytes,
                               .kv_type = s->o.kv_flag, .n_vocab = s->n_vocab};
}

typedef struct {
    sched_t *s;
    int *blocks; /* the published ones */
} save_t;

static void get_block(void *arg, int i, sched_kvrec_t *rec)
{
    const save_t *sv = arg;
    const int b = sv->blocks[i];
    kvc_key(sv->s->kvc, b, &rec->key);
    rec->parent = sv->s->blk_parent[b];
    memcpy(rec->toks, sv->s->blk_toks + (size_t)b * MODEL_KV_BLOCK, sizeof rec->toks);
    model_kvpool_block_get(sv->s->pool, b, rec->data);
}

/* The published blocks into order[n_blocks], the most recently used chain
 * first and each chain from its first block: a restart with a smaller pool
 * reads the file until it is full, so it keeps the latest conversations
 * whole (a block without the blocks before it is of no use). Returns how
 * many, or -1 when out of memory. */
static int save_order(const sched_t *s, int *order)
{
    int *recent = malloc((size_t)s->n_blocks * sizeof *recent);
    int *chain = malloc((size_t)s->n_blocks * sizeof *chain);
    bool *done = calloc((size_t)s->n_blocks, sizeof *done);
    int n = recent && chain && done ? 0 : -1;
    const int n_recent = n == 0 ? kvc_recent(s->kvc, recent) : 0;
    for (int i = 0; i < n_recent; i++) {
        int len = 0; /* recent[i] and the blocks before it not yet placed */
        for (int b = recent[i]; b >= 0 && !done[b] && len < s->n_blocks;
             b = kvc_find(s->kvc, s->blk_parent[b])) {
            chain[len++] = b;
            done[b] = true;
        }
        while (len > 0)
            order[n++] = chain[--len];
    }
    free(recent);
    free(chain);
    free(done);
    return n;
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
    save_t sv = {s, malloc((size_t)s->n_blocks * sizeof *sv.blocks)};
    void *data = malloc(s->block_bytes);
    const int n = sv.blocks ? save_order(s, sv.blocks) : -1;
    if (n < 0 || !data) {
        /* an empty file would replace the last good one: keep that one */
        free(data);
        free(sv.blocks);
        return ecs_error(ECS_ERR_NOMEM, "prefix cache: no memory to order %d blocks for %s; "
                         "the previous file is kept", s->n_blocks, path);
    }
    const sched_kvfile_id_t id = file_id(s);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && sched_kvfile_write(f, &id, n, get_block, &sv, data);
    if (f && fclose(f) != 0)
        ok = false;
    free(data);
    free(sv.blocks);
    if (!ok || rename(tmp, path) != 0) {
        ecs_err_t e = ecs_error(ECS_ERR_IO, "prefix cache: cannot write %s: %s", path, strerror(errno));
        unlink(tmp);
        return e;
    }
    *n_saved = n;
    *n_tokens = (long)n * MODEL_KV_BLOCK;
    return ECS_OK;
}

/* One sound record into a free block, cached. Only while more blocks are
 * free than a context needs: a restart with a smaller pool keeps what
 * fits, and the warm-up step still finds blocks. */
static int put_block(void *arg, const sched_kvrec_t *r)
{
    sched_t *s = arg;
    if (kvc_n_free(s->kvc) <= sched_blocks_for(s->o.n_ctx))
        return -1;
    if (kvc_find(s->kvc, r->key) >= 0)
        return 1; /* already there */
    const int b = kvc_restore(s->kvc, r->key);
    if (b < 0)
        return 0;
    model_kvpool_block_put(s->pool, b, r->data);
    memcpy(s->blk_toks + (size_t)b * MODEL_KV_BLOCK, r->toks, sizeof r->toks);
    s->blk_parent[b] = r->parent;
    return 1;
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
    const sched_kvfile_id_t id = file_id(s);
    ecs_err_t e = sched_kvfile_read(f, &id, put_block, s, n_loaded, n_skipped);
    fclose(f);
    *n_tokens = (long)*n_loaded * MODEL_KV_BLOCK;
    pthread_mutex_lock(&s->mu);
    s->stats.kv_blocks_cached = kvc_n_cached(s->kvc);
    pthread_mutex_unlock(&s->mu);
    return e;
}
