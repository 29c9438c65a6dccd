/* whole.c - a decode-sized call whole to one replica on all the host's
 * cores (DISPATCH_ALONE_ROWS): which replica takes it, and the thread
 * count every call to a spawned worker carries (ExpertCall.threads).
 * The model thread's, inside submit (dispatch.c). */
#include "coordinator/dispatch/dispatch_int.h"

/* Whether worker wi is live, connected, spawned here and its threads
 * sized by this coordinator (it shares the host's cores with the others:
 * dispatch_share_threads). */
bool dispatch_shares_cores(dispatch_t *d, int wi)
{
    return d->share_threads > 0 && d->w[wi].child >= 0 &&
           atomic_load(&d->w[wi].state) == DW_LIVE && atomic_load(&d->w[wi].peer) >= 0;
}

static bool holds_todo(dispatch_t *d, int wi)
{
    for (int e = 0; e < d->hp.n_expert; e++) {
        if (!d->b->todo[e])
            continue;
        const int16_t *h;
        const int n = placement_holders(d->pl, d->b->layer, e, &h);
        int i = 0;
        while (i < n && h[i] != wi)
            i++;
        if (i == n)
            return false;
    }
    return true;
}

/* A decode-sized call (DISPATCH_ALONE_ROWS) whose experts are all held by
 * one spawned worker goes whole to one such holder: the one with the
 * fewest calls in flight (choose()'s first rule, for the whole call), ties
 * to the one that took the last such call, then the next in order. Not
 * round robin: alternating the replicas decoded 1.11-1.36x slower on
 * ds2-lite-4l (docs/benchmarks.md); with one call out at a time the other
 * replica idles either way, and a second micro-batch's call finds the
 * busy one with a call in flight and goes to another. -1: none (the call
 * is dealt per expert). Which worker computes a call does not change its
 * bits. */
int dispatch_choose_whole(dispatch_t *d)
{
    if (d->b->n_tok > DISPATCH_ALONE_ROWS || d->n_workers < 2 || d->share_threads <= 0)
        return -1;
    int best = -1;
    uint32_t best_fl = 0;
    for (int i = 0; i < d->n_workers; i++) {
        const int wi = (i + d->last_whole) % d->n_workers;
        if (!dispatch_shares_cores(d, wi) || !holds_todo(d, wi))
            continue;
        const uint32_t fl = mux_peer_inflight(d->mux, atomic_load(&d->w[wi].peer));
        if (best < 0 || fl < best_fl) {
            best = wi;
            best_fl = fl;
        }
    }
    return best;
}

/* Once the experts are dealt (d->rows_now): whether the call is alone
 * (one worker gets rows, and no other worker sharing the cores has a call
 * out, another micro-batch's: it may take all of them), and whether it
 * went whole to the replica dispatch_choose_whole gave (one). */
void dispatch_note_whole(dispatch_t *d, int one)
{
    int n_to = 0, to = -1;
    for (int wi = 0; wi < d->n_workers; wi++)
        if (d->rows_now[wi]) {
            n_to++;
            to = wi;
        }
    d->alone = n_to == 1;
    for (int wi = 0; wi < d->n_workers && d->alone; wi++)
        if (wi != to && dispatch_shares_cores(d, wi) &&
            mux_peer_inflight(d->mux, atomic_load(&d->w[wi].peer)) > 0)
            d->alone = false;
    d->whole = one >= 0 && d->alone;
    if (d->whole)
        d->last_whole = one;
}

/* The threads worker wi computes this submit's call with (ExpertCall.threads):
 * its own (0) when it alone is busy among the workers sharing the cores, else
 * its share of them. */
uint32_t dispatch_call_threads(dispatch_t *d, int wi)
{
    if (d->w[wi].child < 0 || d->share_threads <= 0 || d->alone)
        return 0;
    const int t = d->w[wi].threads > 0 && d->w[wi].threads < d->share_threads
                      ? d->w[wi].threads
                      : d->share_threads;
    return (uint32_t)t;
}
