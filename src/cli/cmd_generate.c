/* trill generate: simple sampling over the reference forward (the fast engine is src/infer). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "trill/model.h"
#include "trill/rng.h"
#include "trill/tokenizer.h"

static const char USAGE[] =
    "trill generate --model DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-p P] [--top-k K] [--seed S]\n"
    "  Prints the completion. Defaults: 64 new tokens, temperature 1 (0 = greedy), top-p 1, top-k 0 (off), seed 0.\n"
    "  Stops at the model's eos_token_id.";

typedef struct sampling {
    double temperature, top_p;
    int top_k;
    uint64_t seed;
} sampling;

typedef struct cand { float p; int id; } cand;

static int cmp_cand_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    return x->p < y->p ? 1 : x->p > y->p ? -1 : (x->id > y->id) - (x->id < y->id);
}

/* Samples from softmax(logits / T) restricted to the top-k, then to the top-p mass.
 * The uniform draw is keyed by (seed, position), so a prompt reproduces exactly. */
static int sample(float *logits, int V, const sampling *s, int position, cand *c) {
    if (s->temperature == 0.0) {
        int best = 0;
        for (int i = 1; i < V; i++) if (logits[i] > logits[best]) best = i;
        return best;
    }
    float maxv = -INFINITY;
    for (int i = 0; i < V; i++) if (logits[i] > maxv) maxv = logits[i];
    double sum = 0;
    for (int i = 0; i < V; i++) {
        c[i].id = i;
        c[i].p = expf((float)((logits[i] - maxv) / s->temperature));
        sum += c[i].p;
    }
    for (int i = 0; i < V; i++) c[i].p /= (float)sum;
    qsort(c, (size_t)V, sizeof *c, cmp_cand_desc);
    int n = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    double mass = 0;
    int keep = 0;
    while (keep < n && (keep == 0 || mass < s->top_p)) mass += c[keep++].p;
    double u = trill_rng_uniform(s->seed, (uint64_t)position) * mass, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[keep - 1].id;
}

int cmd_generate(int argc, char **argv) {
    static const struct option opts[] = {
        { "model", required_argument, 0, 'm' }, { "prompt", required_argument, 0, 'p' },
        { "max-new-tokens", required_argument, 0, 'n' }, { "temperature", required_argument, 0, 't' },
        { "top-p", required_argument, 0, 'P' }, { "top-k", required_argument, 0, 'k' },
        { "seed", required_argument, 0, 's' }, { "help", no_argument, 0, 'h' }, { 0, 0, 0, 0 },
    };
    const char *dir = NULL, *prompt = NULL;
    long long max_new = 64, top_k = 0, seed = 0;
    sampling s = { .temperature = 1.0, .top_p = 1.0 };
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case 'm': dir = optarg; break;
        case 'p': prompt = optarg; break;
        case 'n': bad = cli_parse_int("generate", USAGE, "--max-new-tokens", optarg, 0, 1 << 20, &max_new); break;
        case 't': bad = cli_parse_double("generate", USAGE, "--temperature", optarg, 0, 100, &s.temperature); break;
        case 'P': bad = cli_parse_double("generate", USAGE, "--top-p", optarg, 1e-9, 1, &s.top_p); break;
        case 'k': bad = cli_parse_int("generate", USAGE, "--top-k", optarg, 0, 1 << 24, &top_k); break;
        case 's': bad = cli_parse_int("generate", USAGE, "--seed", optarg, 0, (long long)1 << 62, &seed); break;
        case 'h': printf("usage: %s\n", USAGE); return 0;
        default: return cli_usage_error("generate", USAGE, "invalid option");
        }
        if (bad) return EXIT_USAGE;
    }
    if (optind < argc) return cli_usage_error("generate", USAGE, "unexpected argument \"%s\"", argv[optind]);
    if (!dir || !prompt) return cli_usage_error("generate", USAGE, "--model DIR and --prompt TEXT are required");
    s.top_k = (int)top_k;
    s.seed = (uint64_t)seed;

    trill_model *m = NULL;
    trill_tokenizer *tok = NULL;
    int *ids = NULL;
    size_t n = 0;
    trill_status st = trill_model_load_as(dir, TRILL_STORE_CHECKPOINT, &m);
    if (!st) st = trill_tokenizer_load(dir, &tok);
    if (!st) st = trill_tokenizer_encode(tok, prompt, strlen(prompt), false, &ids, &n);
    if (!st && n == 0) st = trill_error(TRILL_ERR_INVALID, "--prompt: the prompt encodes to no tokens");
    const int V = m ? m->config.vocab_size : 0;
    int *seq = NULL;
    float *logits = NULL;
    cand *cands = NULL;
    if (!st) {
        seq = malloc((n + (size_t)max_new) * sizeof *seq);
        logits = malloc((size_t)V * sizeof *logits);
        cands = malloc((size_t)V * sizeof *cands);
        if (!seq || !logits || !cands) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else memcpy(seq, ids, n * sizeof *seq);
    }
    size_t len = n;
    for (long long step = 0; !st && step < max_new; step++) {
        if ((st = trill_model_next_logits(m, seq, (int)len, logits))) break;
        int next = sample(logits, V, &s, (int)len, cands);
        bool eos = false;
        for (int e = 0; e < m->config.n_eos; e++) eos |= next == m->config.eos_token_ids[e];
        if (eos) break;
        seq[len++] = next;
        char *piece;
        size_t plen;
        if (trill_tokenizer_decode(tok, &next, 1, false, &piece, &plen) == TRILL_OK) {
            fwrite(piece, 1, plen, stdout);
            free(piece);
        } else {
            printf("<%d>", next); /* an id the tokenizer has no string for */
        }
        fflush(stdout);
    }
    if (!st) putchar('\n');
    free(seq);
    free(logits);
    free(cands);
    free(ids);
    trill_tokenizer_free(tok);
    trill_model_free(m);
    return st ? cli_fail("generate") : 0;
}
