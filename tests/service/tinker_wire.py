"""The protobuf messages of the official Tinker protocol that the tests send and read, encoded and
decoded by hand from the wire format (varints, length-delimited fields, fixed 64-bit doubles) and
the messages' field numbers: an oracle independent of trill's schema (src/service/tinker.proto)
and of any protobuf library.

ForwardBackwardRequest: 1 model_id, 2 seq_id, 3 data (Datum: 1 model_input (Chunk: 1 encoded_text
(1 tokens: int32 bytes)), 2 loss_fn_inputs (map entry: 1 key, 2 Tensor: 1 dense bytes, 3 dtype
(1 float32, 2 int64), 4 shape: [N], or [N, K] for top-k targets)), 4 loss_fn, 5 loss_fn_config (map:
1 key, 2 double), 6 forward_only.
ForwardBackwardOutput: 1 loss_fn_output_type, 2 loss_fn_outputs (ArrayRecord: 1 type_tag,
2 fields (map: 1 key, 2 BatchedTensor: 1 data, 2 offsets (int64 byte offsets), 3 dtype,
4 trailing_shape), 3 num_datums), 3 metrics (map: 1 key, 2 double).
SampleResponse: 1 sequences (SampledSequence: 1 stop_reason (0 stop, 1 length), 2 tokens (int32
bytes), 3 logprobs (float32 bytes)), 2 prompt_logprobs, 3 topk_prompt_logprobs, 4 prompt_cache_hit_tokens."""

import struct


def _varint(n):
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, wire, payload):
    head = _varint(number << 3 | wire)
    if wire == 2:
        return head + _varint(len(payload)) + payload
    return head + payload


def _bytes(number, b):
    return _field(number, 2, b)


def _tensor(values, dtype):
    """A dense Tensor of a list, or of rows (shape [N, K])."""
    shape = [len(values), len(values[0])] if values and isinstance(values[0], list) else [len(values)]
    flat = [x for row in values for x in row] if len(shape) == 2 else values
    data = struct.pack(f"<{len(flat)}q", *flat) if dtype == "int64" else struct.pack(f"<{len(flat)}f", *flat)
    return _bytes(1, data) + _field(3, 0, _varint(2 if dtype == "int64" else 1)) + _bytes(4, b"".join(_varint(d) for d in shape))


def forward_backward_request(model_id, data, loss_fn, loss_fn_config=None, forward_only=False, seq_id=1, chunk=None):
    """data: [(tokens, {name: values})]; target_tokens go as int64, the rest as float32. chunk:
    a Chunk's bytes put in place of the first datum's (for the refusals)."""
    out = _bytes(1, model_id.encode()) + _field(2, 0, _varint(seq_id))
    for i, (tokens, inputs) in enumerate(data):
        text = _bytes(1, _bytes(1, struct.pack(f"<{len(tokens)}i", *tokens)))
        datum = _bytes(1, chunk if chunk is not None and i == 0 else text)
        for name, values in inputs.items():
            entry = _bytes(1, name.encode()) + _bytes(2, _tensor(values, "int64" if name == "target_tokens" else "float32"))
            datum += _bytes(2, entry)
        out += _bytes(3, datum)
    out += _bytes(4, loss_fn.encode())
    for k, v in (loss_fn_config or {}).items():
        out += _bytes(5, _bytes(1, k.encode()) + _field(2, 1, struct.pack("<d", v)))
    if forward_only:
        out += _field(6, 0, _varint(1))
    return out


def _fields(buf):
    """(number, wire type, value) of a message's fields: ints for varints, bytes otherwise."""
    i = 0
    while i < len(buf):
        key, i = _read_varint(buf, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(buf, i)
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        elif wire == 2:
            n, i = _read_varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield number, wire, value


def _read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def forward_backward_output(buf):
    """{type, metrics, outputs: [{name: [values]}] one a datum}."""
    out = {"type": "", "metrics": {}, "outputs": []}
    for number, _, value in _fields(buf):
        if number == 1:
            out["type"] = value.decode()
        elif number == 3:
            entry = dict((n, v) for n, _, v in _fields(value))
            out["metrics"][entry[1].decode()] = struct.unpack("<d", entry[2])[0]
        elif number == 2:
            fields, count = {}, 0
            for n, _, v in _fields(value):
                if n == 2:
                    entry = dict((k, x) for k, _, x in _fields(v))
                    bt = dict((k, x) for k, _, x in _fields(entry[2]))
                    assert bt.get(3) == 1, "float32 expected"
                    data, offsets = bt.get(1, b""), struct.unpack(f"<{len(bt[2]) // 8}q", bt[2])
                    rows = [list(struct.unpack(f"<{(b - a) // 4}f", data[a:b])) for a, b in zip(offsets, offsets[1:])]
                    k = _read_varint(bt[4], 0)[0] if 4 in bt else 0  # trailing_shape [K] (packed): rows of K
                    fields[entry[1].decode()] = [[r[i:i + k] for i in range(0, len(r), k)] for r in rows] if k else rows
                elif n == 3:
                    count = v
            out["outputs"] += [{name: fields[name][d] for name in fields} for d in range(count)]
    return out


def sample_prompt_logprobs(buf):
    """A SampleResponse's prompt log-probs (NaN where none), or None."""
    for number, _, value in _fields(buf):
        if number == 2:
            return list(struct.unpack(f"<{len(value) // 4}f", value))
    return None


def sample_response(buf):
    """[{tokens, logprobs, stop_reason}]."""
    seqs = []
    for number, _, value in _fields(buf):
        if number == 1:
            s = {"stop_reason": "stop", "tokens": [], "logprobs": None}
            for n, _, v in _fields(value):
                if n == 1:
                    s["stop_reason"] = ["stop", "length"][v]
                elif n == 2:
                    s["tokens"] = list(struct.unpack(f"<{len(v) // 4}i", v))
                elif n == 3:
                    s["logprobs"] = list(struct.unpack(f"<{len(v) // 4}f", v))
            seqs.append(s)
    return seqs
