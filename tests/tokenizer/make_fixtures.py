#!/usr/bin/env python3
"""Writes the small hand-designed tokenizer.json fixtures of tests/test_tokenizer.cpp (run from anywhere).

basic.json         Qwen2 Split regex + ByteLevel, a few merges ("a b" strings), 3 special tokens
basic_pairs.json   the same with merges as [a, b] pairs
ignore_merges.json basic + token "xyz" that merges cannot reach, ignore_merges = true
added_flags.json   basic + added tokens with single_word / lstrip / rstrip / normalized = true
nfc.json           basic with an NFC normalizer
gpt2.json          a plain ByteLevel(use_regex = true, add_prefix_space = false) pre-tokenizer
err_*.json         one unsupported or broken component each (err_bad_json.json is written by hand)
Ids: special tokens 0..2, then the 256 byte tokens in byte order (byte b -> id 3 + b), then merged tokens.
"""
import copy
import json
import os

QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"),
          ("Ġwor", "l"), ("Ġworl", "d"), ("Ġ", "Ġ"), ("a", "a"), ("aa", "aa"), ("Ċ", "Ċ")]


def added(content, id_, special=True, normalized=False, **flags):
    return {"id": id_, "content": content, "single_word": flags.get("single_word", False),
            "lstrip": flags.get("lstrip", False), "rstrip": flags.get("rstrip", False),
            "normalized": normalized, "special": special}


def base():
    vocab = {s: i for i, s in enumerate(SPECIALS)}
    for b in range(256):
        vocab[B2U[b]] = 3 + b
    for a, b in MERGES:
        vocab[a + b] = len(vocab)
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(s, i) for i, s in enumerate(SPECIALS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b in MERGES]},
    }


def main():
    out = os.path.dirname(os.path.abspath(__file__))
    files = {"basic.json": base()}
    t = base()
    t["model"]["merges"] = [[a, b] for a, b in MERGES]
    files["basic_pairs.json"] = t
    t = base()
    v = t["model"]["vocab"]
    for tok in ("yz", "xy", "xyz"):
        v[tok] = len(v)
    # "y z" ranks before "x y", so BPE turns "xyz" into [x, yz] and "xy z" never applies; the token "xyz"
    # is only reachable through ignore_merges.
    t["model"]["merges"] += ["y z", "x y", "xy z"]
    t["model"]["ignore_merges"] = True
    files["ignore_merges.json"] = t
    t = base()
    n = len(t["model"]["vocab"])
    t["added_tokens"] += [added("[MASK]", n, special=False, normalized=True, single_word=True),
                          added("<tool>", n + 1, special=False, normalized=True, lstrip=True, rstrip=True),
                          added("café", n + 2, special=False, normalized=True)]
    files["added_flags.json"] = t
    t = copy.deepcopy(files["added_flags.json"])
    t["normalizer"] = {"type": "NFC"}
    files["nfc.json"] = t
    t = base()
    t["pre_tokenizer"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    files["gpt2.json"] = t
    # Error cases: each must be rejected with a kvq::Error naming the offending component.
    t = base()
    t["model"]["type"] = "WordPiece"
    files["err_model_type.json"] = t
    t = base()
    t["model"]["merges"].append("q zz")  # "zz" is not in the vocab
    files["err_merge_missing_token.json"] = t
    t = base()
    t["model"]["merges"].append("z z")  # "zz", the merged token, is not in the vocab
    files["err_merge_result_missing.json"] = t
    t = base()
    t["normalizer"] = {"type": "Lowercase"}
    files["err_normalizer.json"] = t
    t = base()
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    files["err_pre_tokenizer.json"] = t
    t = base()
    t["decoder"] = {"type": "WordPiece", "prefix": "##", "cleanup": True}
    files["err_decoder.json"] = t
    t = base()
    t["model"]["byte_fallback"] = True
    files["err_byte_fallback.json"] = t
    for name, tok in files.items():
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            json.dump(tok, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main()
