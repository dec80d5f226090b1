#!/usr/bin/env python3
"""Fails (exit 1) when an include in src/ breaks trill's layering (ARCHITECTURE.md):

    base <- kernels, dist, text <- model <- train, infer <- rl <- service <- cli

A file may include public headers (include/trill/) of its own layer and the layers below, and
private headers (src/<folder>/...) of its own layer and below, except the command (cli), which
uses the public API only (and base's private utilities, such as its jansson glue). A model family's folder src/arch/<family>/ is the model
layer's, every file in it whatever its name: the decoder its layer description picks options of is
written once per pass (src/model/decoder.c, src/train/decoder_backward.c, src/infer/gen_decoder.c). Each public header's
layer is listed below; a header missing from the list is an error, so the list stays complete.
Usage: check_layers.py [SOURCE_DIR]"""
import os
import re
import sys

RANK = {"base": 0, "kernels": 1, "dist": 1, "text": 1, "model": 2, "train": 3, "infer": 3, "rl": 4, "service": 5, "cli": 6}
PUBLIC = {
    "base": "error fileio json dtype rng timing log",
    "dist": "dist",
    "kernels": "kernels kernels_decl weight",
    "text": "tokenizer chat",
    "model": "arch config safetensors model lora",
    "train": "train optim",
    "infer": "infer sample eplb",
    "rl": "rl run_config rl_metrics run eval rl_algo loss reward reward_model dataset demo channel sft report plan",
    "service": "service",
}
HEADER_LAYER = {f"trill/{h}.h": layer for layer, names in PUBLIC.items() for h in names.split()}
HEADER_LAYER["trill/families.def"] = "model"  # the family registry: the model layer's


def layer_of(rel):  # rel: a path under src/
    parts = rel.split("/")
    if parts[0] == "arch":
        return "model"
    return parts[0]


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    src = os.path.join(root, "src")
    errors = []
    for h in sorted(os.listdir(os.path.join(root, "include", "trill"))):
        if f"trill/{h}" not in HEADER_LAYER:
            errors.append(f"include/trill/{h}: not assigned to a layer in scripts/check_layers.py")
    for dirpath, _, files in os.walk(src):
        for name in sorted(files):
            if not name.endswith((".c", ".h")):
                continue
            rel = os.path.relpath(os.path.join(dirpath, name), src)
            mine = layer_of(rel)
            with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
                    if not m:
                        continue
                    inc = m.group(1)
                    if inc in HEADER_LAYER:
                        theirs, private = HEADER_LAYER[inc], False
                    elif "/" in inc and os.path.exists(os.path.join(src, inc)):
                        theirs, private = layer_of(inc), True
                    else:
                        continue  # a header next to the file
                    where = f"src/{rel}:{lineno}: {mine} includes {inc} ({'private, ' if private else ''}{theirs})"
                    if RANK[theirs] > RANK[mine] or (RANK[theirs] == RANK[mine] and theirs != mine):
                        errors.append(where + ": a layer may only use the layers below it")
                    elif private and mine == "cli" and theirs not in ("cli", "base"):
                        errors.append(where + ": the command uses the public API (include/trill) only")
    for e in errors:
        print(e, file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
