/* The C side of the gradient parity test (tests/train/grad_parity.sh):
 *   grad_tool MODEL_DIR IN.jsonl OUT.safetensors [--replay] [--recompute] [--adapter DIR [--save-adapter DIR2]]
 *             [--steps N --lr LR --weight-decay WD --beta2 B2 --clip MAXNORM]
 * Each input line: {"tokens": [...], "coef": [null, c1, ...], "experts"?: [[[k ids] per MoE layer] per token]}.
 * loss = sum of coef[t] * logprob[t]; writes d loss / d every parameter under its HF name
 * (F32) and prints {"loss": ...}. With --replay the lines' experts are forced (router replay).
 * With --adapter (a PEFT LoRA folder) the base is frozen and only the adapter's gradients are
 * written, under PEFT's names. With --steps N it instead takes N AdamW steps (beta1 0.9,
 * eps 1e-8) on that loss and writes the trainable values after them. --save-adapter writes the
 * adapter it loaded back with trill's writer to DIR2 and stops (the file forms' round trip). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch/family.h"
#include "base/json.h"
#include "model/lora_internal.h"
#include "trill/kernels.h"
#include "trill/lora.h"
#include "trill/optim.h"
#include "trill/model.h"
#include "trill/safetensors.h"
#include "trill/train.h"

static int fail(const char *what) {
    fprintf(stderr, "grad_tool: %s: %s\n", what, trill_error_message());
    return 1;
}

int main(int argc, char **argv) {
    trill_blas_restart(argv); /* OpenBLAS's kernels for this CPU */
    if (argc < 4) { fprintf(stderr, "usage: grad_tool MODEL_DIR IN.jsonl OUT.safetensors [--replay] [--adapter DIR]\n"); return 2; }
    bool replay = false, recompute = false;
    const char *adapter = NULL, *save_adapter = NULL;
    int steps = 0;
    double lr = 1e-3, clip = 0;
    trill_adamw_config opt_cfg = trill_adamw_defaults();
    for (int i = 4; i < argc; i++) {
        if (strcmp(argv[i], "--replay") == 0) replay = true;
        else if (strcmp(argv[i], "--recompute") == 0) recompute = true;
        else if (strcmp(argv[i], "--adapter") == 0 && i + 1 < argc) adapter = argv[++i];
        else if (strcmp(argv[i], "--save-adapter") == 0 && i + 1 < argc) save_adapter = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc) steps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--lr") == 0 && i + 1 < argc) lr = atof(argv[++i]);
        else if (strcmp(argv[i], "--weight-decay") == 0 && i + 1 < argc) opt_cfg.weight_decay = atof(argv[++i]);
        else if (strcmp(argv[i], "--beta2") == 0 && i + 1 < argc) opt_cfg.beta2 = atof(argv[++i]);
        else if (strcmp(argv[i], "--clip") == 0 && i + 1 < argc) clip = atof(argv[++i]);
        else { fprintf(stderr, "grad_tool: unknown argument %s\n", argv[i]); return 2; }
    }
    trill_model *m; /* with an adapter the base is frozen and kept as stored (bf16 checkpoints stay bf16) */
    if (trill_model_load_as(argv[1], adapter ? TRILL_STORE_CHECKPOINT : TRILL_STORE_F32, &m)) return fail(argv[1]);
    trill_lora *lora = NULL;
    if (adapter) {
        if (trill_lora_load(m, adapter, &lora)) return fail(adapter);
        trill_model_attach_lora(m, lora);
    }
    if (save_adapter) {
        if (!lora) { fprintf(stderr, "grad_tool: --save-adapter needs --adapter\n"); return 2; }
        if (trill_lora_save(lora, save_adapter)) return fail(save_adapter);
        trill_lora_free(lora);
        trill_model_free(m);
        return 0;
    }
    const trill_config *c = &m->config;
    const int L = c->n_moe_layers, K = c->num_experts_per_tok;
    FILE *f = fopen(argv[2], "r");
    if (!f) { perror(argv[2]); return 1; }
    int *tokens = NULL, offsets[1024] = { 0 }, n_seqs = 0;
    float *coef = NULL;
    uint16_t *ids = NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) > 1 && n_seqs < 1023) {
        json_t *j;
        if (trill_json_parse(argv[2], line, (size_t)len, &j)) return fail("input");
        const json_t *tk = json_object_get(j, "tokens"), *cf = json_object_get(j, "coef"), *ex = json_object_get(j, "experts");
        int n = (int)json_array_size(tk), base = offsets[n_seqs];
        tokens = realloc(tokens, sizeof(int) * (base + n));
        coef = realloc(coef, sizeof(float) * (base + n));
        ids = realloc(ids, sizeof(uint16_t) * ((size_t)(base + n) * L * K + 1));
        for (int t = 0; t < n; t++) {
            tokens[base + t] = (int)json_integer_value(json_array_get(tk, t));
            const json_t *v = json_array_get(cf, t);
            coef[base + t] = json_is_number(v) ? (float)json_number_value(v) : 0.0f;
            for (int l = 0; replay && l < L; l++)
                for (int k = 0; k < K; k++)
                    ids[((size_t)(base + t) * L + l) * K + k] =
                        (uint16_t)json_integer_value(json_array_get(json_array_get(json_array_get(ex, t), l), k));
        }
        offsets[++n_seqs] = base + n;
        json_decref(j);
    }
    free(line);
    fclose(f);
    const int T = offsets[n_seqs];
    float *logprobs = malloc(sizeof(float) * (T + 1));
    float *trainable = lora ? lora->params : m->params;
    const size_t n_trainable = lora ? lora->n_params : m->n_params;
    float *gvals = calloc(n_trainable, sizeof(float));
    trill_adamw *opt = NULL;
    if (steps > 0 && trill_adamw_create(n_trainable, opt_cfg, &opt)) return fail("optimizer");
    uint8_t *frozen = calloc(n_trainable, 1); /* full: the selection bias, neither decayed nor written */
    for (size_t i = 0; !lora && i < m->n_tensors; i++)
        if (!trill_tensor_trainable(m->tensors[i].kind)) memset(frozen + (m->tensors[i].data - m->params), 1, m->tensors[i].numel);
    double loss = 0;
    for (int step = 0; step < (steps > 0 ? steps : 1); step++) {
        memset(gvals, 0, n_trainable * sizeof(float));
        trill_forward_pass *pass;
        if (trill_model_forward_train(m, tokens, offsets, n_seqs, replay ? ids : NULL, logprobs, NULL, recompute, &pass)) return fail("forward");
        if (trill_model_backward(pass, coef, lora ? NULL : gvals, lora ? gvals : NULL)) return fail("backward");
        trill_forward_pass_free(pass);
        loss = 0;
        for (int t = 0; t < T; t++)
            if (!isnan(logprobs[t])) loss += (double)coef[t] * logprobs[t];
        if (opt) {
            double norm = trill_clip_grad_norm(gvals, n_trainable, clip);
            trill_adamw_step(opt, trainable, gvals, lr, frozen);
            fprintf(stderr, "step %d loss %.9g grad norm %.6g\n", step, loss, norm);
        }
    }
    /* gradients of the trainable tensors, named as their values */
    const trill_param *tensors = lora ? lora->tensors : m->tensors;
    const size_t n_tensors = lora ? lora->n_tensors : m->n_tensors;
    /* after --steps, the trained values themselves; else their gradients */
    const float *values = trainable, *gvalues = opt ? trainable : gvals;
    trill_tensor_out *outs = calloc(n_tensors, sizeof *outs);
    size_t n_out = 0;
    for (size_t i = 0; i < n_tensors; i++) {
        const trill_param *p = &tensors[i];
        if (!trill_tensor_trainable(p->kind)) continue;
        outs[n_out] = (trill_tensor_out){ .name = p->name, .data = gvalues + (p->data - values), .src_dtype = TRILL_F32 };
        outs[n_out].ndim = trill_param_file_shape(&m->config, p, outs[n_out].shape); /* as the checkpoint holds it (a conv1d's [C, 1, K]) */
        n_out++;
    }
    if (trill_st_write(argv[3], outs, n_out, TRILL_F32)) return fail(argv[3]);
    printf("{\"loss\": %.9g}\n", loss);
    trill_adamw_free(opt);
    free(outs); free(gvals); free(logprobs); free(frozen);
    trill_lora_free(lora); free(tokens); free(coef); free(ids);
    trill_model_free(m);
    return 0;
}
