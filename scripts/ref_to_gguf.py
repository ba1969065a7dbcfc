#!/usr/bin/python3
"""models/ref (a Qwen3 checkpoint) as a GGUF file for llama.cpp, for scripts/vs_llamacpp.sh and the ppl goldens.

    scripts/ref_to_gguf.py GGUF_PY_DIR OUT.gguf [--model models/ref] [--outtype f16|f32|bf16]

GGUF_PY_DIR is llama.cpp's gguf-py folder (its own writer, from a checkout built outside this repository).
convert_hf_to_gguf.py needs torch and transformers; this reads the safetensors with Debian's python3-numpy (hence
/usr/bin/python3) and writes what it would: architecture qwen3, the tensors renamed by gguf's name map, the tied
output left to token_embd, a gpt2 tokenizer with the qwen2 pre-tokenizer, added special tokens as CONTROL, add_bos
false.
"""
import argparse
import json
import struct
import sys
from pathlib import Path


def read_safetensors(path, np):
    """name -> float32 array of every tensor in one .safetensors file (F32, BF16 or F16)."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = memoryview(data)[8 + n:]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        raw = body[a:b]
        if t["dtype"] == "BF16":
            x = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif t["dtype"] == "F16":
            x = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
        elif t["dtype"] == "F32":
            x = np.frombuffer(raw, dtype=np.float32).copy()
        else:
            sys.exit(f"ref_to_gguf: tensor {name}: dtype {t['dtype']} is not F32, BF16 or F16")
        out[name] = x.reshape(t["shape"])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gguf_py")
    ap.add_argument("out")
    ap.add_argument("--model", default="models/ref")
    ap.add_argument("--outtype", choices=["f16", "f32", "bf16"], default="f16")
    args = ap.parse_args()
    sys.path.insert(0, args.gguf_py)
    import numpy as np
    import gguf

    model = Path(args.model)
    cfg = json.loads((model / "config.json").read_text())
    if cfg.get("model_type") != "qwen3":
        sys.exit(f"ref_to_gguf: {model}: model_type {cfg.get('model_type')!r}, this script writes qwen3 only")
    files = sorted(model.glob("*.safetensors"))
    if not files:
        sys.exit(f"ref_to_gguf: {model}: no .safetensors files")
    tensors = {}
    for f in files:
        tensors.update(read_safetensors(f, np))

    arch = gguf.MODEL_ARCH.QWEN3
    n_layers = cfg["num_hidden_layers"]
    w = gguf.GGUFWriter(args.out, gguf.MODEL_ARCH_NAMES[arch])
    w.add_name(model.name)
    w.add_block_count(n_layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "bf16": gguf.LlamaFileType.MOSTLY_BF16}[args.outtype])

    tok = json.loads((model / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    added = {t["id"]: t for t in tok["added_tokens"]}
    n_vocab = cfg["vocab_size"]
    by_id = {i: s for s, i in vocab.items()}
    for i, t in added.items():
        by_id[i] = t["content"]
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in by_id:
            sys.exit(f"ref_to_gguf: tokenizer.json has no token {i}")
        tokens.append(by_id[i])
        types.append(gguf.TokenType.CONTROL if i in added and added[i]["special"] else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_bos_token_id(cfg.get("bos_token_id", cfg["eos_token_id"]))
    w.add_pad_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(False)

    names = gguf.get_tensor_name_map(arch, n_layers)
    dtype = {"f32": np.float32, "f16": np.float16}.get(args.outtype)
    for hf_name, x in tensors.items():
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            sys.exit(f"ref_to_gguf: no GGUF name for tensor {hf_name}")
        if x.ndim == 1 or args.outtype == "f32":  # norms stay f32, as convert_hf_to_gguf.py keeps them
            w.add_tensor(name, x.astype(np.float32))
        elif dtype is not None:
            w.add_tensor(name, x.astype(dtype))
        else:  # bf16: the stored bits, rounded to nearest even from the f32 widening (exact: they came from bf16)
            bits = (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            w.add_tensor(name, bits, raw_shape=x.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"ref_to_gguf: wrote {args.out} ({len(tensors)} tensors, {args.outtype})")


if __name__ == "__main__":
    main()
