/* out.c - ecs-run's input and output edges: SIGINT / SIGTERM stop the run
 * between steps (exit 128 + signal, no half-written file), --dump-logits
 * files appear complete or not at all, every write to standard output is
 * checked (closed stdout, full disk: exit 1 with a message), and -f reads a
 * prompt from a file or standard input. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/ecs-run/run.h"

/* ----------------------------------------------------------------- signals */

static volatile sig_atomic_t stop_sig;

static void on_signal(int sig) { stop_sig = sig; }

void run_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int run_stopped(void) { return (int)stop_sig; }

/* ------------------------------------------------------------------ prompt */

/* Beyond any context a model here takes, in bytes of text. */
#define PROMPT_MAX ((size_t)256 << 20)

int run_read_prompt(const char *path, char **out)
{
    const bool in = !strcmp(path, "-");
    int fd = in ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return run_fail("-f %s: %s", path, strerror(errno));
    struct stat st;
    if (!in && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        return run_fail("-f %s: not a regular file (use -f - to read a pipe)", path);
    }
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    int rc = buf ? 0 : run_fail("-f %s: out of memory", path);
    while (rc == 0) {
        if (len + 1 == cap) {
            char *nb = cap < PROMPT_MAX ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                rc = run_fail("-f %s: prompt over %zu bytes", path, cap - 1);
                break;
            }
            buf = nb;
            cap *= 2;
        }
        const ssize_t got = read(fd, buf + len, cap - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = run_fail("-f %s: %s", path, strerror(errno));
        else if (got == 0)
            break;
        else
            len += (size_t)got;
    }
    if (!in)
        close(fd);
    if (rc == 0 && len == 0)
        rc = run_fail("-f %s: empty prompt", path);
    if (rc == 0 && memchr(buf, '\0', len))
        rc = run_fail("-f %s: the prompt contains a NUL byte", path);
    if (rc) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *out = buf;
    return 0;
}

/* ------------------------------------------------------------ output files */

int run_out_open(run_out_t *o, const char *path)
{
    o->path = path;
    o->tmp[0] = '\0';
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) { /* /dev/stdout, a FIFO... */
        o->f = fopen(path, "w");
        if (!o->f)
            return run_fail("%s: %s", path, strerror(errno));
        return 0;
    }
    /* in the target's directory, so that rename() is atomic */
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", path, (long)getpid()) >=
        sizeof o->tmp)
        return run_fail("%s: path too long", path);
    const int fd = open(o->tmp, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
    if (fd < 0)
        return run_fail("%s: %s", o->tmp, strerror(errno));
    o->f = fdopen(fd, "w");
    if (!o->f) {
        const int err = errno;
        close(fd);
        unlink(o->tmp);
        return run_fail("%s: %s", o->tmp, strerror(err));
    }
    return 0;
}

int run_out_commit(run_out_t *o)
{
    const bool bad = ferror(o->f) != 0;
    int err = bad ? EIO : 0;
    if (fflush(o->f) != 0 && !err)
        err = errno;
    if (fclose(o->f) != 0 && !err)
        err = errno;
    o->f = NULL;
    if (!err && o->tmp[0] && rename(o->tmp, o->path) != 0)
        err = errno;
    if (err && o->tmp[0])
        unlink(o->tmp);
    if (err)
        return run_fail("%s: writing failed: %s", o->path, strerror(err));
    return 0;
}

void run_out_abort(run_out_t *o)
{
    if (o->f)
        fclose(o->f);
    o->f = NULL;
    if (o->tmp[0])
        unlink(o->tmp);
}

/* ----------------------------------------------------------------- stdout */

int run_stdout_check(void)
{
    if (fflush(stdout) != 0 || ferror(stdout))
        return run_fail("standard output: %s (the output is incomplete)",
                        errno ? strerror(errno) : "write error");
    return 0;
}

int run_guard_stdout(bool needed)
{
    if (fcntl(STDOUT_FILENO, F_GETFD) >= 0 || errno != EBADF)
        return 0;
    if (needed)
        return run_fail("standard output is closed: the output would be lost");
    const int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (fd >= 0 && fd != STDOUT_FILENO) { /* fd 1 was free: open() took it */
        dup2(fd, STDOUT_FILENO);
        close(fd);
    }
    return 0;
}
