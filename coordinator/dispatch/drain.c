/* drain.c - operators' requests (drain, undrain, restart), run one at a
 * time by the control thread, a step per tick.
 *
 * A placement change from A (routing now) to B never fails a call:
 *   GROW    every worker is told to hold A u B (Assign; the workers that
 *           gain pairs reload while they keep serving what they held);
 *           wait until each has said Ready for that generation.
 *   SWITCH  B replaces A for routing between two layers: by the model
 *           thread at its next submit, or here when the model is idle.
 *           No call of a layer is in flight then, so every call sent
 *           later names only pairs of B, which the holders of A u B hold.
 *   SHRINK  every worker is told to hold B; wait for their Ready.
 * A worker that dies meanwhile is reassigned what it must hold now (hold,
 * else pl) when it registers again, as always. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator/dispatch/dispatch_int.h"

enum { PH_NONE, PH_GROW, PH_SWITCH, PH_SHRINK, PH_RESTART };

#define OP_RESTART_MS 120000 /* a restarted worker must be back within this */

static const char *const kind_name[] = {"drain", "undrain", "restart"};

ecs_err_t dispatch_op_start(dispatch_t *d, dispatch_op_kind_t kind, const char *worker,
                            dispatch_op_done_fn done, void *arg)
{
    if ((unsigned)kind > DISPATCH_OP_RESTART || !worker || !worker[0] ||
        strlen(worker) >= PLACEMENT_ID_MAX)
        return ecs_error(ECS_ERR_INVAL, "dispatch: bad request (worker id empty or too long)");
    dispatch_op_t *op = calloc(1, sizeof *op);
    if (!op)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    op->kind = kind;
    snprintf(op->worker, sizeof op->worker, "%s", worker);
    op->done = done;
    op->arg = arg;
    pthread_mutex_lock(&d->lock);
    dispatch_op_t **tail = &d->ops;
    while (*tail)
        tail = &(*tail)->next;
    *tail = op;
    pthread_mutex_unlock(&d->lock);
    return ECS_OK;
}

int dispatch_n_workers(const dispatch_t *d) { return d->n_workers; }

ecs_err_t dispatch_placement_text(dispatch_t *d, char **out)
{
    size_t len;
    *out = NULL;
    FILE *f = open_memstream(out, &len);
    if (!f)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    pthread_mutex_lock(&d->lock);
    ecs_err_t rc = placement_write(d->pl, f);
    pthread_mutex_unlock(&d->lock);
    if (fclose(f) != 0 && rc == ECS_OK)
        rc = ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    if (rc != ECS_OK) {
        free(*out);
        *out = NULL;
    }
    return rc;
}

void dispatch_op_status(dispatch_t *d, char *buf, size_t cap)
{
    static const char *const what[] = {"", "moving experts (workers loading)",
                                       "switching calls over", "releasing experts",
                                       "waiting for it to come back"};
    pthread_mutex_lock(&d->lock);
    if (d->op)
        snprintf(buf, cap, "%s %s: %s", kind_name[d->op->kind], d->op->worker,
                 what[d->op_phase]);
    else
        snprintf(buf, cap, "%s", "");
    pthread_mutex_unlock(&d->lock);
}

static void set_phase(dispatch_t *d, int ph)
{
    pthread_mutex_lock(&d->lock);
    d->op_phase = ph;
    pthread_mutex_unlock(&d->lock);
}

static void finish(dispatch_t *d, ecs_err_t rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void finish(dispatch_t *d, ecs_err_t rc, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dispatch_op_t *op = d->op;
    fprintf(stderr, "dispatch: %s %s: %s\n", kind_name[op->kind], op->worker, msg);
    pthread_mutex_lock(&d->lock);
    d->op = NULL;
    d->op_phase = PH_NONE;
    pthread_mutex_unlock(&d->lock);
    if (op->done)
        op->done(op->arg, rc, msg);
    free(op);
}

/* pl_next replaces pl (under lock, between layers). */
static void swap_locked(dispatch_t *d)
{
    placement_free(d->pl);
    d->pl = d->pl_next;
    d->pl_next = NULL;
}

void dispatch_layer_begin(dispatch_t *d)
{
    pthread_mutex_lock(&d->lock);
    if (d->pl_next && !d->in_layer) /* no other batch's calls out */
        swap_locked(d);
    d->in_layer++;
    pthread_mutex_unlock(&d->lock);
}

void dispatch_layer_end(dispatch_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->in_layer--;
    pthread_mutex_unlock(&d->lock);
}

static bool is_live(const dispatch_t *d, int i) { return atomic_load(&d->w[i].state) == DW_LIVE; }

/* Whether every live worker whose share differs between a and b holds
 * its latest assignment. */
static bool loaded(const dispatch_t *d, const placement_t *a, const placement_t *b, int *waiting)
{
    for (int i = 0; i < d->n_workers; i++)
        if (!placement_same_share(a, b, i) && atomic_load(&d->w[i].state) != DW_FAILED &&
            (!is_live(d, i) || d->w[i].ready_gen != d->w[i].assign_gen)) {
            /* a dead one gets what it must hold when it is back */
            if (atomic_load(&d->w[i].state) == DW_DEAD)
                continue;
            *waiting = i;
            return false;
        }
    return true;
}

static void reassign(dispatch_t *d, const placement_t *a, const placement_t *b)
{
    for (int i = 0; i < d->n_workers; i++)
        if (!placement_same_share(a, b, i) && atomic_load(&d->w[i].state) != DW_FAILED &&
            atomic_load(&d->w[i].state) != DW_DEAD && dispatch_send_assign(d, i) != ECS_OK)
            fprintf(stderr, "%s\n", ecs_errmsg()); /* it is dead: it gets it when back */
}

static void set_drained(dispatch_t *d, int wi, bool on)
{
    pthread_mutex_lock(&d->lock);
    d->w[wi].drained = on;
    pthread_mutex_unlock(&d->lock);
}

/* Starts the change from pl to b (taken over). */
static void change_to(dispatch_t *d, placement_t *b, uint64_t now)
{
    placement_t *u;
    if (placement_union(d->pl, b, &u) != ECS_OK) {
        placement_free(b);
        finish(d, ECS_ERR_NOMEM, "%s", ecs_errmsg());
        return;
    }
    pthread_mutex_lock(&d->lock);
    d->hold = u;
    pthread_mutex_unlock(&d->lock);
    d->op_target = b;
    const int timeout = d->o.start_timeout_ms > 0 ? d->o.start_timeout_ms : 300000;
    d->op_deadline_ms = now + (uint64_t)timeout;
    set_phase(d, PH_GROW);
    reassign(d, d->pl, u);
}

static void begin(dispatch_t *d, uint64_t now)
{
    dispatch_op_t *op = d->op;
    const int wi = dispatch_find_worker(d, op->worker);
    d->op_wi = wi;
    if (wi < 0) {
        finish(d, ECS_ERR_NOTFOUND, "no worker '%s' (see ecsctl workers)", op->worker);
        return;
    }
    dispatch_worker_t *w = &d->w[wi];
    bool usable[PLACEMENT_MAX_WORKERS];
    for (int i = 0; i < d->n_workers; i++)
        usable[i] = i != wi && is_live(d, i) && !d->w[i].drained;
    placement_t *b = NULL;
    if (op->kind == DISPATCH_OP_RESTART) {
        if (w->child >= 0) {
            const pid_t pid = d->children[w->child].pid;
            if (pid <= 0) {
                finish(d, ECS_ERR_INVAL, "not running now (%s); the supervisor restarts it",
                       d->children[w->child].given_up ? "given up on" : "a restart is due");
                return;
            }
            kill(pid, SIGTERM);
            d->op_pid = (int)pid;
            fprintf(stderr, "dispatch: restart %s: SIGTERM to pid %d\n", w->id, (int)pid);
        } else {
            wire_msg_t m = {.kind = WIRE_DRAIN,
                            .drain = {.reason = "restart requested by an operator (ecsctl)"}};
            if (mux_ctrl_send(d->mux, &w->route, &m) != ECS_OK) {
                finish(d, ECS_ERR_IO, "cannot reach it: %s", ecs_errmsg());
                return;
            }
            d->op_pid = w->pid;
            fprintf(stderr, "dispatch: restart %s: asked it to exit (its service manager "
                    "starts it again)\n", w->id);
        }
        d->op_deadline_ms = now + OP_RESTART_MS;
        set_phase(d, PH_RESTART);
        return;
    }
    if (op->kind == DISPATCH_OP_DRAIN) {
        if (w->drained) {
            finish(d, ECS_OK, "already drained");
            return;
        }
        if (placement_without(d->pl, wi, usable, &b) != ECS_OK) {
            finish(d, ECS_ERR_NOTFOUND, "cannot drain: %s", ecs_errmsg());
            return;
        }
        set_drained(d, wi, true);
    } else {
        if (!w->drained) {
            finish(d, ECS_OK, "not drained: nothing to do");
            return;
        }
        if (!is_live(d, wi)) {
            finish(d, ECS_ERR_INVAL, "it is not live now; undrain it when it is back");
            return;
        }
        if (placement_with(d->pl, wi, usable, &b) != ECS_OK) {
            finish(d, ECS_ERR_NOMEM, "cannot undrain: %s", ecs_errmsg());
            return;
        }
        set_drained(d, wi, false);
    }
    change_to(d, b, now);
}

static void step(dispatch_t *d, uint64_t now)
{
    const int wi = d->op_wi;
    dispatch_worker_t *w = &d->w[wi];
    int waiting = -1;
    switch (d->op_phase) {
    case PH_GROW:
        if (!loaded(d, d->pl, d->hold, &waiting)) {
            if (now < d->op_deadline_ms)
                return;
            /* give up: workers may hold more than they need, which is harmless */
            pthread_mutex_lock(&d->lock);
            placement_free(d->hold);
            d->hold = NULL;
            pthread_mutex_unlock(&d->lock);
            placement_free(d->op_target);
            d->op_target = NULL;
            set_drained(d, wi, d->op->kind != DISPATCH_OP_DRAIN);
            finish(d, ECS_ERR_IO, "worker %s did not load its new experts in time; nothing "
                   "changed", d->w[waiting].id);
            return;
        }
        pthread_mutex_lock(&d->lock);
        d->pl_next = d->op_target;
        d->op_target = NULL;
        d->op_phase = PH_SWITCH;
        pthread_mutex_unlock(&d->lock);
        /* the model may be idle: try the switch now */
        __attribute__((fallthrough));
    case PH_SWITCH: {
        pthread_mutex_lock(&d->lock);
        if (d->pl_next && !d->in_layer)
            swap_locked(d);
        const bool taken = !d->pl_next;
        placement_t *u = taken ? d->hold : NULL;
        if (taken)
            d->hold = NULL;
        pthread_mutex_unlock(&d->lock);
        if (!taken)
            return;
        d->op_target = u; /* what they held during the switch, to compare */
        set_phase(d, PH_SHRINK);
        reassign(d, u, d->pl);
        return;
    }
    case PH_SHRINK:
        if (!loaded(d, d->op_target, d->pl, &waiting))
            return;
        placement_free(d->op_target);
        d->op_target = NULL;
        dispatch_state_changed(d);
        if (d->op->kind == DISPATCH_OP_DRAIN)
            finish(d, ECS_OK, "drained: its experts are held by the other workers; it holds "
                   "none and takes no calls");
        else
            finish(d, ECS_OK, "undrained: it holds %d experts again", placement_held(d->pl, wi));
        return;
    case PH_RESTART:
        if (w->pid != d->op_pid && is_live(d, wi) && w->ready_gen == w->assign_gen) {
            finish(d, ECS_OK, "restarted: pid %d, was %d", w->pid, d->op_pid);
        } else if (now > d->op_deadline_ms) {
            finish(d, ECS_ERR_IO, "it has not come back in %d s (state: %s)",
                   OP_RESTART_MS / 1000,
                   atomic_load(&w->state) == DW_FAILED ? "given up on" : "not live");
        }
        return;
    }
}

void dispatch_ops_tick(dispatch_t *d, uint64_t now)
{
    if (!d->op) {
        pthread_mutex_lock(&d->lock);
        dispatch_op_t *op = d->ops;
        if (op) {
            d->ops = op->next;
            op->next = NULL;
            d->op = op;
        }
        pthread_mutex_unlock(&d->lock);
        if (!op)
            return;
        begin(d, now);
        return;
    }
    step(d, now);
}

void dispatch_ops_cancel(dispatch_t *d)
{
    if (d->op)
        finish(d, ECS_ERR_IO, "the coordinator is stopping");
    for (;;) {
        pthread_mutex_lock(&d->lock);
        dispatch_op_t *op = d->ops;
        if (op)
            d->ops = op->next;
        d->op = op;
        pthread_mutex_unlock(&d->lock);
        if (!op)
            break;
        finish(d, ECS_ERR_IO, "the coordinator is stopping");
    }
    pthread_mutex_lock(&d->lock);
    placement_free(d->hold);
    placement_free(d->pl_next);
    d->hold = d->pl_next = NULL;
    pthread_mutex_unlock(&d->lock);
    placement_free(d->op_target);
    d->op_target = NULL;
}

ecs_err_t dispatch_layer_counts(dispatch_t *d, int **counts, int *first, int *n_layer)
{
    const int nw = d->n_workers, f = d->hp.n_layer_dense, nl = d->hp.n_layer - f;
    int *c = calloc((size_t)(nl > 0 ? nl : 1) * (size_t)(nw > 0 ? nw : 1), sizeof *c);
    if (!c)
        return ecs_error(ECS_ERR_NOMEM, "dispatch: out of memory");
    pthread_mutex_lock(&d->lock);
    for (int l = 0; l < nl; l++)
        for (int e = 0; e < d->hp.n_expert; e++) {
            const int16_t *h;
            const int n = placement_holders(d->pl, f + l, e, &h);
            for (int i = 0; i < n; i++)
                c[(size_t)l * (size_t)nw + (size_t)h[i]]++;
        }
    pthread_mutex_unlock(&d->lock);
    *counts = c;
    *first = f;
    *n_layer = nl;
    return ECS_OK;
}
