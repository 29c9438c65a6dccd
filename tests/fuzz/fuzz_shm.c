/* fuzz_shm.c - libFuzzer target for the consumer side of the same-host
 * plane's rings (proto/dplane/shm.c): whatever bytes a hostile or broken
 * peer leaves in a ring, dplane_ring_peek hands out only entries that lie
 * inside what was published and inside the ring, and each frame is then
 * decoded as mux_shm.c / server.c do (a private copy, wire_decode). The
 * first 2 bytes pick how much of the ring counts as published. The frame
 * goes through dplane_entry_decode, the decoder both sides use. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/dplane/dplane.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    /* a fresh segment each run; one entry spans what the fuzzer gives */
    dplane_shm_t *s;
    if (dplane_shm_create(4096, &s) != ECS_OK)
        return 0;
    dplane_entry_t e;
    uint8_t *buf = NULL;
    size_t cap = 0;
    const size_t want = ((size_t)data[0] | (size_t)data[1] << 8) % 3900;
    if (dplane_ring_reserve(s, DPLANE_RESULTS, 0, want, &e) == ECS_OK) {
        uint8_t *start = e.frame - 16;
        const size_t room = e.payload + e.payload_len - start;
        dplane_ring_commit(s, DPLANE_RESULTS, &e, 0);
        /* the peer rewrites the entry header and body after publishing */
        const size_t n = size - 2 < room ? size - 2 : room;
        memcpy(start, data + 2, n);
        for (int i = 0; i < 64; i++) {
            dplane_entry_t r;
            if (dplane_ring_peek(s, DPLANE_RESULTS, &r) != ECS_OK)
                break;
            wire_msg_t w;
            dplane_entry_decode(&r, &buf, &cap, &w);
            wire_msg_clear(&w);
            dplane_ring_release(s, DPLANE_RESULTS, &r);
        }
    }
    free(buf);
    dplane_shm_free(s);
    return 0;
}
