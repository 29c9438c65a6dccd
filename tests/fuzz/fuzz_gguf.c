/* fuzz_gguf.c - libFuzzer target for the GGUF reader: any byte string must
 * either open (and then every tensor lies inside the buffer and every getter
 * is safe) or fail with a message, never crash or leak. */
#include <stdint.h>
#include <string.h>

#include "common/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file_t *f;
    if (gguf_open_buffer(data, size, "fuzz", &f) != ECS_OK) {
        if (!ecs_errmsg()[0])
            __builtin_trap(); /* every failure must say why */
        return 0;
    }
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(f); i++) {
        const gguf_tensor_t *t = gguf_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->nbytes > data + size)
            __builtin_trap();
        if (t->nbytes)
            sink ^= p[0] ^ p[t->nbytes - 1];
    }
    for (uint64_t i = 0; i < gguf_n_kv(f); i++) {
        const gguf_kv_t *kv = gguf_kv_at(f, i);
        const gguf_value_t *v = &kv->value;
        if (v->type == GGUF_TYPE_ARRAY && v->arr.n) {
            sink ^= (uint8_t)gguf_arr_i64(v, v->arr.n - 1);
            if (v->arr.strs && v->arr.strs[v->arr.n - 1].len)
                sink ^= (uint8_t)v->arr.strs[v->arr.n - 1].ptr[0];
        }
    }
    uint32_t u;
    gguf_get_u32(f, "general.alignment", &u);
    (void)sink;
    gguf_close(f);
    return 0;
}
