"""Reads and writes trill's recorded rollout batches (rollouts.save / rollouts.replay).

The file is rl_batch_pack's bytes (src/rl/data/rollout.c), native byte order: a 40-byte header
(uint32 magic "TRLB", uint32 format, int32 n_seqs, group_size, n_moe_layers, top_k, int64
n_tokens, text_bytes), then the arrays back to back, then the completions NUL-terminated.
Format 1 is single-turn. Format 2 (trajectories) has an int64 segment count after the header and,
after the arrays, seg_offsets (int32 [n_seqs + 1]) and the segments (int32 len, kind: 0 injected,
1 sampled); format 3 (episodes) then adds each sequence's episode (float64 env_return, env_s;
int32 turns, stop, cut_turns, tool_calls, parse_errors, reserved) and, after the completions, each
episode's environment metrics (JSON text). Written here from that description, so a test that
reads a file trill wrote checks the format.
"""
import json
import struct

import numpy as np

MAGIC, FORMAT = 0x424C5254, 1
EPISODE = np.dtype([("env_return", "f8"), ("env_s", "f8"), ("turns", "i4"), ("stop", "i4"), ("cut_turns", "i4"), ("tool_calls", "i4"),
                    ("parse_errors", "i4"), ("reserved", "i4")])
STOPS = ("done", "max_turns", "context", "env_error")
HEADER = struct.Struct("=IIiiiiqq")
# (name, dtype, length as a function of n_seqs, n_tokens, experts per token)
ARRAYS = (
    ("offsets", np.int32, lambda n, T, row: n + 1),
    ("prompt_len", np.int32, lambda n, T, row: n),
    ("tokens", np.int32, lambda n, T, row: T),
    ("behav_logp", np.float32, lambda n, T, row: T),
    ("version", np.uint32, lambda n, T, row: T),
    ("experts", np.uint16, lambda n, T, row: T * row),
    ("example", np.int32, lambda n, T, row: n),
    ("reward", np.float64, lambda n, T, row: n),
    ("adv", np.float64, lambda n, T, row: n),
    ("correct", np.float64, lambda n, T, row: n),
    ("keep", np.bool_, lambda n, T, row: n),
)


def read(path):
    data = open(path, "rb").read()
    magic, fmt, n, group, layers, k, T, text = HEADER.unpack_from(data, 0)
    if magic != MAGIC or fmt not in (1, 2, 3):
        raise ValueError(f"{path}: not a rollout batch (magic {magic:08x}, format {fmt})")
    b = {"n_seqs": n, "group_size": group, "n_moe_layers": layers, "top_k": k, "format": fmt}
    at = HEADER.size
    arrays = list(ARRAYS)
    if fmt >= 2:
        (n_segs,) = struct.unpack_from("=q", data, at)
        at += 8
        arrays += [("seg_offsets", np.int32, lambda n, T, row: n + 1),
                   ("segs", np.int32, lambda n, T, row: 2 * n_segs)]
    if fmt == 3:
        arrays.append(("episodes", EPISODE, lambda n, T, row: n))
    for name, dtype, count in arrays:
        m = count(n, T, layers * k)
        b[name] = np.frombuffer(data, dtype=dtype, count=m, offset=at).copy()
        at += m * np.dtype(dtype).itemsize
    if fmt >= 2:
        b["segs"] = b["segs"].reshape(-1, 2)
    if at + text != len(data):
        raise ValueError(f"{path}: {len(data)} bytes, the header describes {at + text}")
    texts = [s.decode("utf-8") for s in data[at:-1].split(b"\0")] if n else []
    b["completion"] = texts[:n]
    if fmt == 3:
        b["env_metrics"] = [json.loads(t) for t in texts[n:]]
    if len(texts) != (2 if fmt == 3 else 1) * n:
        raise ValueError(f"{path}: {len(texts)} texts for {n} sequences (format {fmt})")
    b["experts"] = b["experts"].reshape(T, layers, k)
    return b


def write(path, b):
    n, T = b["n_seqs"], int(b["offsets"][-1])
    text = b"".join(c.encode("utf-8") + b"\0" for c in b["completion"])
    out = [HEADER.pack(MAGIC, FORMAT, n, b["group_size"], b["n_moe_layers"], b["top_k"], T, len(text))]
    for name, dtype, count in ARRAYS:
        a = np.ascontiguousarray(b[name], dtype=dtype).reshape(-1)
        assert a.size == count(n, T, b["n_moe_layers"] * b["top_k"]), name
        out.append(a.tobytes())
    out.append(text)
    with open(path, "wb") as f:
        f.write(b"".join(out))


def loss_mask(b):
    """1 on the tokens the model sampled: the sampled segments (format 1: every response token)."""
    T = int(b["offsets"][-1])
    mask = np.zeros(T, dtype=np.uint8)
    for s in range(b["n_seqs"]):
        if "segs" not in b:
            mask[response(b, s)[0]:response(b, s)[1]] = 1
            continue
        t = int(b["offsets"][s])
        for length, kind in b["segs"][b["seg_offsets"][s]:b["seg_offsets"][s + 1]]:
            mask[t:t + length] = kind
            t += length
    return mask


def response(b, s):
    """Token positions [start, end) of sequence s's response."""
    return int(b["offsets"][s] + b["prompt_len"][s]), int(b["offsets"][s + 1])
