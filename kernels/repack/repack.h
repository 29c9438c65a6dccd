/* repack.h - the row-interleaved copy (kcpu_r16_pack) of a list of matrices
 * of a GGUF, kept in a cache file and mapped read-only like the GGUF: made
 * once (a few seconds per GB), found again on later loads. The coordinator's
 * model copies every matrix decode reads; a worker copies only its experts'
 * slices (kmoe_split views) and names its own file.
 *
 * A copy is used only for the very file it was made from, undamaged:
 * - identity: the file header records the GGUF's fingerprint (SHA-256 of
 *   metadata and tensor table), size, device, inode, ctime and mtime, the
 *   layout version (KCPU_R16_LAYOUT) and every copied matrix (offset in the
 *   GGUF, type, shape). cp -p, tar, rsync and touch -r give another inode
 *   or ctime, which no user can set; so does any write to the GGUF. Any
 *   difference: the copy is made again.
 * - damage: the payload carries an xxHash64 per KREPACK_CHUNK bytes; every
 *   chunk is checked when the copy is mapped, before any product reads it
 *   (on the pool's threads; it also brings the copy into the page cache,
 *   which the first steps would do anyway). A mismatch: made again.
 * - a copy is written to <path>.tmp.<pid> and renamed into place; temporary
 *   files of processes that no longer exist are removed on open. Something
 *   other than a regular file at the path: a FIFO or other special file is
 *   replaced by a new copy; a directory is an error (never removed).
 * The kernels give the same bits with or without the copy, so a missing
 * copy costs only speed; callers run from the GGUF and say why.
 *
 *     kcpu_mat_t *mats[] = {&gate, &up};   // views into the mapped GGUF
 *     krepack_opts_t o = {.dir = dir, .name = "model.gguf.r16", .src = f, .tp = tp};
 *     krepack_t *k;
 *     if (krepack_open(&o, mats, 2, &k) != ECS_OK) ... ecs_errmsg() says why
 *     ... products of gate and up now read the copy (mats[i]->r16) ...
 *     krepack_close(k);  // after the last product
 */
#ifndef ECS_KERNELS_REPACK_H
#define ECS_KERNELS_REPACK_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "common/gguf.h"
#include "common/threadpool.h"
#include "kernels/cpu/cpu.h"

/* Payload bytes per checksum. */
#define KREPACK_CHUNK ((size_t)2 << 20)

typedef struct krepack krepack_t;

typedef struct {
    const char *dir;        /* cache directory; made (with parents) if missing */
    const char *name;       /* file name in dir, no '/' */
    const gguf_file_t *src; /* the mapped GGUF the matrices' data points into */
    ecs_threadpool_t *tp;   /* checksums run on it (NULL: the calling thread) */
} krepack_opts_t;

/* Whether w has the layout and a kernel that reads it. */
bool krepack_fits(const kcpu_mat_t *w);
/* Bytes of the cache file for mats[0, n) (all of which must fit). */
size_t krepack_file_bytes(kcpu_mat_t *const *mats, int n);

/* Maps the copy of mats[0, n) in dir/name, making it first when there is
 * none that passes the checks above, and points each mats[i]->r16 at its
 * copy. On error (unwritable directory, full disk, a directory at the path,
 * a source without a file identity) the matrices are left alone. */
ecs_err_t krepack_open(const krepack_opts_t *o, kcpu_mat_t *const *mats, int n,
                       krepack_t **out);
/* Unmaps; the matrices' r16 pointers must not be used after. NULL is fine. */
void krepack_close(krepack_t *k);

size_t krepack_bytes(const krepack_t *k);
const void *krepack_map(const krepack_t *k);
const char *krepack_path(const krepack_t *k);
/* Why this open made the copy ("none found", "made from another file",
 * "damaged: chunk 12 of 37", ...), NULL when an existing copy was used. */
const char *krepack_made_why(const krepack_t *k);
/* Stale temporary files this open removed. */
int krepack_cleaned(const krepack_t *k);

/* The cache directory programs use by default: $ECS_CACHE_DIR, else
 * $XDG_CACHE_HOME/ecs, else ~/.cache/ecs (in buf); NULL if none is set. */
const char *krepack_default_dir(char *buf, size_t cap);

#endif
