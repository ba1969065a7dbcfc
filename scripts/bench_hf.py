#!/usr/bin/env python3
"""The standard stack beside `kvq bench decode --dummy-weights`: PyTorch + transformers on the same shape, batch
and context, with random weights and nothing downloaded. Timing only.

  python3 scripts/bench_hf.py -m models/shapes/qwen3-8b --ctx 8192,32768 --seqs 8,64 [--cache static|dynamic]

What it runs, per (ctx, seqs), printing one JSON line each on stdout (notes on stderr):
  - the model: AutoModelForCausalLM.from_config(config.json) on the GPU in bf16, attn_implementation "sdpa", random
    weights from transformers' own init (linears and embeddings N(0, initializer_range^2), norms 1) - the
    distribution kvq's --dummy-weights reproduces; eager PyTorch (no torch.compile).
  - prefill: --prefill-seqs sequences of ctx random tokens, one at a time (batch 1, as kvq bench decode prefills),
    through the decoder stack into a DynamicCache, no logits (kvq computes none in prefill either); the SDPA flash
    backend is forced (torch.nn.attention.sdpa_kernel) and the JSON says so, or says why it could not be.
  - decode: a batch of `seqs` sequences over a cache holding ctx random keys and values per sequence (the values do
    not change the time; prefilling seqs x ctx tokens first would only cost device time), then --warmup untimed
    and --n-decode timed greedy steps (each sequence feeds back its argmax), ms/step = wall time / steps after a
    synchronize. --cache static (default): a StaticCache of ctx + warmup + n-decode slots, written in place, with
    SDPA's default backend under its mask; --cache dynamic: transformers' default DynamicCache, which concatenates
    every step (copying the cache). The JSON's "cache" field names the one used.
A shape whose cache does not fit the free memory is reported as skipped.
"""
import argparse
import contextlib
import inspect
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local config.json; never reach the network


def fail(msg):
    sys.exit(f"bench_hf.py: error: {msg}")


try:
    import torch
except ImportError as e:
    fail(f"PyTorch is not installed ({e})")
if not torch.cuda.is_available():
    fail("no CUDA device (torch.cuda.is_available() is False): this benchmark times the GPU")
try:
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, StaticCache
except ImportError as e:
    fail(f"transformers is not installed or too old for DynamicCache / StaticCache ({e})")


def ints(s):
    try:
        v = [int(x) for x in s.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a comma-separated list of integers")
    if not v or min(v) < 1:
        raise argparse.ArgumentTypeError(f"'{s}': give positive integers")
    return v


def flash_context():
    """A factory of context managers forcing SDPA's flash backend (a context manager is single-use)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return lambda: sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def build_model(model_dir, seed):
    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)  # parameters are created in bf16 ...
    with torch.device("cuda"):               # ... on the GPU, and initialised there by transformers
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    torch.set_default_dtype(torch.float32)
    model = model.to("cuda").eval()
    if next(model.parameters()).dtype != torch.bfloat16:  # a cast would also round fp32 buffers (RoPE): only if needed
        model = model.to(torch.bfloat16)
    return config, model


def init_std(model):
    """Std of layer 0's q_proj: transformers' init must have run (initializer_range), not left memory uninitialised."""
    for name, p in model.named_parameters():
        if name.endswith("layers.0.self_attn.q_proj.weight"):
            return float(p.float().std())
    return float("nan")


def head_dim_of(config):
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def kv_bytes(config, seqs, tokens):
    return 2 * config.num_hidden_layers * seqs * config.num_key_value_heads * tokens * head_dim_of(config) * 2


def time_prefill(model, config, ctx, n_seqs, gen):
    """Tokens/s of n_seqs batch-1 prefills of ctx tokens (after a short warm-up), and the SDPA backend used."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    flash = flash_context()

    def prefill(n):
        ids = torch.randint(0, config.vocab_size, (1, n), device="cuda", generator=gen)
        cache = DynamicCache()
        decoder(input_ids=ids, past_key_values=cache, use_cache=True)
        return cache

    backend, attention = "flash (forced)", flash
    try:
        with torch.inference_mode(), attention():
            prefill(min(ctx, 1024))  # warm-up
    except RuntimeError as e:  # SDPA refused flash for this model's attention call: say so, run its default
        backend = f"default (flash refused: {str(e).splitlines()[0][:160]})"
        attention = contextlib.nullcontext
        print(f"note: prefill: {backend}", file=sys.stderr)
        with torch.inference_mode():
            prefill(min(ctx, 1024))
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n_seqs):
        with torch.inference_mode(), attention():
            cache = prefill(ctx)
        torch.cuda.synchronize()
        del cache
    seconds = time.perf_counter() - t0
    torch.cuda.empty_cache()
    return n_seqs * ctx / seconds, backend


def filled_cache(kind, config, seqs, ctx, max_len, gen):
    """A cache holding ctx random keys and values for each of seqs sequences (Cache.update, layer by layer)."""
    if kind == "static":
        try:
            cache = StaticCache(config=config, max_cache_len=max_len)
        except TypeError as e:
            fail(f"StaticCache(config=, max_cache_len=) is not this transformers' signature ({e}); try --cache dynamic")
    else:
        cache = DynamicCache()
    pos = torch.arange(ctx, device="cuda")
    shape = (seqs, config.num_key_value_heads, ctx, head_dim_of(config))
    for layer in range(config.num_hidden_layers):
        k = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=gen)
        cache.update(k, v, layer, {"cache_position": pos})
        del k, v
    return cache


def time_decode(model, config, kind, seqs, ctx, warmup, n_decode, gen):
    """Milliseconds of one batched greedy decode step of seqs sequences at ctx."""
    cache = filled_cache(kind, config, seqs, ctx, ctx + warmup + n_decode, gen)
    takes_position = "cache_position" in inspect.signature(model.forward).parameters
    ids = torch.randint(0, config.vocab_size, (seqs, 1), device="cuda", generator=gen)
    pos = ctx

    def step():
        nonlocal ids, pos
        extra = {"cache_position": torch.tensor([pos], device="cuda")} if takes_position else {}
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, **extra)
        ids = out.logits[:, -1].argmax(-1, keepdim=True)
        pos += 1

    with torch.inference_mode():
        for _ in range(warmup):
            step()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n_decode):
            step()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    del cache
    torch.cuda.empty_cache()
    return 1e3 * seconds / n_decode


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True, help="directory with config.json (e.g. models/shapes/qwen3-8b)")
    ap.add_argument("--ctx", type=ints, default=[8192], help="contexts, comma-separated")
    ap.add_argument("--seqs", type=ints, default=[8], help="decode batch sizes, comma-separated")
    ap.add_argument("--cache", choices=["static", "dynamic"], default="static", help="decode KV cache")
    ap.add_argument("--n-decode", type=int, default=32, help="timed decode steps")
    ap.add_argument("--warmup", type=int, default=4, help="untimed decode steps before them")
    ap.add_argument("--prefill-seqs", type=int, default=2, help="batch-1 prefills timed per context")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(a.model, "config.json")):
        fail(f"{a.model}/config.json not found")
    if a.n_decode < 1 or a.warmup < 0 or a.prefill_seqs < 1:
        fail("--n-decode and --prefill-seqs must be >= 1, --warmup >= 0")

    config, model = build_model(a.model, a.seed)
    params = sum(p.numel() for p in model.parameters())
    std = init_std(model)
    if not (std == std) or not (0.5 * config.initializer_range < std < 2 * config.initializer_range):
        fail(f"layer 0 q_proj has std {std}, expected about initializer_range {config.initializer_range}: "
             "transformers did not initialise the weights")
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # shared (tied) ones once
    # What a decode step reads of them, as kvq counts it: all but an untied embedding table (it gathers B rows).
    embed = model.get_input_embeddings().weight
    read_bytes = weight_bytes - (0 if config.tie_word_embeddings else embed.numel() * embed.element_size())
    common = {"impl": "transformers", "model": a.model, "arch": config.model_type, "params": params,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "transformers": transformers.__version__, "dtype": "bfloat16", "attn_implementation": "sdpa",
              "compiled": False, "weights": "random (from_config), timing only", "timing_only": True,
              "init_std_q_proj": std, "n_decode": a.n_decode, "warmup": a.warmup, "cache": a.cache}
    gen = torch.Generator(device="cuda").manual_seed(a.seed)
    for ctx in a.ctx:
        prefill_tps, backend = time_prefill(model, config, ctx, a.prefill_seqs, gen)
        for seqs in a.seqs:
            rec = dict(common, ctx=ctx, seqs=seqs, prefill_seqs=a.prefill_seqs, prefill_tokens_per_second=prefill_tps,
                       prefill_sdpa_backend=backend)
            max_len = ctx + a.warmup + a.n_decode
            need = kv_bytes(config, seqs, max_len)
            free, _ = torch.cuda.mem_get_info()
            if need + (4 << 30) > free:  # + activations and the logits of the batch
                rec["skipped"] = f"the cache needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
                print(json.dumps(rec), flush=True)
                continue
            torch.cuda.reset_peak_memory_stats()
            ms = time_decode(model, config, a.cache, seqs, ctx, a.warmup, a.n_decode, gen)
            cache_bytes = kv_bytes(config, seqs, ctx)
            step_bytes = read_bytes + cache_bytes  # the weights a step reads + the cache at ctx
            rec.update(decode_ms_per_step=ms, decode_tokens_per_second=seqs * 1e3 / ms, kv_mib=cache_bytes / 2**20,
                       weight_bytes=read_bytes, step_bytes_read_approx=step_bytes,
                       step_read_gbps=step_bytes / (ms * 1e-3) / 1e9,
                       peak_memory_gib=torch.cuda.max_memory_allocated() / 2**30)
            print(json.dumps(rec), flush=True)


if __name__ == "__main__":
    main()
