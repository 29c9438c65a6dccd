/* fuzz_admin.c - libFuzzer target for the admin request decoder: any
 * bytes either decode into a request that re-encodes to one decoding to
 * the same request, or fail with a message; never crash or leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/admin.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *buf = malloc(size ? size : 1); /* a copy: ASan sees reads past it */
    if (!buf)
        return 0;
    memcpy(buf, data, size);
    admin_req_t r, again;
    char err[256];
    if (admin_req_decode(buf, size, &r, err, sizeof err) == ECS_OK) {
        char *s = admin_req_encode(&r);
        if (!s || admin_req_decode(s, strlen(s), &again, err, sizeof err) != ECS_OK ||
            again.cmd != r.cmd || strcmp(again.worker, r.worker))
            abort();
        free(s);
    } else if (!err[0]) {
        abort(); /* a refusal always says why */
    }
    free(buf);
    return 0;
}
