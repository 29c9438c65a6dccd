/* fuzz_wire.c - libFuzzer target for the message decoder: any pair of
 * frames must either decode into a message that passes wire_check (every
 * entry's row inside the payload, the payload exactly the size the header
 * names) and re-encodes, or fail with a message; never crash or leak.
 *
 * Input: byte 0 bit 0 = a payload frame follows; bytes 1..4 = the first
 * frame's length (little endian, clamped to what is there); then the first
 * frame; the rest is the payload frame. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 5)
        return 0;
    const bool has = data[0] & 1;
    size_t n0 = (size_t)data[1] | (size_t)data[2] << 8 | (size_t)data[3] << 16 |
                (size_t)data[4] << 24;
    data += 5;
    size -= 5;
    if (n0 > size)
        n0 = size;
    /* copies, so that ASan sees any read past either frame */
    uint8_t *f0 = malloc(n0 ? n0 : 1), *f1 = malloc(size - n0 ? size - n0 : 1);
    if (!f0 || !f1)
        __builtin_trap();
    memcpy(f0, data, n0);
    memcpy(f1, data + n0, size - n0);
    wire_msg_t m;
    ecs_clear_error();
    if (wire_decode(f0, n0, f1, size - n0, has, &m) != ECS_OK) {
        if (!ecs_errmsg()[0] || m.pb_)
            __builtin_trap(); /* every failure says why and owns nothing */
    } else {
        if (wire_check(&m) != ECS_OK)
            __builtin_trap();
        volatile uint8_t sink = 0;
        if (m.kind == WIRE_CALL) {
            const wire_call_t *c = &m.call;
            const size_t row = wire_row_bytes(c->dtype, c->n_embd);
            for (size_t j = 0; j < c->n_entries; j++) {
                const uint8_t *r = (const uint8_t *)c->payload + (size_t)c->row_index[j] * row;
                sink ^= r[0] ^ r[row - 1];
            }
        } else if (m.kind == WIRE_RESULT && m.result.payload_bytes) {
            const uint8_t *p = m.result.payload;
            sink ^= p[m.result.payload_bytes - 1];
        }
        (void)sink;
        /* what decoded must encode again to the same frame size */
        size_t want = 0, len = 0;
        if (wire_frame_size(&m, &want) != ECS_OK)
            __builtin_trap();
        uint8_t *out = malloc(want);
        if (!out || wire_encode(&m, out, want, &len) != ECS_OK || len != want)
            __builtin_trap();
        free(out);
    }
    wire_msg_clear(&m);
    free(f0);
    free(f1);
    return 0;
}
