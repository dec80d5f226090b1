#!/usr/bin/python3
"""Independent PyTorch reference for Hugging Face Mixtral (MixtralForCausalLM, model_type
"mixtral").

Written from the equations of HF `models/mixtral/modeling_mixtral.py` and
`configuration_mixtral.py` (not from the C code it checks), using only torch + numpy +
stdlib (no `safetensors`/`transformers` packages: safetensors is read and written by hand).
Subcommands, options, files and records are qwen3_ref.py's, whose generic parts it imports
(safetensors IO, RMSNorm, RoPE, attention and top-k MoE model function, LoRA, forward /
grad / merge commands, the finite-difference check) with Mixtral's names, config and
tensors given here: compare.py and compare_grads.py work unchanged.

  make-model --out DIR --seed N --dtype f32|bf16 [--shards K] [--std S] [--set key=value ...]
      DIR/config.json (BASE_CONFIG + --set; a VALUE is JSON, else a string; `--set KEY=`
      with nothing after "=" leaves KEY out, e.g. head_dim, which HF then derives) and
      random weights under HF's tensor names, exactly the tensors the config implies: one
      model.safetensors, or K shards plus model.safetensors.index.json.

  forward --model DIR --input IN.jsonl --output OUT.jsonl [--replay] [--adapter ADIR [--no-lora]]
      Per line {"tokens": [...]}: {"tokens", "logprobs" (entry 0 null), "experts",
      "router_probs"}. experts[t][l]: layer l's k expert ids by router probability,
      descending, lower id first on exact ties (replayed ids as given); router_probs[t][l]:
      the router's own sorted top-(k+1) softmax probabilities, replay or not.

  grad --model DIR --input IN.jsonl --output GRADS.safetensors [--replay] [--loss-out LOSS.json]
       [--adapter ADIR [--no-lora]] [--base-grads FILE]
      Lines {"tokens", "coef": [null, c_1, ...]}; loss = sum over lines and t >= 1 of
      c_t * log p(token t | tokens < t), float64 autograd through the forward's function.
      d loss / d W for every parameter, HF names, F32 (tied: the embedding gets the summed
      gradient, no lm_head.weight; experts no token was routed to: zeros). With --adapter
      the base is frozen and GRADS holds the lora_A / lora_B gradients (PEFT names);
      --base-grads FILE also writes the base weights' gradients. LOSS.json: {"loss",
      "logprobs"}.

  adamw-steps --model DIR --input IN.jsonl --steps N --lr LR --weight-decay WD --betas B1,B2
              --eps EPS [--clip MAXNORM] --output PARAMS.safetensors [--replay] [--adapter ADIR]
      As qwen3_ref: N torch.optim.AdamW steps (float64) on the grad loss; the trainable
      tensors' final values under the names grad writes.

  make-adapter --model DIR --out ADIR --rank R --alpha A [--rslora] --targets T,... --seed N
               [--b-std S]
      A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors, F32): A as
      PEFT's init, U(-1/sqrt(in), 1/sqrt(in)); B ~ N(0, S) (default 0.05, non-zero so a
      test sees it). Targets among q_proj, k_proj, v_proj, o_proj, w1, w2, w3, lm_head
      (PEFT's rule: the module name equals a target or ends with "." + target; "gate"
      would select the router block_sparse_moe.gate, an nn.Linear too). Tensors
      base_model.model.<module>.lora_A.weight [r, in] / .lora_B.weight [out, r].

  merge --model DIR --adapter ADIR --out MDIR
      W += scale * B @ A (scale alpha/r, or alpha/sqrt(r) with use_rslora) for every
      adapted Linear, float64, written as a full F32 model; a tied model with an lm_head
      adapter is written untied (lm_head.weight = embedding + delta).

  selfcheck-grad [--seed N]
      Autograd vs central finite differences (h = 1e-6, rel err < 1e-6) on a tiny
      float64 Mixtral (2 layers, both MoE: hidden 16, 2 heads / 1 KV head of 8, 8
      experts top-2, vocab 11, 5 tokens): embedding, q/k/v/o_proj, both RMSNorms, both
      routers, experts' w1 / w2 / w3, final norm, lm_head; with and without replay, tied
      embeddings; LoRA (r 3 on q/k/v/o_proj, w1, w2, w3 and lm_head, base frozen) with
      alpha/r, and rslora on a tied model with replay (plus: B = 0 is the base exactly, the
      float64 merge is the adapter's function to 1e-12). Unrouted experts' gradients must
      be exactly zero. About two seconds.

Model (float64; bf16 weights widened exactly). x = embed_tokens[tokens]; per layer
  h = input_layernorm(x); x += o_proj(attn(h)); h = post_attention_layernorm(x);
  x += block_sparse_moe(h); then logits = lm_head(norm(x)) (lm_head = embed_tokens with
  tie_word_embeddings). RMSNorm w * x / sqrt(mean(x^2) + rms_norm_eps).
Attention (MixtralAttention): q/k/v_proj without bias and without QK-norm; head_dim =
  config head_dim, or hidden_size // num_attention_heads when absent or null; RoPE as
  Llama/Mistral (rotate_half; inv_freq = 1 / rope_theta^(2i / head_dim), positions
  0..T-1, emb = [freqs, freqs]) on q and k; causal softmax(q k^T * head_dim^-0.5), query
  head h reading KV head h // (num_attention_heads / num_key_value_heads); o_proj.
MoE (MixtralSparseMoeBlock), in every layer: router_logits = gate(h) (Linear H -> E, no
  bias, E = num_local_experts); p = softmax(router_logits); the top k =
  num_experts_per_tok of p; their weights p_i / sum of the k (always renormalised, so
  top-1 weighs 1); out = sum w_i * expert_i(h), expert(h) = w2(silu(w1(h)) * w3(h)).
  router_jitter_noise (HF: training only) must be 0, sliding_window null or a window (every
  layer: a query at t sees keys t - window + 1 .. t, HF's sliding mask), rope_scaling
  null (rope_parameters, if any, the default RoPE with rope_theta), hidden_act silu:
  anything else is refused rather than computed otherwise.
Router replay (--replay): a line's "experts": [[[k ids] per layer] per token] replaces the
  top-k ids; the weights are the router's own p at those ids, renormalised, so the router
  keeps its gradient. Lines without "experts" route themselves.
"""

import copy
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen3_ref as q3  # noqa: E402  (the generic parts: IO, model function, commands)

BASE_CONFIG = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
    "vocab_size": 97, "hidden_size": 64, "intermediate_size": 32, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "num_local_experts": 8, "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "tie_word_embeddings": False,
    "hidden_act": "silu", "max_position_embeddings": 4096, "sliding_window": None,
    "router_jitter_noise": 0.0, "bos_token_id": 1, "eos_token_id": 2,
    # In HF's config.json too; they do not change the forward.
    "attention_dropout": 0.0, "output_router_logits": False, "router_aux_loss_coef": 0.02,
    "initializer_range": 0.02, "use_cache": True,
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "w1", "w2", "w3", "lm_head")
MOE = "block_sparse_moe"


def check_config(cfg):
    """Refuse what this reference does not implement, rather than compute something else."""
    def need(ok, msg):
        if not ok:
            raise SystemExit(f"config: {msg}")
    need(cfg.get("model_type") == "mixtral", f"unsupported model_type {cfg.get('model_type')!r}")
    need(cfg.get("hidden_act", "silu") == "silu", "only hidden_act silu is implemented")
    need(cfg.get("sliding_window") is None or (isinstance(cfg["sliding_window"], int) and cfg["sliding_window"] >= 1),
         "sliding_window must be null or a positive integer")
    need(not cfg.get("router_jitter_noise"), "router_jitter_noise must be 0 (not implemented)")
    need(not cfg.get("rope_scaling") or q3.rope_scaling_of(cfg), "rope_scaling other than YaRN is not implemented")
    rp = cfg.get("rope_parameters") or {}  # transformers v5's form of the same
    need(rp.get("rope_type", "default") == "default" and "rope_theta" in cfg
         and rp.get("rope_theta", cfg["rope_theta"]) == cfg["rope_theta"],
         "need rope_theta, and rope_parameters (if any) the default RoPE with that theta")
    need(cfg["num_attention_heads"] % cfg["num_key_value_heads"] == 0,
         "num_attention_heads must be a multiple of num_key_value_heads")
    need(q3.head_dim_of(cfg) % 2 == 0, "head_dim must be even (RoPE)")
    need(1 <= cfg["num_experts_per_tok"] <= cfg["num_local_experts"],
         "need 1 <= num_experts_per_tok <= num_local_experts")


def build_config(overrides, dtype):
    cfg = copy.deepcopy({**BASE_CONFIG, **overrides})
    for k in [k for k, v in overrides.items() if v == ""]:
        del cfg[k]  # `--set KEY=`: KEY absent from config.json
    cfg["torch_dtype"] = {"f32": "float32", "bf16": "bfloat16"}[dtype]
    check_config(cfg)
    return cfg


def tensor_shapes(cfg):
    """Every checkpoint tensor the config implies, (HF name, shape), in checkpoint order."""
    H, V, I, E = cfg["hidden_size"], cfg["vocab_size"], cfg["intermediate_size"], \
        cfg["num_local_experts"]
    q, kv = cfg["num_attention_heads"] * q3.head_dim_of(cfg), \
        cfg["num_key_value_heads"] * q3.head_dim_of(cfg)
    out = [("model.embed_tokens.weight", (V, H))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        out += [(f"{p}.input_layernorm.weight", (H,)),
                (f"{p}.self_attn.q_proj.weight", (q, H)), (f"{p}.self_attn.k_proj.weight", (kv, H)),
                (f"{p}.self_attn.v_proj.weight", (kv, H)), (f"{p}.self_attn.o_proj.weight", (H, q)),
                (f"{p}.post_attention_layernorm.weight", (H,)),
                (f"{p}.{MOE}.gate.weight", (E, H))]
        for e in range(E):
            x = f"{p}.{MOE}.experts.{e}"
            out += [(f"{x}.w1.weight", (I, H)), (f"{x}.w2.weight", (H, I)),
                    (f"{x}.w3.weight", (I, H))]
    out.append(("model.norm.weight", (H,)))
    if not cfg.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (V, H)))
    return out


def linear_modules(cfg):
    """Every nn.Linear of HF's MixtralForCausalLM, (module name, in, out), in order; lm_head
    is a module even when its weight is tied."""
    out = [(n[:-len(".weight")], s[1], s[0]) for n, s in tensor_shapes(cfg)
           if len(s) == 2 and n != "model.embed_tokens.weight" and n != "lm_head.weight"]
    return out + [("lm_head", cfg["hidden_size"], cfg["vocab_size"])]


def make_weights(cfg, seed, std=0.02):
    """Random fp32 weights in a fixed order (the same seed gives the same tensors in any
    dtype or sharding): norms 1 + N(0, 0.1) (so their multiply is exercised), the routers
    N(0, 0.5) (decisive routing, not near-uniform), every other tensor N(0, std)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for name, shape in tensor_shapes(cfg):
        if len(shape) == 1:
            sd, mean = 0.1, 1.0
        else:
            sd, mean = (0.5 if name.endswith(f"{MOE}.gate.weight") else std), 0.0
        out.append((name, torch.randn(shape, generator=g, dtype=torch.float32) * sd + mean))
    return out


def cmd_make_model(args):
    cfg = build_config(q3.parse_set(args.set), args.dtype)
    tensors = make_weights(cfg, args.seed, args.std)
    files = q3.write_model(args.out, cfg, tensors, args.dtype, args.shards)
    print(f"wrote {args.out}: {len(tensors)} tensors, mixtral, {args.dtype}, files={files}")


class MixtralModel(q3.Model):
    """qwen3_ref's model function with Mixtral's layer: no QK-norm, every layer the
    block_sparse_moe of num_local_experts (w1 gate, w3 up, w2 down), top-k always
    renormalised (qwen3_ref's norm_topk_prob true: HF's two blocks compute the same)."""
    MODEL_TYPES = ("mixtral",)
    QK_NORM = False
    MOE_BLOCK = MOE
    EXPERT_PROJ = ("w1", "w3", "w2")

    def __init__(self, model_dir=None, cfg=None, weights=None, adapter=None):
        super().__init__(model_dir, cfg, weights, adapter)
        check_config(self.cfg)
        self.moe_layers = list(range(self.L))
        self.layer_windows = [self.cfg.get("sliding_window")] * self.L  # every layer (HF MixtralAttention)
        self.n_experts = self.cfg["num_local_experts"]
        self.norm_topk = True
        # Exactly the checkpoint tensors the config implies (a tied model may carry an
        # unused lm_head.weight), with their shapes.
        want = dict(tensor_shapes(self.cfg))
        have = {n: tuple(t.shape) for n, t in self.W.items() if n not in self.lora_names}
        if self.tied:
            have.pop("lm_head.weight", None)
        for n in sorted(set(want) | set(have)):
            if want.get(n) != have.get(n):
                raise SystemExit(f"tensor {n}: shape {list(have[n]) if n in have else 'missing'}, "
                                 f"expected {list(want[n]) if n in want else 'none (unknown)'}")

    def linear_modules(self):
        return linear_modules(self.cfg)


# ---------------------------------------------------------------------------
# selfcheck-grad
# ---------------------------------------------------------------------------

SELFCHECK_SET = {"vocab_size": 11, "hidden_size": 16, "intermediate_size": 12,
                 "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
                 "head_dim": 8, "num_local_experts": 8, "num_experts_per_tok": 2}


def selfcheck_case(replay, tied, seed, lora=None):
    cfg = build_config(dict(SELFCHECK_SET, tie_word_embeddings=tied), "f32")
    # Large std: sizeable gradients everywhere, so central differences resolve them.
    base_w = dict(make_weights(cfg, seed, std=0.3))
    model = MixtralModel(cfg=cfg, weights=base_w)
    lora_fails = []
    if lora:
        model, lora_fails = q3.selfcheck_lora(model, base_w, LORA_TARGETS, seed, lora)
    assert model.moe_layers == [0, 1], model.moe_layers

    def kinds_of(grads, visited):
        def expert(layer, proj):  # the visited expert with the largest w2 gradient
            def w2(e):
                m = f"model.layers.{layer}.{MOE}.experts.{e}.w2"
                return grads[q3.lora_names(m)[1] if lora else m + ".weight"].norm()
            return f"model.layers.{layer}.{MOE}.experts.{max(visited[layer], key=w2)}.{proj}"
        mods = [("q_proj", "model.layers.0.self_attn.q_proj"),
                ("k_proj", "model.layers.1.self_attn.k_proj"),
                ("v_proj", "model.layers.0.self_attn.v_proj"),
                ("o_proj", "model.layers.1.self_attn.o_proj"),
                ("expert w1", expert(0, "w1")), ("expert w3", expert(1, "w3")),
                ("expert w2", expert(1, "w2"))]
        if lora:
            return [(f"{kind} lora_{ab}", n) for kind, m in mods + [("lm_head", "lm_head")]
                    for ab, n in zip("AB", q3.lora_names(m))]
        return ([(kind, m + ".weight") for kind, m in mods]
                + [("embed", "model.embed_tokens.weight"),
                   ("input_layernorm", "model.layers.1.input_layernorm.weight"),
                   ("post_attention_layernorm", "model.layers.0.post_attention_layernorm.weight"),
                   ("router", f"model.layers.0.{MOE}.gate.weight"),
                   ("router", f"model.layers.1.{MOE}.gate.weight"),
                   ("final norm", "model.norm.weight"),
                   ("lm_head", "model.embed_tokens.weight" if tied else "lm_head.weight")])
    worst, checked, fails, visited, noise = q3.selfcheck_grads(model, seed, replay, kinds_of,
                                                               n_entries=3)
    return worst, checked, lora_fails + fails, visited, noise


def cmd_selfcheck_grad(args):
    ok = True
    cases = [(False, False, None), (True, False, None), (True, True, None),
             (False, False, "lora"), (True, True, "rslora")]
    for c, (rp, tied, lora) in enumerate(cases):
        worst, checked, fails, visited, noise = selfcheck_case(rp, tied, args.seed + c, lora)
        print(f"selfcheck-grad replay={str(rp).lower():5s} tied={str(tied).lower():5s} "
              f"lora={lora or 'none':6s}: {checked} entries, worst rel err {worst:.2e} "
              f"(fd rounding ~{noise:.0e} abs), experts visited {visited}  "
              f"{'ok' if not fails else 'FAIL'}")
        for f_ in fails:
            print("  " + f_)
        ok &= not fails
    print("selfcheck-grad: PASS" if ok else "selfcheck-grad: FAIL")
    return 0 if ok else 1


def main(argv=None):
    args = q3.arg_parser(__doc__).parse_args(argv)
    commands = {
        "make-model": cmd_make_model,
        "forward": lambda a: q3.cmd_forward(a, MixtralModel),
        "grad": lambda a: q3.cmd_grad(a, MixtralModel),
        "adamw-steps": lambda a: q3.cmd_adamw_steps(a, MixtralModel),
        "make-adapter": lambda a: q3.cmd_make_adapter(a, linear_modules),
        "merge": lambda a: q3.cmd_merge(a, MixtralModel),
        "selfcheck-grad": cmd_selfcheck_grad,
    }
    return commands[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
