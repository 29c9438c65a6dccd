/* test_fairq.c - the worker's call queue between coordinators (proto/fairq.h):
 * first in, first out per sender; round robin between senders, so a
 * sender's backlog delays another sender by one item per round at most; a
 * sender that ran dry joins at the end of the round; full and bad keys are
 * refused without losing what is queued. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "proto/fairq.h"

/* item = sender * 1000 + sequence */
static void push(fairq_t *q, int sender, int seq)
{
    char key[16];
    const int n = snprintf(key, sizeof key, "coord-%d", sender);
    cr_assert_eq(fairq_push(q, key, (size_t)n, (uint32_t)(sender * 1000 + seq)), ECS_OK, "%s",
                 ecs_errmsg());
}

static uint32_t pop(fairq_t *q)
{
    uint32_t v;
    cr_assert(fairq_pop(q, &v), "queue empty too early");
    return v;
}

Test(fairq, fifo_for_one_sender)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(16, &q), ECS_OK);
    for (int i = 0; i < 10; i++)
        push(q, 1, i);
    cr_assert_eq(fairq_len(q), 10);
    cr_assert_eq(fairq_senders(q), 1);
    for (int i = 0; i < 10; i++)
        cr_assert_eq(pop(q), 1000u + (uint32_t)i);
    uint32_t v;
    cr_assert(!fairq_pop(q, &v));
    cr_assert_eq(fairq_len(q), 0);
    cr_assert_eq(fairq_senders(q), 0);
    fairq_free(q);
}

Test(fairq, a_backlog_does_not_starve_another_sender)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(256, &q), ECS_OK);
    for (int i = 0; i < 100; i++) /* a busy coordinator queues 100 calls */
        push(q, 1, i);
    push(q, 2, 0); /* then another one sends one */
    push(q, 2, 1);
    /* 1's oldest was first in the round; 2 is next, not after 1's backlog */
    cr_assert_eq(pop(q), 1000u);
    cr_assert_eq(pop(q), 2000u);
    cr_assert_eq(pop(q), 1001u);
    cr_assert_eq(pop(q), 2001u);
    for (int i = 2; i < 100; i++)
        cr_assert_eq(pop(q), 1000u + (uint32_t)i);
    cr_assert_eq(fairq_len(q), 0);
    fairq_free(q);
}

Test(fairq, round_robin_over_three_senders_with_uneven_backlogs)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(64, &q), ECS_OK);
    const int backlog[3] = {5, 1, 3};
    for (int s = 0; s < 3; s++)
        for (int i = 0; i < backlog[s]; i++)
            push(q, s + 1, i);
    const uint32_t want[] = {1000, 2000, 3000, 1001, 3001, 1002, 3002, 1003, 1004};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert_eq(pop(q), want[i], "item %zu", i);
    fairq_free(q);
}

Test(fairq, a_sender_that_ran_dry_joins_at_the_end_of_the_round)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(16, &q), ECS_OK);
    push(q, 1, 0);
    push(q, 2, 0);
    push(q, 2, 1);
    cr_assert_eq(pop(q), 1000u); /* 1 ran dry and left the round */
    push(q, 3, 0);
    push(q, 1, 1); /* 1 comes back behind 2 and 3 */
    cr_assert_eq(pop(q), 2000u); /* 2 goes to the back, behind 1 */
    cr_assert_eq(pop(q), 3000u);
    cr_assert_eq(pop(q), 1001u);
    cr_assert_eq(pop(q), 2001u);
    cr_assert_eq(fairq_senders(q), 0);
    fairq_free(q);
}

Test(fairq, full_and_bad_keys_are_refused_and_lose_nothing)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(4, &q), ECS_OK);
    for (int i = 0; i < 4; i++)
        push(q, i % 2, i);
    cr_assert_eq(fairq_push(q, "x", 1, 99), ECS_ERR_RANGE);
    cr_assert(strstr(ecs_errmsg(), "full"), "%s", ecs_errmsg());
    char big[FAIRQ_KEY_MAX + 1];
    memset(big, 'k', sizeof big);
    cr_assert_eq(fairq_push(q, big, sizeof big, 99), ECS_ERR_INVAL);
    cr_assert_eq(fairq_len(q), 4);
    const uint32_t want[] = {0, 1001, 2, 1003};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pop(q), want[i], "item %d", i);
    /* the pool is whole again: fill it twice over */
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < 4; i++)
            push(q, 7, i);
        for (int i = 0; i < 4; i++)
            cr_assert_eq(pop(q), 7000u + (uint32_t)i);
    }
    cr_assert_eq(fairq_new(0, &(fairq_t *){NULL}), ECS_ERR_RANGE);
    fairq_free(q);
}

Test(fairq, empty_key_and_longest_key_are_distinct_senders)
{
    fairq_t *q;
    cr_assert_eq(fairq_new(8, &q), ECS_OK);
    uint8_t longest[FAIRQ_KEY_MAX];
    memset(longest, 0xab, sizeof longest);
    cr_assert_eq(fairq_push(q, "", 0, 1), ECS_OK);
    cr_assert_eq(fairq_push(q, "", 0, 2), ECS_OK);
    cr_assert_eq(fairq_push(q, longest, sizeof longest, 3), ECS_OK);
    cr_assert_eq(fairq_senders(q), 2);
    cr_assert_eq(pop(q), 1u);
    cr_assert_eq(pop(q), 3u);
    cr_assert_eq(pop(q), 2u);
    fairq_free(q);
}
