#!/usr/bin/env python3
"""Train kvq's reference model: a small Qwen3 in the exact Hugging Face file format.

Runs on one GPU (the H200 device machine), end to end, from the corpus train split:
  1. trains a byte-level BPE tokenizer (Qwen2 split regex, no normalizer) and saves tokenizer.json;
  2. tokenizes the train split and mixes in synthetic passkey sequences (needle at every depth);
  3. trains the Qwen3 model (RMSNorm, QK-norm, RoPE, GQA, SwiGLU, tied embeddings) in bf16 autocast;
  4. writes config.json, sharded model.safetensors + index, tokenizer.json and metrics.json to --out.

Evaluation and golden outputs are a separate step: scripts/make_golden.py (same machine, same run).
Reproduce: scripts/build_corpus.py, then on the GPU machine
  python3 scripts/train_reference.py --train-dir build/corpus/train --out models/ref --steps N
with N the step count recorded in models/ref/MODEL_CARD.md (by default the step count is fitted to
--train-seconds after timing the first steps).
"""
import argparse
import glob
import json
import math
import os
import random
import time

import torch
import torch.nn.functional as F

from qwen3_torch import Qwen3, Qwen3Config, PASSKEY, passkey_example, save_hf_checkpoint

# The Qwen2 / Qwen3 pre-tokenizer split pattern, as shipped in their tokenizer.json files.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Hugging Face's ChatML template, written into tokenizer_config.json (kvq serve renders it natively as "chatml").
CHATML_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                   "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                   "{% endif %}")


def train_tokenizer(texts, vocab_size, path):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    tok.save(path)
    return tok


def chunk_text(text, piece=1 << 16):
    """Cut text into ~64 KB pieces on line boundaries so encode_batch can spread them over cores."""
    out, i = [], 0
    while i < len(text):
        j = text.find("\n", i + piece)
        j = len(text) if j < 0 else j + 1
        out.append(text[i:j])
        i = j
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--train-dir", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=384)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=1280)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--rope-theta", type=float, default=1e6)
    ap.add_argument("--batch", type=int, default=32, help="sequences per step")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--passkey-frac", type=float, default=0.15)
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (0: fit to --train-seconds)")
    ap.add_argument("--train-seconds", type=float, default=300)
    ap.add_argument("--tokenizer-mb", type=float, default=24, help="MB of text the BPE trainer sees")
    ap.add_argument("--max-train-mb", type=float, default=0, help="cap on train text (smoke runs)")
    args = ap.parse_args()

    t_start = time.time()
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)

    # --- corpus and tokenizer -------------------------------------------------------------------
    domains = {}
    for path in sorted(glob.glob(os.path.join(args.train_dir, "*.txt"))):
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if args.max_train_mb:
            text = text[: int(args.max_train_mb * 1e6 / 5)]
        domains[os.path.basename(path)[:-4]] = text
    total_bytes = sum(len(t) for t in domains.values())
    # The tokenizer sees an even sample of every domain: pieces taken at a fixed stride.
    sample = []
    for text in domains.values():
        pieces = chunk_text(text)
        keep = max(1, int(len(pieces) * min(1.0, args.tokenizer_mb * 1e6 / total_bytes)))
        stride = max(1, len(pieces) // keep)
        sample += pieces[::stride]
    tok = train_tokenizer(sample, args.vocab, os.path.join(args.out, "tokenizer.json"))
    eos_id = tok.token_to_id("<|endoftext|>")
    print(f"[{time.time() - t_start:6.1f}s] tokenizer trained on {sum(map(len, sample)) / 1e6:.1f} MB", flush=True)

    streams = []
    for name, text in domains.items():
        ids = []
        for enc in tok.encode_batch(chunk_text(text)):
            ids.extend(enc.ids)
        streams.append(torch.tensor(ids, dtype=torch.int32))
        print(f"  {name}: {len(text) / 1e6:.1f} MB -> {len(ids) / 1e6:.2f} M tokens", flush=True)
    stream = torch.cat(streams)
    n_tokens = stream.numel()
    print(f"[{time.time() - t_start:6.1f}s] tokenized: {n_tokens / 1e6:.1f} M tokens, "
          f"{total_bytes / n_tokens:.2f} bytes/token", flush=True)

    # --- model ----------------------------------------------------------------------------------
    cfg = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads,
                      num_key_value_heads=args.kv_heads, head_dim=128, max_position_embeddings=args.ctx,
                      rope_theta=args.rope_theta, eos_token_id=eos_id)
    dev = torch.device("cuda")
    model = Qwen3(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params / 1e6:.2f} M parameters", flush=True)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    cmodel = torch.compile(model)
    gen = torch.Generator().manual_seed(args.seed)
    row = args.ctx + 1
    stream_dev = stream.to(dev)

    def text_row():
        start = int(torch.randint(0, n_tokens - row, (1,), generator=gen))
        return stream_dev[start:start + row]

    def passkey_depth():
        # Needle depths: uniform, with extra mass at the two ends (a needle at position 0 of the sequence is
        # otherwise almost never seen and is the hardest case at 8K).
        u = float(torch.rand((1,), generator=gen))
        return 0.0 if u < 0.15 else 1.0 if u < 0.2 else float(torch.rand((1,), generator=gen))

    def passkey_row():
        # Half the passkey rows are one sequence of the full context; the rest pack sequences of random lengths.
        parts, used = [], 0
        single = float(torch.rand((1,), generator=gen)) < 0.5
        while row - used >= 128:
            length = row if single else int(torch.randint(256, row + 1, (1,), generator=gen))
            length = min(length, row - used)
            start = int(torch.randint(0, n_tokens - length, (1,), generator=gen))
            key = int(torch.randint(10000, 100000, (1,), generator=gen))
            depth = passkey_depth()
            ids = passkey_example(tok, stream[start:start + length].tolist(), length, key, depth, eos_id)
            parts.append(torch.tensor(ids, dtype=torch.int32))
            used += len(ids)
        if used < row:
            parts.append(text_row()[: row - used].cpu())
        return torch.cat(parts).to(dev)

    def batch():
        rows = [passkey_row() if float(torch.rand((1,), generator=gen)) < args.passkey_frac else text_row()
                for _ in range(args.batch)]
        b = torch.stack(rows).long()
        return b[:, :-1], b[:, 1:]

    def lr_at(step, total):
        warm = max(1, min(100, total // 10))
        if step < warm:
            return args.lr * (step + 1) / warm
        progress = (step - warm) / max(1, total - warm)
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))

    total_steps = args.steps if args.steps else 10_000
    losses, step, t_train = [], 0, None
    model.train()
    while step < total_steps:
        if step == 10:
            torch.cuda.synchronize()
            t_train = time.time()
        if step == 30 and not args.steps:
            torch.cuda.synchronize()
            per_step = (time.time() - t_train) / 20
            total_steps = max(40, int(args.train_seconds / per_step))
            print(f"[{time.time() - t_start:6.1f}s] {per_step * 1000:.0f} ms/step, "
                  f"{args.batch * args.ctx / per_step / 1e6:.2f} M tok/s -> {total_steps} steps", flush=True)
        for g in opt.param_groups:
            g["lr"] = lr_at(step, total_steps)
        x, y = batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = cmodel(x)
        loss = F.cross_entropy(logits.float().view(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item() if step % 10 == 0 or step == total_steps - 1 else None)
        if step % 50 == 0:
            print(f"[{time.time() - t_start:6.1f}s] step {step}/{total_steps} loss {loss.item():.4f}", flush=True)
        step += 1
    torch.cuda.synchronize()
    train_seconds = time.time() - (t_train or t_start)

    save_hf_checkpoint(model, cfg, args.out, n_shards=3)
    with open(os.path.join(args.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                   "pad_token": "<|endoftext|>", "model_max_length": args.ctx,
                   "chat_template": CHATML_TEMPLATE}, f, indent=2)
    metrics = {
        "recipe": {k: v for k, v in vars(args).items()},
        "steps": total_steps, "tokens_seen": total_steps * args.batch * args.ctx,
        "train_seconds": round(train_seconds, 1), "parameters": n_params, "train_tokens": n_tokens,
        "bytes_per_token": round(total_bytes / n_tokens, 3),
        "loss_curve": [[i, l] for i, l in enumerate(losses) if l is not None],
        "passkey_format": PASSKEY,
    }
    with open(os.path.join(args.out, "train_metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"[{time.time() - t_start:6.1f}s] saved to {args.out}: {total_steps} steps, final loss {losses[-1]:.4f}",
          flush=True)


if __name__ == "__main__":
    main()
