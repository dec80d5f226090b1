/* Rewards: the built-in verifiers on hand cases and on every GSM8K test answer, and the
 * external reward process: replies and metrics, the example scripts, long requests, a flood on
 * stderr, restarts after crashes, timeouts, garbage replies, no zombies and no leaked
 * descriptors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "trill/error.h"
#include "rl/reward/reward_process.h"
#include "trill/reward.h"
#include "trill/timing.h"

/* The message of the last error must contain `needle`. */
#define assert_msg_has(needle)                                                                   \
    do {                                                                                         \
        const char *m_ = trill_error_message();                                                  \
        if (!strstr(m_, (needle))) fail_msg("message \"%s\" lacks \"%s\"", m_, (needle));        \
    } while (0)

/* ---- verifiers ---------------------------------------------------------------------- */

static void test_exact(void **state) {
    (void)state;
    assert_true(trill_reward_exact("42", "42") == 1.0);
    assert_true(trill_reward_exact("  42\n", "\t42 ") == 1.0);
    assert_true(trill_reward_exact("Paris", "paris") == 0.0);
    assert_true(trill_reward_exact("42.", "42") == 0.0);
    assert_true(trill_reward_exact("", "") == 1.0);
    assert_true(trill_reward_exact(" \n", "") == 1.0);
    assert_true(trill_reward_exact("a b", "a  b") == 0.0);
    assert_true(trill_reward_exact(NULL, "x") == 0.0);
}

static void test_demo(void **state) {
    (void)state;
    assert_true(trill_reward_demo("1234", "1234") == 1.0);
    assert_true(trill_reward_demo("1234\nmore text", "1234") == 1.0);
    assert_true(trill_reward_demo("1234\n", "1234\n") == 1.0); /* the truth is trimmed */
    assert_true(trill_reward_demo("12345", "1234") == 0.0);
    assert_true(trill_reward_demo("123", "1234") == 0.0);
    assert_true(trill_reward_demo(" 1234", "1234") == 0.0);
    assert_true(trill_reward_demo("1234 ", "1234") == 0.0);
    assert_true(trill_reward_demo("\n1234", "1234") == 0.0);
    assert_true(trill_reward_demo("", "") == 0.0); /* an empty truth matches nothing */
    assert_true(trill_reward_demo("", "7") == 0.0);
}

typedef struct {
    const char *text;
    bool found;
    double value;
} extract_case;

static void test_extract_hand_cases(void **state) {
    (void)state;
    static const extract_case cases[] = {
        /* GSM8K marker */
        {"Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs.\n#### 18", true, 18},
        {"#### 1,000", true, 1000},
        {"#### -12", true, -12},
        {"####72", true, 72},
        {"#### $18", true, 18},
        {"first #### 3 then\n#### 4", true, 4},
        {"#### 18 dollars, or 20 with tax", true, 18},
        {"#### Step 1\nwe get 5 apples\n#### Step 2\nso the answer is 7", true, 7}, /* headings */
        {"#### 5\n#### Summary", true, 5},
        {"#### \\frac{3}{4}", true, 0.75},
        /* \boxed */
        {"So the answer is \\boxed{42}.", true, 42},
        {"\\boxed{\\frac{1}{2}}", true, 0.5},
        {"\\boxed{\\dfrac{10}{4}}", true, 2.5},
        {"\\boxed{-\\frac{3}{4}}", true, -0.75},
        {"\\boxed{\\frac{-3}{4}}", true, -0.75},
        {"$\\boxed{\\$1{,}000}$", true, 1000},
        {"\\boxed{1\\,000}", true, 1000},
        {"\\boxed{50\\%}", true, 50},
        {"\\boxed{18 \\text{ dollars}}", true, 18},
        {"\\boxed{x = 5}", true, 5},
        {"\\boxed{3/4}", true, 0.75},
        {"first \\boxed{3} and finally \\boxed{4}, not 5", true, 4},
        {"\\boxed{3} then a truncated \\boxed{4", true, 3}, /* the last complete box */
        {"\\boxed{\\boxed{6}}", true, 6},
        {"\\boxed{x}", false, 0}, /* the box is the answer, and it is no number */
        {"we have 7 and \\boxed{\\text{none}}", false, 0},
        {"\\boxed{5", true, 5}, /* unclosed: the last number */
        /* last number */
        {"The answer is 42.", true, 42},
        {"It costs $1,234.50 in total.", true, 1234.5},
        {"12,345,678", true, 12345678},
        {"1,000,000 people", true, 1000000},
        {"1,2,3", true, 3},    /* a list: commas separate only 3-digit groups */
        {"1,234,5", true, 5},
        {"1234,567", true, 567}, /* a first group of more than 3 digits is no thousands number */
        {"1, 000", true, 0},
        {".5", true, 0.5},
        {"0.50", true, 0.5},
        {"about 3/4 of it", true, 0.75},
        {"-5", true, -5},
        {"(-5)", true, -5},
        {"answer: -7.25", true, -7.25},
        {"answer: \xe2\x88\x92" "7", true, -7}, /* U+2212 MINUS SIGN */
        {"16-3-4=9", true, 9},
        {"3-4", true, 4},       /* a minus after a digit is subtraction, not a sign */
        {"x-5", true, 5},
        {"costs $-3", true, -3},
        {"-$12.50 total", true, -12.5},
        {"50%", true, 50},
        {"1e5", true, 100000},
        {"2.5E-3", true, 0.0025},
        {"3 eggs", true, 3},
        {"3:30", true, 30},
        {"12/25/2023", true, 2023},
        {"1/0", true, 0},
        {"1.2.3", true, 3},
        {"the 2nd one", true, 2},
        {"99999999999999999999999", true, 1e23},
        {"0", true, 0},
        {"-0", true, 0},
        /* no number */
        {"", false, 0},
        {"no number here", false, 0},
        {"####", false, 0},
        {"-", false, 0},
        {".", false, 0},
        {"$", false, 0},
        {"1e400", false, 0}, /* too large for a double */
        {"\\frac{}{}", false, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double v = -999;
        bool found = trill_reward_extract_number(cases[i].text, &v);
        if (found != cases[i].found) fail_msg("\"%s\": found %d, expected %d", cases[i].text, found, cases[i].found);
        if (found && fabs(v - cases[i].value) > 1e-12 * fmax(1, fabs(cases[i].value)))
            fail_msg("\"%s\": %.17g, expected %.17g", cases[i].text, v, cases[i].value);
        if (!found && v != -999) fail_msg("\"%s\": value written though no number", cases[i].text);
    }
    double v;
    assert_false(trill_reward_extract_number(NULL, &v));
}

static void test_numeric_hand_cases(void **state) {
    (void)state;
    static const struct {
        const char *completion, *truth;
        double reward;
    } cases[] = {
        {"0.5", "1/2", 1},
        {"\\boxed{\\frac{1}{2}}", "0.5", 1},
        {"1,000", "1000", 1},
        {"The answer is 1000.", "1,000", 1},
        {"The answer is 42.", "42", 1},
        {"The answer is 41.", "42", 0},
        {"So she makes $18 every day.", "Janet sells 9 eggs.\n#### 18", 1},
        {"#### 18", "She makes 9 * 2 = $<<9*2=18>>18.\n#### 18", 1},
        {"18.0", "18", 1},
        {"18.000001", "18", 1}, /* within 1e-6 relative */
        {"18.0001", "18", 0},
        {"1000000.5", "1000000", 1},
        {"-3", "3", 0},
        {"-3", "-3", 1},
        {"50%", "50", 1},
        {"0", "0.0", 1},
        {"0.000000001", "0", 1},  /* 1e-9 absolute at zero */
        {"0.00001", "0", 0},
        {"I don't know", "42", 0},
        {"42", "no number", 0},
        {"", "", 0},
        {NULL, "1", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double r = trill_reward_numeric(cases[i].completion, cases[i].truth);
        if (r != cases[i].reward)
            fail_msg("numeric(\"%s\", \"%s\") = %g, expected %g", cases[i].completion ? cases[i].completion : "(null)",
                     cases[i].truth, r, cases[i].reward);
    }
}

/* GSM8K's test.jsonl: $TRILL_GSM8K (the file or its folder) when set, else the shared data folder
 * beside the project root (../shared/data, as developers' and CI machines lay it out). A missing
 * file fails the test, naming where it looked: a skip would read as a pass. */
static char *gsm8k_test_path(void) {
    const char *env = getenv("TRILL_GSM8K");
    if (env && env[0]) {
        char *p = malloc(strlen(env) + 16);
        sprintf(p, "%s%s", env, strstr(env, ".jsonl") ? "" : "/test.jsonl");
        return p;
    }
    return strdup(TRILL_SOURCE_DIR "/../shared/data/gsm8k/test.jsonl");
}

/* Every GSM8K test answer scores 1 against itself, and its number is the text after "####"
 * with the commas removed. */
static void test_gsm8k_answers(void **state) {
    (void)state;
    char *path = gsm8k_test_path();
    FILE *f = fopen(path, "r");
    if (!f) fail_msg("GSM8K test set %s: %s (the data lives in ../shared/data beside the project root, or set TRILL_GSM8K)", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, f) > 0) {
        json_error_t jerr;
        json_t *row = json_loads(line, 0, &jerr);
        if (!row) fail_msg("%s line %d: %s", path, n + 1, jerr.text);
        const char *answer = json_string_value(json_object_get(row, "answer"));
        assert_non_null(answer);
        const char *marker = strstr(answer, "#### ");
        assert_non_null(marker);
        char digits[64];
        size_t k = 0;
        for (const char *c = marker + 5; *c && k < sizeof digits - 1; c++)
            if (*c != ',') digits[k++] = *c;
        digits[k] = '\0';
        char *end;
        double expected = strtod(digits, &end);
        if (end == digits || *end) fail_msg("line %d: \"%s\" is not a plain number", n + 1, digits);
        double v;
        if (!trill_reward_extract_number(answer, &v) || v != expected)
            fail_msg("line %d: extracted %.17g from \"...%s\", expected %.17g", n + 1, v, marker, expected);
        if (trill_reward_numeric(answer, answer) != 1.0) fail_msg("line %d: the answer does not match itself", n + 1);
        if (trill_reward_numeric(answer, digits) != 1.0) fail_msg("line %d: the answer does not match %s", n + 1, digits);
        json_decref(row);
        n++;
    }
    free(line);
    fclose(f);
    assert_true(n >= 1000);
    free(path);
}

/* ---- external reward process -------------------------------------------------------- */

/* No child of this process is left, running or zombie. */
static void assert_no_children(void) {
    int status;
    errno = 0;
    pid_t r = waitpid(-1, &status, WNOHANG);
    if (!(r == -1 && errno == ECHILD)) fail_msg("a child process is left (waitpid: %d, errno %d)", (int)r, errno);
}

static int count_open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

typedef struct {
    char *dir;
    int fds_before;
} proc_fixture;

static int proc_setup(void **state) {
    proc_fixture *f = calloc(1, sizeof *f);
    f->dir = test_tmpdir("reward");
    f->fds_before = count_open_fds();
    *state = f;
    return 0;
}

static int proc_teardown(void **state) {
    proc_fixture *f = *state;
    assert_no_children();
    assert_int_equal(count_open_fds(), f->fds_before);
    test_rmdir(f->dir);
    free(f->dir);
    free(f);
    return 0;
}

/* Writes a script into the fixture's folder and returns "INTERPRETER 'dir/name'" (malloc'ed). */
static char *script(proc_fixture *f, const char *name, const char *interpreter, const char *text) {
    test_write(f->dir, name, text, strlen(text));
    char *cmd = malloc(strlen(interpreter) + strlen(f->dir) + strlen(name) + 8);
    sprintf(cmd, "%s '%s/%s'", interpreter, f->dir, name);
    return cmd;
}

static double metric(const json_t *metrics, const char *key) {
    json_t *v = json_object_get(metrics, key);
    if (!json_is_number(v)) fail_msg("metric \"%s\" missing", key);
    return json_number_value(v);
}

/* Reward = completion length in characters; metrics echo what the script received. */
static const char *const echo_py =
    "import json, sys\n"
    "for line in sys.stdin:\n"
    "    r = json.loads(line)\n"
    "    m = {'prompt_len': len(r['prompt']), 'truth_is_x': 1 if r['ground_truth'] == 'x' else 0,\n"
    "         'has_newline': 1 if '\\n' in r['completion'] else 0, 'has_fffd': 1 if '\\ufffd' in r['completion'] else 0}\n"
    "    if r['completion'] == 'no metrics':\n"
    "        print(json.dumps({'reward': -1.5}), flush=True)\n"
    "    else:\n"
    "        print(json.dumps({'reward': len(r['completion']), 'metrics': m}), flush=True)\n";

static void test_process_replies(void **state) {
    proc_fixture *f = *state;
    char *cmd = script(f, "echo.py", "/usr/bin/python3", echo_py);
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 3, &p), TRILL_OK);
    double r;
    json_t *m;
    assert_int_equal(trill_reward_process_score(p, "What is 2+2?", "four", "x", &r, &m), TRILL_OK);
    assert_true(r == 4.0);
    assert_non_null(m);
    assert_true(metric(m, "prompt_len") == 12);
    assert_true(metric(m, "truth_is_x") == 1);
    assert_true(metric(m, "has_newline") == 0);
    json_decref(m);
    /* quotes, backslashes, newlines and UTF-8 survive the JSON line; invalid UTF-8 becomes U+FFFD */
    assert_int_equal(trill_reward_process_score(p, "p\"q\\", "a\nb\t\"c\" \xc3\xa9", "y", &r, &m), TRILL_OK);
    assert_true(r == 9.0);
    assert_true(metric(m, "prompt_len") == 4);
    assert_true(metric(m, "truth_is_x") == 0);
    assert_true(metric(m, "has_newline") == 1);
    json_decref(m);
    assert_int_equal(trill_reward_process_score(p, "", "ab\xff", "", &r, &m), TRILL_OK);
    assert_true(r == 3.0);
    assert_true(metric(m, "has_fffd") == 1);
    json_decref(m);
    /* a reply without metrics; NULL prompt and truth are sent as "" */
    assert_int_equal(trill_reward_process_score(p, NULL, "no metrics", NULL, &r, &m), TRILL_OK);
    assert_true(r == -1.5);
    assert_null(m);
    assert_int_equal(trill_reward_process_score(p, "p", "no metrics", "t", &r, NULL), TRILL_OK);
    /* a request far larger than a pipe's buffer, and a reply line read in many pieces */
    size_t big = 600000;
    char *completion = malloc(big + 1);
    for (size_t i = 0; i < big; i++) completion[i] = "abc\n"[i % 4];
    completion[big] = '\0';
    assert_int_equal(trill_reward_process_score(p, completion, completion, "x", &r, &m), TRILL_OK);
    assert_true(r == (double)big);
    assert_true(metric(m, "prompt_len") == (double)big);
    json_decref(m);
    free(completion);
    trill_reward_process_free(p);
    free(cmd);
}

/* A reply line longer than any read, and 300 KB on stderr before each reply: trill must drain
 * stderr while it waits, or the child blocks on a full pipe. Blank lines before a reply are
 * skipped. */
static void test_process_stderr_flood_and_long_reply(void **state) {
    proc_fixture *f = *state;
    char *cmd = script(f, "flood.py", "/usr/bin/python3",
                       "import json, sys\n"
                       "for line in sys.stdin:\n"
                       "    sys.stderr.write('noise ' * 50000 + '\\n')\n"
                       "    sys.stderr.flush()\n"
                       "    names = {'metric_%d' % i: i for i in range(20000)}\n"
                       "    print('\\n  \\n' + json.dumps({'reward': 0.25, 'metrics': names}), flush=True)\n");
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 1, &p), TRILL_OK);
    for (int k = 0; k < 3; k++) {
        double r;
        json_t *m;
        assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, &m), TRILL_OK);
        assert_true(r == 0.25);
        assert_int_equal(json_object_size(m), 20000);
        assert_true(metric(m, "metric_19999") == 19999);
        json_decref(m);
    }
    trill_reward_process_free(p);
    free(cmd);
}

static void test_process_examples(void **state) {
    (void)state;
    const char *py = TRILL_SOURCE_DIR "/examples/rewards/gsm8k_reward.py", *sh = TRILL_SOURCE_DIR "/examples/rewards/length_penalty.sh";
    if (access(py, R_OK) != 0) fail_msg("%s: %s", py, strerror(errno));
    if (access(sh, R_OK) != 0) fail_msg("%s: %s", sh, strerror(errno));
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s'", py);
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 2, &p), TRILL_OK);
    static const struct {
        const char *completion, *truth;
        double reward, has_answer;
    } cases[] = {
        {"9 * 2 = 18 dollars.\n#### 18", "She makes 9 * 2 = $<<9*2=18>>18.\n#### 18", 1, 1},
        {"The answer is \\boxed{\\frac{1}{2}}.", "0.5", 1, 1},
        {"It is 1,000.", "1000", 1, 1},
        {"It is 999.", "1,000", 0, 1},
        {"I cannot tell.", "7", 0, 0},
        {"\\boxed{-3}", "#### -3", 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        double r;
        json_t *m;
        assert_int_equal(trill_reward_process_score(p, "question", cases[i].completion, cases[i].truth, &r, &m), TRILL_OK);
        if (r != cases[i].reward) fail_msg("gsm8k_reward.py on \"%s\": %g", cases[i].completion, r);
        assert_true(metric(m, "has_answer") == cases[i].has_answer);
        /* the built-in verifier agrees */
        assert_true(trill_reward_numeric(cases[i].completion, cases[i].truth) == cases[i].reward);
        json_decref(m);
    }
    trill_reward_process_free(p);

    snprintf(cmd, sizeof cmd, "LENGTH_LIMIT=10 /bin/sh '%s'", sh);
    assert_int_equal(trill_reward_process_start(cmd, 10, 2, &p), TRILL_OK);
    double r;
    json_t *m;
    assert_int_equal(trill_reward_process_score(p, "q", "short", "t", &r, &m), TRILL_OK);
    assert_true(r == 1.0);
    assert_true(metric(m, "length") == 5);
    json_decref(m);
    assert_int_equal(trill_reward_process_score(p, "q \"completion\":\"trap\"", "twenty characters...", "t", &r, &m), TRILL_OK);
    assert_true(fabs(r - 0.5) < 1e-6);
    assert_true(metric(m, "length") == 20);
    json_decref(m);
    trill_reward_process_free(p);
}

/* Crashes on the 2nd request of each process: every request is still scored (one restart
 * each), and each restart is a fresh process. */
static void test_process_restart_after_crash(void **state) {
    proc_fixture *f = *state;
    char starts[4200];
    snprintf(starts, sizeof starts, "%s/starts", f->dir);
    char text[8000];
    snprintf(text, sizeof text,
             "import json, sys\n"
             "open('%s', 'a').write('x')\n"
             "for n, line in enumerate(sys.stdin):\n"
             "    if n == 1:\n"
             "        raise RuntimeError('second request')\n"
             "    print(json.dumps({'reward': len(json.loads(line)['completion'])}), flush=True)\n",
             starts);
    char *cmd = script(f, "crash2.py", "/usr/bin/python3", text);
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 2, &p), TRILL_OK);
    for (int k = 1; k <= 5; k++) {
        char completion[8];
        memset(completion, 'a', (size_t)k);
        completion[k] = '\0';
        double r;
        assert_int_equal(trill_reward_process_score(p, "p", completion, "t", &r, NULL), TRILL_OK);
        assert_true(r == k);
    }
    trill_reward_process_free(p);
    FILE *s = fopen(starts, "r");
    assert_non_null(s);
    char buf[64] = "";
    size_t n = fread(buf, 1, sizeof buf - 1, s);
    fclose(s);
    assert_int_equal(n, 5); /* processes 1..5: requests 2..5 each needed a restart */
    free(cmd);
}

static void test_process_always_crashes(void **state) {
    proc_fixture *f = *state;
    char *cmd = script(f, "crash.py", "/usr/bin/python3",
                       "import sys\n"
                       "line = sys.stdin.readline()\n"
                       "raise ValueError('bad input: ' + str(len(line)))\n");
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 3, &p), TRILL_OK);
    double r = -7;
    json_t *m = (json_t *)&r; /* must be reset to NULL */
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, &m), TRILL_ERR_INVALID);
    assert_null(m);
    assert_true(r == -7);
    assert_msg_has("reward process \"/usr/bin/python3 '");
    assert_msg_has("3 consecutive failures");
    assert_msg_has("exited with status 1");
    assert_msg_has("last stderr line: \"ValueError: bad input: ");
    assert_no_children();
    /* the next request tries again from a fresh process */
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_ERR_INVALID);
    assert_msg_has("3 consecutive failures");
    trill_reward_process_free(p);
    free(cmd);

    assert_int_equal(trill_reward_process_start("read line; kill -SEGV $$", 10, 1, &p), TRILL_OK);
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_ERR_INVALID);
    assert_msg_has("1 consecutive failure;");
    assert_msg_has("killed by signal 11 (SIGSEGV)");
    trill_reward_process_free(p);

    assert_int_equal(trill_reward_process_start("/nonexistent/reward-script --flag", 10, 2, &p), TRILL_OK);
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_ERR_INVALID);
    assert_msg_has("exited with status 127");
    assert_msg_has("/nonexistent/reward-script: not found");
    trill_reward_process_free(p);
}

/* Exits without reading: writing to it must not raise SIGPIPE in this process (a request much
 * larger than the pipe's buffer makes the write fail with EPIPE). */
static void test_process_exits_without_reading(void **state) {
    (void)state;
    size_t big = 1 << 20;
    char *completion = malloc(big + 1);
    memset(completion, 'z', big);
    completion[big] = '\0';
    reward_process *p;
    assert_int_equal(trill_reward_process_start("exit 0", 10, 2, &p), TRILL_OK);
    double r;
    assert_int_equal(trill_reward_process_score(p, "p", completion, "t", &r, NULL), TRILL_ERR_INVALID);
    assert_msg_has("2 consecutive failures; last: no reply: it exited with status 0");
    assert_int_equal(trill_reward_process_score(p, "p", "small", "t", &r, NULL), TRILL_ERR_INVALID);
    trill_reward_process_free(p);
    free(completion);
}

/* /proc/PID is gone or a zombie (of init) within 10 s (a killed process is reaped at once, but a
 * loaded machine may take its time). */
static bool process_gone(long pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", pid);
    for (int k = 0; k < 1000; k++) {
        FILE *s = fopen(path, "r");
        if (!s) return true;
        size_t n = fread(buf, 1, sizeof buf - 1, s);
        fclose(s);
        buf[n] = '\0';
        char *paren = strrchr(buf, ')');
        if (paren && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X')) return true;
        usleep(10000);
    }
    return false;
}

/* Never replies: each try is killed after the timeout, with the grandchild (`sleep`) that the
 * shell started, and the whole call takes max_failures × timeout. */
static void test_process_timeout(void **state) {
    proc_fixture *f = *state;
    char text[8000];
    snprintf(text, sizeof text, "echo starting >&2\nwhile read line; do sleep 100 & echo $! > '%s/sleep.pid'; wait; done\n",
             f->dir);
    char *cmd = script(f, "hang.sh", "/bin/sh", text);
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 0.3, 2, &p), TRILL_OK);
    double t0 = trill_now();
    double r;
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_ERR_INVALID);
    double elapsed = trill_now() - t0;
    assert_msg_has("2 consecutive failures; last: no reply within 0.3 s (killed); last stderr line: \"starting\"");
    /* never early; the upper bound only tells a hang from a loaded machine */
    if (elapsed < 0.55 || elapsed > 20) fail_msg("two timeouts of 0.3 s took %.2f s", elapsed);
    assert_no_children();
    char pidfile[4200];
    snprintf(pidfile, sizeof pidfile, "%s/sleep.pid", f->dir);
    FILE *s = fopen(pidfile, "r");
    assert_non_null(s);
    long pid = 0;
    assert_int_equal(fscanf(s, "%ld", &pid), 1);
    fclose(s);
    if (!process_gone(pid)) fail_msg("the shell's `sleep` (pid %ld) was not killed", pid);
    trill_reward_process_free(p);
    free(cmd);
}

/* free() on a process that ignores end of stdin: it is killed after a short wait. */
static void test_process_free_kills(void **state) {
    (void)state;
    reward_process *p;
    assert_int_equal(trill_reward_process_start("exec sleep 100", 10, 1, &p), TRILL_OK);
    double t0 = trill_now();
    trill_reward_process_free(p);
    double elapsed = trill_now() - t0;
    if (elapsed > 10) fail_msg("free took %.2f s (it waited for `sleep 100`?)", elapsed);
    trill_reward_process_free(NULL);
}

/* Replies that are not an object with a numeric reward and numeric metrics. */
static void test_process_garbage(void **state) {
    proc_fixture *f = *state;
    static const struct {
        const char *reply, *message;
    } cases[] = {
        {"not json", "reply is not JSON ("},
        {"{\"reward\": \"x\"}", "reply is not an object with a numeric \"reward\": \"{\"reward\": \"x\"}\""},
        {"{\"score\": 1}", "numeric \"reward\""},
        {"[1]", "numeric \"reward\""},
        {"{\"reward\": true}", "numeric \"reward\""},
        {"{\"reward\": 1, \"metrics\": [1]}", "reply's \"metrics\" is not an object (array)"},
        {"{\"reward\": 1, \"metrics\": {\"a\": \"b\"}}", "reply's metric \"a\" is not a number (string)"},
        {"{\"reward\": 1e999}", "reply is not JSON"},
        {"{\"reward\": 1} trailing", "reply is not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_t *reply = json_string(cases[i].reply);
        char *literal = json_dumps(reply, JSON_ENCODE_ANY); /* a JSON string is a Python literal too */
        char text[1000];
        snprintf(text, sizeof text, "import sys\nfor line in sys.stdin:\n    print(%s, flush=True)\n", literal);
        free(literal);
        json_decref(reply);
        char name[32];
        snprintf(name, sizeof name, "garbage%zu.py", i);
        char *cmd = script(f, name, "/usr/bin/python3", text);
        reward_process *p;
        assert_int_equal(trill_reward_process_start(cmd, 10, 2, &p), TRILL_OK);
        double r;
        json_t *m;
        assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, &m), TRILL_ERR_INVALID);
        assert_null(m);
        assert_msg_has("2 consecutive failures");
        assert_msg_has(cases[i].message);
        trill_reward_process_free(p);
        free(cmd);
    }
}

/* Garbage from the first process only: the restart recovers. */
static void test_process_garbage_then_good(void **state) {
    proc_fixture *f = *state;
    char text[8000];
    snprintf(text, sizeof text,
             "import os, sys\n"
             "flag = '%s/started'\n"
             "first = not os.path.exists(flag)\n"
             "open(flag, 'a').close()\n"
             "for line in sys.stdin:\n"
             "    print('oops' if first else '{\"reward\": 2}', flush=True)\n",
             f->dir);
    char *cmd = script(f, "once.py", "/usr/bin/python3", text);
    reward_process *p;
    assert_int_equal(trill_reward_process_start(cmd, 10, 2, &p), TRILL_OK);
    double r;
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_OK);
    assert_true(r == 2);
    assert_int_equal(trill_reward_process_score(p, "p", "c", "t", &r, NULL), TRILL_OK);
    trill_reward_process_free(p);
    free(cmd);
}

/* Pipes are close-on-exec: a child sees no pipe but its stdin, stdout and stderr, even with
 * another reward process running. */
static void test_process_no_inherited_pipes(void **state) {
    proc_fixture *f = *state;
    char *cmd = script(f, "fds.py", "/usr/bin/python3",
                       "import json, os, sys\n"
                       "for line in sys.stdin:\n"
                       "    n = 0\n"
                       "    for fd in os.listdir('/proc/self/fd'):\n"
                       "        try:\n"
                       "            if int(fd) > 2 and os.readlink('/proc/self/fd/' + fd).startswith('pipe:'): n += 1\n"
                       "        except OSError: pass\n"
                       "    print(json.dumps({'reward': n}), flush=True)\n");
    reward_process *a, *b;
    assert_int_equal(trill_reward_process_start(cmd, 10, 1, &a), TRILL_OK);
    assert_int_equal(trill_reward_process_start(cmd, 10, 1, &b), TRILL_OK);
    double r;
    assert_int_equal(trill_reward_process_score(a, "", "", "", &r, NULL), TRILL_OK);
    assert_true(r == 0);
    assert_int_equal(trill_reward_process_score(b, "", "", "", &r, NULL), TRILL_OK);
    assert_true(r == 0);
    trill_reward_process_free(a);
    trill_reward_process_free(b);
    free(cmd);
}

static void test_process_start_refusals(void **state) {
    (void)state;
    reward_process *p = (reward_process *)1;
    assert_int_equal(trill_reward_process_start("", 1, 1, &p), TRILL_ERR_INVALID);
    assert_null(p);
    assert_msg_has("empty");
    assert_int_equal(trill_reward_process_start("cat", 0, 1, &p), TRILL_ERR_INVALID);
    assert_msg_has("timeout");
    assert_int_equal(trill_reward_process_start("cat", NAN, 1, &p), TRILL_ERR_INVALID);
    assert_int_equal(trill_reward_process_start("cat", 1, 0, &p), TRILL_ERR_INVALID);
    assert_msg_has("max_failures 0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_demo),
        cmocka_unit_test(test_extract_hand_cases),
        cmocka_unit_test(test_numeric_hand_cases),
        cmocka_unit_test(test_gsm8k_answers),
        cmocka_unit_test_setup_teardown(test_process_replies, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_stderr_flood_and_long_reply, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_examples, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_restart_after_crash, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_always_crashes, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_exits_without_reading, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_timeout, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_free_kills, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_garbage, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_garbage_then_good, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_no_inherited_pipes, proc_setup, proc_teardown),
        cmocka_unit_test_setup_teardown(test_process_start_refusals, proc_setup, proc_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
