#!/usr/bin/env python3
"""Writes fuzz/seeds/: small valid inputs of the parsers fuzzed by make fuzz, so libFuzzer starts from files that
reach past their first checks (scripts/run_fuzz.sh seeds every target with them, beside tests/malformed,
tests/models and models/ref's small files).

  rotation_l2h2d4.safetensors   a rotation file (rotation/rotation_file.h): identity R_K per head, R_V per layer, key
                                means, 2 layers x 2 kv heads x d 4
  pnmix_l1h2d32.safetensors     a PN-Mix width file (codecs/pnmix/pnmix_file.h): 1 layer x 2 kv heads x d 32, every
                                pair at 1 bit (the allocation of any scores at 32 code bits)
  fp8_scales_l2.safetensors     an FP8 scales file (codecs/fp8/fp8_scales.h): 2 layers, e4m3, amax / 448
  index.json                    a sharded checkpoint's model.safetensors.index.json
  config_mistral.json           a transformers-5 style config with layer_types and rope_parameters

The files are committed; rerun this script (python3 fuzz/make_seeds.py) only to regenerate them. Standard library
only, deterministic output.
"""
import json
import os
import struct

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")


def safetensors(path, tensors, metadata):
    """tensors: list of (name, dtype, shape, raw bytes)."""
    header, off, data = {"__metadata__": metadata}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    text = json.dumps(header, sort_keys=True).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def f32(values):
    return struct.pack("<%df" % len(values), *values)


def eye(d):
    return [1.0 if i == j else 0.0 for i in range(d) for j in range(d)]


def main():
    os.makedirs(HERE, exist_ok=True)
    L, H, d = 2, 2, 4
    tensors = []
    for l in range(L):
        tensors.append((f"layers.{l}.r_k", "F32", [H, d, d], f32(eye(d) * H)))
        tensors.append((f"layers.{l}.r_v", "F32", [d, d], f32(eye(d))))
        tensors.append((f"layers.{l}.key_mean", "F32", [H, d], f32([0.25 * i for i in range(H * d)])))
    meta = {"method": "optr", "n_layers": L, "n_kv_heads": H, "head_dim": d, "model_fingerprint": "0" * 64}
    safetensors(os.path.join(HERE, "rotation_l2h2d4.safetensors"), tensors,
                {"kvq_rotation": json.dumps(meta, sort_keys=True)})

    L, H, d = 1, 2, 32
    half = d // 2
    meta = {"method": "pnmix", "n_layers": L, "n_kv_heads": H, "head_dim": d, "code_bits": 2 * half,
            "key_bits": 1.0, "score": "product", "model_fingerprint": "0" * 64}
    safetensors(os.path.join(HERE, "pnmix_l1h2d32.safetensors"),
                [("layers.0.pair_bits", "U8", [H, half], bytes([1] * (H * half))),
                 ("layers.0.pair_score", "F32", [H, half], f32([1.0 + i for i in range(H * half)]))],
                {"kvq_pnmix": json.dumps(meta, sort_keys=True)})

    k_amax, v_amax = [4.0, 8.0], [2.0, 1.0]  # powers of two: their / 448 is the float the loader recomputes
    meta = {"method": "fp8-scales", "format": "e4m3", "n_layers": 2, "model_fingerprint": "0" * 64}
    safetensors(os.path.join(HERE, "fp8_scales_l2.safetensors"),
                [("k_amax", "F32", [2], f32(k_amax)), ("v_amax", "F32", [2], f32(v_amax)),
                 ("k_scale", "F32", [2], f32([a / 448.0 for a in k_amax])),
                 ("v_scale", "F32", [2], f32([a / 448.0 for a in v_amax]))],
                {"kvq_fp8_scales": json.dumps(meta, sort_keys=True)})

    weight_map = {"model.embed_tokens.weight": "model-00001-of-00002.safetensors",
                  "model.layers.0.self_attn.q_proj.weight": "model-00001-of-00002.safetensors",
                  "lm_head.weight": "model-00002-of-00002.safetensors"}
    with open(os.path.join(HERE, "index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 1024}, "weight_map": weight_map}, f, indent=1, sort_keys=True)

    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "dtype": "bfloat16",
              "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "max_position_embeddings": 2048,
              "rms_norm_eps": 1e-6, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
              "sliding_window": 24, "layer_types": ["sliding_attention", "full_attention"],
              "tie_word_embeddings": False, "eos_token_id": [0, 1], "bos_token_id": 0, "hidden_act": "silu"}
    with open(os.path.join(HERE, "config_mistral.json"), "w") as f:
        json.dump(config, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
