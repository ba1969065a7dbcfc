"""kvq's own PyTorch Qwen3: the training implementation of the reference model.

Parameter names equal Hugging Face's Qwen3ForCausalLM names, so save_hf_checkpoint writes files that
transformers loads unchanged. Also defines the passkey format shared by training, the model card and kvq's
C++ passkey generator (keep them in sync: src/eval documents the same strings).
"""
import json
import math
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

# Passkey / needle-in-a-haystack format. A sequence of `length` tokens is
#   hay[:pos] + NEEDLE + hay[pos:] + QUESTION + ANSWER + <|endoftext|>
# with pos = round(depth * n_hay); retrieval is scored by greedy decoding len(ANSWER) tokens after QUESTION.
PASSKEY = {
    "needle": " The pass key is {key}. Remember it. {key} is the pass key. ",
    "question": " What is the pass key? The pass key is",
    "answer": " {key}",
    "key_range": [10000, 99999],
}


def passkey_parts(tok, key):
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    return (enc(PASSKEY["needle"].format(key=key)), enc(PASSKEY["question"]),
            enc(PASSKEY["answer"].format(key=key)))


def passkey_example(tok, hay, length, key, depth, eos_id):
    """Token ids of one passkey sequence of exactly `length` tokens (answer and EOS included)."""
    needle, question, answer = passkey_parts(tok, key)
    n_hay = length - len(needle) - len(question) - len(answer) - 1
    hay = hay[:max(0, n_hay)]
    pos = round(depth * len(hay))
    return hay[:pos] + needle + hay[pos:] + question + answer + [eos_id]


@dataclass
class Qwen3Config:
    vocab_size: int = 8192
    hidden_size: int = 384
    intermediate_size: int = 1280
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 128
    max_position_embeddings: int = 8192
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    eos_token_id: int = 0

    def hf_dict(self):
        d = asdict(self)
        d.update({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
                  "tie_word_embeddings": True, "attention_bias": False, "attention_dropout": 0.0,
                  "use_sliding_window": False, "sliding_window": None, "max_window_layers": d["num_hidden_layers"],
                  "rope_scaling": None, "bos_token_id": d["eos_token_id"], "initializer_range": 0.02,
                  "use_cache": True, "torch_dtype": "bfloat16"})
        return d


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(cfg, n_pos, device):
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    freqs = torch.arange(n_pos, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d, hq, hk = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        self.q_proj = nn.Linear(cfg.hidden_size, hq * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, hk * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, hk * d, bias=False)
        self.o_proj = nn.Linear(hq * d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(d, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(d, cfg.rms_norm_eps)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        c = self.cfg
        d, hq, hk = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        q = self.q_norm(self.q_proj(x).view(B, T, hq, d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, hk, d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, hk, d).transpose(1, 2)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        g = hq // hk
        k = k.repeat_interleave(g, dim=1)
        v = v.repeat_interleave(g, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(d))
        return self.o_proj(y.transpose(1, 2).reshape(B, T, hq * d))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Qwen3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = Body(cfg)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        cos, sin = rope_cos_sin(self.cfg, ids.shape[1], ids.device)
        x = self.model.embed_tokens(ids)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return x @ self.model.embed_tokens.weight.t().to(x.dtype)


def save_hf_checkpoint(model, cfg, out, n_shards):
    """config.json + model-0000i-of-0000n.safetensors (bf16) + model.safetensors.index.json."""
    from safetensors.torch import save_file
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg.hf_dict(), f, indent=2)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous().cpu() for k, v in model.state_dict().items()}
    total = sum(t.numel() * 2 for t in tensors.values())
    shards, cur, cur_bytes = [], {}, 0
    for name, t in tensors.items():
        if cur and cur_bytes + t.numel() * 2 > total / n_shards * 1.05 and len(shards) < n_shards - 1:
            shards.append(cur)
            cur, cur_bytes = {}, 0
        cur[name] = t
        cur_bytes += t.numel() * 2
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def load_checkpoint(model_dir, dtype=torch.float32, device="cpu"):
    from safetensors.torch import load_file
    with open(os.path.join(model_dir, "config.json")) as f:
        hf = json.load(f)
    fields = Qwen3Config.__dataclass_fields__
    cfg = Qwen3Config(**{k: v for k, v in hf.items() if k in fields})
    model = Qwen3(cfg)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for fname in files:
        state.update(load_file(os.path.join(model_dir, fname)))
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()})
    return model.to(device=device, dtype=dtype).eval(), cfg
