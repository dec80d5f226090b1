/* The C side of the reward-model parity test (tests/reference/reward_model_ref.py):
 *   reward_model_tool MODEL_DIR IN.jsonl OUT.jsonl
 * Each input line {"text": "..."}; all texts are scored by one trill_reward_model_score call
 * (packed batches), and each output line is {"score": x}. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "trill/kernels.h"
#include "trill/reward_model.h"

static int fail(const char *what) {
    fprintf(stderr, "reward_model_tool: %s: %s\n", what, trill_error_message());
    return 1;
}

int main(int argc, char **argv) {
    trill_blas_restart(argv); /* OpenBLAS's kernels for this CPU */
    if (argc != 4) {
        fprintf(stderr, "usage: reward_model_tool MODEL_DIR IN.jsonl OUT.jsonl\n");
        return 2;
    }
    trill_reward_model *rm;
    if (trill_reward_model_load(argv[1], &rm)) return fail(argv[1]);
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    json_t **lines = NULL;
    const char **texts = NULL;
    int n = 0;
    char *line = NULL;
    size_t cap = 0;
    while (getline(&line, &cap, f) > 0) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        json_error_t err;
        json_t *j = json_loads(line, 0, &err);
        const json_t *text = j ? json_object_get(j, "text") : NULL;
        if (!json_is_string(text)) { fprintf(stderr, "reward_model_tool: %s line %d: expected {\"text\": string}\n", argv[2], n + 1); return 1; }
        lines = realloc(lines, sizeof *lines * (size_t)(n + 1));
        texts = realloc(texts, sizeof *texts * (size_t)(n + 1));
        lines[n] = j;
        texts[n++] = json_string_value(text);
    }
    free(line);
    fclose(f);
    double *scores = calloc((size_t)n + 1, sizeof *scores);
    if (trill_reward_model_score(rm, texts, n, scores)) return fail(argv[2]);
    FILE *out = fopen(argv[3], "w");
    if (!out) { perror(argv[3]); return 1; }
    for (int i = 0; i < n; i++) fprintf(out, "{\"score\": %.17g}\n", scores[i]);
    fclose(out);
    for (int i = 0; i < n; i++) json_decref(lines[i]);
    free(lines);
    free(texts);
    free(scores);
    trill_reward_model_free(rm);
    return 0;
}
