#!/usr/bin/env python3
"""Writes an HF Qwen3 checkpoint (its *.safetensors files; bf16/f16/f32) as an F16 GGUF for llama.cpp,
so `llama-quantize` can make its Q4_0 and `llama-bench` can time it next to this project's CPU
backend (examples/bench_cpu.rs). A synthetic checkpoint has no tokenizer: the GGUF borrows the
tokenizer of DONOR_GGUF (any GPT-2-style GGUF, e.g. SmolLM2's) and pads its token list to the
checkpoint's vocab_size, as llama.cpp's own converter pads a short vocabulary. Tokens do not
change the speed of a bench on random ids.

    python3 scripts/qwen3-gguf.py GGUF_PY_DIR HF_DIR DONOR_GGUF OUT.gguf

GGUF_PY_DIR is llama.cpp's gguf-py directory (in the vendored llama.cpp of PyPI's llama-cpp-python
sdist); numpy is the only other requirement.
"""
import json
import os
import struct
import sys

import numpy as np

gguf_py, hf_dir, donor, out = sys.argv[1:5]
sys.path.insert(0, gguf_py)
import gguf  # noqa: E402

cfg = json.load(open(os.path.join(hf_dir, "config.json")))
# Every *.safetensors file of the directory (one model.safetensors, or shards such as the
# model-layer-NN.safetensors bench_cpu writes): tensor name -> (file, header entry, data).
tensors = {}
files = sorted(f for f in os.listdir(hf_dir) if f.endswith(".safetensors"))
if not files:
    sys.exit(f"{hf_dir}: no *.safetensors file")
for file in files:
    path = os.path.join(hf_dir, file)
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    for name, info in header.items():
        if name != "__metadata__":
            tensors[name] = (path, info, data)


def tensor(name):
    if name not in tensors:
        sys.exit(f"{hf_dir}: no tensor {name} in {', '.join(files)}")
    path, info, data = tensors[name]
    start, end = info["data_offsets"]
    raw = data[start:end]
    if info["dtype"] == "BF16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(info["shape"])
    if info["dtype"] == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(info["shape"])
    if info["dtype"] == "F32":
        return raw.view(np.float32).reshape(info["shape"])
    sys.exit(f"{path}: tensor {name} has dtype {info['dtype']}; expected BF16, F16 or F32")


hidden, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
head_dim = cfg.get("head_dim") or hidden // cfg["num_attention_heads"]
w = gguf.GGUFWriter(out + ".partial", "qwen3")
w.add_context_length(cfg.get("max_position_embeddings", 40960))
w.add_embedding_length(hidden)
w.add_block_count(layers)
w.add_feed_forward_length(cfg["intermediate_size"])
w.add_head_count(cfg["num_attention_heads"])
w.add_head_count_kv(cfg["num_key_value_heads"])
w.add_key_length(head_dim)
w.add_value_length(head_dim)
w.add_rope_freq_base(cfg.get("rope_theta", 1000000.0))
w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

r = gguf.GGUFReader(donor)


def strings(key):
    field = r.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


tokens = strings("tokenizer.ggml.tokens")
types = [int(r.fields["tokenizer.ggml.token_type"].parts[i][0]) for i in r.fields["tokenizer.ggml.token_type"].data]
vocab = cfg["vocab_size"]
if len(tokens) > vocab:
    sys.exit(f"{donor} has {len(tokens)} tokens, more than vocab_size {vocab}")
pad = vocab - len(tokens)
tokens += [f"[PAD{i}]" for i in range(pad)]
types += [int(gguf.TokenType.USER_DEFINED)] * pad
w.add_tokenizer_model("gpt2")
w.add_tokenizer_pre(strings("tokenizer.ggml.pre")[0])
w.add_token_list(tokens)
w.add_token_types(types)
w.add_token_merges(strings("tokenizer.ggml.merges"))
for key, add in [
    ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
    ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
]:
    if key in r.fields:
        add(int(r.fields[key].parts[-1][0]))

names = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def add(name, t):
    # Matrices as f16, vectors (norms) as f32, as llama.cpp's converter stores them.
    w.add_tensor(name, t.astype(np.float16) if t.ndim == 2 else t.astype(np.float32))


add("token_embd.weight", tensor("model.embed_tokens.weight"))
add("output_norm.weight", tensor("model.norm.weight"))
if "lm_head.weight" in header:
    add("output.weight", tensor("lm_head.weight"))
for i in range(layers):
    for hf, gg in names.items():
        add(f"blk.{i}.{gg}.weight", tensor(f"model.layers.{i}.{hf}.weight"))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
os.replace(out + ".partial", out)
print(out)
