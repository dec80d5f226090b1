"""trill plan against published RL figures (docs/plan.md, "Against published figures").

Each row is a published run: the keys and flags that describe its setup to `trill plan`, the
figure it published and the plan's prediction of it. Nothing is fitted: the clusters are the
shipped datasheet profiles with their stated efficiencies, and every setup detail a source does
not give is an assumption named in the comments below and in docs/plan.md. No source publishes
how its response lengths spread: each row is planned with uniform and with exponential lengths,
and both are printed.

Dense models (Llama 3.1, Qwen3-32B) are written as Qwen3 dense configs of the published
dimensions (the Llama 3.1 ones carry Qwen3's per-head q/k norms: 256 parameters a layer).

Usage: python3 bench/plan_published.py [TRILL]   (default build/trill)
Prints figures; never pass/fail."""

import json
import os
import subprocess
import sys
import tempfile

TRILL = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/trill")
SPREADS = ("uniform", "exponential")


def dense(root, name, hidden, inter, layers, heads, kv, vocab):
    d = os.path.join(root, name)
    os.makedirs(d)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab, "hidden_size": hidden,
                   "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
                   "num_key_value_heads": kv, "head_dim": 128, "rope_theta": 500000.0, "rms_norm_eps": 1e-5,
                   "tie_word_embeddings": False, "max_position_embeddings": 131072, "bos_token_id": 0, "eos_token_id": 1}, f)
    return d


def plan(spread, args):
    out = subprocess.run([TRILL, "plan", "--json", "--spread", spread] + args, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def get(p, path):
    for key in path.split("."):
        p = p[key]
    return p


def best_async(spread, args, devices, gen, unit):
    """The fastest async step over trainer shares of 1/4, 1/2 and 3/4 of the devices (data-parallel
    groups of `unit` devices: the trainer's ep x tp, in args), the rest generators of `gen`
    devices each: the published runs pick their split by hand; this takes the plan's best of three."""
    best = None
    for share in (0.25, 0.5, 0.75):
        dp = int(devices * share / unit)
        reps = (devices - dp * unit) // gen
        if dp < 1 or reps < 1:
            continue
        t = plan(spread, args + [f"parallel.trainer.dp={dp}", f"parallel.generator.replicas={reps}"])["time"]["async_step_s"]
        best = t if best is None else min(best, t)
    return best


def show(label, published, values):
    u, e = values
    print(f"  {label:<42} {published:>9g} {u:>10.4g} / {e:<10.4g} {u / published:>6.2f} / {e / published:<6.2f}")


def row(label, published, field, args):
    show(label, published, [get(plan(s, args), field) for s in SPREADS])


def row_async(label, published, args, devices, gen, unit):
    show(label, published, [best_async(s, args, devices, gen, unit) for s in SPREADS])


def main():
    root = tempfile.mkdtemp()
    llama8 = dense(root, "llama3.1-8b", 4096, 14336, 32, 32, 8, 128256)
    llama70 = dense(root, "llama3.1-70b", 8192, 28672, 80, 64, 8, 128256)
    llama405 = dense(root, "llama3.1-405b", 16384, 53248, 126, 128, 8, 128256)
    qwen32 = dense(root, "qwen3-32b", 5120, 25600, 64, 64, 8, 151936)
    print(f"{'published run':<44} {'published':>9} {'plan: uniform / exponential':>23} {'plan / published':>16}")

    # NeMo-RL v0.4 (docs/about/performance-summary.md): GRPO on OpenMathInstruct-2, DGX-H100, bf16
    # training and generation, every weight trained. Its "G-Average Seq len" taken as prompt +
    # response with prompts of 128 tokens (assumed), the longest response its T-Max less 128;
    # G-GBS rollouts (16 a prompt), G-GBS / T-GBS minibatches; a KL term (assumed: NeMo-RL's GRPO
    # default). On policy: every GPU generates in generators of G-TP GPUs, then all train (the
    # colocated step). 1-step off: the async step of the best of three splits.
    def nemo(resp, max_new, prompts, minibatches, *more):
        return ["--full", "--prompt-len", "128", "--response-len", str(resp), "generator.dtype=bf16", "algo.kl_coef=0.01",
                "generator.n=16", f"generator.max_new_tokens={max_new}", f"generator.prompts_per_step={prompts}",
                f"algo.minibatches={minibatches}"] + list(more)

    print("NeMo-RL v0.4, on policy: the colocated step (s)")
    row("Llama 3.1 8B, 16 H100, G-TP 1", 97.7, "time.colocated_step_s",
        ["--model", llama8, "--cluster", "h100-sxm:2"] + nemo(932, 3968, 128, 4, "parallel.trainer.dp=8", "parallel.generator.replicas=8"))
    row("Qwen3-32B, 32 H100, G-TP 4", 393, "time.colocated_step_s",
        ["--model", qwen32, "--cluster", "h100-sxm:4", "--gen-tp", "4"] +
        nemo(3078, 3968, 128, 4, "parallel.trainer.dp=4", "parallel.trainer.tp=4", "parallel.generator.replicas=4"))
    row("Qwen3-30B-A3B, 32 H100, G-TP 4", 225, "time.colocated_step_s",
        ["--model", "qwen3-30b-a3b", "--cluster", "h100-sxm:4", "--gen-tp", "4"] +
        nemo(3026, 3968, 128, 4, "parallel.trainer.ep=8", "parallel.trainer.tp=2", "parallel.generator.replicas=4"))
    row("Qwen3-235B-A22B, 128 H100, G-TP 16", 506, "time.colocated_step_s",
        ["--model", "qwen3-235b-a22b", "--cluster", "h100-sxm:16", "--gen-tp", "16"] +
        nemo(5543, 8064, 32, 1, "parallel.trainer.dp=2", "parallel.trainer.ep=16", "parallel.trainer.tp=2", "parallel.generator.replicas=4"))
    row("DeepSeek-V3, 256 H100, G-TP 32", 154, "time.colocated_step_s",
        ["--model", "deepseek-v3", "--cluster", "h100-sxm:32", "--gen-tp", "32"] +
        nemo(617, 1408, 32, 1, "parallel.trainer.dp=8", "parallel.trainer.ep=16", "parallel.generator.replicas=4"))
    print("NeMo-RL v0.4, 1-step off policy: the async step (s), the best of three splits")
    row_async("Llama 3.1 8B, 16 H100, G-TP 1", 74.6, ["--model", llama8, "--cluster", "h100-sxm:2"] + nemo(1001, 3968, 128, 4), 16, 1, 1)
    row_async("Qwen3-32B, 64 H100, G-TP 4", 215, ["--model", qwen32, "--cluster", "h100-sxm:8", "--gen-tp", "4"] +
              nemo(3079, 3968, 128, 4, "parallel.trainer.tp=4"), 64, 4, 4)
    row_async("Qwen3-30B-A3B, 32 H100, G-TP 2", 244, ["--model", "qwen3-30b-a3b", "--cluster", "h100-sxm:4", "--gen-tp", "2"] +
              nemo(3030, 3968, 128, 4, "parallel.trainer.ep=8"), 32, 2, 8)
    row_async("Qwen3-235B-A22B, 256 H100, G-TP 8", 241, ["--model", "qwen3-235b-a22b", "--cluster", "h100-sxm:32", "--gen-tp", "8"] +
              nemo(5563, 8064, 32, 1, "parallel.trainer.ep=16", "parallel.trainer.tp=4"), 256, 8, 64)
    row_async("DeepSeek-V3, 512 H100, G-TP 32", 77.9, ["--model", "deepseek-v3", "--cluster", "h100-sxm:64", "--gen-tp", "32"] +
              nemo(616, 1408, 32, 1, "parallel.trainer.ep=16"), 512, 32, 16)

    # verl, docs/perf/dpsk.md (08/2025) and examples/grpo_trainer/run_deepseek671b_math_megatron_96gb.sh:
    # DeepSeek-V3 on 96 H20; 96 prompts x 8; prompts at most 2048 tokens (256 on average: assumed);
    # responses at most 9632, 1960 on average (published); vLLM TP 32 in bf16, colocated (3
    # generators); Megatron TP 8 EP 8 PP 12 (here tp 8 x ep 4 x dp 3 over the 96: trill has no
    # pipeline parallelism); 3 minibatches; a KL loss (the reference's pass); full recomputation.
    verl = ["--model", "deepseek-v3", "--cluster", "h20:12", "--gen-tp", "32", "--full", "--prompt-len", "256", "--response-len", "1960",
            "generator.dtype=bf16", "generator.prompts_per_step=96", "generator.n=8", "generator.max_new_tokens=9632", "algo.minibatches=3",
            "algo.kl_coef=0.001", "trainer.recompute=true", "parallel.trainer.dp=2", "parallel.trainer.ep=4", "parallel.trainer.tp=8",
            "parallel.generator.replicas=1"]
    print("verl, DeepSeek-V3 on 96 H20, colocated (s)")
    row("rollout", 1050, "time.colocated_gen_s", verl)
    row("step", 1700, "time.colocated_step_s", verl)

    # LlamaRL (arXiv 2505.24034): a DeepSpeed-Chat-like colocated baseline against its async
    # layout, every weight trained. Its GPU counts, batch and lengths are in no text this project
    # could read; assumed: H100s; 8B on 128, 70B on 256, 405B on 1024; NeMo-RL's Llama 8B workload
    # (2048 rollouts, 128-token prompts, responses of 932 on average, at most 3968, 4 minibatches);
    # bf16 generators of 1, 8 and 16 GPUs for the baseline, async generators of 1, 8 and 8 GPUs,
    # int8 for 405B (its fp8 generator).
    def llamarl(dtype):
        return ["--full", "--prompt-len", "128", "--response-len", "932", "algo.kl_coef=0.01", "generator.n=16",
                "generator.prompts_per_step=128", "generator.max_new_tokens=3968", "algo.minibatches=4", f"generator.dtype={dtype}"]

    print("LlamaRL: sync, the colocated step (s); async, the best of three splits (s)")
    row("8B sync, 128 H100 (assumed)", 22.45, "time.colocated_step_s",
        ["--model", llama8, "--cluster", "h100-sxm:16"] + llamarl("bf16") + ["parallel.trainer.dp=64", "parallel.generator.replicas=64"])
    row_async("8B async", 8.90, ["--model", llama8, "--cluster", "h100-sxm:16"] + llamarl("bf16"), 128, 1, 1)
    row("70B sync, 256 H100 (assumed)", 82.32, "time.colocated_step_s",
        ["--model", llama70, "--cluster", "h100-sxm:32", "--gen-tp", "8"] + llamarl("bf16") +
        ["parallel.trainer.dp=16", "parallel.trainer.tp=8", "parallel.generator.replicas=16"])
    row_async("70B async", 20.67, ["--model", llama70, "--cluster", "h100-sxm:32", "--gen-tp", "8"] + llamarl("bf16") +
              ["parallel.trainer.tp=8"], 256, 8, 8)
    row("405B sync, 1024 H100 (assumed)", 635.8, "time.colocated_step_s",
        ["--model", llama405, "--cluster", "h100-sxm:128", "--gen-tp", "16"] + llamarl("bf16") +
        ["parallel.trainer.dp=64", "parallel.trainer.tp=8", "parallel.generator.replicas=32"])
    row_async("405B async (int8 generators)", 59.5, ["--model", llama405, "--cluster", "h100-sxm:128", "--gen-tp", "8"] + llamarl("int8") +
              ["parallel.trainer.tp=8"], 1024, 8, 8)
    row("405B weight transfer, point to point (< 2)", 2, "sync.merge_p2p_s",
        ["--model", llama405, "--cluster", "h100-sxm:128", "--gen-tp", "8"] + llamarl("int8") +
        ["parallel.trainer.dp=64", "parallel.trainer.tp=8", "parallel.generator.replicas=64"])

    # Kimi K2's weight updates: checkpoint-engine (MoonshotAI) about 20 s for the 1T model;
    # Perplexity 1.3 s from 256 training GPUs (bf16) to 128 inference GPUs (FP8) by RDMA writes.
    # Here: int8 merge, trainer ep 64 x dp 4 = 256, generators 4 x ep 32 = 128, 48 H800 nodes.
    k2 = ["--model", "kimi-k2", "--cluster", "h800:48", "generator.dtype=int8", "sync.mode=merge", "parallel.trainer.dp=4",
          "parallel.trainer.ep=64", "parallel.generator.replicas=4", "parallel.generator.ep=32"]
    print("Kimi K2 weight sync (s)")
    row("broadcast (checkpoint-engine: about 20)", 20, "sync.merge_s", k2)
    row("point to point (Perplexity: 1.3)", 1.3, "sync.merge_p2p_s", k2)


if __name__ == "__main__":
    main()
