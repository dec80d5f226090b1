#!/usr/bin/python3
"""Writes the fuzz seed corpus (tests/fuzz/corpus/). Run once; the output is committed.
Uses struct + json only, so it runs on a bare python3.

`make_corpus.py --c-literal` prints the byte-level tokenizer.json that fuzz_tokenizer_encode.c
embeds (the same as corpus/tokenizer_json/bytelevel-qwen3.json) as a C string literal."""
import json
import os
import shutil
import struct
import sys

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


# ---- tokenizers --------------------------------------------------------------------------

# Qwen3's pre-tokenizer regex (its tokenizer.json, pre_tokenizer.pretokenizers[0]).
QWEN3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    """GPT-2's byte -> symbol map: printable bytes stand for themselves, the rest take 256, 257, ..."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, shifted = {}, 0
    for b in range(256):
        if b in printable:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + shifted)
            shifted += 1
    return out


B2U = bytes_to_unicode()


def sym(raw):
    """Byte-level symbol string of raw bytes (or of a str's UTF-8)."""
    if isinstance(raw, str):
        raw = raw.encode()
    return "".join(B2U[b] for b in raw)


# Merges as (left, right) raw text/bytes: English, spaces, newlines, digits, CJK, an emoji.
_ZH_NI, _ZH_HAO, _PARTY = "你".encode(), "好".encode(), "🎉".encode()
BPE_MERGES = [
    (" ", "t"), ("h", "e"), ("t", "h"), ("th", "e"), (" t", "he"), (" ", "a"), ("i", "n"), (" ", "s"),
    ("e", "r"), ("o", "n"), ("r", "e"), ("a", "n"), (" ", "w"), ("o", "u"), ("e", "n"), (" ", "o"),
    ("i", "s"), ("in", "g"), (" a", "n"), (" an", "d"), (" ", "i"), (" i", "s"), ("e", "s"), ("a", "t"),
    (" ", "c"), ("o", "r"), ("l", "l"), ("H", "e"), ("He", "ll"), (" ", " "), ("  ", "  "), ("\n", "\n"), (".", "\n"),
    ("!", "!"), ("1", "2"), ("0", "0"), ("2", "0"), (" ", "1"),
    (_ZH_NI[:1], _ZH_NI[1:2]), (_ZH_NI[:2], _ZH_NI[2:]), (_ZH_HAO[:1], _ZH_HAO[1:2]), (_ZH_HAO[:2], _ZH_HAO[2:]),
    (_ZH_NI, _ZH_HAO), (_PARTY[:1], _PARTY[1:2]), (_PARTY[:2], _PARTY[2:3]),
]


def added(tid, content, special=True, normalized=None, lstrip=False, rstrip=False):
    return {"id": tid, "content": content, "single_word": False, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def bpe_tokenizer(merges, pre_tokenizer, normalizer=None, post_processor=None, merges_as_pairs=False,
                  extra_added=(), ignore_merges=False):
    """Byte-level BPE: ids 0-255 are the byte symbols in byte order, then one per merge;
    added tokens "<|endoftext|>" (special) and "<tool_call>" (not special) follow."""
    vocab = {B2U[b]: b for b in range(256)}
    pairs = []
    for a, b in merges:
        sa, sb = sym(a), sym(b)
        assert sa in vocab and sb in vocab, (a, b)
        vocab.setdefault(sa + sb, len(vocab))
        pairs.append([sa, sb] if merges_as_pairs else sa + " " + sb)
    n = len(vocab)
    toks = [added(n, "<|endoftext|>"), added(n + 1, "<tool_call>", special=False)]
    toks += [added(n + 2 + i, c, **kw) for i, (c, kw) in enumerate(extra_added)]
    model = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
             "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "vocab": vocab, "merges": pairs}
    if ignore_merges:
        model["ignore_merges"] = True
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": toks,
            "normalizer": normalizer, "pre_tokenizer": pre_tokenizer, "post_processor": post_processor,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": model}


def split(regex=None, string=None, behavior="Isolated", invert=False):
    pat = {"Regex": regex} if regex is not None else {"String": string}
    return {"type": "Split", "pattern": pat, "behavior": behavior, "invert": invert}


def byte_level(add_prefix_space=False, use_regex=False):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": False, "use_regex": use_regex}


# The tokenizer fuzz_tokenizer_encode.c embeds.
BPE_QWEN3 = bpe_tokenizer(BPE_MERGES, {"type": "Sequence", "pretokenizers": [split(QWEN3_REGEX), byte_level()]},
                          normalizer={"type": "NFC"})


def wordlevel(tokens, pre_tokenizer, normalizer=None, post_processor=None, added_tokens=None, decoder=None):
    """WordLevel over "<unk>" (0) and `tokens`."""
    vocab = {"<unk>": 0}
    for t in tokens:
        vocab.setdefault(t, len(vocab))
    toks = [added(0, "<unk>")] + (added_tokens or [])
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": toks, "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": post_processor, "decoder": decoder,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}


CHARS = ["\n"] + [chr(c) for c in range(32, 127)]
WORDS = ["hello", "world", "the", "a", "is", "1", "2", "12", "123", ",", ".", "!", " ", "hello ", " world",
         "world.", "hello,", "é", "ﬁ", "fi", "日本", "語"]


def template(prefix, suffix):
    single = [{"SpecialToken": {"id": p, "type_id": 0}} for p in prefix] + [{"Sequence": {"id": "A", "type_id": 0}}]
    single += [{"SpecialToken": {"id": s, "type_id": 0}} for s in suffix]
    return single


def with_template(tok, bos, eos):
    """tok with a TemplateProcessing post-processor: bos $A eos (both added tokens of tok)."""
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    tok = dict(tok)
    tok["post_processor"] = {
        "type": "TemplateProcessing", "single": template([bos], [eos]),
        "pair": template([bos], [eos]) + [{"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in (bos, eos)}}
    return tok


def charlevel_trill():
    """The tokenizer.json `trill init` writes (trill_tokenizer_charlevel_json)."""
    vocab = {"<|endoftext|>": 0, "<unk>": 1, "\n": 2}
    for c in range(32, 127):
        vocab[chr(c)] = 3 + c - 32
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [added(0, "<|endoftext|>", normalized=False), added(1, "<unk>", normalized=False)],
            "normalizer": None, "pre_tokenizer": split(r"[\s\S]"), "post_processor": None,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}, "decoder": {"type": "Fuse"}}


SP = "\u2581"


def sentencepiece(pre_tokenizer=None, normalizer=None, decoder=None, ignore_merges=False):
    """SentencePiece-style BPE over characters (Llama-2's shape): byte fallback, fused unknowns."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = 3 + b
    for w in [SP, "a", "b", "c", "d", "e", " ", SP + "a", "ab", SP + "ab", "abc", "de", SP + "de"]:
        vocab.setdefault(w, len(vocab))
    return {"version": "1.0", "added_tokens": [added(1, "<s>"), added(2, "</s>")], "normalizer": normalizer,
            "pre_tokenizer": pre_tokenizer, "post_processor": None, "decoder": decoder,
            "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True, "ignore_merges": ignore_merges,
                      "vocab": vocab, "merges": [SP + " a", "a b", SP + "a b", "d e", SP + " de"]}}


TOKENIZERS = {
    "sentencepiece-llama2": sentencepiece(
        normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SP},
                                                        {"type": "Replace", "pattern": {"String": " "}, "content": SP}]},
        decoder={"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
                                                  {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}),
    "sentencepiece-metaspace": sentencepiece(
        pre_tokenizer={"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": True},
        normalizer={"type": "Replace", "pattern": {"Regex": "\\s{2,}"}, "content": " "},
        decoder={"type": "Metaspace", "replacement": SP, "prepend_scheme": "first", "split": True}, ignore_merges=True),
    "charlevel-trill": charlevel_trill(),
    "bytelevel-qwen3": BPE_QWEN3,
    "bytelevel-gpt2-template": with_template(bpe_tokenizer(
        BPE_MERGES[:12], byte_level(add_prefix_space=True, use_regex=True), normalizer={"type": "NFKC"},
        merges_as_pairs=True, extra_added=[("<s>", {}), ("</s>", {"lstrip": True, "rstrip": True})]), "<s>", "</s>"),
    "bytelevel-digits-ignore-merges": bpe_tokenizer(
        BPE_MERGES[:8], {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False},
                                                              split(r"\p{N}{1,3}"), byte_level(use_regex=True)]},
        normalizer={"type": "Sequence", "normalizers": []}, ignore_merges=True,
        post_processor={"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}),
    "wordlevel-nfkc-sequence": wordlevel(CHARS, split(r"[\s\S]"), decoder={"type": "Fuse"},
                                         normalizer={"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]}),
    "wordlevel-nfd-nfkd": wordlevel(CHARS, split(r"\X"), normalizer={"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "NFD"}]}),
    "split-removed": wordlevel(WORDS, split(string=" ", behavior="Removed")),
    "split-merged-previous": wordlevel(WORDS, split(r"[.,!?]", behavior="MergedWithPrevious")),
    "split-merged-next": wordlevel(WORDS, split(r"\s+", behavior="MergedWithNext")),
    "split-contiguous": wordlevel(WORDS, split(r"\d", behavior="Contiguous")),
    "split-invert": wordlevel(WORDS, split(r"\p{L}+", behavior="Removed", invert=True)),
    "split-sequence-digits": wordlevel(WORDS, {"type": "Sequence", "pretokenizers": [
        split(string=" ", behavior="MergedWithNext"), {"type": "Digits", "individual_digits": True}]},
        normalizer={"type": "NFC"}),
    "pretok-whitespace-split": wordlevel(WORDS, {"type": "WhitespaceSplit"}),
    "pretok-whitespace-digits": wordlevel(WORDS, {"type": "Sequence", "pretokenizers": [
        {"type": "Whitespace"}, {"type": "Digits", "individual_digits": False}]}),
    "pretok-punctuation": wordlevel(WORDS, {"type": "Punctuation"}),
    "pretok-punctuation-merged-next": wordlevel(WORDS, {"type": "Punctuation", "behavior": "MergedWithNext"}),
    "pretok-bert-bytelevel": bpe_tokenizer(BPE_MERGES[:8], {"type": "Sequence", "pretokenizers": [
        {"type": "BertPreTokenizer"}, byte_level()]}),
    "template-lstrip-rstrip": wordlevel(
        WORDS, split(string=" ", behavior="Removed"), decoder={"type": "Fuse"},
        added_tokens=[added(100, "[CLS]"), added(101, "[SEP]", lstrip=True, rstrip=True),
                      added(102, "<mask>", special=False, normalized=True, lstrip=True)],
        post_processor={"type": "Sequence", "processors": [
            {"type": "ByteLevel", "trim_offsets": False},
            {"type": "TemplateProcessing", "single": template(["[CLS]"], ["[SEP]"]), "pair": template(["[CLS]"], ["[SEP]"]),
             "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [100], "tokens": ["[CLS]"]},
                                "[SEP]": {"id": "[SEP]", "ids": [101], "tokens": ["[SEP]"]}}}]}),
    # loads; the template id 150 lies in the gap below "[CLS]" (100): encode gives it, decode refuses it
    "template-gap-id": wordlevel(WORDS, split(r"\s+", behavior="Removed"), added_tokens=[added(200, "[CLS]")],
                                 post_processor={"type": "TemplateProcessing", "single": template(["<g>"], []),
                                                 "special_tokens": {"<g>": {"id": "<g>", "ids": [150], "tokens": ["<g>"]}}}),
    "bad-model-unigram": dict(wordlevel(WORDS, None), model={"type": "Unigram", "vocab": [["a", 0.0]]}),
    "bad-regex": wordlevel(WORDS, split(r"(unclosed[")),
    "bad-behavior": wordlevel(WORDS, split(" ", behavior="Sideways")),
    "bad-punctuation-behavior": wordlevel(WORDS, {"type": "Punctuation", "behavior": "Sideways"}),
    "bad-normalizer": wordlevel(WORDS, None, normalizer={"type": "Lowercase"}),
    "bad-single-word": wordlevel(WORDS, None, added_tokens=[dict(added(50, "x"), single_word=True)]),
    "bad-bpe-merge-missing": dict(BPE_QWEN3, model=dict(BPE_QWEN3["model"], vocab={"a": 0, "q": 1}, merges=["a q"])),
    "bad-bpe-no-bytelevel": dict(BPE_QWEN3, pre_tokenizer=split(string=" "), model=dict(BPE_QWEN3["model"], vocab={"a": 0}, merges=[])),
    "bad-bpe-missing-byte": dict(BPE_QWEN3, model=dict(BPE_QWEN3["model"], vocab={"a": 0, "q": 1, "aq": 2}, merges=[["a", "q"]])),
    "bad-id-range": wordlevel(WORDS, None, added_tokens=[added(1 << 24, "<big>")]),
    "bad-template-id": wordlevel(WORDS, None, post_processor={
        "type": "TemplateProcessing", "single": template(["<x>"], []),
        "special_tokens": {"<x>": {"id": "<x>", "ids": [99999], "tokens": ["<x>"]}}}),
}

# Texts for fuzz_tokenizer_encode (raw bytes).
TEXTS = {
    "ascii": b"Hello world! The answer is 12 and 2000.\nThis is the end.\n\n  Indented    spaces\tand tabs.\r\n",
    "contractions": b"It's what they've said; I'd think we'll, YOU'RE sure? DON'T!!\n",
    "code": b"def f(x):\n    return x * 2  # doubled\n\nif __name__ == '__main__':\n\tprint(f(21))\n",
    "cjk": "你好世界。你好！日本語のテキスト、カタカナ。한국어 문장입니다.\n".encode(),
    "emoji": "Party 🎉🎉 time 👍🏽 👨‍👩‍👧 ❤️ flags 🇫🇷\n".encode(),
    "nfd-combining": "cafe\u0301 A\u030a \u212b \u1100\u1161 e\u0301\u0323 \ufb01 \u2126".encode(),
    "mixed-scripts": "Привет, мир! مرحبا بالعالم. नमस्ते दुनिया. Γειά σου κόσμε 123٤٥٦\n".encode(),
    "special-tokens": b"<|endoftext|>Hello<tool_call>{\"name\": \"f\"}</tool_call> <|endoftext|><|endoftext|> <tool_call\n<|endoftext",
    "special-nfc-edge": "<tool_call>\u0338 <|endoftext|>\u0301 x<|endoftext|>".encode(),
    "invalid-utf8": b"ok \xff\xfe bad \xc3\x28 trunc \xe4\xbd \xf0\x9f\x8e cont \x80\x80 over \xc0\xaf surrogate \xed\xa0\x80 end",
    "nul-controls": b"a\x00b\x01\x02\x7f\x1b[0m\x00\x00 \x0b\x0c\x85",
    "whitespace": b"   \n\n\n   \t\t \r\n \r\r\n  x  \n",
    "long-word": b"a" * 300 + b" " + b"the" * 100,
}


# The service's base in fuzz_service_request.c: vocab 128, 3 MoE layers x top-2 of 8 experts
# (routed_experts: 6 logical ids a token).
def datum(tokens, nxt, **inputs):
    return {"model_input": tokens, "loss_fn_inputs": dict(target_tokens=tokens[1:] + [nxt], **inputs)}


RL_INPUTS = {"logprobs": [-1.5, -0.25, -3.0], "advantages": [1.0, -0.5, 0.0]}
SERVICE_REQUESTS = {
    "fb-cross-entropy": {"data": [datum([5, 6, 7], 8, weights=[1, 1, 0.5])], "loss_fn": "cross_entropy"},
    "fb-importance-sampling": {"data": [datum([5, 6, 7], 8, **RL_INPUTS)], "loss_fn": "importance_sampling"},
    "fb-ppo": {"data": [datum([5, 6, 7], 8, **RL_INPUTS)], "loss_fn": "ppo",
               "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}},
    "fb-cispo": {"data": [datum([5, 6, 7], 8, **RL_INPUTS), datum([9], 0, logprobs=[-2], advantages=[2])],
                 "loss_fn": "cispo", "loss_fn_config": {"clip_low_threshold": 0.5, "clip_high_threshold": 2}},
    "fb-dro": {"data": [datum([5, 6, 7], 8, **RL_INPUTS)], "loss_fn": "dro", "loss_fn_config": {"beta": 0.1}},
    "fb-dro-no-beta": {"data": [datum([5, 6, 7], 8, **RL_INPUTS)], "loss_fn": "dro"},
    "fb-routed-experts": {"data": [datum([3, 4], 0, routed_experts=[0, 1, 2, 3, 4, 5, 7, 6, 5, 4, 3, 2])],
                          "loss_fn": "cross_entropy"},
    "fb-routed-experts-repeated": {"data": [datum([3], 0, routed_experts=[1, 1, 2, 3, 4, 5])], "loss_fn": "cross_entropy"},
    "fb-target-not-next": {"data": [{"model_input": [5, 6], "loss_fn_inputs": {"target_tokens": [7, 8]}}],
                           "loss_fn": "cross_entropy"},
    "fb-token-outside-vocab": {"data": [datum([5, 128], 1)], "loss_fn": "cross_entropy"},
    "optim-step": {"adam_params": {"learning_rate": 1e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-12,
                                   "weight_decay": 0.01, "grad_clip_norm": 1.0}},
    "optim-step-defaults": {"adam_params": {}},
    "save-state": {"name": "step-10"},
    "save-state-bad-name": {"name": "../../etc"},
    "load-state": {"path": "trill://t-0123456789abcdef/step-10", "with_optimizer": True},
    "load-state-file-path": {"path": "/tmp/state", "with_optimizer": False},
    "sample-stop-strings": {"prompt": [40, 41, 42], "num_samples": 2,
                            "sampling_params": {"max_tokens": 8, "seed": 3, "stop": ["\n", "end"], "temperature": 0.7,
                                                "top_k": 5, "top_p": 0.9}},
    "sample-stop-string": {"prompt": [40], "sampling_params": {"max_tokens": 4, "seed": 0, "stop": ".", "top_k": -1}},
    "sample-stop-ids": {"prompt": [40, 41], "num_samples": 1, "sampling_params": {"max_tokens": 16, "seed": 9, "stop": [0, 2]}},
    "sample-stop-mixed": {"prompt": [40], "sampling_params": {"stop": [0, "end"]}},
    "sample-stop-empty-string": {"prompt": [1], "sampling_params": {"stop": ""}},
    "compute-logprobs": {"prompt": [1, 2, 3, 4]},
    "bad-types": {"data": "datums", "loss_fn": 7, "loss_fn_config": [], "adam_params": [1], "name": 3, "path": None,
                  "with_optimizer": "yes", "prompt": {"0": 1}, "sampling_params": "greedy"},
    "huge-numbers": {"loss_fn": "cross_entropy", "data": [datum([9223372036854775807], -9223372036854775808, weights=[1e308])],
                     "adam_params": {"learning_rate": 1e308, "eps": 5e-324}, "prompt": [1], "num_samples": 1e300,
                     "sampling_params": {"seed": 9007199254740993, "top_k": 1e18, "max_tokens": 4096.5}},
}
SERVICE_RAW = {  # bodies json.dump cannot write
    "huge-integer": b'{"prompt": [1, 99999999999999999999999], "adam_params": {"eps": 1e999}}\n',
    "deep-nesting-accepted": b'{"data": ' + b"[" * 200 + b"]" * 200 + b', "loss_fn": "cross_entropy"}\n',
    "deep-nesting-refused": b'{"data": ' + b"[" * 2100 + b"]" * 2100 + b"}\n",
    "duplicate-keys": b'{"loss_fn": "ppo", "loss_fn": "cross_entropy", "data": []}\n',
    "not-an-object": b'[{"prompt": [1]}]\n',
    "truncated": b'{"prompt": [1, 2, \n',
    "nul-in-string": b'{"name": "a\\u0000b", "loss_fn": "cross_entropy\\u0000"}\n',
}


def c_literal(obj):
    """obj as compact ASCII JSON, cut into C string literal lines."""
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=True)
    lines, line = [], ""
    for ch in text:
        esc = "\\\\" if ch == "\\" else '\\"' if ch == '"' else ch
        if len(line) + len(esc) > 110:
            lines.append(line)
            line = ""
        line += esc
    lines.append(line)
    return "\n".join('    "%s"' % l for l in lines)


# tiktoken split patterns as their Python tokenizers give them (fuzz_tiktoken_pattern.c)
TIKTOKEN_PATTERNS = {
    "kimi.py": 'class T:\n    pat_str = "|".join(\n        [\n            r"""[\\p{Han}]+""",\n'
               '            r"""[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+'
               '(?i:\'s|\'t|\'re|\'ve|\'m|\'ll|\'d)?""",  # letters\n            r"""\\p{N}{1,3}""",\n            r"""\\s+""",\n        ]\n    )\n',
    "llama3.py": 'pat_str = r"(?i:\'s|\'t|\'re|\'ve|\'m|\'ll|\'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"\n',
    "plain-pattern.txt": '[a-z&&[^aeiou]]+|[\\p{L}&&[\\p{Lu}]&&[^\\p{Han}]]|\\[x&&y\\]',
    "bad-unterminated.py": 'pat_str = r"""[a&&[b]"""\n',
    "bad-no-assignment.py": 'x = 1\n',
}


sys.path.insert(0, os.path.join(HERE, "..", "service"))
import tinker_wire  # noqa: E402  (the tests' own protobuf writer)

SERVICE_PROTOBUF = {  # the Tinker protocol's forward_backward bodies
    "tinker-fb-cross-entropy": tinker_wire.forward_backward_request("t-0123456789abcdef", [([5, 6, 7], {"target_tokens": [6, 7, 8],
                                                                                                       "weights": [1, 1, 0.5]})], "cross_entropy"),
    "tinker-fb-ppo": tinker_wire.forward_backward_request("t-0123456789abcdef", [([5, 6, 7], {"target_tokens": [6, 7, 8], **RL_INPUTS})],
                                                          "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, seq_id=3),
    "tinker-forward-only": tinker_wire.forward_backward_request("t-1", [([1], {"target_tokens": [2]})] * 3, "cross_entropy", forward_only=True),
    "tinker-image-chunk": tinker_wire.forward_backward_request("t-1", [([1], {"target_tokens": [2]})], "cross_entropy",
                                                               chunk=b"\x12\x04\x0a\x02\xff\xd8"),
    "tinker-no-model": tinker_wire.forward_backward_request("", [([1], {"target_tokens": [2]})], "cross_entropy"),
    "tinker-top-k": tinker_wire.forward_backward_request("t-1", [([5, 6], {"target_tokens": [[6, 1, 2], [7, 3, 4]],
                                                                             "weights": [[1, 0.5, 0.25], [1, 0.5, 0.25]]})], "cross_entropy"),
}


def main():
    if sys.argv[1:] == ["--c-literal"]:
        print(c_literal(BPE_QWEN3))
        return
    for sub in ("safetensors", "config", "tokenizer_json", "tokenizer_encode", "service_request", "tiktoken_pattern"):
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
    for name, tok in TOKENIZERS.items():
        with open(os.path.join(HERE, "corpus", "tokenizer_json", name + ".json"), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
    for name, text in TIKTOKEN_PATTERNS.items():
        with open(os.path.join(HERE, "corpus", "tiktoken_pattern", name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(HERE, "corpus", "tokenizer_json", "bad-json-truncated.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(BPE_QWEN3, ensure_ascii=False)[:300])
    for name, data in TEXTS.items():
        with open(os.path.join(HERE, "corpus", "tokenizer_encode", name + ".txt"), "wb") as f:
            f.write(data)
    for name, body in SERVICE_REQUESTS.items():
        with open(os.path.join(HERE, "corpus", "service_request", name + ".json"), "w") as f:
            json.dump(body, f)
            f.write("\n")
    for name, data in SERVICE_RAW.items():
        with open(os.path.join(HERE, "corpus", "service_request", name + ".json"), "wb") as f:
            f.write(data)
    for name, data in SERVICE_PROTOBUF.items():
        with open(os.path.join(HERE, "corpus", "service_request", name + ".pb"), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
