/* Supervised fine-tuning (trill/sft.h) on the RL trainer executor and dataset reader. */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/json.h"
#include "rl/run/checkpoint.h"
#include "rl/run/run.h"
#include "rl/exec/trainer.h"
#include "trill/chat.h"
#include "trill/dataset.h"
#include "trill/fileio.h"
#include "trill/log.h"
#include "trill/model.h"
#include "trill/sft.h"
#include "trill/train.h"
#include "trill/timing.h"
#include "trill/tokenizer.h"

typedef struct sft_run {
    const trill_run_config *c;
    FILE *log;
    trill_tokenizer *tok;
    trill_chat_template *chat;
    trill_dataset *train, *eval;
    trill_trainer *t;
    trill_comm *world;            /* NULL: one process */
    int rank;                     /* 0 logs and writes */
    int lock_fd;                  /* run_dir/.lock (rank 0) */
    rl_identity base;             /* the base model's, in every checkpoint's manifest */
    char *resume_dir;             /* the checkpoint continued from, or NULL */
    int start_step;               /* its step */
    int saved_step;               /* the newest checkpoint's */
    int eos;                      /* the end-of-sequence token each example ends with */
    int vocab;
} sft_run;

/* A progress line to the caller's file, or to the library's log sink; rank 0's only. */
static void sft_log_rank(int rank, FILE *f, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#define sft_log(f, ...) sft_log_rank(r->rank, f, __VA_ARGS__)
static void sft_log_rank(int rank, FILE *f, const char *fmt, ...) {
    if (rank != 0) return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (f) fprintf(f, "%s\n", line);
    else trill_log(TRILL_LOG_INFO, "%s", line);
}

trill_status trill_sft_validate(const trill_run_config *c) {
    if (!c->model[0]) return trill_error(TRILL_ERR_INVALID, "model: trill sft needs a model folder (--model DIR or model=DIR)");
    if (!c->data.train[0]) return trill_error(TRILL_ERR_INVALID, "data.train: trill sft needs a JSONL file of prompts and completions (--data FILE)");
    if (!c->run_dir[0]) return trill_error(TRILL_ERR_INVALID, "run_dir: trill sft writes the trained weights there (--out DIR or run_dir=DIR)");
    if (c->trainer.lora.targets == 0 && c->sft.mode == TRILL_SFT_LORA)
        return trill_error(TRILL_ERR_INVALID, "trainer.lora.targets: no module selected");
    return TRILL_OK;
}

/* ---- examples as batches ---- */

/* An example's tokens: the prompt, the completion (cut to fit when the dataset loaded it under
 * sft.truncate) and the end-of-sequence token. */
static int example_len(const trill_example *e) { return e->n_ids + e->n_completion + 1; }

/* Examples idx[0, n) of d as a batch: prompt_len per sequence, the loss on what follows. */
static trill_status make_batch(const sft_run *r, const trill_dataset *d, const int *idx, int n, rl_batch *b) {
    memset(b, 0, sizeof *b);
    b->n_seqs = n;
    b->group_size = 1;
    b->offsets = trill_malloc(sizeof(int) * (size_t)(n + 1));
    b->prompt_len = trill_malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!b->offsets || !b->prompt_len) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    b->offsets[0] = 0;
    for (int i = 0; i < n; i++) b->offsets[i + 1] = b->offsets[i] + example_len(&d->examples[idx[i]]);
    if (!(b->tokens = trill_malloc(sizeof(int) * (size_t)(b->offsets[n] ? b->offsets[n] : 1)))) return trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        const trill_example *e = &d->examples[idx[i]];
        const int np = e->n_ids, nc = e->n_completion;
        int *at = b->tokens + b->offsets[i];
        memcpy(at, e->ids, sizeof(int) * (size_t)np);
        memcpy(at + np, e->completion_ids, sizeof(int) * (size_t)nc);
        at[np + nc] = r->eos;
        b->prompt_len[i] = np;
        for (int k = 0; k < np + nc + 1; k++)
            if (at[k] >= r->vocab)
                return trill_error(TRILL_ERR_INVALID, "%s: example %d: token id %d exceeds the model's vocab_size %d", d->path, idx[i] + 1,
                                   at[k], r->vocab);
    }
    return TRILL_OK;
}

typedef struct example_list { const trill_dataset *d; const int *order; } example_list;

static int ordered_len(const void *ctx, int i) {
    const example_list *l = ctx;
    return example_len(&l->d->examples[l->order[i]]);
}

/* How many of order[at, n) the next `micro` micro-batches take (trainer.micro_batch_tokens each;
 * trill_micro_batch_take's rule). */
static int step_size(const sft_run *r, const int *order, int at, int n, int micro) {
    int k = at;
    for (int m = 0; m < micro && k < n; m++) {
        const example_list l = { r->train, order + k };
        k += trill_micro_batch_take(n - k, r->c->trainer.micro_batch_tokens, ordered_len, &l);
    }
    return k - at;
}

/* Mean NLL per completion token of the held-out set. */
static trill_status eval_loss(sft_run *r, double *out) {
    int *all = trill_malloc(sizeof(int) * (size_t)r->eval->n);
    rl_batch b = { 0 };
    double nll = 0;
    long n = 0;
    trill_status st = all ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    for (int i = 0; all && i < r->eval->n; i++) all[i] = i;
    if (!st) st = make_batch(r, r->eval, all, r->eval->n, &b);
    if (!st) st = trill_trainer_nll(r->t, &b, &nll, &n);
    trill_rl_batch_free(&b);
    free(all);
    *out = n ? nll / n : NAN;
    return st;
}

/* ---- checkpoints and the result ---- */

static const char *mode_name(const trill_run_config *c) { return c->sft.mode == TRILL_SFT_FULL ? "full" : "lora"; }

static trill_status write_parts(void *ctx, const char *dir) { return trill_trainer_save(((const sft_run *)ctx)->t, dir); }

/* RUN/checkpoints/step-NNNNNNNN: the weights (the PEFT adapter or the full model) and the
 * optimizer state as run_dir's result has them, config.yaml, state.json and the manifest (the
 * run folder's machinery, src/rl/run/checkpoint.h); the newest checkpoint.keep are kept. */
static trill_status save_checkpoint(sft_run *r, int step, double eval) {
    const trill_run_config *c = r->c;
    trill_status st = trill_trainer_gather(r->t, true); /* the experts' shards, under expert parallelism */
    if (!st && r->rank == 0) { /* every rank holds the same weights */
        json_t *j = json_pack("{s:i, s:s, s:o}", "step", step, "mode", mode_name(c), "eval_loss", isnan(eval) ? json_null() : json_real(eval));
        st = j ? trill_rl_checkpoint_write(c->run_dir, step, c, j, write_parts, r, &r->base, c->checkpoint.keep)
               : trill_error(TRILL_ERR_NOMEM, "out of memory");
        json_decref(j);
    }
    st = trill_comm_agree(r->world, st, "writing a checkpoint");
    if (!st) r->saved_step = step;
    return st;
}

/* run_dir's result from checkpoint `ckpt`: each weight and optimizer file hard-linked into
 * run_dir (a whole file replaced at once; no second copy of a large model), written afresh where
 * the file system has no hard links; then trainer_state.json; a full model gets the base's side
 * files (tokenizer...) so that the folder is usable on its own. */
static trill_status publish(const sft_run *r, const char *ckpt, int step, double eval) {
    const trill_run_config *c = r->c;
    DIR *d = opendir(ckpt);
    trill_status st = d ? TRILL_OK : trill_error(TRILL_ERR_IO, "%s: cannot list: %s", ckpt, strerror(errno));
    bool linked = true;
    for (struct dirent *e; !st && linked && (e = readdir(d));) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "manifest.json") == 0 || strcmp(e->d_name, "state.json") == 0 ||
            strcmp(e->d_name, "config.yaml") == 0)
            continue;
        char from[8192], tmp[8192], to[8192];
        snprintf(from, sizeof from, "%s/%s", ckpt, e->d_name);
        snprintf(to, sizeof to, "%s/%s", c->run_dir, e->d_name);
        snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", c->run_dir, e->d_name, (long)getpid());
        unlink(tmp);
        if (link(from, tmp) != 0) linked = false;
        else if (rename(tmp, to) != 0) st = trill_error(TRILL_ERR_IO, "%s: cannot rename to %s: %s", tmp, to, strerror(errno));
    }
    if (d) closedir(d);
    if (!st && !linked) st = trill_trainer_save(r->t, c->run_dir);
    if (!st) st = trill_fsync_dir(c->run_dir);
    char *state = st ? NULL : trill_path_join(c->run_dir, "trainer_state.json");
    if (!st && !state) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        json_t *j = json_pack("{s:i, s:s, s:o}", "step", step, "mode", mode_name(c), "eval_loss", isnan(eval) ? json_null() : json_real(eval));
        st = j ? trill_json_write_file(state, j) : trill_error(TRILL_ERR_NOMEM, "out of memory");
        json_decref(j);
    }
    if (!st && c->sft.mode == TRILL_SFT_FULL) st = trill_model_copy_side_files(c->model, c->run_dir);
    free(state);
    return st;
}

/* The end of the run: its last step checkpointed (unless it already is), then run_dir's result. */
static trill_status finish(sft_run *r, int step, double eval) {
    trill_status st = r->saved_step == step ? TRILL_OK : save_checkpoint(r, step, eval);
    if (st || r->rank != 0) return st;
    char ckpt[4200];
    snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%08d", r->c->run_dir, step);
    return publish(r, ckpt, step, eval);
}

/* ---- set-up ---- */

/* The run folder (rank 0 locks it: one process a run folder, as trill train's), the checkpoint
 * to continue from (resume: "" afresh, refused where checkpoints exist; "auto" the newest
 * complete one, falling back past damaged ones; else that folder), and what a resumed run must
 * keep: the base model (by content), seed, sft.mode and the adapter's shape. */
static trill_status open_run_dir(sft_run *r) {
    const trill_run_config *c = r->c;
    trill_status st = r->rank == 0 ? trill_mkdir_p(c->run_dir) : TRILL_OK;
    if (!st && r->rank == 0) st = trill_lock_dir(c->run_dir, "run_dir", "trill sft", &r->lock_fd);
    st = trill_comm_agree(r->world, st, "setting the run up");
    if (!st) st = trill_rl_checkpoint_choose(c->run_dir, c->resume, "trill sft", r->rank == 0, &r->resume_dir);
    if (!st && !r->resume_dir) { /* a result of an older trill sft, written before run folders had checkpoints */
        char *legacy = trill_path_join(c->run_dir, "trainer_state.json"), *ckpts = trill_path_join(c->run_dir, "checkpoints");
        if (!legacy || !ckpts) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        else if (trill_file_exists(legacy) && !trill_file_exists(ckpts))
            st = trill_error(TRILL_ERR_INVALID, "run_dir %s holds the result of an earlier trill sft that kept no checkpoints (an older "
                             "version): it cannot be continued; choose another run_dir", c->run_dir);
        free(legacy);
        free(ckpts);
    }
    if (!st) st = trill_rl_model_identity(c->model, &r->base);
    if (!st && r->resume_dir) st = trill_rl_checkpoint_check_base(r->resume_dir, &r->base, c->model);
    trill_run_config saved;
    char *path = NULL;
    json_t *state = NULL;
    const char *mode = NULL;
    if (!st && r->resume_dir && !(st = trill_run_config_defaults(&saved))) {
        if (!(path = trill_path_join(r->resume_dir, "config.yaml"))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) st = trill_run_config_load(&saved, path);
        if (!st) st = trill_run_config_check_resume(&saved, c, r->resume_dir);
        trill_run_config_free(&saved);
        free(path);
        path = NULL;
        if (!st && !(path = trill_path_join(r->resume_dir, "state.json"))) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
        if (!st) st = trill_json_load_file(path, &state);
        if (!st) st = trill_json_get_int(state, "step", path, 0, INT32_MAX, &r->start_step);
        if (!st) st = trill_json_get_string(state, "mode", path, &mode);
        if (!st && (!mode || strcmp(mode, mode_name(c)) != 0))
            st = trill_error(TRILL_ERR_INVALID, "%s: the checkpoint trained sft.mode %s, this config %s", path, mode ? mode : "?", mode_name(c));
        json_decref(state);
        free(path);
        r->saved_step = r->start_step;
    }
    return trill_comm_agree(r->world, st, "setting the run up");
}

static trill_status load(sft_run *r) {
    const trill_run_config *c = r->c;
    trill_status st = trill_trainer_create_sft(c, c->model, r->resume_dir, r->world, &r->t);
    if (!st) st = trill_tokenizer_load(c->model, &r->tok);
    if (!st && strcmp(c->data.template_, "chat") == 0) st = trill_chat_template_load(c->model, &r->chat);
    const trill_config *mc = st ? NULL : trill_model_config(trill_trainer_policy(r->t));
    trill_dataset_options o = { .prompt_field = c->data.prompt_field, .answer_field = c->data.answer_field, .template_ = c->data.template_,
                                .chat = r->chat, .max_prompt_tokens = c->data.max_prompt_tokens, .completion_field = c->data.completion_field,
                                .max_seq_len = c->sft.max_seq_len, .truncate = c->sft.truncate,
                                .max_position_embeddings = mc ? mc->max_position_embeddings : 0 };
    if (!st) st = trill_dataset_load(c->data.train, r->tok, &o, &r->train);
    o.limit = c->data.eval_size;
    if (!st && c->data.eval[0]) st = trill_dataset_load(c->data.eval, r->tok, &o, &r->eval);
    if (!st) {
        char note[128];
        sft_log(r->log, "trill sft: %s, %s", c->model, trill_trainer_precision_note(r->t, note, sizeof note));
        r->eos = mc->n_eos ? mc->eos_token_ids[0] : 0;
        r->vocab = mc->vocab_size;
    }
    return st;
}

/* Optimizer steps in all: the micro-batches of an epoch (packed in file order) / sft.grad_accum,
 * times the epochs, at most sft.max_steps. */
static int total_steps(const sft_run *r, int *micro_per_epoch) {
    const trill_run_config *c = r->c;
    int *order = trill_malloc(sizeof(int) * (size_t)r->train->n);
    if (!order) return -1;
    for (int i = 0; i < r->train->n; i++) order[i] = i;
    *micro_per_epoch = 0;
    for (int at = 0; at < r->train->n; (*micro_per_epoch)++) at += step_size(r, order, at, r->train->n, 1);
    free(order);
    const int per_epoch = (*micro_per_epoch + c->sft.grad_accum - 1) / c->sft.grad_accum;
    const int64_t total = (int64_t)per_epoch * c->sft.epochs;
    return c->sft.max_steps > 0 && c->sft.max_steps < total ? c->sft.max_steps : (int)(total < INT32_MAX ? total : INT32_MAX);
}

/* ---- the run ---- */

/* A stop was asked for (a signal, trill_rl_request_stop); under data parallelism the ranks agree,
 * so that all stop after the same step. */
static bool stop_requested(const sft_run *r) {
    const bool mine = trill_rl_stop_requested();
    if (!r->world || trill_comm_size(r->world) < 2) return mine;
    uint64_t any = 0;
    if (trill_comm_allreduce_max_u64(r->world, mine, &any)) return true; /* a lost peer: stop here */
    return any != 0;
}

/* One optimizer step on order[at, at + k), then its line, checkpoint and held-out loss when due. */
static trill_status one_step(sft_run *r, const int *order, int k, int step, int total, int last, double t_start, long *tokens,
                             double *eval) {
    const trill_run_config *c = r->c;
    rl_batch b;
    trill_nll_stats ns;
    trill_trainer_comm_reset(r->t);
    trill_status st = make_batch(r, r->train, order, k, &b);
    if (!st) st = trill_trainer_nll_step(r->t, &b, step, total, &ns);
    trill_rl_batch_free(&b);
    if (st) return st;
    *tokens += ns.tokens;
    const double elapsed = trill_now() - t_start;
    char comm[96] = ""; /* what the step's collectives moved from this rank, and their time */
    if (r->world && trill_comm_size(r->world) > 1) {
        const trill_comm_stats cs = trill_trainer_comm_stats(r->t);
        double bytes = 0, ms = 0;
        for (int kind = 0; kind < TRILL_COMM_KINDS; kind++) bytes += (double)cs.bytes[kind], ms += cs.ms[kind];
        snprintf(comm, sizeof comm, "  comm %.2f MB %.1f ms", bytes / 1e6, ms);
    }
    sft_log(r->log, "step %d/%d  loss %.4f  lr %.2e  grad_norm %.3f  %.0f tokens/s  eta %.0fs%s%s", step, total, ns.loss, ns.lr, ns.grad_norm,
            *tokens / elapsed, elapsed / (step - r->start_step) * (total - step), comm, ns.applied ? "" : "  (not finite: skipped)");
    const bool stop = step < last && stop_requested(r);
    if (((c->sft.save_every > 0 && step % c->sft.save_every == 0) || stop) && step < last && !(st = save_checkpoint(r, step, *eval)))
        sft_log(r->log, "step %d  checkpoint saved to %s/checkpoints/step-%08d", step, c->run_dir, step);
    if (!st && stop)
        return trill_error(TRILL_ERR_INTERRUPTED, "stopped on request after step %d of %d (checkpoint written); continue with resume=auto",
                           step, total);
    if (!st && r->eval && c->sft.eval_every > 0 && step % c->sft.eval_every == 0 && step < total && !(st = eval_loss(r, eval)))
        sft_log(r->log, "step %d  eval loss %.4f", step, *eval);
    return st;
}

static trill_status train(sft_run *r, int total, int *step_out, double *eval) {
    const trill_run_config *c = r->c;
    const int n = r->train->n;
    const int last = c->sft.stop_after > 0 && c->sft.stop_after < total ? c->sft.stop_after : total;
    int *order = trill_malloc(sizeof(int) * (size_t)n), step = 0;
    trill_status st = order ? TRILL_OK : trill_error(TRILL_ERR_NOMEM, "out of memory");
    const double t_start = trill_now();
    long tokens = 0;
    for (int64_t epoch = 0; !st && step < last; epoch++) {
        /* the order of each epoch is a function of (seed, epoch): the steps a resumed run already
         * took are skipped exactly */
        if ((st = trill_dataset_order(r->train, c->seed, c->data.shuffle, epoch * n, n, order))) break;
        for (int at = 0; !st && step < last && at < n;) {
            const int k = step_size(r, order, at, n, c->sft.grad_accum);
            step++;
            if (step > r->start_step) st = one_step(r, order + at, k, step, total, last, t_start, &tokens, eval);
            at += k;
        }
    }
    free(order);
    *step_out = step;
    return st;
}

trill_status trill_sft_run(const trill_run_config *c, const trill_sft_options *o, trill_sft_result *out) {
    *out = (trill_sft_result){ .eval_loss = NAN };
    trill_status st = trill_sft_validate(c);
    if (st) return st;
    sft_run r = { .c = c, .log = o ? o->log : NULL, .world = o ? o->world : NULL, .lock_fd = -1 };
    r.rank = r.world ? trill_comm_rank(r.world) : 0;
    if (c->parallel.generator.replicas || c->parallel.scorer)
        st = trill_error(TRILL_ERR_INVALID, "parallel.generator.replicas %d, parallel.scorer %d: trill sft has no generator or scorer "
                         "(set them to 0)", c->parallel.generator.replicas, c->parallel.scorer);
    if (!st) st = trill_rl_parallel_check(c, r.world ? trill_comm_size(r.world) : 1);
    trill_rl_stop_reset();
    if (!st) st = open_run_dir(&r);
    if (!st) st = load(&r);
    int micro_per_epoch = 0, total = st ? 0 : total_steps(&r, &micro_per_epoch);
    if (!st && total < 0) st = trill_error(TRILL_ERR_NOMEM, "out of memory");
    if (!st) {
        size_t n_values = 0;
        const trill_lora *lora = trill_trainer_lora(r.t);
        if (lora) trill_lora_params((trill_lora *)lora, &n_values);
        else n_values = trill_model_n_params(trill_trainer_policy(r.t));
        sft_log_rank(r.rank, r.log, "trill sft: %d examples, %d micro-batches/epoch, %d steps (%s, %zu trainable values)%s", r.train->n,
                     micro_per_epoch, total, lora ? "LoRA" : "full", n_values,
                     r.world && trill_comm_size(r.world) > 1 ? ", data-parallel over the job's ranks" : "");
        if (r.resume_dir) sft_log_rank(r.rank, r.log, "trill sft: resuming from %s at step %d", r.resume_dir, r.start_step);
    }
    double eval = NAN;
    int step = 0;
    if (!st) st = train(&r, total, &step, &eval);
    if (!st && r.eval && !(st = eval_loss(&r, &eval))) {
        sft_log_rank(r.rank, r.log, "eval loss %.4f (%d held-out examples)", eval, r.eval->n);
        out->eval_loss = eval;
    }
    if (!st) st = finish(&r, step, eval);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t rss = (uint64_t)ru.ru_maxrss;
    if (!st && r.world && trill_comm_size(r.world) > 1) st = trill_comm_allreduce_max_u64(r.world, rss, &rss);
    if (!st)
        sft_log_rank(r.rank, r.log, "trill sft: wrote %s (peak RSS %.0f MB%s)", c->run_dir, rss / 1024.0,
                     r.world && trill_comm_size(r.world) > 1 ? ", the largest rank's" : "");
    out->steps = step;
    trill_trainer_free(r.t);
    trill_dataset_free(r.train);
    trill_dataset_free(r.eval);
    trill_chat_template_free(r.chat);
    trill_tokenizer_free(r.tok);
    free(r.resume_dir);
    if (r.lock_fd >= 0) close(r.lock_fd); /* releases the lock */
    return st;
}
