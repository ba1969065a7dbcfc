#!/usr/bin/env python3
"""Decode-step attention with PyTorch scaled_dot_product_attention (bf16), the reference point for
`kvq bench attention --device cuda`: q [B, 32, 1, 128], k / v [B, 8, ctx, 128], GQA, over the same
batch x ctx grid. Forces the flash backend when torch.nn.attention.sdpa_kernel exists (falls back to the
default backend with a note). Times with CUDA events (warm-up, then the median of --iters calls).

  python3 scripts/bench_sdpa.py [--batch 1,8,32,64] [--ctx 4096,16384,65536,131072] [--json out.json]
"""
import argparse
import contextlib
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def ints(s):
    return [int(x) for x in s.split(",") if x]


def backend_context(note):
    """A factory of context managers forcing the flash backend (a context manager is single-use)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return (lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])), "flash"
    except Exception as e:  # older torch
        note.append(f"torch.nn.attention.sdpa_kernel unavailable ({e}); default SDPA backend")
        return contextlib.nullcontext, "default"


def sdpa(q, k, v, gqa):
    if gqa:
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1))


def time_us(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=ints, default=[1, 8, 32, 64])
    ap.add_argument("--ctx", type=ints, default=[4096, 16384, 65536, 131072])
    ap.add_argument("--q-heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", help="write the records to this file")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_sdpa.py: no CUDA device")
    dev = torch.device("cuda")
    note = []
    ctx_mgr, backend = backend_context(note)
    # enable_gqa arrived in torch 2.5; expand the kv heads before that.
    gqa = "enable_gqa" in (F.scaled_dot_product_attention.__doc__ or "")
    if not gqa:
        note.append("enable_gqa unavailable: k / v expanded to the query heads (extra copies, timed)")
    for n in note:
        print("note:", n, file=sys.stderr)
    print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | backend {backend} | "
          f"q-heads {a.q_heads} kv-heads {a.kv_heads} d {a.head_dim} | median of {a.iters}")
    print(f"{'batch':>6} {'ctx':>7} {'us':>10} {'MB read':>12} {'TB/s':>7}")
    records = []
    for B in a.batch:
        for ctx in a.ctx:
            need = 2 * B * a.kv_heads * ctx * a.head_dim * 2
            free, _ = torch.cuda.mem_get_info()
            if need * 1.1 > free:
                print(f"note: skipping batch {B} ctx {ctx}: needs {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free",
                      file=sys.stderr)
                continue
            q = torch.randn(B, a.q_heads, 1, a.head_dim, device=dev, dtype=torch.bfloat16)
            k = torch.randn(B, a.kv_heads, ctx, a.head_dim, device=dev, dtype=torch.bfloat16)
            v = torch.randn_like(k)
            try:
                with ctx_mgr():
                    us = time_us(lambda: sdpa(q, k, v, gqa), a.iters)
                used = backend
            except RuntimeError as e:  # the flash backend refused this shape
                print(f"note: batch {B} ctx {ctx}: {backend} backend failed ({e}); default backend", file=sys.stderr)
                us = time_us(lambda: sdpa(q, k, v, gqa), a.iters)
                used = "default"
            tbps = need / (us * 1e-6) / 1e12
            print(f"{B:6d} {ctx:7d} {us:10.1f} {need / 1e6:12.2f} {tbps:7.3f}")
            records.append({"batch": B, "ctx": ctx, "type_k": "bf16", "type_v": "bf16", "us": us,
                            "bytes_read": need, "tbps": tbps, "backend": used, "torch": torch.__version__})
            del q, k, v
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    main()
