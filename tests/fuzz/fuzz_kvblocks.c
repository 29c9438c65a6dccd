/* fuzz_kvblocks.c - libFuzzer target for the reader of the prefix cache's
 * file (DIR/kv-blocks.ecs, coordinator/sched/kvfile.c), which the
 * coordinator reads at start-up with --prefix-cache-dir: any bytes are read
 * twice, once for the identity and block size the input's own header names
 * (so records are reached; block sizes capped at 64 KiB, the reader
 * allocates the caller's size, never the file's) and once for a fixed
 * identity (tiny-ds2-q8_0's, the seed corpus's model). Every record the
 * reader hands over must be sound (key chain, token ids, checksum), and
 * writing them again must read back as the same records; never a crash,
 * a leak or a read past the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "coordinator/sched/sched_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { MAX_KEPT = 8, N_VOCAB = 102400 };
/* tiny-ds2-q8_0's identity (seed, 4 layers x 64 tokens x 80 F16 values):
 * its file, written by ecs-coordinator --prefix-cache-dir, seeds the corpus */
#define TINY_SEED 8320529948398932863ull
#define TINY_BLOCK_BYTES 40960

typedef struct {
    const sched_kvfile_id_t *id;
    int n;
    sched_kvrec_t rec[MAX_KEPT];
    void *rows[MAX_KEPT];
} kept_t;

/* Checks a record and keeps a copy of the first MAX_KEPT (then: no room). */
static int put(void *arg, const sched_kvrec_t *r)
{
    kept_t *k = arg;
    if (kvc_chain(r->parent, r->toks, MODEL_KV_BLOCK) != r->key)
        abort();
    for (int i = 0; i < MODEL_KV_BLOCK; i++)
        if (r->toks[i] < 0 || r->toks[i] >= k->id->n_vocab)
            abort();
    if (k->n == MAX_KEPT)
        return -1;
    k->rows[k->n] = malloc(k->id->block_bytes);
    if (!k->rows[k->n])
        return -1;
    memcpy(k->rows[k->n], r->data, k->id->block_bytes);
    k->rec[k->n] = *r;
    k->rec[k->n].data = k->rows[k->n];
    return k->n++ % 3 != 2 ? 1 : 0; /* some refused, as a full pool does */
}

static void get(void *arg, int i, sched_kvrec_t *rec)
{
    const kept_t *k = arg;
    void *out = rec->data;
    *rec = k->rec[i];
    rec->data = out;
    memcpy(out, k->rec[i].data, k->id->block_bytes);
}

static void kept_free(kept_t *k)
{
    for (int i = 0; i < k->n; i++)
        free(k->rows[i]);
    k->n = 0;
}

/* Reads f for id; what came out, written again, reads back the same. */
static void read_and_rewrite(const uint8_t *buf, size_t size, const sched_kvfile_id_t *id)
{
    FILE *f = fmemopen((void *)buf, size, "rb");
    if (!f)
        return;
    kept_t k = {.id = id};
    int n_in, n_bad;
    ecs_err_t e = sched_kvfile_read(f, id, put, &k, &n_in, &n_bad);
    fclose(f);
    if (e != ECS_OK) {
        kept_free(&k);
        return;
    }
    if (n_in < 0 || n_bad < 0 || n_in > k.n)
        abort();
    char *out = NULL;
    size_t out_len = 0;
    FILE *w = open_memstream(&out, &out_len);
    void *scratch = malloc(id->block_bytes);
    if (w && scratch && sched_kvfile_write(w, id, k.n, get, &k, scratch) && fflush(w) == 0) {
        kept_t again = {.id = id};
        FILE *r = fmemopen(out, out_len, "rb");
        if (!r || sched_kvfile_read(r, id, put, &again, &n_in, &n_bad) != ECS_OK || again.n != k.n)
            abort();
        for (int i = 0; i < k.n; i++)
            if (again.rec[i].key != k.rec[i].key || again.rec[i].parent != k.rec[i].parent ||
                memcmp(again.rec[i].toks, k.rec[i].toks, sizeof k.rec[i].toks) ||
                memcmp(again.rows[i], k.rows[i], id->block_bytes))
                abort();
        fclose(r);
        kept_free(&again);
    }
    if (w)
        fclose(w);
    free(out);
    free(scratch);
    kept_free(&k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1); /* a copy: ASan sees reads past it */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    /* the tiny model's identity (its real file is the seed corpus) */
    const sched_kvfile_id_t fixed = {.seed = TINY_SEED, .block_bytes = TINY_BLOCK_BYTES,
                                     .n_vocab = N_VOCAB};
    read_and_rewrite(buf, size, &fixed);
    if (size >= 24) { /* the header's own identity and block size */
        sched_kvfile_id_t own = {.n_vocab = N_VOCAB};
        uint64_t bytes;
        memcpy(&own.seed, buf + 8, sizeof own.seed);
        memcpy(&bytes, buf + 16, sizeof bytes);
        own.block_bytes = bytes <= 65536 ? (size_t)bytes : 1;
        read_and_rewrite(buf, size, &own);
    }
    free(buf);
    return 0;
}
