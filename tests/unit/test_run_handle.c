/* The run handle (trill_run_*): stepping, status, a cancel from another thread while a step runs,
 * and resuming — the interrupted and resumed run equals the uninterrupted one, metrics (less
 * timings) and adapter bytes; in sync and in async mode. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>

#include "testutil.h"
#include "trill/fileio.h"
#include "trill/model.h"
#include "trill/run_config.h"
#include "trill/run.h"

enum { STEPS = 6 };

typedef struct world {
    char *dir, *model, *train, *reward;
} world;

static char *join(const char *a, const char *b) {
    char *p = trill_path_join(a, b);
    assert_non_null(p);
    return p;
}

static void world_init(world *w) {
    w->dir = test_tmpdir("run_handle");
    w->model = join(w->dir, "model");
    trill_model *m = test_small_moe(11, false, true);
    assert_int_equal(trill_model_save(m, w->model, TRILL_F32, 0), TRILL_OK);
    assert_int_equal(trill_model_write_charlevel_files(w->model, trill_model_config(m)), TRILL_OK);
    trill_model_free(m);
    char lines[4096] = "";
    for (int i = 0; i < 16; i++) {
        char line[96];
        snprintf(line, sizeof line, "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\"}\n", 10 + i, 3 * i, 10 + 4 * i);
        strcat(lines, line);
    }
    test_write(w->dir, "train.jsonl", lines, strlen(lines));
    w->train = join(w->dir, "train.jsonl");
    /* a graded reward (the share of digits), so groups differ and the adapters really train */
    static const char py[] = "import json, sys\n"
                             "for line in sys.stdin:\n"
                             "    c = json.loads(line)['completion']\n"
                             "    print(json.dumps({'reward': sum(ch.isdigit() for ch in c) / max(len(c), 1)}), flush=True)\n";
    test_write(w->dir, "digits.py", py, sizeof py - 1);
    char *script = join(w->dir, "digits.py");
    assert_true(asprintf(&w->reward, "/usr/bin/python3 %s", script) > 0);
    free(script);
}

static void world_free(world *w) {
    test_rmdir(w->dir);
    free(w->dir);
    free(w->model);
    free(w->train);
    free(w->reward);
}

static void config(const world *w, const char *run, bool async, trill_run_config *c) {
    assert_int_equal(trill_run_config_defaults(c), TRILL_OK);
    char *run_dir = join(w->dir, run);
    const char *sets[] = { "generator.prompts_per_step=2", "generator.n=4", "generator.max_new_tokens=5", "trainer.lr=1e-2",
                           "trainer.schedule=constant", "checkpoint.keep=0", "reward.verifier=none" };
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) assert_int_equal(trill_run_config_set(c, sets[i]), TRILL_OK);
    free(c->model);
    c->model = strdup(w->model);
    free(c->data.train);
    c->data.train = strdup(w->train);
    free(c->run_dir);
    c->run_dir = run_dir;
    free(c->reward.external);
    c->reward.external = strdup(w->reward);
    c->steps = STEPS;
    if (async) {
        c->mode = TRILL_MODE_ASYNC;
        c->async.max_staleness = 0; /* equal to sync, so the resumed run is comparable */
        c->resources.pin = false;
    }
}

/* metrics.jsonl without the timings (and the generator's last update size, which in async mode
 * depends on when it took the weights), one string per line. */
static json_t *metrics_of(const char *run_dir) {
    char *path = join(run_dir, "metrics.jsonl"), *text = NULL;
    size_t len = 0;
    assert_int_equal(trill_read_file(path, &text, &len), TRILL_OK);
    json_t *lines = json_array();
    for (char *at = text, *nl; (nl = strchr(at, '\n')); at = nl + 1) {
        *nl = 0;
        json_error_t err;
        json_t *m = json_loads(at, 0, &err);
        assert_non_null(m);
        json_object_del(m, "time");
        json_object_del(m, "sync_ms");
        json_object_del(m, "generator_apply_bytes");
        json_array_append_new(lines, m);
    }
    free(text);
    free(path);
    return lines;
}

static char *adapter_of(const char *run_dir, int step, size_t *len) {
    char rel[128], *data = NULL;
    snprintf(rel, sizeof rel, "checkpoints/step-%08d/adapter/adapter_model.safetensors", step);
    char *path = join(run_dir, rel);
    assert_int_equal(trill_read_file(path, &data, len), TRILL_OK);
    free(path);
    return data;
}

typedef struct canceller {
    trill_run *h;
    atomic_int step_returned;
    int saw_phase; /* the phase it cancelled in (TRILL_RUN_IDLE: after the step had returned) */
} canceller;

/* Waits for the step after step 3 to be under way, then cancels (or cancels once it returned). */
static void *cancel_when_busy(void *arg) {
    canceller *k = arg;
    for (;;) {
        trill_run_status s;
        trill_run_get_status(k->h, &s);
        if (s.step == 3 && s.phase != TRILL_RUN_IDLE) { k->saw_phase = (int)s.phase; break; }
        if (atomic_load(&k->step_returned)) { k->saw_phase = TRILL_RUN_IDLE; break; }
    }
    trill_run_cancel(k->h);
    return NULL;
}

static void interrupted_equals_uninterrupted(bool async) {
    world w;
    world_init(&w);
    trill_run_config a, b;
    config(&w, "whole", async, &a);
    config(&w, "parts", async, &b);
    trill_rl_result res;
    /* uninterrupted, through the handle step by step */
    trill_run *h;
    assert_int_equal(trill_run_create(&a, NULL, &h), TRILL_OK);
    for (int i = 0; i < STEPS; i++) assert_int_equal(trill_run_step(h), TRILL_OK);
    trill_run_status s;
    trill_run_get_status(h, &s);
    assert_int_equal(s.step, STEPS);
    assert_int_equal(s.phase, TRILL_RUN_DONE);
    assert_int_equal(trill_run_step(h), TRILL_OK); /* after the last step: nothing to do */
    assert_int_equal(trill_run_finish(h, &res), TRILL_OK);
    assert_int_equal(res.steps_done, STEPS);
    trill_run_free(h);

    /* three steps, then a cancel from another thread while the fourth runs */
    assert_int_equal(trill_run_create(&b, NULL, &h), TRILL_OK);
    for (int i = 0; i < 3; i++) assert_int_equal(trill_run_step(h), TRILL_OK);
    trill_run_get_status(h, &s);
    assert_int_equal(s.step, 3);
    assert_int_equal(s.policy_version, 3);
    assert_true(s.has_metrics);
    assert_int_equal(s.last.step, 3);
    canceller k = { .h = h };
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, cancel_when_busy, &k), 0);
    trill_status st = trill_run_step(h);
    atomic_store(&k.step_returned, 1);
    pthread_join(t, NULL);
    if (st == TRILL_OK) st = trill_run_step(h); /* the cancel came after the step had returned */
    assert_int_equal(st, TRILL_ERR_INTERRUPTED);
    assert_non_null(strstr(trill_error_message(), "stopped on request after step 4 of 6 (checkpoint written)"));
    assert_int_equal(trill_run_step(h), TRILL_ERR_INTERRUPTED); /* and stays so */
    trill_run_get_status(h, &s);
    assert_int_equal(s.step, 4);
    assert_true(s.cancelled);
    assert_int_equal(trill_run_finish(h, &res), TRILL_ERR_INTERRUPTED);
    assert_int_equal(res.steps_done, 4);
    trill_run_free(h);
    print_message("cancel seen in phase %d (%s)\n", k.saw_phase, k.saw_phase == TRILL_RUN_IDLE ? "after the step" : "during the step");

    /* resume to the end */
    free(b.resume);
    b.resume = strdup("auto");
    assert_int_equal(trill_run_create(&b, NULL, &h), TRILL_OK);
    trill_run_get_status(h, &s);
    assert_int_equal(s.step, 4);
    while (trill_run_get_status(h, &s), s.phase != TRILL_RUN_DONE) assert_int_equal(trill_run_step(h), TRILL_OK);
    assert_int_equal(trill_run_finish(h, &res), TRILL_OK);
    assert_int_equal(res.steps_done, 2);
    trill_run_free(h);

    json_t *ma = metrics_of(a.run_dir), *mb = metrics_of(b.run_dir);
    assert_int_equal(json_array_size(ma), STEPS);
    if (!json_equal(ma, mb)) {
        char *x = json_dumps(ma, 0), *y = json_dumps(mb, 0);
        fail_msg("metrics differ:\n%s\n%s", x, y);
    }
    size_t la, lb;
    char *xa = adapter_of(a.run_dir, STEPS, &la), *xb = adapter_of(b.run_dir, STEPS, &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(xa, xb, la);
    free(xa);
    free(xb);
    json_decref(ma);
    json_decref(mb);
    trill_run_config_free(&a);
    trill_run_config_free(&b);
    world_free(&w);
}

static void test_cancel_and_resume_sync(void **state) {
    (void)state;
    interrupted_equals_uninterrupted(false);
}

static void test_cancel_and_resume_async(void **state) {
    (void)state;
    interrupted_equals_uninterrupted(true);
}

/* A progress callback gets every step's status and line; a bad config fails at create. */
typedef struct seen { int calls, last_step; char line[512]; } seen;

static void on_progress(void *ctx, const trill_run_status *s, const char *line) {
    seen *x = ctx;
    x->calls++;
    x->last_step = s->last.step;
    snprintf(x->line, sizeof x->line, "%s", line);
}

static void test_progress_and_errors(void **state) {
    (void)state;
    world w;
    world_init(&w);
    trill_run_config c;
    config(&w, "progress", false, &c);
    c.steps = 2;
    seen x = { 0 };
    const trill_run_options o = { .progress = on_progress, .progress_ctx = &x };
    trill_run *h;
    assert_int_equal(trill_run_create(&c, &o, &h), TRILL_OK);
    assert_int_equal(trill_run_step(h), TRILL_OK);
    /* a checkpoint on request between steps (checkpoint.every would write none before the end) */
    assert_int_equal(trill_run_checkpoint(h), TRILL_OK);
    char *ck = join(c.run_dir, "checkpoints/step-00000001/manifest.json");
    assert_true(trill_file_exists(ck));
    free(ck);
    assert_int_equal(trill_run_step(h), TRILL_OK);
    assert_int_equal(x.calls, 2);
    assert_int_equal(x.last_step, 2);
    assert_non_null(strstr(x.line, "step 2/2 | reward "));
    assert_int_equal(trill_run_finish(h, NULL), TRILL_OK);
    trill_run_free(h);
    /* the same run folder while nothing is to resume: refused, nothing left behind */
    assert_int_equal(trill_run_create(&c, &o, &h), TRILL_ERR_INVALID);
    assert_non_null(strstr(trill_error_message(), "already has checkpoints"));
    assert_null(h);
    trill_run_config_free(&c);
    world_free(&w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_and_resume_sync),
        cmocka_unit_test(test_cancel_and_resume_async),
        cmocka_unit_test(test_progress_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
