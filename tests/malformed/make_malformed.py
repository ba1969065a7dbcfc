#!/usr/bin/env python3
"""Writes the malformed-input corpus under tests/malformed/ and EXPECTED.tsv.

Each EXPECTED.tsv line is: <path relative to tests/malformed>\t<kind>\t<substring the kvq::Error must contain>.
kind is one of: header (SafeTensorsFile::open), checkpoint (Checkpoint::open), weights (Checkpoint::open then
Weights::load with the directory's config.json), config (ModelConfig::load).
The files are committed; rerun this script (python3 tests/malformed/make_malformed.py) only to regenerate them.
Standard library only, deterministic output.
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
expected = []

DTYPE_SIZE = {"F32": 4, "BF16": 2, "F16": 2, "I32": 4}


def header_file(name, header, data=b"", kind="header", expect="", raw_header=None, length=None):
    """A safetensors file from a header dict (or raw header bytes) and a data section."""
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    n = len(text) if length is None else length
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(struct.pack("<Q", n) + text + data)
    expected.append((name, kind, expect))


def safetensors_bytes(tensors):
    """tensors: list of (name, dtype, shape, bytes) -> a valid safetensors file."""
    header, off, data = {}, 0, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
        data += raw
    text = json.dumps(header).encode()
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def t(name, shape, dtype="BF16"):
    n = 1
    for d in shape:
        n *= d
    return (name, dtype, shape, bytes(n * DTYPE_SIZE[dtype]))


TINY_CONFIG = {
    "model_type": "qwen3", "vocab_size": 16, "hidden_size": 8, "intermediate_size": 12,
    "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "tie_word_embeddings": True, "eos_token_id": 1, "bos_token_id": None, "torch_dtype": "bfloat16",
}


def tiny_tensors():
    p = "model.layers.0."
    return [t("model.embed_tokens.weight", [16, 8]), t("model.norm.weight", [8]),
            t(p + "input_layernorm.weight", [8]), t(p + "self_attn.q_proj.weight", [8, 8]),
            t(p + "self_attn.k_proj.weight", [4, 8]), t(p + "self_attn.v_proj.weight", [4, 8]),
            t(p + "self_attn.q_norm.weight", [4]), t(p + "self_attn.k_norm.weight", [4]),
            t(p + "self_attn.o_proj.weight", [8, 8]), t(p + "post_attention_layernorm.weight", [8]),
            t(p + "mlp.gate_proj.weight", [12, 8]), t(p + "mlp.up_proj.weight", [12, 8]),
            t(p + "mlp.down_proj.weight", [8, 12])]


def checkpoint_dir(name, kind, expect, files):
    d = os.path.join(HERE, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for fname, content in files.items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(content if isinstance(content, bytes) else json.dumps(content, indent=1).encode())
    expected.append((name, kind, expect))


def sharded(tensors, split, drop_from_shard2=None):
    """Two shards + index; optionally leave a tensor out of shard 2 while the index still names it."""
    names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    parts = [tensors[:split], [x for x in tensors[split:] if x[0] != drop_from_shard2]]
    weight_map = {x[0]: names[0] for x in tensors[:split]}
    weight_map.update({x[0]: names[1] for x in tensors[split:]})
    index = {"metadata": {"total_size": 0}, "weight_map": weight_map}
    return names, [safetensors_bytes(p) for p in parts], index


def main():
    for f in os.listdir(HERE):
        if f not in ("make_malformed.py",):
            p = os.path.join(HERE, f)
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)

    ok = {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}
    valid = safetensors_bytes([("a", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4))])

    # --- single files (SafeTensorsFile::open) -----------------------------------------------------------------
    with open(os.path.join(HERE, "truncated_length.safetensors"), "wb") as f:
        f.write(valid[:5])
    expected.append(("truncated_length.safetensors", "header", "too short for the 8-byte header length"))
    with open(os.path.join(HERE, "truncated_data.safetensors"), "wb") as f:
        f.write(valid[:-6])
    expected.append(("truncated_data.safetensors", "header", "run past the end of the data section"))
    header_file("header_past_eof.safetensors", ok, bytes(16), length=1000, expect="runs past the end of the file")
    header_file("header_len_huge.safetensors", ok, bytes(16), length=(1 << 63) + 5, expect="exceeds the")
    header_file("empty.safetensors", None, raw_header=b"", length=0, expect="header is not valid JSON")
    header_file("bad_json.safetensors", None, bytes(16), raw_header=b'{"a": {"dtype": "F32", "shape": [2, 2]',
                expect="header is not valid JSON")
    header_file("bad_utf8.safetensors", None, bytes(16), raw_header=b'{"\xff\xfe": 1}',
                expect="header is not valid JSON")
    header_file("header_not_object.safetensors", [1, 2, 3], expect="header must be a JSON object")
    header_file("entry_not_object.safetensors", {"a": 5}, expect="tensor 'a': entry must be a JSON object")
    header_file("missing_offsets.safetensors", {"a": {"dtype": "F32", "shape": [2, 2]}}, bytes(16),
                expect="tensor 'a': missing field 'data_offsets'")
    header_file("offsets_past_end.safetensors",
                {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]}}, bytes(16),
                expect="tensor 'a': data_offsets [8, 24] run past the end of the data section (16 bytes)")
    header_file("offsets_reversed.safetensors",
                {"a": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}, bytes(16), expect="begin > end")
    header_file("offsets_not_pair.safetensors",
                {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}, bytes(16),
                expect="data_offsets must be [begin, end]")
    header_file("overlap.safetensors",
                {"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                 "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, bytes(16),
                expect="tensor 'b': data_offsets [8, 16] overlap tensor 'a'")
    header_file("unknown_dtype.safetensors",
                {"a": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}}, bytes(4),
                expect="tensor 'a': unknown dtype 'F8_E4M3'")
    header_file("dtype_not_string.safetensors",
                {"a": {"dtype": 7, "shape": [4], "data_offsets": [0, 4]}}, bytes(4), expect="dtype must be a string")
    header_file("shape_bytes_mismatch.safetensors",
                {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 16]}}, bytes(16),
                expect="tensor 'a': shape [2,3] of F32 needs 24 bytes but data_offsets [0, 16] hold 16 bytes")
    header_file("numel_overflow.safetensors",
                {"a": {"dtype": "F32", "shape": [1 << 62, 1 << 62], "data_offsets": [0, 16]}}, bytes(16),
                expect="tensor 'a': shape [4611686018427387904,4611686018427387904] overflows")
    header_file("bytes_overflow.safetensors",
                {"a": {"dtype": "F64", "shape": [1 << 62], "data_offsets": [0, 16]}}, bytes(16),
                expect="overflows")
    header_file("negative_shape.safetensors",
                {"a": {"dtype": "F32", "shape": [-2, -2], "data_offsets": [0, 16]}}, bytes(16),
                expect="shape must hold non-negative integers")
    header_file("float_shape.safetensors",
                {"a": {"dtype": "F32", "shape": [2.0, 2], "data_offsets": [0, 16]}}, bytes(16),
                expect="shape must hold non-negative integers")
    header_file("bad_metadata.safetensors", {"__metadata__": {"format": 1}, **ok}, bytes(16),
                expect="__metadata__ value of 'format' must be a string")
    header_file("duplicate_name.safetensors", None, bytes(16),
                raw_header=b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},'
                           b' "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}',
                expect="tensor 'a': duplicate tensor name")
    header_file("deep_nesting.safetensors", None, raw_header=b"[" * 10000 + b"]" * 10000,
                expect="nests deeper than")

    # --- checkpoint directories ----------------------------------------------------------------------------
    tensors = tiny_tensors()
    checkpoint_dir("ckpt_no_weights", "checkpoint", "has neither model.safetensors nor", {"config.json": TINY_CONFIG})
    checkpoint_dir("ckpt_no_config", "checkpoint", "config.json",
                   {"model.safetensors": safetensors_bytes(tensors)})
    names, shards, index = sharded(tensors, 5)
    checkpoint_dir("ckpt_missing_shard", "checkpoint",
                   "shard 'model-00002-of-00002.safetensors' (holding tensor",
                   {"config.json": TINY_CONFIG, "model.safetensors.index.json": index, names[0]: shards[0]})
    names, shards, index = sharded(tensors, 5, drop_from_shard2="model.layers.0.mlp.up_proj.weight")
    checkpoint_dir("ckpt_index_tensor_not_in_shard", "checkpoint",
                   "index maps tensor 'model.layers.0.mlp.up_proj.weight' to shard 'model-00002-of-00002.safetensors',"
                   " but that shard has no such tensor",
                   {"config.json": TINY_CONFIG, "model.safetensors.index.json": index, names[0]: shards[0],
                    names[1]: shards[1]})
    checkpoint_dir("ckpt_bad_index_json", "checkpoint", "index is not valid JSON",
                   {"config.json": TINY_CONFIG, "model.safetensors.index.json": b'{"weight_map": {'})
    checkpoint_dir("ckpt_index_no_weight_map", "checkpoint", "index has no \"weight_map\" object",
                   {"config.json": TINY_CONFIG, "model.safetensors.index.json": {"metadata": {}}})
    checkpoint_dir("ckpt_index_path_escape", "checkpoint", "which is not a plain file name",
                   {"config.json": TINY_CONFIG,
                    "model.safetensors.index.json": {"weight_map": {"model.norm.weight": "../x.safetensors"}}})
    checkpoint_dir("ckpt_bad_shard", "checkpoint", "model.safetensors: header length",
                   {"config.json": TINY_CONFIG, "model.safetensors": struct.pack("<Q", 999) + b"{}"})
    checkpoint_dir("ckpt_missing_tensor", "weights", "missing tensor 'model.layers.0.mlp.down_proj.weight'",
                   {"config.json": TINY_CONFIG, "model.safetensors": safetensors_bytes(tensors[:-1])})
    wrong = [x if x[0] != "model.layers.0.self_attn.k_proj.weight" else t(x[0], [8, 8]) for x in tensors]
    checkpoint_dir("ckpt_wrong_shape", "weights",
                   "tensor 'model.layers.0.self_attn.k_proj.weight' in", {"config.json": TINY_CONFIG,
                                                                         "model.safetensors": safetensors_bytes(wrong)})
    expected[-1] = (expected[-1][0], "weights", "self_attn.k_proj.weight' in {dir} has shape [8, 8], expected [4, 8]")
    ints = [x if x[0] != "model.norm.weight" else t(x[0], [8], "I32") for x in tensors]
    checkpoint_dir("ckpt_int_weight", "weights", "tensor 'model.norm.weight' in {dir} has dtype I32; weights must be",
                   {"config.json": TINY_CONFIG, "model.safetensors": safetensors_bytes(ints)})

    # --- config.json files -----------------------------------------------------------------------------------
    def config(name, expect, **changes):
        c = dict(TINY_CONFIG)
        for k, v in changes.items():
            if v is None:
                c.pop(k, None)
            else:
                c[k] = v
        with open(os.path.join(HERE, name), "w") as f:
            json.dump(c, f, indent=1)
        expected.append((name, "config", expect))

    config("config_unknown_model_type.json",
           "unsupported model_type 'gemma' (supported: qwen3, qwen2, llama, mistral)", model_type="gemma")
    config("config_moe.json", "\"num_local_experts\" = 8: mixture-of-experts layers are not supported",
           model_type="mistral", num_local_experts=8, num_experts_per_tok=2)
    config("config_quantized.json", "\"quantization_config\" (quant_method \"awq\"): quantized checkpoints are not "
           "supported", quantization_config={"quant_method": "awq", "bits": 4})
    config("config_partial_rotary.json", "unsupported partial_rotary_factor 0.5", partial_rotary_factor=0.5)
    config("config_missing_model_type.json", "missing required field \"model_type\"", model_type=None)
    config("config_missing_field.json", "missing required field \"hidden_size\"", hidden_size=None)
    config("config_heads_not_divisible.json", "num_attention_heads 6 is not divisible by num_key_value_heads 4",
           num_attention_heads=6, num_key_value_heads=4)
    config("config_negative_size.json", "\"intermediate_size\" = -12 must be positive", intermediate_size=-12)
    config("config_string_size.json", "\"vocab_size\" must be an integer", vocab_size="16")
    config("config_odd_head_dim.json", "head_dim 5 must be positive and even", head_dim=5)
    config("config_bad_rope_type.json", "unsupported rope type 'yarn'", model_type="llama",
           rope_scaling={"rope_type": "yarn", "factor": 4.0})
    config("config_llama3_missing_factor.json", "missing required field \"low_freq_factor\"", model_type="llama",
           rope_scaling={"rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 8192})
    config("config_eos_out_of_range.json", "eos_token_id 99 must be an integer in [0, vocab_size 16)",
           eos_token_id=[1, 99])
    config("config_sliding_window.json", "unsupported \"layer_types\"[0] = \"linear_attention\"",
           model_type="qwen2", use_sliding_window=True, sliding_window=8, layer_types=["linear_attention"])
    config("config_sliding_window_zero.json", "\"sliding_window\" = 0 must be positive", model_type="mistral",
           sliding_window=0)
    with open(os.path.join(HERE, "config_not_json.json"), "w") as f:
        f.write('{"model_type": "qwen3",')
    expected.append(("config_not_json.json", "config", "not valid JSON"))

    with open(os.path.join(HERE, "EXPECTED.tsv"), "w") as f:
        f.write("# path\tkind\tsubstring of the kvq::Error message ({dir} = the checkpoint directory). "
                "Generated by make_malformed.py\n")
        for path, kind, expect in expected:
            f.write(f"{path}\t{kind}\t{expect}\n")


if __name__ == "__main__":
    main()
