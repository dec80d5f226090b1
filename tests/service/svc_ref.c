/* The in-process side of the service's parity test (test_service.py): runs a trainer's calls with
 * the library alone (trill/service.h, no server, no HTTP) and writes what the service must equal.
 *
 * Usage: svc_ref MODEL_DIR OPS.json OUT_DIR
 *   OPS.json: {"trainer": {"rank", "seed", "train_mlp", "train_attn", "train_unembed"},
 *              "ops": [{"op": "forward" | "forward_backward", "data", "loss_fn", "loss_fn_config"},
 *                      {"op": "optim_step", "adam_params"}, ...]}   (the wire's bodies, docs/service.md)
 *   OUT_DIR/state: the trainer's state after the calls (adapter, optimizer), as save_state writes it;
 *   OUT_DIR/results.json: each call's result: {"logprobs": [[...] per datum], "loss": L} or
 *   {"grad_norm": G, "step": S}. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "service/svc.h"

static int fail(const char *what) {
    fprintf(stderr, "svc_ref: %s: %s\n", what, trill_error_message());
    return 1;
}

static json_t *forward(trill_svc_trainer *t, trill_svc_base *b, const json_t *op, bool backward) {
    trill_loss loss;
    trill_svc_loss_config lc;
    trill_svc_datum *data = NULL;
    int n = 0;
    long tokens = 0;
    if (trill_svc_parse_loss(op, &loss, &lc) || trill_svc_parse_data(b, loss, json_object_get(op, "data"), &data, &n, &tokens)) return NULL;
    float *lp = malloc(sizeof(float) * (size_t)tokens);
    double sum = 0;
    json_t *out = NULL;
    if (lp && !trill_svc_forward(t, data, n, loss, &lc, backward, lp, &sum)) {
        json_t *all = json_array();
        for (int d = 0, k = 0; d < n; d++) {
            json_t *a = json_array();
            for (int i = 0; i < data[d].n; i++) json_array_append_new(a, json_real(lp[k++]));
            json_array_append_new(all, a);
        }
        out = json_pack("{s:o, s:f}", "logprobs", all, "loss", sum);
    }
    free(lp);
    trill_svc_free_data(data, n);
    return out;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: svc_ref MODEL_DIR OPS.json OUT_DIR\n");
        return 2;
    }
    json_error_t err;
    json_t *ops = json_load_file(argv[2], 0, &err);
    if (!ops) { fprintf(stderr, "svc_ref: %s: %s\n", argv[2], err.text); return 1; }
    const json_t *tc = json_object_get(ops, "trainer");
    trill_svc_trainer_config c = { .rank = (int)json_integer_value(json_object_get(tc, "rank")),
                                   .seed = (uint64_t)json_integer_value(json_object_get(tc, "seed")),
                                   .train_mlp = json_is_true(json_object_get(tc, "train_mlp")),
                                   .train_attn = json_is_true(json_object_get(tc, "train_attn")),
                                   .train_unembed = json_is_true(json_object_get(tc, "train_unembed")) };
    trill_svc_base *b = NULL;
    trill_svc_trainer *t = NULL;
    if (trill_svc_base_load(argv[1], NULL, &b)) return fail("loading the model");
    if (trill_svc_trainer_create(b, &c, &t)) return fail("creating the trainer");
    json_t *results = json_array();
    size_t i;
    json_t *op;
    json_array_foreach(json_object_get(ops, "ops"), i, op) {
        const char *kind = json_string_value(json_object_get(op, "op"));
        json_t *r = NULL;
        if (strcmp(kind, "optim_step") == 0) {
            trill_svc_adam p;
            double norm = 0;
            if (!trill_svc_parse_adam(op, &p) && !trill_svc_optim_step(t, &p, &norm))
                r = json_pack("{s:f, s:I}", "grad_norm", norm, "step", (json_int_t)trill_svc_trainer_step(t));
        } else {
            r = forward(t, b, op, strcmp(kind, "forward_backward") == 0);
        }
        if (!r) return fail(kind);
        json_array_append_new(results, r);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/state", argv[3]);
    if (trill_svc_trainer_save(t, path, true)) return fail("saving");
    snprintf(path, sizeof path, "%s/results.json", argv[3]);
    if (json_dump_file(results, path, JSON_COMPACT)) return fail("writing results.json");
    json_decref(results);
    json_decref(ops);
    trill_svc_trainer_free(t);
    trill_svc_base_free(b);
    return 0;
}
