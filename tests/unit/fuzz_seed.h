/* fuzz_seed.h - the unit tests that make a fuzz target's seed files (with
 * ECS_WRITE_FUZZ_CORPUS=DIR set) hand each file here; without the
 * variable nothing is written.
 *     fuzz_seed_copy("/tmp/x.gguf", "deepseek2");  // DIR/deepseek2 */
#ifndef ECS_TEST_FUZZ_SEED_H
#define ECS_TEST_FUZZ_SEED_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

static inline void fuzz_seed_copy(const char *path, const char *name)
{
    const char *dir = getenv("ECS_WRITE_FUZZ_CORPUS");
    if (!dir)
        return;
    char out[512], buf[1 << 14];
    snprintf(out, sizeof out, "%s/%s", dir, name);
    FILE *in = fopen(path, "rb"), *o = fopen(out, "wb");
    cr_assert(in && o, "%s -> %s", path, out);
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        cr_assert_eq(fwrite(buf, 1, n, o), n, "%s", out);
    cr_assert(!ferror(in) && fclose(o) == 0, "%s", out);
    fclose(in);
}

#endif
