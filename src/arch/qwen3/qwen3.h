/* The Qwen3 family (Qwen3ForCausalLM, Qwen3MoeForCausalLM and their *ForSequenceClassification):
 * its tensor roles. Internal to the library. */
#ifndef TRILL_ARCH_QWEN3_H
#define TRILL_ARCH_QWEN3_H

/* A tensor's role (trill_param.role). */
enum qwen3_role {
    QWEN3_EMBED, QWEN3_INPUT_NORM, QWEN3_Q, QWEN3_K, QWEN3_V, QWEN3_O, QWEN3_Q_NORM, QWEN3_K_NORM, QWEN3_POST_NORM,
    QWEN3_ROUTER, QWEN3_EXPERT_GATE, QWEN3_EXPERT_UP, QWEN3_EXPERT_DOWN, QWEN3_GATE, QWEN3_UP, QWEN3_DOWN,
    QWEN3_FINAL_NORM, QWEN3_LM_HEAD, QWEN3_SCORE,
};

#endif
