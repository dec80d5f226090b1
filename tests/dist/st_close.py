"""How far apart two runs' safetensors files are, for the distributed tests (tensor parallelism
adds its partial sums in another order than one process, so its files are close, not equal).

    st_close.py A.safetensors B.safetensors MAX [--relative]

Both files must hold the same F32 tensors. Without --relative the largest difference must be at
most MAX times the largest value of A; with it, every element's difference at most MAX times its
own size (floored at 1e-3). Prints the figure; exits 1 past the bound."""
import array
import json
import struct
import sys


def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, v in header.items():
        if name == "__metadata__":
            continue
        assert v["dtype"] == "F32", (path, name, v["dtype"])
        a = array.array("f")
        a.frombytes(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
        out[name] = a
    return out


def main():
    a, b, bound = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
    relative = "--relative" in sys.argv[4:]
    if sorted(a) != sorted(b):
        sys.exit(f"{sys.argv[1]} and {sys.argv[2]} hold other tensors")
    if relative:
        worst = max(abs(x - y) / max(abs(x), 1e-3) for k in a for x, y in zip(a[k], b[k]))
        print(f"  every value within {worst:.2g} relative")
    else:
        top = max(abs(x) for t in a.values() for x in t)
        worst = max(abs(x - y) for k in a for x, y in zip(a[k], b[k])) / top
        print(f"  the largest difference {worst:.2g} of the largest value")
    if worst > bound:
        sys.exit(f"{sys.argv[1]} and {sys.argv[2]}: {worst:.3g} apart, over {bound:g}")


main()
