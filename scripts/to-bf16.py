#!/usr/bin/env python3
"""Writes a copy of an HF checkpoint directory whose f32 / f16 tensors are bfloat16 (rounded to
nearest even), as models are published in bf16: config, generation config and tokenizer files are
copied, config.json says `"torch_dtype": "bfloat16"`. For trying the CPU backend's bf16 paths on a
checkpoint shipped in f32 (SmolLM2's from scripts/fetch-smollm2), e.g.

    python3 scripts/to-bf16.py $(scripts/fetch-smollm2) /tmp/smollm2-bf16
    cargo run --release --example perplexity -- --model /tmp/smollm2-bf16 --text fixtures/text/eval.txt \\
        --tokens 761 --bf16-products --no-rtn

numpy is the only requirement. The output directory is written under a temporary name and renamed when complete.
"""
import json
import os
import shutil
import struct
import sys

import numpy as np


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns, rounded to nearest even (NaN stays NaN)."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def convert(path: str, out: str) -> None:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        entries, blobs, offset = {}, [], 0
        for name, info in header.items():
            if name == "__metadata__":
                entries[name] = info
                continue
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            data = f.read(end - begin)
            dtype = info["dtype"]
            if dtype in ("F32", "F16"):
                values = np.frombuffer(data, dtype=np.float32 if dtype == "F32" else np.float16)
                data = to_bf16_bits(values).tobytes()
                dtype = "BF16"
            entries[name] = {"dtype": dtype, "shape": info["shape"], "data_offsets": [offset, offset + len(data)]}
            blobs.append(data)
            offset += len(data)
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: to-bf16.py HF_DIR OUT_DIR")
    src, out = sys.argv[1:3]
    if not os.path.isfile(os.path.join(src, "config.json")):
        sys.exit(f"{src}: no config.json; expected an HF checkpoint directory")
    tmp = out.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if name.endswith(".safetensors"):
            convert(path, os.path.join(tmp, name))
        elif name == "config.json":
            cfg = json.load(open(path))
            cfg["torch_dtype"] = "bfloat16"
            with open(os.path.join(tmp, name), "w") as f:
                json.dump(cfg, f, indent=2)
        elif os.path.isfile(path):
            shutil.copy(path, os.path.join(tmp, name))
    # An earlier copy is replaced only once this one is complete.
    old = out.rstrip("/") + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(out):
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    main()
