/* utf8_check.h - a strict UTF-8 check written apart from the tokenizer's
 * own, for the tests that judge its output (the tokenizer's unit tests and
 * fuzz_tokenizer): no overlong forms, no surrogates, nothing past
 * U+10FFFF, no truncated sequence. */
#ifndef ECS_TEST_UTF8_CHECK_H
#define ECS_TEST_UTF8_CHECK_H

#include <stdbool.h>
#include <stddef.h>

static inline bool utf8_valid(const char *str, size_t n)
{
    const unsigned char *s = (const unsigned char *)str;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t len;
        unsigned cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            len = 2;
            cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3;
            cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + len > n)
            return false;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        unsigned min = len == 2 ? 0x80 : len == 3 ? 0x800 : 0x10000;
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += len;
    }
    return true;
}

#endif
