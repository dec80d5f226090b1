/* One RL step's metrics (trill_rl_metrics): the figures metrics.jsonl, the progress line and
 * `trill report` read by name. */
#ifndef TRILL_RL_METRICS_H
#define TRILL_RL_METRICS_H

#include "trill/run_config.h"

/* ---- one step's metrics: computed once, read by name; metrics.jsonl and the progress line are
 * written from this struct (trill_rl_metrics_json). NAN where a figure does not apply. ---- */
#define TRILL_RL_MAX_EXT_METRICS 32  /* distinct metric names an external reward process may report */
#define TRILL_RL_MAX_LAG 1025        /* staleness histogram entries: lags 0 .. async.max_staleness */

/* A step's per-token distributions in fixed bins (the same every step and run, so steps and runs
 * compare bin by bin; trill_rl_hist_edges gives each histogram's edges):
 *   log_ratio   Δ = log pi_train - log mu by the decade of |Δ|: bins 0-7 negative (|Δ| >= 1,
 *               [0.1, 1), ..., [1e-6, 1e-5), below 1e-6), bin 8 exactly 0 (the two engines agree to
 *               the bit), bins 9-16 positive mirrored (below 1e-6, ..., >= 1);
 *   weight_raw  the importance weight exp(Δ) before any correction, and
 *   weight_used the weight the loss uses (TIS's cap applied) with MIS-masked tokens in bin 0:
 *               bins 0 (masked or 0), (0, 0.5), [0.5, 0.8), [0.8, 0.9), [0.9, 0.95), [0.95, 0.99),
 *               [0.99, 1.01), [1.01, 1.05), [1.05, 1.1), [1.1, 1.25), [1.25, 2), [2, 5), >= 5;
 *   response_len each sequence's response length in 10 equal bins of [0, max_new_tokens] (the
 *               last holds max_new_tokens itself: the truncated responses). */
#define TRILL_RL_HIST_RATIO_BINS 17
#define TRILL_RL_HIST_WEIGHT_BINS 13
#define TRILL_RL_HIST_LEN_BINS 10
typedef struct trill_rl_histograms {
    long log_ratio[TRILL_RL_HIST_RATIO_BINS];
    long weight_raw[TRILL_RL_HIST_WEIGHT_BINS], weight_used[TRILL_RL_HIST_WEIGHT_BINS];
    long response_len[TRILL_RL_HIST_LEN_BINS];
} trill_rl_histograms;
typedef struct trill_rl_metrics {
    int step;                  /* 1-based, the step these describe */
    /* async mode only (async true) */
    bool async;
    int64_t batch;             /* the rollout batch's index in the prompt stream */
    double staleness_mean;     /* policy versions between the response tokens' weights and the trained ones */
    int staleness_max;
    long staleness_tokens[TRILL_RL_MAX_LAG]; /* response tokens at lag 0 .. staleness_max */
    long dropped_batches, regenerated_batches; /* so far in this run */
    /* the batch */
    double reward, accuracy, response_len;
    int flat_groups, trained_seqs;
    /* the trainer (means over the step's optimizer steps) */
    double loss, pg_loss, kl_loss, kl_ref, clip_frac, ratio_mean, grad_norm;
    int skipped_nonfinite;
    double lr;
    /* training-inference mismatch over the trained response tokens */
    double mismatch_mean_abs, mismatch_max_abs, mismatch_k1, mismatch_k3, mismatch_chi2;
    long mismatch_tokens;
    double tis_mean, tis_capped_frac, mis_masked_frac;
    double flip_token_frac;    /* routed experts the trainer chose differently (NAN without MoE layers) */
    int n_moe_layers;
    double flip_layer[1024];   /* [n_moe_layers] the same per MoE layer */
    bool has_hist;             /* the per-token distributions of the trained tokens (not when replayed without a trainer step) */
    trill_rl_histograms hist;
    /* generator.on_policy: the trained response tokens whose scored log-prob (bits) or expert set
     * differs from the generator's; 0 proves the two equal (TIS weights 1, nothing masked) */
    bool on_policy;
    long on_policy_differing;
    /* data parallelism (more than one rank): the step's collectives from this rank, per kind
     * (trill_comm_kind): bytes sent and milliseconds */
    bool has_comm;
    uint64_t comm_bytes[TRILL_COMM_KINDS];
    double comm_ms[TRILL_COMM_KINDS];
    /* weight sync */
    trill_weight_sync_mode sync_mode;
    size_t sync_bytes;
    double sync_ms;
    uint32_t policy_version;
    /* parallel.generator.replicas: the version's transfer over MPI (a non-blocking broadcast of
     * the adapters' or the merged weights' bytes, its XXH64 checked by each receiver), and per
     * receiver its rank, the ms from the broadcast's start to the bytes in its memory and the ms
     * its engine took to apply them */
    int n_receivers;
    size_t transfer_bytes;
    uint64_t transfer_checksum;
    struct { int rank; double receive_ms, apply_ms; size_t bytes; } receivers[64];
    /* the external reward process's own metrics, means over the batch, as "reward_ext_<name>" */
    int n_ext;
    char ext_name[TRILL_RL_MAX_EXT_METRICS][64];
    double ext_value[TRILL_RL_MAX_EXT_METRICS];
    struct {
        double generate_s, reward_s, train_s, sync_s, step_s, gen_tokens_per_s, train_tokens_per_s;
        double trainer_wait_s, generator_apply_ms, interval_s; /* async */
        /* the process's CPU time in the kernel and in user space, and its minor page faults, since
         * the previous step ended (the first step: since the run's metrics were opened) */
        double system_s, user_s;
        long minor_faults;
        /* the process's peak resident memory so far (MB), and with several ranks the largest
         * rank's (0 on one process) */
        double rss_peak_mb, rss_peak_max_mb;
        double score_s;        /* generator.on_policy: teacher forcing through the scorer (within train_s) */
    } time;
    /* env.kind: the batch's episodes, means per episode ("env" in metrics.jsonl): model turns, turns
     * cut at generator.max_new_tokens, tokens sampled and injected (prompt included), the return;
     * the episodes' stop reasons (counts: done, max_turns, context, env_error); the seconds in the environment
     * (summed); the rows the engine prefilled with turns kept across (each group's prompt once, each
     * observation and the turn's last token) against what rendering every turn afresh would
     * prefill (each turn's whole prefix) */
    bool has_env;
    struct {
        double turns, cut_turns, sampled_tokens, injected_tokens, return_mean, env_s;
        double tool_calls, parse_errors;   /* per episode: calls parsed from its turns (env.render chat), malformed ones */
        long stops[4];
        long prefill_tokens, rerender_prefill_tokens;
        int n_metrics;                 /* the environment's own metrics: their means over the episodes ("metrics") */
        char metric_name[TRILL_RL_MAX_EXT_METRICS][64];
        double metric_value[TRILL_RL_MAX_EXT_METRICS];
    } env;
    size_t generator_apply_bytes; /* async: the generator's last weight update */
    bool has_eval;             /* eval.every: a held-out evaluation after this step */
    double eval_pass1, eval_passk;
} trill_rl_metrics;

/* The metrics as a metrics.jsonl line (no newline; malloc'ed; NULL when out of memory). */
char *trill_rl_metrics_json(const trill_rl_metrics *m);

#endif
