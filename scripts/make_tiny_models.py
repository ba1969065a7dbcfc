#!/usr/bin/env python3
"""Tiny random checkpoints of every architecture kvq loads, with golden outputs from Hugging Face transformers.

Run once on the GPU machine (transformers, torch, safetensors, tokenizers; fp32 on its GPU, or the CPU):
  python3 scripts/make_tiny_models.py --out tests/models

For each model, tests/models/<name>/ gets
  config.json            written as the Hub's checkpoints of that family write theirs (rope_scaling, torch_dtype, ...)
  model.safetensors      random weights (seeded), stored in bfloat16 as downloaded checkpoints are
  tokenizer.json         models/ref's byte-level BPE cut to the model's 512 ids (its first merges), so run and serve work
  tokenizer_config.json  models/ref's (chat template included)
  golden.safetensors     per prompt i: p{i}.ids (int32), p{i}.rows (int32: its first and last 8 positions) and
                         p{i}.logits (float32, those rows; transformers' eager attention in float32 on the bf16
                         weights), p{i}.greedy (int32, 24 greedy tokens) and p{i}.margin (float32, each greedy step's
                         top-1 minus top-2 logit)
and tests/models/MANIFEST.json lists them with what each checks.
"""
import argparse
import json
import os
import shutil

import torch
from safetensors.torch import save_file

VOCAB = 512
N_GREEDY = 24

# name: (transformers config class, config.json fields beyond the common ones, what it checks)
COMMON = {"vocab_size": VOCAB, "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "initializer_range": 0.08,
          "hidden_act": "silu", "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 0,
          "torch_dtype": "bfloat16", "use_cache": True}
MODELS = {
    "llama3-d64": ("LlamaForCausalLM", "llama", {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 64, "rope_theta": 500000.0, "tie_word_embeddings": True,
        "max_position_embeddings": 131072,
        "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"}},
        "Llama 3.2: llama3 RoPE scaling, tied embeddings, head_dim 64, GQA 4/2"),
    "qwen2.5-d64": ("Qwen2ForCausalLM", "qwen2", {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 1,
        "num_key_value_heads": 1, "rope_theta": 1000000.0, "tie_word_embeddings": False, "use_sliding_window": False,
        "sliding_window": 32768, "max_window_layers": 2, "rope_scaling": None},
        "Qwen2.5: q/k/v biases, untied lm_head, head_dim 64 from hidden / heads"),
    "qwen3-d128": ("Qwen3ForCausalLM", "qwen3", {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 128, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
        "rope_scaling": None},
        "Qwen3: QK-norm, head_dim 128"),
    "qwen3-d256": ("Qwen3ForCausalLM", "qwen3", {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 256, "rope_theta": 1000000.0, "tie_word_embeddings": True,
        "attention_bias": False, "use_sliding_window": False, "sliding_window": None, "max_window_layers": 2,
        "rope_scaling": None},
        "Qwen3: QK-norm, head_dim 256 (Gemma's width), MQA, heads wider than the hidden size"),
    "mistral-d64-sw": ("MistralForCausalLM", "mistral", {
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 64, "rope_theta": 1000000.0, "tie_word_embeddings": False,
        "sliding_window": 24},
        "Mistral: sliding-window attention (24 positions, the prompts run past it), head_dim 64"),
    "llama-d96": ("LlamaForCausalLM", "llama", {
        "hidden_size": 96, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 1,
        "num_key_value_heads": 1, "rope_theta": 10000.0, "tie_word_embeddings": False, "attention_bias": False,
        "mlp_bias": False, "rope_scaling": None},
        "Llama with head_dim 96 (Phi-3's width) from hidden / heads, default RoPE"),
    "llama-d80": ("LlamaForCausalLM", "llama", {
        "hidden_size": 80, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 1,
        "num_key_value_heads": 1, "rope_theta": 10000.0, "tie_word_embeddings": True, "attention_bias": False,
        "mlp_bias": False, "rope_scaling": None},
        "Llama with head_dim 80 (StableLM's width) from hidden / heads"),
}
PROMPT_LENGTHS = (7, 33, 80)  # the 80-token prompt crosses the Mistral window and a 64-token page


def cut_tokenizer(src, vocab):
    """models/ref's tokenizer.json with the ids below `vocab` and the merges that make them."""
    t = json.load(open(src))
    v = {s: i for s, i in t["model"]["vocab"].items() if i < vocab}
    merges = []
    for m in t["model"]["merges"]:
        a, b = m if isinstance(m, list) else m.split(" ")
        if a in v and b in v and a + b in v:
            merges.append(m)
    t["model"]["vocab"] = v
    t["model"]["merges"] = merges
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < vocab]
    return t


@torch.no_grad()
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/models")
    ap.add_argument("--ref", default="models/ref")
    args = ap.parse_args()
    import transformers
    from tokenizers import Tokenizer

    # fp32 on the GPU when there is one (TF32 off: the goldens are fp32 maths), else the CPU
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tok_json = cut_tokenizer(os.path.join(args.ref, "tokenizer.json"), VOCAB)
    manifest = {"transformers": transformers.__version__, "torch": torch.__version__, "models": {}}
    for seed, (name, (arch, model_type, fields, what)) in enumerate(MODELS.items()):
        d = os.path.join(args.out, name)
        os.makedirs(d, exist_ok=True)
        cfg = dict(COMMON, **fields, model_type=model_type, architectures=[arch])
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        json.dump(tok_json, open(os.path.join(d, "tokenizer.json"), "w"), ensure_ascii=False)
        shutil.copy(os.path.join(args.ref, "tokenizer_config.json"), os.path.join(d, "tokenizer_config.json"))
        Tokenizer.from_file(os.path.join(d, "tokenizer.json")).encode("checks that the cut tokenizer loads")

        torch.manual_seed(1000 + seed)
        config = transformers.AutoConfig.from_pretrained(d)
        # eager attention: the sliding window's mask as transformers itself defines it
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").float().eval()
        model.to(dev)
        # RMSNorm weights start at 1: give them spread, so a wrong norm cannot pass
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif n.endswith(".bias"):
                p.copy_(0.05 * torch.randn_like(p))
        # stored in bf16, the goldens computed in fp32 on the stored (rounded) weights
        state = {k: v.to(torch.bfloat16).cpu().contiguous() for k, v in model.state_dict().items()}
        if config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
        model.load_state_dict({k: v.float().to(dev) for k, v in state.items()}, strict=not config.tie_word_embeddings)
        if config.tie_word_embeddings:
            model.tie_weights()

        g = torch.Generator().manual_seed(2000 + seed)
        golden = {}
        for i, n in enumerate(PROMPT_LENGTHS):
            ids = torch.randint(3, VOCAB, (n,), generator=g)
            logits = model(ids[None].to(dev)).logits[0].float().cpu()
            seq, greedy, margin = ids.tolist(), [], []
            for _ in range(N_GREEDY):  # a full forward per step: no cache, the same maths as the logits above
                last = model(torch.tensor([seq], device=dev)).logits[0, -1].float()
                top = torch.topk(last, 2)
                greedy.append(int(top.indices[0]))
                margin.append(float(top.values[0] - top.values[1]))
                seq.append(greedy[-1])
            golden[f"p{i}.ids"] = ids.to(torch.int32)
            rows = sorted(set(range(min(8, n))) | set(range(max(0, n - 8), n)))
            golden[f"p{i}.rows"] = torch.tensor(rows, dtype=torch.int32)
            golden[f"p{i}.logits"] = logits[rows].contiguous()
            golden[f"p{i}.greedy"] = torch.tensor(greedy, dtype=torch.int32)
            golden[f"p{i}.margin"] = torch.tensor(margin, dtype=torch.float32)
        save_file(golden, os.path.join(d, "golden.safetensors"))
        params = sum(v.numel() for v in state.values())
        manifest["models"][name] = {"architecture": arch, "checks": what, "parameters": params,
                                    "prompts": list(PROMPT_LENGTHS), "greedy": N_GREEDY,
                                    "logit_std": float(golden["p2.logits"].std())}
        print(f"{name}: {arch}, {params} parameters, logits std {manifest['models'][name]['logit_std']:.3f}, "
              f"smallest greedy margin {min(float(golden[f'p{i}.margin'].min()) for i in range(3)):.4f}")
    json.dump(manifest, open(os.path.join(args.out, "MANIFEST.json"), "w"), indent=2)


if __name__ == "__main__":
    main()
