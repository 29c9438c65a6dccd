/* cli.c - command-line value parsing shared by the programs (cli.h). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>

#include "common/cli.h"

bool ecs_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

bool ecs_parse_int(const char *s, long lo, long hi, int *out)
{
    long v;
    if (!ecs_parse_long(s, lo, hi, &v) || v < -2147483647L - 1 || v > 2147483647L)
        return false;
    *out = (int)v;
    return true;
}

bool ecs_parse_float(const char *s, float *out)
{
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

bool ecs_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0))
        return false;
    double mul = 1;
    switch (*end) {
    case 'k': case 'K': mul = 1024.0; end++; break;
    case 'm': case 'M': mul = 1048576.0; end++; break;
    case 'g': case 'G': mul = 1073741824.0; end++; break;
    case 't': case 'T': mul = 1099511627776.0; end++; break;
    default: break;
    }
    if (*end == 'i')
        end++;
    if (*end == 'B')
        end++;
    if (*end || v * mul > 1e18)
        return false;
    *out = (uint64_t)(v * mul);
    return true;
}
