#!/usr/bin/python3
"""Writes the fuzz seed corpus (tests/fuzz/corpus/). Run once; the output is committed.
Uses struct + json only, so it runs on a bare python3."""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIZES = {"F32": 4, "BF16": 2, "F16": 2}


def st_file(tensors, metadata=None, pad=True):
    """tensors: [(name, dtype, shape)]; data packed in order, bytes 0, 1, 2, ..."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape in tensors:
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + bytes(i % 251 for i in range(off))


def raw(header_text, data_len, hlen=None):
    h = header_text.encode()
    return struct.pack("<Q", len(h) if hlen is None else hlen) + h + b"\x5a" * data_len


def t1(dtype, shape, offs):
    return json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": offs}})


SAFETENSORS = {
    "valid-f32": st_file([("a", "F32", [2, 3]), ("b", "F32", [4])]),
    "valid-bf16-meta": st_file([("layers.0.w", "BF16", [2, 2, 2]), ("norm", "BF16", [3])], {"format": "pt"}),
    "valid-f16-zero-scalar": st_file([("e", "F16", [0, 4]), ("s", "F16", []), ("v", "F16", [5])]),
    "valid-empty": st_file([]),
    "valid-unpadded": st_file([("x", "F32", [1])], pad=False),
    "bad-overlap": raw('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                       '"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', 12),
    "bad-gap": raw('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                   '"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}', 12),
    "bad-dtype": raw(t1("I64", [1], [0, 8]), 8),
    "bad-span": raw(t1("BF16", [3], [0, 4]), 4),
    "bad-offsets-past-end": raw(t1("F32", [4], [0, 16]), 8),
    "bad-shape-negative": raw(t1("F32", [2, -1], [0, 0]), 0),
    "bad-shape-overflow": raw(t1("F32", [4611686018427387904, 4], [0, 0]), 0),
    "bad-trailing": raw(t1("F32", [1], [0, 4]), 7),
    "bad-hlen-huge": raw("{}", 0, hlen=1 << 63),
    "bad-truncated-data": st_file([("a", "F32", [8])])[:-5],
    "bad-metadata": raw('{"__metadata__":"pt"}', 0),
    "bad-duplicate": raw('{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                         '"t":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),
}

MOE_TINY = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 256,
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "decoder_sparse_step": 1,
    "norm_topk_prob": True, "mlp_only_layers": [0], "bos_token_id": 1, "eos_token_id": [2, 3],
    "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False, "torch_dtype": "bfloat16",
}

CONFIGS = {
    "moe-tiny": MOE_TINY,
    "moe-defaults": {"model_type": "qwen3_moe"},
    "moe-sparse-step": dict(MOE_TINY, num_hidden_layers=8, decoder_sparse_step=2, mlp_only_layers=[0, 1]),
    "moe-rope-parameters": dict(MOE_TINY, rope_parameters={"rope_type": "default", "rope_theta": 5e5}),
    "dense": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 300, "hidden_size": 32,
              "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "eos_token_id": 7,
              "layer_types": ["full_attention", "full_attention"]},
    "bad-yarn": dict(MOE_TINY, rope_scaling={"rope_type": "yarn", "factor": 4.0}),
    "bad-sliding": dict(MOE_TINY, use_sliding_window=True),
    "bad-topk": dict(MOE_TINY, num_experts_per_tok=9),
    "bad-type": dict(MOE_TINY, hidden_size="64"),
    "bad-arch": dict(MOE_TINY, architectures=["LlamaForCausalLM"]),
}


def main():
    for sub in ("safetensors", "config"):
        d = os.path.join(HERE, "corpus", sub)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    for name, data in SAFETENSORS.items():
        with open(os.path.join(HERE, "corpus", "safetensors", name + ".safetensors"), "wb") as f:
            f.write(data)
    for name, cfg in CONFIGS.items():
        with open(os.path.join(HERE, "corpus", "config", name + ".json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")
    with open(os.path.join(HERE, "corpus", "config", "bad-json.json"), "w") as f:
        f.write('{"model_type": "qwen3_moe", "hidden_size": }\n')


if __name__ == "__main__":
    main()
