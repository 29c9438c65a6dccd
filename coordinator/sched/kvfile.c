/* kvfile.c - the bytes of the prefix cache's file (DIR/kv-blocks.ecs),
 * apart from the scheduler so that any bytes can be read through it
 * (tests/fuzz/fuzz_kvblocks.c) without a model:
 *
 *   header: "ECSKVB2\0", u64 identity seed, u64 block bytes,
 *           u32 tokens per block (MODEL_KV_BLOCK), u32 records,
 *           u32 KV element type (sched_opts_t.kv_flag: F16 and BF16 rows
 *           have the same size, and a BF16 block read as F16 would be
 *           garbage; q8 blocks are smaller), u32 zero
 *   record: u64 key, u64 parent key, u64 checksum (xxHash64 of the rows,
 *           seeded with the key), i32 tokens[MODEL_KV_BLOCK], the rows
 *
 * in host byte order (the file never leaves the host). The reader trusts
 * nothing but the caller's identity: a header of another identity or
 * layout yields no record, a record whose key is not the chain of its
 * parent and tokens, whose token ids are out of the vocabulary or whose
 * rows do not match the checksum is skipped, a short record ends the file.
 * It allocates one block's rows, of the caller's size, never the file's. */
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "sched_int.h"

#define MAGIC "ECSKVB2"

typedef struct {
    char magic[8];
    uint64_t seed, block_bytes;
    uint32_t block_tokens, n_blocks;
    uint32_t kv_type, pad;
} file_hdr_t;

typedef struct {
    uint64_t key, parent, sum;
    int32_t toks[MODEL_KV_BLOCK];
} rec_hdr_t;

bool sched_kvfile_write(FILE *f, const sched_kvfile_id_t *id, int n, sched_kvfile_get_fn get,
                        void *arg, void *data)
{
    file_hdr_t h = {.seed = id->seed, .block_bytes = id->block_bytes,
                    .block_tokens = MODEL_KV_BLOCK, .n_blocks = (uint32_t)n,
                    .kv_type = id->kv_type};
    memcpy(h.magic, MAGIC, sizeof h.magic);
    if (fwrite(&h, sizeof h, 1, f) != 1)
        return false;
    for (int i = 0; i < n; i++) {
        sched_kvrec_t r = {.data = data};
        get(arg, i, &r);
        rec_hdr_t rh = {.key = r.key, .parent = r.parent,
                        .sum = ecs_hash64(data, id->block_bytes, r.key)};
        memcpy(rh.toks, r.toks, sizeof rh.toks);
        if (fwrite(&rh, sizeof rh, 1, f) != 1 || fwrite(data, 1, id->block_bytes, f) != id->block_bytes)
            return false;
    }
    return true;
}

static bool sound(const sched_kvfile_id_t *id, const rec_hdr_t *r, const void *data)
{
    for (int i = 0; i < MODEL_KV_BLOCK; i++)
        if (r->toks[i] < 0 || r->toks[i] >= id->n_vocab)
            return false;
    return kvc_chain(r->parent, r->toks, MODEL_KV_BLOCK) == r->key &&
           ecs_hash64(data, id->block_bytes, r->key) == r->sum;
}

ecs_err_t sched_kvfile_read(FILE *f, const sched_kvfile_id_t *id, sched_kvfile_put_fn put, void *arg,
                            int *n_loaded, int *n_skipped)
{
    *n_loaded = *n_skipped = 0;
    if (id->block_bytes == 0)
        return ecs_error(ECS_ERR_INVAL, "prefix cache: empty blocks");
    void *buf = malloc(id->block_bytes);
    if (!buf)
        return ecs_error(ECS_ERR_NOMEM, "prefix cache: out of memory");
    file_hdr_t h;
    if (fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, MAGIC, sizeof h.magic) != 0 ||
        h.seed != id->seed || h.block_bytes != id->block_bytes || h.block_tokens != MODEL_KV_BLOCK ||
        h.kv_type != id->kv_type) {
        *n_skipped = 1; /* another model's (or layout's) file, or not ours */
        h.n_blocks = 0;
    }
    rec_hdr_t r;
    for (uint32_t i = 0; i < h.n_blocks; i++) {
        if (fread(&r, sizeof r, 1, f) != 1 || fread(buf, 1, id->block_bytes, f) != id->block_bytes) {
            (*n_skipped)++; /* cut short */
            break;
        }
        sched_kvrec_t rec = {.key = r.key, .parent = r.parent, .data = buf};
        memcpy(rec.toks, r.toks, sizeof rec.toks);
        const int took = sound(id, &r, buf) ? put(arg, &rec) : 0;
        if (took < 0)
            break; /* no room left: the rest stays on disk */
        *(took ? n_loaded : n_skipped) += 1;
    }
    free(buf);
    return ECS_OK;
}
