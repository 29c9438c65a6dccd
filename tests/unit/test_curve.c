/* test_curve.c - CURVE key files (made, loaded, refused when unsafe or
 * damaged) and the ZAP handler on real sockets: a listed client's message
 * arrives; an unlisted key and a plaintext peer are refused, counted and
 * reported, and deliver nothing. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/curve.h"

static char dir[64];

static void mkdir_tmp(void)
{
    strcpy(dir, "/tmp/ecs-curve-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void rm_tmp(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(curve, .init = mkdir_tmp, .fini = rm_tmp);

static void path(char *out, const char *name) { sprintf(out, "%s/%s", dir, name); }

static void write_file(const char *name, const char *text, mode_t mode)
{
    char p[128];
    path(p, name);
    FILE *f = fopen(p, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    cr_assert_eq(chmod(p, mode), 0);
}

Test(curve, keygen_then_load)
{
    cr_assert(curve_available(), "libzmq without CURVE");
    char pre[128], key[128], pub[128];
    path(pre, "w1");
    path(key, "w1.key");
    path(pub, "w1.pub");
    cr_assert_eq(curve_keygen(pre), ECS_OK, "%s", ecs_errmsg());
    struct stat st;
    cr_assert_eq(stat(key, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0600);
    curve_keypair_t kp;
    cr_assert_eq(curve_load_keypair(key, &kp), ECS_OK, "%s", ecs_errmsg());
    char p[CURVE_Z85_LEN + 1];
    cr_assert_eq(curve_load_public(pub, p), ECS_OK, "%s", ecs_errmsg());
    cr_assert_str_eq(p, kp.pub);
    cr_assert_eq(curve_load_public(key, p), ECS_OK, "a .key file names its public key too");
    cr_assert_str_eq(p, kp.pub);
    cr_assert_neq(curve_keygen(pre), ECS_OK, "overwrote a key");
    cr_assert(strstr(ecs_errmsg(), "overwrite"), "%s", ecs_errmsg());
}

Test(curve, unsafe_or_damaged_files_are_refused)
{
    char pre[128], key[128];
    path(pre, "a");
    path(key, "a.key");
    cr_assert_eq(curve_keygen(pre), ECS_OK, "%s", ecs_errmsg());
    curve_keypair_t kp;
    cr_assert_eq(chmod(key, 0644), 0);
    cr_assert_eq(curve_load_keypair(key, &kp), ECS_ERR_INVAL);
    cr_assert(strstr(ecs_errmsg(), "chmod 600"), "%s", ecs_errmsg());

    char other[128];
    path(other, "b");
    cr_assert_eq(curve_keygen(other), ECS_OK, "%s", ecs_errmsg());
    curve_keypair_t a, b;
    cr_assert_eq(chmod(key, 0600), 0);
    cr_assert_eq(curve_load_keypair(key, &a), ECS_OK, "%s", ecs_errmsg());
    strcat(other, ".key");
    cr_assert_eq(curve_load_keypair(other, &b), ECS_OK, "%s", ecs_errmsg());
    char text[256];
    snprintf(text, sizeof text, "public %s\nsecret %s\n", a.pub, b.sec);
    write_file("mixed.key", text, 0600);
    path(key, "mixed.key");
    cr_assert_eq(curve_load_keypair(key, &kp), ECS_ERR_FORMAT);
    cr_assert(strstr(ecs_errmsg(), "does not belong"), "%s", ecs_errmsg());

    write_file("short.key", "public abc\nsecret def\n", 0600);
    path(key, "short.key");
    cr_assert_eq(curve_load_keypair(key, &kp), ECS_ERR_FORMAT);
    write_file("bad.pub", "not a key at all, but forty characters!!\n", 0644);
    path(key, "bad.pub");
    char p[CURVE_Z85_LEN + 1];
    cr_assert_eq(curve_load_public(key, p), ECS_ERR_FORMAT, "%s", ecs_errmsg());
    path(key, "missing.pub");
    cr_assert_eq(curve_load_public(key, p), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "missing.pub"), "%s", ecs_errmsg());
}

/* ---- the handshake and the allow list ---- */

static int n_reported;
static void on_refuse(void *u, const char *addr, const char *key)
{
    (void)u;
    (void)addr;
    (void)key;
    __atomic_add_fetch(&n_reported, 1, __ATOMIC_SEQ_CST);
}

static void load(const char *name, curve_keypair_t *kp)
{
    char pre[128], key[128];
    path(pre, name);
    path(key, name);
    strcat(key, ".key");
    cr_assert_eq(curve_keygen(pre), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(curve_load_keypair(key, kp), ECS_OK, "%s", ecs_errmsg());
}

/* A DEALER that sends "hello" to ep, CURVE with kp unless kp is NULL. */
static void *client(void *zctx, const char *ep, const curve_keypair_t *kp, const char *spub)
{
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
    if (kp)
        cr_assert_eq(curve_client_setup(s, kp, spub), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(zmq_connect(s, ep), 0);
    zmq_send(s, "hello", 5, ZMQ_DONTWAIT);
    return s;
}

/* Whether the server receives a message within ms. */
static bool receives(void *srv, int ms)
{
    zmq_pollitem_t it = {srv, 0, ZMQ_POLLIN, 0};
    if (zmq_poll(&it, 1, ms) <= 0)
        return false;
    zmq_msg_t m;
    zmq_msg_init(&m);
    while (zmq_msg_recv(&m, srv, ZMQ_DONTWAIT) >= 0 && zmq_msg_more(&m))
        ;
    zmq_msg_close(&m);
    return true;
}

Test(curve, only_listed_clients_get_through)
{
    curve_keypair_t srv_kp, good, bad;
    load("srv", &srv_kp);
    load("good", &good);
    load("bad", &bad);
    void *zctx = zmq_ctx_new();
    cr_assert(zctx);
    /* allow list from a directory holding only good.pub */
    char cdir[128], cmd[512];
    path(cdir, "clients");
    snprintf(cmd, sizeof cmd, "mkdir %s && cp %s/good.pub %s/", cdir, dir, cdir);
    cr_assert_eq(system(cmd), 0);
    curve_auth_t *auth;
    cr_assert_eq(curve_auth_start_dir(zctx, cdir, on_refuse, NULL, &auth), ECS_OK, "%s",
                 ecs_errmsg());
    void *srv = zmq_socket(zctx, ZMQ_ROUTER);
    int zero = 0;
    zmq_setsockopt(srv, ZMQ_LINGER, &zero, sizeof zero);
    cr_assert_eq(curve_server_setup(srv, &srv_kp), ECS_OK, "%s", ecs_errmsg());
    char ep[128];
    snprintf(ep, sizeof ep, "ipc://%s/srv.sock", dir);
    cr_assert_eq(zmq_bind(srv, ep), 0);

    void *c_bad = client(zctx, ep, &bad, srv_kp.pub);
    void *c_plain = client(zctx, ep, NULL, NULL);
    cr_assert_not(receives(srv, 1000), "an unlisted or plaintext peer got a message through");
    for (int i = 0; i < 100 && curve_auth_refused(auth) < 1; i++)
        usleep(50000);
    cr_assert_geq(curve_auth_refused(auth), 1, "the unlisted key was not refused by ZAP");
    cr_assert_geq(__atomic_load_n(&n_reported, __ATOMIC_SEQ_CST), 1);

    void *c_good = client(zctx, ep, &good, srv_kp.pub);
    cr_assert(receives(srv, 10000), "the listed client's message did not arrive");
    cr_assert_geq(curve_auth_accepted(auth), 1);

    zmq_close(c_bad);
    zmq_close(c_plain);
    zmq_close(c_good);
    zmq_close(srv);
    curve_auth_stop(auth);
    zmq_ctx_term(zctx);
}

Test(curve, second_handler_on_a_context_is_an_error)
{
    void *zctx = zmq_ctx_new();
    curve_auth_t *a, *b;
    cr_assert_eq(curve_auth_start(zctx, NULL, 0, NULL, NULL, &a), ECS_OK, "%s", ecs_errmsg());
    cr_assert_eq(curve_auth_start(zctx, NULL, 0, NULL, NULL, &b), ECS_ERR_IO);
    cr_assert(strstr(ecs_errmsg(), "one handler per context"), "%s", ecs_errmsg());
    const char *junk[] = {"short"};
    cr_assert_eq(curve_auth_start(zctx, junk, 1, NULL, NULL, &b), ECS_ERR_INVAL);
    curve_auth_stop(a);
    zmq_ctx_term(zctx);
}
