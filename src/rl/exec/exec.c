/* The executors' work (exec.h): the stages of run.h, timed. */
#include "rl/exec/exec.h"

#include "trill/timing.h"

const char *trill_rl_exec_name(rl_exec_kind kind) {
    switch (kind) {
    case RL_EXEC_GENERATOR: return "generator";
    case RL_EXEC_REPLAY: return "replay";
    case RL_EXEC_REWARD: return "reward";
    case RL_EXEC_TRAINER: return "trainer";
    case RL_EXEC_EVALUATOR: return "evaluator";
    }
    return "?";
}

rl_exec trill_rl_exec_make(rl_run *r, rl_exec_kind kind) { return (rl_exec){ .kind = kind, .r = r }; }

static void set_phase(const rl_exec *e, trill_run_phase phase) {
    if (e->phase) e->phase(e->phase_ctx, phase);
}

/* The update on ro, published through e->publish; the run's training totals. */
static trill_status train(rl_exec *e, rl_rollout *ro) {
    rl_run *r = e->r;
    double train_s = 0;
    long tokens = 0;
    const trill_status st = trill_rl_stage_train(r, ro, e->publish, e->publish_ctx, ro->m, &train_s, &tokens);
    r->train_s += train_s;
    r->train_tokens += tokens;
    return st;
}

trill_status trill_rl_exec_work(rl_exec *e, rl_rollout *ro) {
    const double t0 = trill_now();
    const int64_t index = ro->index;
    const bool redo = ro->redo;
    trill_status st = TRILL_OK;
    switch (e->kind) {
    case RL_EXEC_GENERATOR:
        set_phase(e, TRILL_RUN_GENERATING);
        st = trill_rl_stage_generate(e->r, index, ro, e->between_steps, e->between_ctx);
        ro->redo = redo;
        break;
    case RL_EXEC_REPLAY:
        st = trill_rl_stage_replay(e->r, index, ro);
        break;
    case RL_EXEC_REWARD:
        set_phase(e, TRILL_RUN_SCORING);
        st = trill_rl_stage_reward(e->r, ro);
        break;
    case RL_EXEC_TRAINER:
        set_phase(e, TRILL_RUN_TRAINING);
        st = train(e, ro);
        break;
    case RL_EXEC_EVALUATOR:
        set_phase(e, TRILL_RUN_EVALUATING);
        ro->m->has_eval = true;
        st = trill_rl_stage_evaluate(e->r, (int)index, "now", &ro->m->eval_pass1, &ro->m->eval_passk);
        break;
    }
    e->busy_s += trill_now() - t0;
    return st;
}
