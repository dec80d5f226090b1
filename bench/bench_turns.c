/* bench_turns: multi-turn generation with the sample kept in the engine (trill_request.hold,
 * trill_engine_continue: each turn prefills only the injected tokens) against starting every turn
 * afresh with the whole conversation as its prompt (what a loop that re-renders and re-submits
 * does). Same model, sessions, lengths and formats; the generated tokens differ between the two
 * (other draw keys), their counts do not (no stop tokens).
 *
 * A benchmark, not a test: it prints figures and fails only if it cannot run.
 *
 *   bench_turns [--preset NAME] [--format f32|bf16|int8] [--sessions B] [--turns T]
 *               [--prompt P] [--inject I] [--generate G]
 *
 * Prints, for each way, the prefill rows and the wall time of turns 2..T (turn 1 is the same for
 * both), and their ratio. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/config_json.h"
#include "trill/config.h"
#include "trill/error.h"
#include "trill/infer.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/timing.h"

enum { MAX_SESSIONS = 256 };

static int parse_int(const char *opt, const char *s, int min) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < min || v > 1 << 20) {
        fprintf(stderr, "bench_turns: %s expects an integer >= %d, got '%s'\n", opt, min, s);
        exit(2);
    }
    return (int)v;
}

static void die(const char *what) {
    fprintf(stderr, "bench_turns: %s: %s\n", what, trill_error_message());
    exit(1);
}

typedef struct opts {
    const char *preset;
    trill_gen_format format;
    int sessions, turns, prompt, inject, generate;
} opts;

static opts parse(int argc, char **argv) {
    opts o = { .preset = "small", .format = TRILL_GEN_BF16, .sessions = 8, .turns = 4, .prompt = 256, .inject = 64, .generate = 32 };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "usage: bench_turns [--preset NAME] [--format f32|bf16|int8] [--sessions B] [--turns T] [--prompt P] "
                            "[--inject I] [--generate G]\n");
            exit(2);
        }
        i++;
        if (!strcmp(a, "--preset")) o.preset = v;
        else if (!strcmp(a, "--format")) o.format = !strcmp(v, "f32") ? TRILL_GEN_F32 : !strcmp(v, "int8") ? TRILL_GEN_INT8 : TRILL_GEN_BF16;
        else if (!strcmp(a, "--sessions")) o.sessions = parse_int(a, v, 1);
        else if (!strcmp(a, "--turns")) o.turns = parse_int(a, v, 2);
        else if (!strcmp(a, "--prompt")) o.prompt = parse_int(a, v, 1);
        else if (!strcmp(a, "--inject")) o.inject = parse_int(a, v, 1);
        else if (!strcmp(a, "--generate")) o.generate = parse_int(a, v, 1);
        else {
            fprintf(stderr, "bench_turns: unknown option %s\n", a);
            exit(2);
        }
    }
    if (o.sessions > MAX_SESSIONS) o.sessions = MAX_SESSIONS;
    return o;
}

/* Steps the engine to the end; the prefill rows it took. */
static long run(trill_engine *e) {
    long prefill = 0;
    while (trill_engine_busy(e)) {
        trill_step_stats st;
        if (trill_engine_step(e, &st)) die("step");
        prefill += st.prefill_rows;
    }
    return prefill;
}

/* Every session's finished output, placed by request id. */
static void collect(trill_engine *e, trill_sequence_out *out, int n) {
    for (int got = 0; got < n;) {
        trill_sequence_out s;
        if (trill_engine_collect(e, &s, 1) != 1) die("collect");
        out[s.request % MAX_SESSIONS] = s;
        got++;
    }
}

/* Turn t's injected tokens for session s (random ids, fixed). */
static void injected(const opts *o, int vocab, int s, int t, int *ids) {
    for (int i = 0; i < o->inject; i++) ids[i] = 1 + (int)(trill_rng_uniform((uint64_t)(s * 131 + t), (uint64_t)i) * (vocab - 2));
}

static trill_request request(uint64_t id, const int *prompt, int len, int max_new, bool hold) {
    trill_request r = { .id = id, .prompt = prompt, .prompt_len = len, .n = 1, .max_new_tokens = max_new, .hold = hold };
    r.sampling = trill_sampling_default();
    r.sampling.seed = 7;
    return r;
}

/* Turns 2..T of every session, kept (hold) or afresh; *prefill and the seconds they took. */
static double turns(const opts *o, const trill_model *m, bool keep, long *prefill) {
    trill_engine_config cfg = trill_engine_config_default();
    cfg.format = o->format;
    trill_engine *e;
    if (trill_engine_create(m, &cfg, &e)) die("engine");
    const int V = trill_model_config(m)->vocab_size, total = o->prompt + o->turns * (o->inject + o->generate);
    int *buf = malloc(sizeof(int) * (size_t)total), *inj = malloc(sizeof(int) * (size_t)o->inject);
    trill_sequence_out out[MAX_SESSIONS];
    for (int s = 0; s < o->sessions; s++) { /* turn 1: the same in both ways */
        for (int i = 0; i < o->prompt; i++) buf[i] = 1 + (int)(trill_rng_uniform(1000 + (uint64_t)s, (uint64_t)i) * (V - 2));
        trill_request r = request((uint64_t)s, buf, o->prompt, o->generate, keep);
        if (trill_engine_submit(e, &r)) die("submit");
    }
    run(e);
    collect(e, out, o->sessions);
    *prefill = 0;
    const double t0 = trill_now();
    for (int t = 1; t < o->turns; t++) {
        for (int s = 0; s < o->sessions; s++) {
            injected(o, V, s, t, inj);
            if (keep) {
                if (trill_engine_continue(e, &out[s], inj, o->inject, o->generate)) die("continue");
                continue;
            }
            const int n = out[s].n_prompt + out[s].n_generated;
            memcpy(buf, out[s].tokens, sizeof(int) * (size_t)n);
            memcpy(buf + n, inj, sizeof(int) * (size_t)o->inject);
            trill_sequence_out_free(&out[s]);
            trill_request r = request((uint64_t)s, buf, n + o->inject, o->generate, false);
            if (trill_engine_submit(e, &r)) die("submit");
        }
        *prefill += run(e);
        collect(e, out, o->sessions);
    }
    const double seconds = trill_now() - t0;
    for (int s = 0; s < o->sessions; s++) trill_sequence_out_free(&out[s]);
    free(buf);
    free(inj);
    trill_engine_free(e);
    return seconds;
}

int main(int argc, char **argv) {
    const opts o = parse(argc, argv);
    json_t *js = trill_config_preset(o.preset);
    if (!js) {
        fprintf(stderr, "bench_turns: unknown preset '%s' (known: %s)\n", o.preset, trill_config_preset_names());
        return 2;
    }
    trill_config cfg;
    trill_model *m = NULL;
    if (trill_config_from_json(js, o.preset, &cfg) || trill_model_create(&cfg, &m)) die("model");
    json_decref(js);
    trill_model_init_random(m, 0);
    static const char *const FORMATS[] = { "f32", "bf16", "int8" };
    printf("bench_turns: %s, %s, %d sessions x %d turns: prompt %d, then per turn %d injected + %d generated tokens\n", o.preset,
           FORMATS[o.format], o.sessions, o.turns, o.prompt, o.inject, o.generate);
    long rows[2];
    double sec[2];
    for (int keep = 1; keep >= 0; keep--) {
        sec[keep] = turns(&o, m, keep, &rows[keep]);
        printf("  %-34s prefill rows %8ld   turns 2..%d: %8.1f ms\n", keep ? "kept (hold, trill_engine_continue)" : "afresh (whole conversation)",
               rows[keep], o.turns, 1e3 * sec[keep]);
    }
    printf("  afresh / kept: %.2fx the prefill rows, %.2fx the time\n", (double)rows[0] / (double)rows[1], sec[0] / sec[1]);
    trill_model_free(m);
    return 0;
}
