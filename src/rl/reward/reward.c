/* Built-in verifiers and the external reward process (trill/reward.h). */
#include "rl/reward/reward_process.h"
#include "base/alloc.h"
#include "trill/reward.h"

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

#include "base/utf8.h"
#include "base/json.h"
#include "trill/timing.h"

extern char **environ;

/* ---- verifiers ---------------------------------------------------------------------- */

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

static bool has_prefix(const char *s, size_t len, size_t i, const char *prefix) {
    size_t n = strlen(prefix);
    return i <= len && len - i >= n && memcmp(s + i, prefix, n) == 0;
}

static size_t count_digits(const char *s, size_t len, size_t i) {
    size_t j = i;
    while (j < len && is_digit(s[j])) j++;
    return j - i;
}

/* A thousands separator at i: ",", LaTeX "{,}" or a thin space "\,", when exactly three
 * digits follow it. Returns its length (0: none). */
static size_t group_separator(const char *s, size_t len, size_t i) {
    size_t n = 0;
    if (has_prefix(s, len, i, ",")) n = 1;
    else if (has_prefix(s, len, i, "{,}")) n = 3;
    else if (has_prefix(s, len, i, "\\,")) n = 2;
    return n && count_digits(s, len, i + n) == 3 ? n : 0;
}

/* Decimal digits accumulated into mantissa * 10^exponent: the first 18 significant digits are
 * exact in the mantissa, later ones only move the exponent. */
typedef struct {
    uint64_t mantissa;
    int significant;
    long exponent;
} decimal;

static void decimal_digit(decimal *d, char c, bool after_point) {
    if (d->significant < 18) {
        d->mantissa = d->mantissa * 10 + (uint64_t)(c - '0');
        if (d->mantissa) d->significant++;
        if (after_point) d->exponent--;
    } else if (!after_point) {
        d->exponent++;
    }
}

static double decimal_value(const decimal *d) {
    double m = (double)d->mantissa;
    if (m == 0) return 0;
    if (d->exponent < 0) return d->exponent < -330 ? 0 : m / pow(10, (double)-d->exponent);
    return d->exponent > 330 ? INFINITY : m * pow(10, (double)d->exponent);
}

/* An unsigned decimal at s[i] (digits with thousands separators, then ".digits"; or ".digits"),
 * with an exponent when `exponent` is set. Returns the end (i: none). */
static size_t parse_unsigned(const char *s, size_t len, size_t i, bool exponent, double *value) {
    decimal d = {0, 0, 0};
    size_t j = i, lead = count_digits(s, len, i);
    if (lead == 0 && !(has_prefix(s, len, i, ".") && count_digits(s, len, i + 1) > 0)) return i;
    for (; j < i + lead; j++) decimal_digit(&d, s[j], false);
    if (lead > 0 && lead <= 3) {
        size_t sep;
        while ((sep = group_separator(s, len, j)) > 0) {
            for (size_t k = j + sep; k < j + sep + 3; k++) decimal_digit(&d, s[k], false);
            j += sep + 3;
        }
    }
    if (j < len && s[j] == '.' && count_digits(s, len, j + 1) > 0) {
        for (j++; j < len && is_digit(s[j]); j++) decimal_digit(&d, s[j], true);
    }
    if (exponent && j < len && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        bool negative = false;
        if (k < len && (s[k] == '+' || s[k] == '-')) negative = s[k++] == '-';
        size_t nd = count_digits(s, len, k);
        if (nd > 0 && !(k + nd < len && is_alpha(s[k + nd]))) {
            long e = 0;
            for (size_t t = k; t < k + nd; t++) e = e < 100000 ? e * 10 + (s[t] - '0') : e;
            d.exponent += negative ? -e : e;
            j = k + nd;
        }
    }
    *value = decimal_value(&d);
    return j;
}

/* "\frac{a}{b}" (also \dfrac, \tfrac) at s[i], a and b decimals. Returns the end (i: none). */
static size_t parse_latex_fraction(const char *s, size_t len, size_t i, double *value) {
    static const char *const names[] = {"\\frac{", "\\dfrac{", "\\tfrac{"};
    size_t j = i;
    for (int n = 0; n < 3 && j == i; n++)
        if (has_prefix(s, len, i, names[n])) j = i + strlen(names[n]);
    if (j == i) return i;
    double part[2];
    for (int k = 0; k < 2; k++) {
        if (k == 1) {
            if (!has_prefix(s, len, j, "{")) return i;
            j++;
        }
        while (j < len && is_space(s[j])) j++;
        bool negative = j < len && s[j] == '-';
        if (negative) j++;
        size_t end = parse_unsigned(s, len, j, false, &part[k]);
        if (end == j) return i;
        if (negative) part[k] = -part[k];
        j = end;
        while (j < len && is_space(s[j])) j++;
        if (!has_prefix(s, len, j, "}")) return i;
        j++;
    }
    if (part[1] == 0) return i;
    *value = part[0] / part[1];
    return j;
}

/* A number starting exactly at s[i] (no sign): a LaTeX fraction, or a decimal optionally
 * followed by "/decimal". Returns the end (i: none). */
static size_t parse_magnitude(const char *s, size_t len, size_t i, double *value) {
    size_t j = parse_latex_fraction(s, len, i, value);
    if (j > i) return j;
    if (i > 0 && s[i] == '.' && is_digit(s[i - 1])) return i; /* the tail of "1.2.3" */
    j = parse_unsigned(s, len, i, true, value);
    if (j == i) return i;
    double denominator;
    size_t k;
    if (j < len && s[j] == '/' && (k = parse_unsigned(s, len, j + 1, false, &denominator)) > j + 1 &&
        denominator != 0) {
        *value /= denominator;
        j = k;
    }
    return j;
}

/* A sign: '-', '+' or U+2212, not preceded by a letter or digit (so "3-4" is 3 and 4). */
static size_t sign_length(const char *s, size_t len, size_t i, bool *negative) {
    if (i > 0 && (is_digit(s[i - 1]) || is_alpha(s[i - 1]))) return 0;
    if (s[i] == '-' || s[i] == '+') {
        *negative = s[i] == '-';
        return 1;
    }
    if (has_prefix(s, len, i, "\xe2\x88\x92")) {
        *negative = true;
        return 3;
    }
    return 0;
}

/* A number starting exactly at s[i]: an optional sign (then an optional "$" or "\\$") and a
 * magnitude. Returns the end (i: none). */
static size_t number_at(const char *s, size_t len, size_t i, double *value) {
    bool negative = false;
    size_t start = i + sign_length(s, len, i, &negative);
    if (start > i) {
        if (has_prefix(s, len, start, "$")) start++;
        else if (has_prefix(s, len, start, "\\$")) start += 2;
    }
    size_t end = parse_magnitude(s, len, start, value);
    if (end == start) return i;
    if (negative) *value = -*value;
    return end;
}

/* The first number in s[*pos, len): sets *value and moves *pos past it; false when none. */
static bool next_number(const char *s, size_t len, size_t *pos, double *value) {
    for (size_t i = *pos; i < len; i++) {
        size_t end = number_at(s, len, i, value);
        if (end > i) {
            *pos = end;
            return true;
        }
    }
    *pos = len;
    return false;
}

static bool last_number(const char *s, size_t len, double *value) {
    size_t pos = 0;
    bool found = false;
    double v;
    while (next_number(s, len, &pos, &v)) {
        *value = v;
        found = true;
    }
    return found;
}

/* The last occurrence of `needle` in s[0, len), or NULL (scanning backwards, so repeated
 * searches with a shrinking len stay linear). */
static const char *last_occurrence(const char *s, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = len >= n ? len - n + 1 : 0; i-- > 0;)
        if (memcmp(s + i, needle, n) == 0) return s + i;
    return NULL;
}

/* The content of the last complete \boxed{...} (braces balanced, "\{" and "\}" not counted):
 * *start and *end bound it. False when there is none. An earlier \boxed{ that is still open
 * where a later unclosed one starts never closes either, so each scan stops there. */
static bool last_boxed(const char *s, size_t len, size_t *start, size_t *end) {
    size_t limit = len;
    const char *b;
    while ((b = last_occurrence(s, limit, "\\boxed{")) != NULL) {
        size_t open = (size_t)(b - s) + strlen("\\boxed{");
        long depth = 1;
        for (size_t i = open; i < limit; i++) {
            if (s[i] == '\\' && i + 1 < limit) i++;
            else if (s[i] == '{') depth++;
            else if (s[i] == '}' && --depth == 0) {
                *start = open;
                *end = i;
                return true;
            }
        }
        limit = (size_t)(b - s); /* unclosed (a truncated generation): look further back */
    }
    return false;
}

/* The number right after the last "####" that has one (spaces, "$" or "\\$" may come between):
 * a "#### Step 2" heading in a model's markdown is not the marker. */
static bool marked_number(const char *s, size_t len, double *value) {
    size_t limit = len;
    const char *m;
    while ((m = last_occurrence(s, limit, "####")) != NULL) {
        size_t i = (size_t)(m - s) + 4;
        while (i < len && (s[i] == ' ' || s[i] == '\t')) i++;
        if (has_prefix(s, len, i, "$")) i++;
        else if (has_prefix(s, len, i, "\\$")) i += 2;
        if (number_at(s, len, i, value) > i) return true;
        limit = (size_t)(m - s);
    }
    return false;
}

bool trill_reward_extract_number(const char *text, double *value) {
    if (!text) return false;
    size_t len = strlen(text);
    double v = 0;
    bool found;
    size_t start, end;
    if (marked_number(text, len, &v)) found = true;
    else if (last_boxed(text, len, &start, &end)) found = last_number(text + start, end - start, &v);
    else found = last_number(text, len, &v);
    if (!found || !isfinite(v)) return false;
    *value = v;
    return true;
}

double trill_reward_numeric(const char *completion, const char *truth) {
    double a, b;
    if (!trill_reward_extract_number(completion, &a) || !trill_reward_extract_number(truth, &b)) return 0.0;
    double diff = fabs(a - b);
    return diff <= 1e-9 || diff <= 1e-6 * fmax(fabs(a), fabs(b)) ? 1.0 : 0.0;
}

/* s without surrounding whitespace: *start and *len. */
static void trim(const char *s, const char **start, size_t *len) {
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    *start = s;
    *len = n;
}

double trill_reward_exact(const char *completion, const char *truth) {
    if (!completion || !truth) return 0.0;
    const char *a, *b;
    size_t na, nb;
    trim(completion, &a, &na);
    trim(truth, &b, &nb);
    return na == nb && memcmp(a, b, na) == 0 ? 1.0 : 0.0;
}

double trill_reward_demo(const char *completion, const char *truth) {
    if (!completion || !truth) return 0.0;
    const char *t;
    size_t nt;
    trim(truth, &t, &nt);
    size_t line = strcspn(completion, "\n");
    return nt > 0 && line == nt && memcmp(completion, t, nt) == 0 ? 1.0 : 0.0;
}

/* ---- external reward process -------------------------------------------------------- */

enum { STDERR_LINE_MAX = 320, WHY_MAX = 640 };
#define REPLY_MAX ((size_t)16 << 20) /* a longer reply line is a failure, not unbounded memory */
#define EXIT_GRACE_S 0.5             /* how long a child that closed its output may take to exit */

struct reward_process {
    char *command;
    double timeout_s;
    int max_failures;
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

static trill_status spawn_child(reward_process *p) {
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    if (make_pipe(in) != 0 || make_pipe(out) != 0 || make_pipe(err) != 0) {
        int e = errno;
        for (int k = 0; k < 2; k++) close_fd(&in[k]), close_fd(&out[k]), close_fd(&err[k]);
        return trill_error(TRILL_ERR_IO, "reward process \"%s\": pipe: %s", p->command, strerror(e));
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
        return trill_error(TRILL_ERR_IO, "reward process \"%s\": cannot start /bin/sh: %s", p->command, strerror(rc));
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
static void stop_child(reward_process *p, int *status) {
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
static void take_stderr(reward_process *p, const char *buf, size_t n) {
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

static const char *last_stderr_line(reward_process *p) {
    if (!is_blank(p->err_part, p->err_part_len)) {
        p->err_part[p->err_part_len] = '\0';
        return p->err_part;
    }
    return p->err_last;
}

/* One read from its stderr (poll said it is readable, so this does not block); EOF closes it. */
static void read_stderr(reward_process *p) {
    char buf[4096];
    ssize_t n = read(p->child_err, buf, sizeof buf);
    if (n > 0) take_stderr(p, buf, (size_t)n);
    else if (n == 0 || (errno != EINTR && errno != EAGAIN)) close_fd(&p->child_err);
}

/* Waits up to `seconds` for the child to exit by itself (left unreaped), reading its stderr
 * meanwhile so that a traceback's last line is kept. True when it has exited. */
static bool await_exit(reward_process *p, double seconds) {
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

static void consume_output(reward_process *p, size_t n) {
    memmove(p->out, p->out + n, p->out_len - n);
    p->out_len -= n;
}

/* The child closed its stdout: waits briefly for it to exit, reaps it and says how it ended. */
static void describe_end(reward_process *p, char *why, size_t cap) {
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

/* The start of a reply for messages: at most 80 bytes, control characters as '?'. */
static void excerpt(const char *s, size_t n, char out[96]) {
    size_t k = n < 80 ? n : 80;
    for (size_t i = 0; i < k; i++) out[i] = (unsigned char)s[i] < 0x20 ? '?' : s[i];
    strcpy(out + k, n > k ? "..." : "");
}

/* Reads what the child's stdout holds into p->out: 1 bytes read, 0 end of file or an error
 * (`why` set), -1 nothing there right now, -2 out of memory (`why` set). */
static int read_output(reward_process *p, char *why, size_t cap) {
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
static bool no_surplus_output(reward_process *p, char *why, size_t cap) {
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
        excerpt(p->out, nl ? (size_t)(nl - p->out) : p->out_len, shown);
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
static bool exchange(reward_process *p, const char *request, size_t request_len, size_t *line_len, char *why,
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

static bool parse_reply(const char *line, size_t n, double *reward, json_t **metrics, char *why, size_t cap) {
    char shown[96];
    excerpt(line, n, shown);
    json_error_t jerr;
    json_t *root = json_loadb(line, n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(why, cap, "reply is not JSON (%s): \"%s\"", jerr.text, shown);
        return false;
    }
    bool ok = false;
    json_t *r = json_is_object(root) ? json_object_get(root, "reward") : NULL;
    json_t *m = json_is_object(root) ? json_object_get(root, "metrics") : NULL;
    if (m && json_is_null(m)) m = NULL;
    if (!json_is_number(r) || !isfinite(json_number_value(r))) {
        snprintf(why, cap, "reply is not an object with a numeric \"reward\": \"%s\"", shown);
    } else if (m && !json_is_object(m)) {
        snprintf(why, cap, "reply's \"metrics\" is not an object (%s): \"%s\"", trill_json_type_name(m), shown);
    } else {
        ok = true;
        const char *key;
        json_t *v;
        if (m) json_object_foreach(m, key, v) {
            if (ok && (!json_is_number(v) || !isfinite(json_number_value(v)))) {
                snprintf(why, cap, "reply's metric \"%s\" is not a number (%s): \"%s\"", key, trill_json_type_name(v),
                         shown);
                ok = false;
            }
        }
    }
    if (ok) {
        *reward = json_number_value(r);
        if (metrics) *metrics = m ? json_incref(m) : NULL;
    }
    json_decref(root);
    return ok;
}

/* A JSON string of s (NULL: ""), invalid UTF-8 replaced by U+FFFD. */
static json_t *text_json(const char *s) {
    if (!s) return json_string("");
    json_t *j = json_string(s);
    if (j) return j;
    size_t n;
    char *clean = trill_utf8_sanitize(s, strlen(s), &n);
    if (!clean) return NULL;
    j = json_stringn(clean, n);
    free(clean);
    return j;
}

/* The request line (compact JSON and '\n'), malloc'ed; NULL when out of memory. */
static char *make_request(const char *prompt, const char *completion, const char *truth, size_t *len) {
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "prompt", text_json(prompt)) != 0 ||
        json_object_set_new(o, "completion", text_json(completion)) != 0 ||
        json_object_set_new(o, "ground_truth", text_json(truth)) != 0) {
        json_decref(o);
        return NULL;
    }
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (!s) return NULL;
    size_t n = strlen(s);
    char *line = trill_realloc(s, n + 2);
    if (!line) {
        free(s);
        return NULL;
    }
    line[n] = '\n';
    line[n + 1] = '\0';
    *len = n + 1;
    return line;
}

trill_status trill_reward_process_start(const char *command, double timeout_s, int max_failures, reward_process **out) {
    *out = NULL;
    if (!command || is_blank(command, strlen(command)))
        return trill_error(TRILL_ERR_INVALID, "reward process: the command line is empty");
    if (!(timeout_s > 0) || !isfinite(timeout_s))
        return trill_error(TRILL_ERR_INVALID, "reward process \"%s\": timeout %g s, expected a positive number",
                           command, timeout_s);
    if (max_failures < 1)
        return trill_error(TRILL_ERR_INVALID, "reward process \"%s\": max_failures %d, expected at least 1", command,
                           max_failures);
    reward_process *p = trill_calloc(1, sizeof *p);
    if (!p || !(p->command = trill_strdup(command))) {
        free(p);
        return trill_error(TRILL_ERR_NOMEM, "reward process: out of memory");
    }
    p->timeout_s = timeout_s;
    p->max_failures = max_failures;
    p->to_child = p->from_child = p->child_err = -1;
    trill_status st = spawn_child(p);
    if (st != TRILL_OK) {
        trill_reward_process_free(p);
        return st;
    }
    *out = p;
    return TRILL_OK;
}

trill_status trill_reward_process_score(reward_process *p, const char *prompt, const char *completion, const char *truth,
                                  double *reward, json_t **metrics) {
    if (metrics) *metrics = NULL;
    size_t request_len;
    char *request = make_request(prompt, completion, truth, &request_len);
    if (!request) return trill_error(TRILL_ERR_NOMEM, "reward process \"%s\": out of memory", p->command);
    char why[WHY_MAX] = "";
    for (int failures = 0; failures < p->max_failures; failures++) {
        if (p->pid == 0) {
            trill_status st = spawn_child(p);
            if (st != TRILL_OK) {
                free(request);
                return st;
            }
        }
        size_t line_len;
        if (exchange(p, request, request_len, &line_len, why, sizeof why)) {
            bool ok = parse_reply(p->out, line_len, reward, metrics, why, sizeof why);
            consume_output(p, line_len + 1);
            if (ok) {
                free(request);
                return TRILL_OK;
            }
            stop_child(p, NULL);
        }
    }
    free(request);
    const char *err_line = last_stderr_line(p);
    return trill_error(TRILL_ERR_INVALID, "reward process \"%s\": %d consecutive failure%s; last: %s%s%s%s", p->command,
                       p->max_failures, p->max_failures == 1 ? "" : "s", why,
                       err_line[0] ? "; last stderr line: \"" : "", err_line, err_line[0] ? "\"" : "");
}

void trill_reward_process_free(reward_process *p) {
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
