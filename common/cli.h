/* cli.h - parsing command-line values the same way in every program
 * (ecs-run, ecs-coordinator, ecs-worker, ecs-plan): whole strings only, in
 * range, no silent truncation. Each returns false on anything else, so the
 * caller can name the flag in its message.
 *
 *     int n;  uint64_t bytes;
 *     if (!ecs_parse_int(argv[i], 1, 1024, &n)) fail("--threads: bad count '%s'", argv[i]);
 *     if (!ecs_parse_size("12G", &bytes)) ...   // 12 * 2^30
 */
#ifndef ECS_CLI_H
#define ECS_CLI_H

#include <stdbool.h>
#include <stdint.h>

/* A decimal integer in [lo, hi]. */
bool ecs_parse_long(const char *s, long lo, long hi, long *out);
bool ecs_parse_int(const char *s, long lo, long hi, int *out);
/* A finite float. */
bool ecs_parse_float(const char *s, float *out);
/* A byte count: a number with an optional K, M, G or T (powers of 1024),
 * optionally followed by "i", "B" or "iB"; at most 1e18. */
bool ecs_parse_size(const char *s, uint64_t *out);

#endif
