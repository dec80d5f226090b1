/* The supervised JSON-lines child process (process.h). */
#include "rl/proc/process.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/alloc.h"
#include "trill/timing.h"

extern char **environ;

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

enum { STDERR_LINE_MAX = 320 };
#define REPLY_MAX ((size_t)16 << 20) /* a longer reply line is a failure, not unbounded memory */
#define EXIT_GRACE_S 0.5             /* how long a child that closed its output may take to exit */

struct rl_process {
    const char *what;
    char *command;
    double timeout_s;
    pid_t pid; /* 0: not running; also its process group id */
    int to_child, from_child, child_err; /* parent ends of its stdin, stdout, stderr; -1: closed */
    char *out; /* bytes read from its stdout, not yet consumed */
    size_t out_len, out_cap;
    char err_last[STDERR_LINE_MAX]; /* last complete non-blank stderr line */
    char err_part[STDERR_LINE_MAX]; /* the stderr line being received (truncated) */
    size_t err_part_len;
};

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* A close-on-exec pipe with both ends above 2, so the child's dup2 onto 0..2 always makes a
 * new descriptor without the flag; other children never inherit either end. */
static int make_pipe(int fds[2]) {
    if (pipe2(fds, O_CLOEXEC) != 0) return -1;
    for (int k = 0; k < 2; k++) {
        if (fds[k] > 2) continue;
        int high = fcntl(fds[k], F_DUPFD_CLOEXEC, 3);
        if (high < 0) {
            int e = errno;
            close(fds[0]);
            close(fds[1]);
            errno = e;
            return -1;
        }
        close(fds[k]);
        fds[k] = high;
    }
    return 0;
}

static trill_status spawn_child(rl_process *p) {
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    if (make_pipe(in) != 0 || make_pipe(out) != 0 || make_pipe(err) != 0) {
        int e = errno;
        for (int k = 0; k < 2; k++) close_fd(&in[k]), close_fd(&out[k]), close_fd(&err[k]);
        return trill_error(TRILL_ERR_IO, "%s \"%s\": pipe: %s", p->what, p->command, strerror(e));
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
    /* Nor descriptors this process inherited without close-on-exec. */
    posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
    /* Its own process group, so a timeout kills the whole pipeline the shell started; default
     * SIGPIPE and an empty signal mask whatever this thread has. */
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t none, defaults;
    sigemptyset(&none);
    sigemptyset(&defaults);
    sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {(char *)"sh", (char *)"-c", p->command, NULL};
    pid_t pid;
    int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
        close(in[1]);
        close(out[0]);
        close(err[0]);
        return trill_error(TRILL_ERR_IO, "%s \"%s\": cannot start /bin/sh: %s", p->what, p->command, strerror(rc));
    }
    /* Writes never block: a child that stops reading must still time out. */
    fcntl(in[1], F_SETFL, fcntl(in[1], F_GETFL) | O_NONBLOCK);
    p->pid = pid;
    p->to_child = in[1];
    p->from_child = out[0];
    p->child_err = err[0];
    p->out_len = 0;
    p->err_last[0] = '\0';
    p->err_part_len = 0;
    return TRILL_OK;
}

/* Kills the child's process group and reaps the child. Until it is reaped the child keeps its
 * pid, so the group id cannot have been reused. *status: its wait status. */
static void stop_child(rl_process *p, int *status) {
    int st = 0;
    if (p->pid > 0) {
        kill(-p->pid, SIGKILL);
        while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {
        }
    }
    if (status) *status = st;
    p->pid = 0;
    close_fd(&p->to_child);
    close_fd(&p->from_child);
    close_fd(&p->child_err);
    p->out_len = 0;
}

static bool is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!is_space(s[i])) return false;
    return true;
}

/* Keeps the last non-blank stderr line (control characters shown as '?'). */
static void take_stderr(rl_process *p, const char *buf, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = buf[i];
        if (c == '\n') {
            if (!is_blank(p->err_part, p->err_part_len)) {
                memcpy(p->err_last, p->err_part, p->err_part_len);
                p->err_last[p->err_part_len] = '\0';
            }
            p->err_part_len = 0;
        } else if (c != '\r' && p->err_part_len < STDERR_LINE_MAX - 1) {
            p->err_part[p->err_part_len++] = (unsigned char)c < 0x20 && c != '\t' ? '?' : c;
        }
    }
}

static const char *last_stderr_line(rl_process *p) {
    if (!is_blank(p->err_part, p->err_part_len)) {
        p->err_part[p->err_part_len] = '\0';
        return p->err_part;
    }
    return p->err_last;
}

/* One read from its stderr (poll said it is readable, so this does not block); EOF closes it. */
static void read_stderr(rl_process *p) {
    char buf[4096];
    ssize_t n = read(p->child_err, buf, sizeof buf);
    if (n > 0) take_stderr(p, buf, (size_t)n);
    else if (n == 0 || (errno != EINTR && errno != EAGAIN)) close_fd(&p->child_err);
}

/* Waits up to `seconds` for the child to exit by itself (left unreaped), reading its stderr
 * meanwhile so that a traceback's last line is kept. True when it has exited. */
static bool await_exit(rl_process *p, double seconds) {
    double end = trill_now() + seconds;
    for (;;) {
        siginfo_t info;
        info.si_pid = 0;
        bool exited = waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == p->pid;
        double left = end - trill_now();
        if (exited || left <= 0) {
            /* What it wrote before exiting is in the pipe already; a grandchild may hold it open. */
            for (int k = 0; k < 64 && p->child_err >= 0; k++) {
                struct pollfd fd = {p->child_err, POLLIN, 0};
                if (poll(&fd, 1, 0) <= 0) break;
                read_stderr(p);
            }
            return exited;
        }
        struct pollfd fd = {p->child_err, POLLIN, 0};
        if (poll(&fd, p->child_err >= 0 ? 1 : 0, left < 0.01 ? (int)ceil(left * 1000) : 10) > 0) read_stderr(p);
    }
}

/* write() that returns EPIPE instead of raising SIGPIPE, without touching the process's signal
 * dispositions: SIGPIPE is blocked in this thread for the call and a SIGPIPE it raised is
 * consumed before unblocking. */
static ssize_t write_no_sigpipe(int fd, const void *buf, size_t n) {
    sigset_t pipe_set, old, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    sigpending(&pending);
    bool was_pending = sigismember(&pending, SIGPIPE);
    ssize_t w = write(fd, buf, n);
    int e = errno;
    if (w < 0 && e == EPIPE && !was_pending) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return w;
}

static void consume_output(rl_process *p, size_t n) {
    memmove(p->out, p->out + n, p->out_len - n);
    p->out_len -= n;
}

/* The child closed its stdout: waits briefly for it to exit, reaps it and says how it ended. */
static void describe_end(rl_process *p, char *why, size_t cap) {
    bool exited = await_exit(p, EXIT_GRACE_S);
    int status;
    stop_child(p, &status);
    if (!exited) snprintf(why, cap, "no reply: it closed its stdout (killed)");
    else if (WIFEXITED(status)) snprintf(why, cap, "no reply: it exited with status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status)) {
        const char *name = sigabbrev_np(WTERMSIG(status));
        snprintf(why, cap, "no reply: it was killed by signal %d (SIG%s)", WTERMSIG(status), name ? name : "?");
    } else snprintf(why, cap, "no reply: it exited");
}

void trill_rl_process_excerpt(const char *s, size_t n, char out[96]) {
    size_t k = n < 80 ? n : 80;
    for (size_t i = 0; i < k; i++) out[i] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    strcpy(out + k, n > k ? "..." : "");
}

/* Reads what the child's stdout holds into p->out: 1 bytes read, 0 end of file or an error
 * (`why` set), -1 nothing there right now, -2 out of memory (`why` set). */
static int read_output(rl_process *p, char *why, size_t cap) {
    if (p->out_len == p->out_cap) {
        size_t cap_new = p->out_cap ? 2 * p->out_cap : 4096;
        char *grown = trill_realloc(p->out, cap_new);
        if (!grown) {
            snprintf(why, cap, "out of memory reading the reply");
            return -2;
        }
        p->out = grown;
        p->out_cap = cap_new;
    }
    ssize_t n = read(p->from_child, p->out + p->out_len, p->out_cap - p->out_len);
    if (n > 0) {
        p->out_len += (size_t)n;
        return 1;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return -1;
    describe_end(p, why, cap);
    return 0;
}

/* Output that is there before a request is sent answers nothing: the process wrote more reply
 * lines than it was sent requests, and its rewards would land on the wrong completions. (A
 * surplus line still in flight when the next request goes out is caught one request later.) */
static bool no_surplus_output(rl_process *p, char *why, size_t cap) {
    struct pollfd pf = { p->from_child, POLLIN, 0 };
    while (p->out_len <= REPLY_MAX && poll(&pf, 1, 0) > 0 && (pf.revents & (POLLIN | POLLHUP))) {
        const int got = read_output(p, why, cap);
        if (got == -2) stop_child(p, NULL);
        if (got == 0 || got == -2) return false; /* it ended (or memory did) before the request */
        if (got == -1) break;
    }
    if (!is_blank(p->out, p->out_len)) {
        char shown[96];
        const char *nl = memchr(p->out, '\n', p->out_len);
        trill_rl_process_excerpt(p->out, nl ? (size_t)(nl - p->out) : p->out_len, shown);
        snprintf(why, cap, "wrote a line before it was sent a request (more replies than requests): \"%s\"", shown);
        stop_child(p, NULL);
        return false;
    }
    p->out_len = 0; /* blank lines */
    return true;
}

/* Writes the request and reads the reply line (blank lines skipped) within the timeout: true
 * with the line at p->out[0, *line_len), its '\n' replaced by NUL. False with `why` and the
 * child stopped. */
static bool exchange(rl_process *p, const char *request, size_t request_len, size_t *line_len, char *why,
                     size_t cap) {
    double deadline = trill_now() + p->timeout_s;
    size_t written = 0;
    if (!no_surplus_output(p, why, cap)) return false;
    for (;;) {
        /* A line that arrives before the whole request is written cannot be its reply. */
        char *nl;
        while (written == request_len && p->out_len > 0 && (nl = memchr(p->out, '\n', p->out_len)) != NULL) {
            size_t n = (size_t)(nl - p->out);
            if (!is_blank(p->out, n)) {
                *nl = '\0';
                *line_len = n;
                return true;
            }
            consume_output(p, n + 1);
        }
        if (p->out_len > REPLY_MAX) {
            snprintf(why, cap, "reply line longer than %zu bytes", REPLY_MAX);
            stop_child(p, NULL);
            return false;
        }
        double left = deadline - trill_now();
        if (left <= 0) {
            snprintf(why, cap, "no reply within %g s (killed)", p->timeout_s);
            stop_child(p, NULL);
            return false;
        }
        struct pollfd fds[3];
        int nfds = 0, in_i = -1, err_i = -1;
        if (written < request_len && p->to_child >= 0) {
            in_i = nfds;
            fds[nfds++] = (struct pollfd){p->to_child, POLLOUT, 0};
        }
        int out_i = nfds;
        fds[nfds++] = (struct pollfd){p->from_child, POLLIN, 0};
        if (p->child_err >= 0) {
            err_i = nfds;
            fds[nfds++] = (struct pollfd){p->child_err, POLLIN, 0};
        }
        int r = poll(fds, (nfds_t)nfds, left > 1e6 ? 1000000000 : (int)ceil(left * 1000));
        if (r < 0) {
            if (errno == EINTR) continue;
            snprintf(why, cap, "poll: %s", strerror(errno));
            stop_child(p, NULL);
            return false;
        }
        if (err_i >= 0 && fds[err_i].revents) read_stderr(p);
        if (in_i >= 0 && fds[in_i].revents) {
            ssize_t n = write_no_sigpipe(p->to_child, request + written, request_len - written);
            if (n > 0) written += (size_t)n;
            else if (n < 0 && errno != EAGAIN && errno != EINTR) close_fd(&p->to_child); /* it closed its
                stdin: its stdout's end or the timeout tells the rest */
        }
        if (fds[out_i].revents) {
            const int got = read_output(p, why, cap);
            if (got == -2) stop_child(p, NULL);
            if (got == 0 || got == -2) return false;
        }
    }
}


trill_status trill_rl_process_start(const char *what, const char *command, double timeout_s, rl_process **out) {
    *out = NULL;
    if (!command || is_blank(command, strlen(command))) return trill_error(TRILL_ERR_INVALID, "%s: the command line is empty", what);
    if (!(timeout_s > 0) || !isfinite(timeout_s))
        return trill_error(TRILL_ERR_INVALID, "%s \"%s\": timeout %g s, expected a positive number", what, command, timeout_s);
    rl_process *p = trill_calloc(1, sizeof *p);
    if (!p || !(p->command = trill_strdup(command))) {
        free(p);
        return trill_error(TRILL_ERR_NOMEM, "%s: out of memory", what);
    }
    p->what = what;
    p->timeout_s = timeout_s;
    p->to_child = p->from_child = p->child_err = -1;
    trill_status st = spawn_child(p);
    if (st != TRILL_OK) {
        trill_rl_process_free(p);
        return st;
    }
    *out = p;
    return TRILL_OK;
}

void trill_rl_process_free(rl_process *p) {
    if (!p) return;
    if (p->pid > 0) {
        close_fd(&p->to_child);
        await_exit(p, EXIT_GRACE_S);
        stop_child(p, NULL);
    }
    free(p->out);
    free(p->command);
    free(p);
}

bool trill_rl_process_running(const rl_process *p) { return p->pid > 0; }

trill_status trill_rl_process_spawn(rl_process *p) { return p->pid > 0 ? TRILL_OK : spawn_child(p); }

void trill_rl_process_kill(rl_process *p) { stop_child(p, NULL); }

bool trill_rl_process_exchange(rl_process *p, const char *request, size_t len, const char **line, size_t *line_len, char *why,
                               size_t cap) {
    if (!exchange(p, request, len, line_len, why, cap)) return false;
    *line = p->out;
    return true;
}

void trill_rl_process_consume(rl_process *p, size_t line_len) { consume_output(p, line_len + 1); }

const char *trill_rl_process_command(const rl_process *p) { return p->command; }

const char *trill_rl_process_stderr(rl_process *p) { return last_stderr_line(p); }
