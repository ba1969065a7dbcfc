#!/usr/bin/env python3
"""Evaluate the reference model and write the golden outputs kvq's C++ tests compare against.

Run on the GPU machine after scripts/train_reference.py:
  python3 scripts/make_golden.py --model models/ref --eval-dir data/eval --golden tests/golden

Writes
  tests/golden/golden.safetensors   per prompt i: p{i}.ids, p{i}.positions, p{i}.logits (HF transformers,
                                    float32), p{i}.greedy (64 greedy tokens from HF)
  tests/golden/golden.json          prompts, shapes, and the max |delta logit| between kvq's training
                                    implementation and transformers' Qwen3ForCausalLM on the same files
  tests/golden/tokenizer_cases.json tricky strings and their Hugging Face tokenizers ids
  models/ref/eval_metrics.json      BF16 held-out ppl per domain and passkey accuracy at 2K/4K/8K
  models/ref/loss_curve.svg         training loss curve
"""
import argparse
import json
import math
import os
import random

import torch
import torch.nn.functional as F

from qwen3_torch import PASSKEY, load_checkpoint, passkey_parts

PROMPTS = [
    "The Linux kernel uses a buddy allocator to manage physical memory pages.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "SELECT name, count(*) FROM pg_stat_activity GROUP BY name;\n\nThe query above",
]
N_FIRST_LOGITS = 6      # logits of the first positions of every prompt ...
N_GREEDY = 64           # ... and a greedy continuation of this many tokens
LONG_PROMPT_TOKENS = 1100  # one long prompt (eval text) crosses pages and prefill chunks

TOKENIZER_CASES = [
    "Hello, world!", "  leading and trailing spaces  ", "tabs\tand\nnewlines\r\n\n\nruns",
    "naïve café résumé", "Ünïcödé ÄÖÜ ß", "日本語のテキスト", "中文分词测试", "Здравствуй, мир",
    "emoji 😀🚀👍🏽 and 👨‍👩‍👧‍👦", "digits 1234567890 and 3.14159 and 1e-5", "x = a**2 + b**2  # comment",
    "    def f(self):\n        return {'a': [1, 2, 3]}", "I'm, you're, they've, he'd, we'll, it's",
    "HELLO'S WORLD'LL", "<|endoftext|>", "text<|endoftext|>more", "   ", "\n\n\n", "a" * 50,
    "$ sudo apt-get install -y linux-doc-6.1 && echo ok", "tab\t\ttab", "mixed 中文 and English 123",
    "🙂", "\u00a0non-breaking\u00a0space", "zero\u200bwidth", "",
]


@torch.no_grad()
def hf_logits(hf, ids):
    return hf(torch.tensor([ids], device=hf.device)).logits[0].float()


@torch.no_grad()
def greedy(forward, ids, n):
    ids = list(ids)
    out = []
    for _ in range(n):
        nxt = int(forward(ids)[-1].argmax())
        out.append(nxt)
        ids.append(nxt)
    return out


@torch.no_grad()
def eval_ppl(model, ids, ctx, device):
    """Perplexity over non-overlapping windows of ctx tokens (every token but each window's first is scored)."""
    nll, count = 0.0, 0
    for start in range(0, len(ids) - ctx + 1, ctx):
        x = torch.tensor([ids[start:start + ctx]], device=device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        nll += F.cross_entropy(logits[0, :-1].float(), x[0, 1:], reduction="sum").item()
        count += ctx - 1
    return math.exp(nll / count), count


@torch.no_grad()
def eval_passkey(model, tok, hay, ctx, depths, trials, device, seed):
    rng = random.Random(seed)
    correct, total = 0, 0
    by_depth = {}
    for depth in depths:
        ok = 0
        for _ in range(trials):
            key = rng.randint(*PASSKEY["key_range"])
            needle, question, answer = passkey_parts(tok, key)
            n_hay = ctx - len(needle) - len(question) - len(answer)
            start = rng.randint(0, len(hay) - n_hay - 1)
            h = hay[start:start + n_hay]
            pos = round(depth * len(h))
            ids = h[:pos] + needle + h[pos:] + question
            x = torch.tensor([ids], device=device)
            got = []
            for _ in range(len(answer)):
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    nxt = int(model(x)[0, -1].argmax())
                got.append(nxt)
                x = torch.cat([x, torch.tensor([[nxt]], device=device)], dim=1)
            ok += got == answer
        by_depth[f"{depth:.1f}"] = ok / trials
        correct += ok
        total += trials
    return correct / total, by_depth


def loss_svg(curve, path):
    w, h, pad = 640, 360, 48
    xs = [c[0] for c in curve]
    ys = [c[1] for c in curve]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = lambda x: pad + (x - x0) / max(1, x1 - x0) * (w - 2 * pad)  # noqa: E731
    sy = lambda y: h - pad - (y - y0) / max(1e-9, y1 - y0) * (h - 2 * pad)  # noqa: E731
    pts = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in curve)
    ticks = "".join(f'<text x="4" y="{sy(y0 + (y1 - y0) * i / 4):.0f}" font-size="11">{y0 + (y1 - y0) * i / 4:.2f}</text>'
                    for i in range(5))
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}">'
                f'<rect width="{w}" height="{h}" fill="white"/>{ticks}'
                f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{pts}"/>'
                f'<text x="{w / 2 - 60}" y="{h - 12}" font-size="12">training step (0..{x1})</text>'
                f'<text x="{w / 2 - 80}" y="20" font-size="13">reference model: train loss (nats/token)</text></svg>')


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--eval-dir", required=True)
    ap.add_argument("--golden", required=True)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--passkey-trials", type=int, default=10, help="trials per depth per context length")
    args = ap.parse_args()
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM
    from safetensors.torch import save_file

    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    ours, cfg = load_checkpoint(args.model, torch.float32, dev)
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).to(dev).eval()
    os.makedirs(args.golden, exist_ok=True)

    eval_text = {}
    for name in sorted(os.listdir(args.eval_dir)):
        with open(os.path.join(args.eval_dir, name), encoding="utf-8") as f:
            eval_text[name[:-4]] = f.read()

    # --- golden logits and greedy continuations, both implementations ------------------------------
    long_ids = tok.encode(eval_text["linux"]).ids[:LONG_PROMPT_TOKENS]
    prompts = [tok.encode(p).ids for p in PROMPTS] + [long_ids]
    tensors, meta, max_delta = {}, [], 0.0
    for i, ids in enumerate(prompts):
        ref = hf_logits(hf, ids)
        with torch.no_grad():
            mine = ours(torch.tensor([ids], device=dev))[0].float()
        delta = (ref - mine).abs().max().item()
        max_delta = max(max_delta, delta)
        positions = list(range(min(N_FIRST_LOGITS, len(ids))))
        if len(ids) - 1 not in positions:
            positions.append(len(ids) - 1)
        g_hf = greedy(lambda s: hf_logits(hf, s), ids, N_GREEDY)
        g_ours = greedy(lambda s: ours(torch.tensor([s], device=dev))[0], ids, N_GREEDY)
        tensors[f"p{i}.ids"] = torch.tensor(ids, dtype=torch.int32)
        tensors[f"p{i}.positions"] = torch.tensor(positions, dtype=torch.int32)
        tensors[f"p{i}.logits"] = ref[positions].cpu().contiguous()
        tensors[f"p{i}.greedy"] = torch.tensor(g_hf, dtype=torch.int32)
        meta.append({"index": i, "text": PROMPTS[i] if i < len(PROMPTS) else f"data/eval/linux.txt, first {LONG_PROMPT_TOKENS} tokens",
                     "n_tokens": len(ids), "positions": positions, "max_abs_delta_logit_ours_vs_hf": delta,
                     "greedy_identical_ours_vs_hf": g_hf == g_ours,
                     "greedy_text": tok.decode(g_hf)})
        print(f"prompt {i}: {len(ids)} tokens, max |delta logit| {delta:.3e}, greedy equal {g_hf == g_ours}", flush=True)
    save_file(tensors, os.path.join(args.golden, "golden.safetensors"))
    with open(os.path.join(args.golden, "golden.json"), "w") as f:
        json.dump({"generator": "scripts/make_golden.py", "reference": "transformers Qwen3ForCausalLM, float32",
                   "max_abs_delta_logit_ours_vs_hf": max_delta, "n_greedy": N_GREEDY, "prompts": meta}, f, indent=1,
                  ensure_ascii=False)
    cases = [{"text": s, "ids": tok.encode(s).ids} for s in TOKENIZER_CASES]
    with open(os.path.join(args.golden, "tokenizer_cases.json"), "w") as f:
        json.dump({"generator": "Hugging Face tokenizers, models/ref/tokenizer.json", "cases": cases}, f, indent=1,
                  ensure_ascii=False)
    del hf

    # --- held-out BF16 perplexity and passkey ---------------------------------------------------------
    ours_bf16, _ = load_checkpoint(args.model, torch.float32, dev)
    metrics = {"ppl_bf16": {}, "ppl_ctx": args.ctx}
    all_ids = []
    for name, text in eval_text.items():
        ids = tok.encode(text).ids
        all_ids += ids
        ppl, n = eval_ppl(ours_bf16, ids, args.ctx, dev)
        metrics["ppl_bf16"][name] = {"ppl": round(ppl, 3), "tokens_scored": n}
        print(f"ppl {name}: {ppl:.3f} over {n} tokens", flush=True)
    depths = [i / 10 for i in range(11)]
    metrics["passkey"] = {}
    for ctx in (2048, 4096, 8192):
        acc, by_depth = eval_passkey(ours_bf16, tok, all_ids, ctx, depths, args.passkey_trials, dev, seed=ctx)
        metrics["passkey"][str(ctx)] = {"accuracy": acc, "trials": len(depths) * args.passkey_trials,
                                        "by_depth": by_depth}
        print(f"passkey {ctx}: {acc:.3f}", flush=True)
    with open(os.path.join(args.model, "eval_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    train_metrics = os.path.join(args.model, "train_metrics.json")
    if os.path.exists(train_metrics):
        with open(train_metrics) as f:
            loss_svg(json.load(f)["loss_curve"], os.path.join(args.model, "loss_curve.svg"))


if __name__ == "__main__":
    main()
