/* test_placement.c - made placements give every expert its replicas on
 * distinct workers with shares proportional to capacity in every layer;
 * placement files load, reject bad lines with their line number, and a
 * written placement loads back identical. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "coordinator/dispatch/dispatch.h"

static const dispatch_shape_t ds2 = {.n_layer = 27, .first_moe = 1, .n_expert = 64};

/* Rows of layer l held by each worker, summed over the layer's experts. */
static void layer_counts(const placement_t *p, int l, int *cnt)
{
    memset(cnt, 0, sizeof(int) * (size_t)placement_n_workers(p));
    for (int e = 0; e < ds2.n_expert; e++) {
        const int16_t *h;
        int n = placement_holders(p, l, e, &h);
        for (int i = 0; i < n; i++)
            cnt[h[i]]++;
    }
}

Test(placement, uniform_every_expert_once_balanced_per_layer)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 1}, {"w2", 1}};
    placement_t *p;
    cr_assert_eq(placement_make(&ds2, w, 3, 1, &p), ECS_OK, "%s", ecs_errmsg());
    for (int l = 0; l < ds2.n_layer; l++) {
        int cnt[3];
        layer_counts(p, l, cnt);
        for (int i = 0; i < 3; i++) {
            if (l == 0)
                cr_assert_eq(cnt[i], 0, "dense layer 0 has holders");
            else
                cr_assert(cnt[i] == 21 || cnt[i] == 22, "layer %d worker %d holds %d", l, i,
                          cnt[i]);
        }
    }
    /* over all layers the remainders spread: totals within one of each other */
    int t0 = placement_held(p, 0), t1 = placement_held(p, 1), t2 = placement_held(p, 2);
    cr_assert_eq(t0 + t1 + t2, 26 * 64);
    cr_assert(abs(t0 - t1) <= 1 && abs(t1 - t2) <= 1 && abs(t0 - t2) <= 1, "%d %d %d", t0, t1,
              t2);
    cr_assert_eq(placement_replication(p), 1);
    placement_free(p);
}

Test(placement, weighted_and_replicated)
{
    placement_worker_t w[] = {{"big", 2}, {"a", 1}, {"b", 1}};
    placement_t *p;
    cr_assert_eq(placement_make(&ds2, w, 3, 2, &p), ECS_OK, "%s", ecs_errmsg());
    for (int l = 1; l < ds2.n_layer; l++)
        for (int e = 0; e < ds2.n_expert; e++) {
            const int16_t *h;
            cr_assert_eq(placement_holders(p, l, e, &h), 2);
            cr_assert_neq(h[0], h[1], "replicas of %d/%d on one worker", l, e);
        }
    /* 128 slots a layer; the big worker may take at most one per expert (64) */
    int cnt[3];
    layer_counts(p, 5, cnt);
    cr_assert_eq(cnt[0] + cnt[1] + cnt[2], 128);
    cr_assert(cnt[0] >= 62 && cnt[0] <= 64, "big worker holds %d", cnt[0]);
    placement_free(p);

    placement_worker_t v[] = {{"x", 3}, {"y", 1}};
    cr_assert_eq(placement_make(&ds2, v, 2, 1, &p), ECS_OK);
    layer_counts(p, 9, cnt);
    cr_assert(cnt[0] >= 47 && cnt[0] <= 49, "x holds %d of 64", cnt[0]);
    placement_free(p);
}

Test(placement, bad_arguments)
{
    placement_worker_t w[] = {{"w0", 1}, {"w0", 1}};
    placement_t *p = (placement_t *)1;
    cr_assert_eq(placement_make(&ds2, w, 2, 1, &p), ECS_ERR_INVAL);
    cr_assert_null(p);
    cr_assert(strstr(ecs_errmsg(), "twice"), "%s", ecs_errmsg());
    placement_worker_t v[] = {{"a", 1}, {"b", 0}};
    cr_assert_eq(placement_make(&ds2, v, 2, 1, &p), ECS_ERR_RANGE);
    v[1].weight = 1;
    cr_assert_eq(placement_make(&ds2, v, 2, 3, &p), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "replication 3"), "%s", ecs_errmsg());
    dispatch_shape_t bad = {.n_layer = 3, .first_moe = 3, .n_expert = 8};
    cr_assert_eq(placement_make(&bad, v, 2, 1, &p), ECS_ERR_INVAL);
}

static char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ecs-placement-XXXXXX");
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(placement, file_rules_and_errors)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 1}};
    placement_t *p;
    char *path = write_tmp("# two halves, and a replica of layer 5's first four\n"
                           "w0 * 0-31\n"
                           "w1 0-26 32-63   # dense layer 0 is skipped\n"
                           "w1 5 0,1,2-3\n\n");
    cr_assert_eq(placement_load(&ds2, path, w, 2, &p), ECS_OK, "%s", ecs_errmsg());
    const int16_t *h;
    cr_assert_eq(placement_holders(p, 5, 2, &h), 2);
    cr_assert_eq(placement_holders(p, 6, 2, &h), 1);
    cr_assert_eq(h[0], 0);
    cr_assert_eq(placement_holders(p, 6, 40, &h), 1);
    cr_assert_eq(h[0], 1);
    cr_assert_eq(placement_held(p, 1), 26 * 32 + 4);
    cr_assert_eq(placement_replication(p), 1);
    placement_free(p);
    unlink(path);

    struct {
        const char *text, *want;
    } bad[] = {
        {"w0 * 0-31\n", "no holder, first layer 1 expert 32"},
        {"w0 * *\nw9 1 1\n", ":2: unknown worker 'w9'"},
        {"w0 * 0-64\n", ":1: bad experts '0-64'"},
        {"w0 27 1\n", ":1: bad layers '27'"},
        {"w0 * 5-3\n", "bad experts"},
        {"w0 * -1\n", "bad experts"},
        {"w0 *\n", "want 'WORKER LAYERS EXPERTS', got 2 fields"},
        {"w0 * * extra\n", "got 4 fields"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        path = write_tmp(bad[i].text);
        p = (placement_t *)1;
        cr_assert_neq(placement_load(&ds2, path, w, 2, &p), ECS_OK, "case %zu loaded", i);
        cr_assert_null(p);
        cr_assert(strstr(ecs_errmsg(), bad[i].want), "case %zu: '%s' lacks '%s'", i,
                  ecs_errmsg(), bad[i].want);
        unlink(path);
    }
    cr_assert_eq(placement_load(&ds2, "/nonexistent/p.txt", w, 2, &p), ECS_ERR_IO);
    /* from a stream; a NUL byte would hide the rest of its line */
    static const char nul[] = "w0 * *\0 w9 junk\n";
    FILE *f = fmemopen((void *)nul, sizeof nul - 1, "r");
    cr_assert(f);
    cr_assert_eq(placement_read(&ds2, f, "mem", w, 2, &p), ECS_ERR_FORMAT);
    cr_assert_null(p);
    cr_assert(strstr(ecs_errmsg(), "mem:1: a NUL byte"), "%s", ecs_errmsg());
    fclose(f);
}

Test(placement, written_file_loads_back_identical)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 2}, {"w2", 1}};
    placement_t *p, *q;
    cr_assert_eq(placement_make(&ds2, w, 3, 2, &p), ECS_OK);
    char path[] = "/tmp/ecs-placement-w-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    cr_assert_eq(placement_write(p, f), ECS_OK);
    fclose(f);
    cr_assert_eq(placement_load(&ds2, path, w, 3, &q), ECS_OK, "%s", ecs_errmsg());
    for (int l = 0; l < ds2.n_layer; l++)
        for (int e = 0; e < ds2.n_expert; e++) {
            const int16_t *a, *b;
            int na = placement_holders(p, l, e, &a), nb = placement_holders(q, l, e, &b);
            cr_assert_eq(na, nb);
            for (int i = 0; i < na; i++) {
                bool found = false;
                for (int j = 0; j < nb; j++)
                    found |= a[i] == b[j];
                cr_assert(found, "layer %d expert %d", l, e);
            }
        }
    placement_free(p);
    placement_free(q);
    unlink(path);
}

/* Drain and undrain: without(w1) leaves w1 nothing, every pair keeps its
 * replication on distinct workers, w1's pairs spread over the others;
 * with(w1) gives it an even share back; union holds both. */
Test(placement, without_and_with_keep_replication_and_balance)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 1}, {"w2", 1}, {"w3", 1}};
    placement_t *p, *d, *u, *b;
    cr_assert_eq(placement_make(&ds2, w, 4, 2, &p), ECS_OK, "%s", ecs_errmsg());
    const bool usable[] = {true, false, true, true};
    cr_assert_eq(placement_without(p, 1, usable, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(placement_held(d, 1), 0);
    cr_assert_eq(placement_held(p, 1), 26 * 64 * 2 / 4, "the old placement changed");
    for (int l = 1; l < ds2.n_layer; l++) {
        int cnt[4];
        layer_counts(d, l, cnt);
        /* w1's pairs go to the two workers not already holding each: no
         * one takes more than half of them */
        cr_assert_eq(cnt[0] + cnt[2] + cnt[3], 128);
        for (int i = 0; i < 4; i++)
            if (i != 1)
                cr_assert(cnt[i] >= 32 && cnt[i] <= 48, "layer %d worker %d holds %d", l, i,
                          cnt[i]);
        for (int e = 0; e < ds2.n_expert; e++) {
            const int16_t *h;
            cr_assert_eq(placement_holders(d, l, e, &h), 2, "layer %d expert %d", l, e);
            cr_assert_neq(h[0], h[1]);
        }
    }
    cr_assert_eq(placement_union(p, d, &u), ECS_OK);
    cr_assert(placement_same_share(u, p, 1), "the union keeps w1's pairs");
    cr_assert(!placement_same_share(u, p, 2) || !placement_same_share(u, p, 3),
              "the union gives the others more");
    cr_assert(placement_same_share(d, d, 0));
    const bool all[] = {true, true, true, true};
    cr_assert_eq(placement_with(d, 1, all, &b), ECS_OK);
    for (int l = 1; l < ds2.n_layer; l++) {
        int cnt[4];
        layer_counts(b, l, cnt);
        for (int i = 0; i < 4; i++)
            cr_assert(cnt[i] >= 31 && cnt[i] <= 33, "undrained layer %d worker %d holds %d", l,
                      i, cnt[i]);
        for (int e = 0; e < ds2.n_expert; e++) {
            const int16_t *h;
            cr_assert_eq(placement_holders(b, l, e, &h), 2);
        }
    }
    placement_free(p);
    placement_free(d);
    placement_free(u);
    placement_free(b);
}

/* Every worker holding every expert (--replication auto's spawned
 * layout): a drain cannot move w1's pairs (the others hold them), so they
 * keep one holder fewer; the undrain gives w1 all of them back, not a
 * share moved off w0. */
Test(placement, undrain_restores_full_replication)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 1}};
    placement_t *p, *d, *b;
    cr_assert_eq(placement_make(&ds2, w, 2, 2, &p), ECS_OK, "%s", ecs_errmsg());
    const bool usable[] = {true, false}, all[] = {true, true};
    cr_assert_eq(placement_without(p, 1, usable, &d), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(placement_held(d, 1), 0);
    cr_assert_eq(placement_held(d, 0), 26 * 64);
    cr_assert_eq(placement_with(d, 1, all, &b), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(placement_held(b, 0), 26 * 64, "w0 lost pairs to the undrain");
    cr_assert_eq(placement_held(b, 1), 26 * 64, "w1 got %d pairs back", placement_held(b, 1));
    cr_assert(placement_same_share(b, p, 1) && placement_same_share(b, p, 0));
    placement_free(p);
    placement_free(d);
    placement_free(b);
}

Test(placement, without_refuses_to_orphan_a_pair)
{
    placement_worker_t w[] = {{"w0", 1}, {"w1", 1}};
    placement_t *p, *d = (placement_t *)1;
    cr_assert_eq(placement_make(&ds2, w, 2, 1, &p), ECS_OK);
    const bool none[] = {false, false};
    cr_assert_eq(placement_without(p, 1, none, &d), ECS_ERR_NOTFOUND);
    cr_assert_null(d);
    cr_assert(strstr(ecs_errmsg(), "w1"), "%s", ecs_errmsg());
    placement_free(p);
}

/* --replication auto: spawned workers hold every expert unless a budget
 * cannot hold their share, then the largest replication that fits, 1 at
 * least; workers started by hand keep 1. */
Test(placement, auto_replication)
{
    placement_worker_t w[10] = {{"w0", 1}, {"w1", 1}, {"w2", 1}, {"w3", 1}, {"w4", 1},
                                {"w5", 1}, {"w6", 1}, {"w7", 1}, {"w8", 1}, {"w9", 1}};
    uint64_t bytes[27] = {0}, none[10] = {0}, b[10];
    for (int l = ds2.first_moe; l < ds2.n_layer; l++)
        bytes[l] = 1000; /* a whole copy: 26 x 64 x 1000 bytes */
    const uint64_t copy = 26u * 64u * 1000u;
    int r = -1;
    cr_assert_eq(placement_auto_replication(&ds2, w, 2, true, none, bytes, &r), ECS_OK);
    cr_assert_eq(r, 2, "2 spawned, no budget: each holds every expert (%d)", r);
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, none, bytes, &r), ECS_OK);
    cr_assert_eq(r, 3);
    cr_assert_eq(placement_auto_replication(&ds2, w, 10, true, none, bytes, &r), ECS_OK);
    cr_assert_eq(r, PLACEMENT_MAX_HOLDERS, "capped at the holders a pair can have (%d)", r);
    cr_assert_eq(placement_auto_replication(&ds2, w, 1, true, none, bytes, &r), ECS_OK);
    cr_assert_eq(r, 1);
    for (int i = 0; i < 3; i++)
        b[i] = copy; /* exactly a whole copy fits */
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, b, bytes, &r), ECS_OK);
    cr_assert_eq(r, 3);
    for (int i = 0; i < 3; i++)
        b[i] = copy - 1; /* a byte short: two thirds of a copy (~1110 pairs) fit */
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, b, bytes, &r), ECS_OK);
    cr_assert_eq(r, 2, "%d", r);
    for (int i = 0; i < 3; i++)
        b[i] = 1000000; /* under two thirds, over one third (~555 pairs) */
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, b, bytes, &r), ECS_OK);
    cr_assert_eq(r, 1, "%d", r);
    for (int i = 0; i < 3; i++)
        b[i] = 100; /* nothing fits: 1, for the workers to refuse naming the experts */
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, b, bytes, &r), ECS_OK);
    cr_assert_eq(r, 1);
    /* one worker's budget limits the rest: w1 holds its share of each R */
    uint64_t one[3] = {0, 1200000, 0};
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, true, one, bytes, &r), ECS_OK);
    cr_assert_eq(r, 2, "%d", r);
    /* started by hand: 1 whatever the budgets */
    cr_assert_eq(placement_auto_replication(&ds2, w, 3, false, none, bytes, &r), ECS_OK);
    cr_assert_eq(r, 1);
    /* the layers' sizes count, not just the pairs: a heavy layer tips it */
    b[0] = b[1] = copy - 1;
    bytes[5] = 2000; /* the copy is now copy + 64000 bytes; two thirds still fit */
    cr_assert_eq(placement_auto_replication(&ds2, w, 2, true, b, bytes, &r), ECS_OK);
    cr_assert_eq(r, 1, "2 workers each needing a copy + 64000 over a copy - 1: %d", r);
}
