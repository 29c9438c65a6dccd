/* fuzz_placement.c - libFuzzer target for the reader of placement files
 * (`--placement FILE`, coordinator/dispatch/placement.c): any bytes either
 * read as a placement in which every (layer, expert) of the MoE layers has
 * a holder, or fail with a message; a placement read is written back in the
 * same format (placement_write), and that text reads as the same holders
 * for every pair. Never a crash, a leak or a read past the input. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* small enough that inputs reach whole placements */
static const dispatch_shape_t SHAPE = {.n_layer = 6, .first_moe = 1, .n_expert = 8};
static const placement_worker_t WORKERS[] = {{"w0", 1}, {"w1", 1}, {"gpu-2", 2}};
enum { N_WORKERS = sizeof WORKERS / sizeof WORKERS[0] };

static placement_t *read_bytes(const void *data, size_t size)
{
    placement_t *p = NULL;
    FILE *f = fmemopen((void *)data, size, "r");
    if (!f)
        return NULL;
    if (placement_read(&SHAPE, f, "fuzz", WORKERS, N_WORKERS, &p) != ECS_OK &&
        (p || !ecs_errmsg()[0]))
        __builtin_trap(); /* a refusal says why and leaves nothing */
    fclose(f);
    return p;
}

static void check_same(const placement_t *a, const placement_t *b)
{
    if (placement_replication(a) != placement_replication(b))
        __builtin_trap();
    for (int l = 0; l < SHAPE.n_layer; l++)
        for (int e = 0; e < SHAPE.n_expert; e++) {
            const int16_t *ha, *hb;
            const int na = placement_holders(a, l, e, &ha), nb = placement_holders(b, l, e, &hb);
            if (na != nb || (l >= SHAPE.first_moe && na < 1))
                __builtin_trap();
            for (int i = 0; i < na; i++) { /* the same set, in any order */
                int found = 0;
                for (int k = 0; k < nb; k++)
                    found |= ha[i] == hb[k];
                if (!found)
                    __builtin_trap();
            }
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0; /* fmemopen wants a buffer */
    placement_t *p = read_bytes(data, size);
    if (!p)
        return 0;
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    if (m) {
        const ecs_err_t rc = placement_write(p, m);
        fclose(m);
        if (rc != ECS_OK)
            __builtin_trap();
        placement_t *q = len ? read_bytes(text, len) : NULL;
        if (!q)
            __builtin_trap(); /* what placement_write prints must read back */
        check_same(p, q);
        placement_free(q);
    }
    free(text);
    placement_free(p);
    return 0;
}
