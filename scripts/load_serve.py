#!/usr/bin/env python3
"""Load generator for kvq serve (python3 standard library only).

For each cache configuration it starts `kvq serve` (port 0: a free one), then for each prompt length and each
concurrency runs a closed loop: `concurrency` clients, each sending streaming /v1/completions requests back to back
until the point's requests are done. Every request has a prompt of exactly --prompt-tokens random token ids (new ones
per request: nothing is shared or cached), generates exactly --gen tokens (ignore_eos, temperature 0 unless --sampling
sets the request's sampling fields) and is timed
from the send to its first content chunk (TTFT) and to its last (end to end).

Per point it reports: generated tokens/s (completion tokens of all requests / the point's wall time), prompt tokens/s,
TTFT p50 / p99, mean inter-token latency (time after the first token / (tokens - 1), averaged over requests), and
from /metrics polled every 0.25 s the most requests running and waiting at once and the preemptions.

  scripts/load_serve.py --kvq build/kvq -m models/ref --caches bf16,int2 --prompt-tokens 2048,8064 \\
      --concurrency 1,2,4,8,16,32,64 --gen 128 --json figures.jsonl

Shared-prefix mode (--shared-prefix N): every request's prompt is the same N random token ids (drawn once per point),
then its own --prompt-tokens random ids, as clients that share a system prompt or few-shot block; the point then also
reports the mean usage.prompt_tokens_details.cached_tokens and the /metrics prefix-cache hits and misses. Without
--warm-prefix the point's first `concurrency` requests start together and none finds the prefix cached yet; with it,
one untimed request of the shared prefix runs first (a system prompt the server has seen before). Compare a server
with prefix caching (the default) and without (a cache 'name=... --no-prefix-cache'):

  scripts/load_serve.py --kvq build/kvq -m models/shapes/qwen3-8b --vocab 151936 \
      --caches 'int2=-ctk int2 -ctv int2,int2-off=-ctk int2 -ctv int2 --no-prefix-cache,bf16=,bf16-off=--no-prefix-cache' \
      --shared-prefix 8192 --warm-prefix --prompt-tokens 256 --concurrency 64 --gen 128 --per-client 2 \
      --serve-args '--dummy-weights --device cuda' --json docs/results/figures/serve-h200-8b-prefix.jsonl

A cache is a name from CACHES below or `name=flags` (e.g. 'int2w=-ctk int2 -ctv int2 --kv-recent 64'). Extra
`kvq serve` flags go after --serve-args (e.g. --serve-args '--device cuda --kv-budget-gib 8'). Or point it at a
running server with --url (one cache: whatever that server runs).
"""
import argparse
import json
import math
import random
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

CACHES = {
    "bf16": [],
    "int2": ["-ctk", "int2", "-ctv", "int2"],
    "int4": ["-ctk", "int4", "-ctv", "int4"],
    "kivi2": ["-ctk", "kivi2", "-ctv", "kivi2"],
}


def percentile(xs, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))]


def start_server(args, cache_flags, ctx, parallel):
    cmd = [args.kvq, "serve", "-m", args.model, "--port", "0", "-c", str(ctx), "-np", str(parallel),
           "--max-queue", str(max(64, 2 * parallel))] + cache_flags + shlex.split(args.serve_args)
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    log = []
    deadline = time.time() + args.start_timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        log.append(line)
        sys.stderr.write("  | " + line)
        m = re.search(r"listening on (http://[0-9.]+:\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # keep draining
            return proc, m.group(1)
    proc.kill()
    raise SystemExit("kvq serve did not start:\n" + "".join(log))


def stop_server(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()


def metrics(url):
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def one_request(url, prompt_tokens, gen, vocab, rng_seed, timeout, prefix=(), sampling=None):
    rng = random.Random(rng_seed)
    body = {"prompt": list(prefix) + [rng.randrange(1, vocab) for _ in range(prompt_tokens)], "max_tokens": gen,
            "temperature": 0, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    body.update(sampling or {})
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    first = last = None
    tokens = cached = 0
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                raise RuntimeError(event["error"]["message"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
                cached = (event["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
            if event.get("choices") and event["choices"][0].get("finish_reason") is None:  # a chunk of tokens
                now = time.perf_counter()
                first = first or now
                last = now
    end = time.perf_counter()
    return {"ttft": (first or end) - t0, "e2e": end - t0, "tokens": tokens, "cached": cached,
            "itl": ((last - first) / (tokens - 1)) if first and last and tokens > 1 else 0.0}


def run_point(url, args, prompt_tokens, concurrency, seed):
    n_requests = args.requests or max(args.min_requests, args.per_client * concurrency)
    shared = random.Random(seed * 7919 + 1)
    prefix = [shared.randrange(1, args.vocab) for _ in range(args.shared_prefix)]
    results, errors = [], []
    lock = threading.Lock()
    next_index = [0]
    peak = {"running": 0.0, "waiting": 0.0}
    done = threading.Event()

    def poll():
        while not done.wait(0.25):
            try:
                m = metrics(url)
            except (OSError, urllib.error.URLError):
                continue
            peak["running"] = max(peak["running"], m.get("kvq_requests_running", 0))
            peak["waiting"] = max(peak["waiting"], m.get("kvq_requests_waiting", 0))

    def client():
        while True:
            with lock:
                i = next_index[0]
                if i >= n_requests:
                    return
                next_index[0] += 1
            try:
                r = one_request(url, prompt_tokens, args.gen, args.vocab, seed * 1000003 + i, args.request_timeout,
                                prefix, args.sampling)
                with lock:
                    results.append(r)
            except Exception as e:  # noqa: BLE001 - reported, the point goes on
                with lock:
                    errors.append(str(e))

    if args.warm_prefix and args.shared_prefix:  # the shared prompt seen once before: a server's steady state
        one_request(url, 1, 1, args.vocab, seed * 1000003 - 1, args.request_timeout, prefix)
    before = metrics(url)
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    t0 = time.perf_counter()
    clients = [threading.Thread(target=client) for _ in range(concurrency)]
    for c in clients:
        c.start()
    for c in clients:
        c.join()
    wall = time.perf_counter() - t0
    done.set()
    poller.join()
    after = metrics(url)
    gen_tokens = sum(r["tokens"] for r in results)
    ttft = [r["ttft"] for r in results] or [float("nan")]
    return {
        "prompt_tokens": prompt_tokens, "gen_tokens": args.gen, "concurrency": concurrency,
        "requests": len(results), "errors": len(errors), "first_error": errors[0] if errors else None,
        "sampling": args.sampling,
        "shared_prefix_tokens": args.shared_prefix, "warm_prefix": bool(args.warm_prefix and args.shared_prefix),
        "wall_s": wall, "generated_tok_s": gen_tokens / wall,
        "prompt_tok_s": (args.shared_prefix + prompt_tokens) * len(results) / wall,
        "cached_tokens_mean": sum(r["cached"] for r in results) / max(1, len(results)),
        "prefix_hits": after.get("kvq_prefix_cache_hit_tokens_total", 0) - before.get("kvq_prefix_cache_hit_tokens_total", 0),
        "prefix_misses": after.get("kvq_prefix_cache_miss_tokens_total", 0)
                         - before.get("kvq_prefix_cache_miss_tokens_total", 0),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_mean_s": sum(r["itl"] for r in results) / max(1, len(results)),
        "e2e_p50_s": percentile([r["e2e"] for r in results] or [float("nan")], 50),
        "peak_running": peak["running"], "peak_waiting": peak["waiting"],
        "preemptions": after.get("kvq_preemptions_total", 0) - before.get("kvq_preemptions_total", 0),
        "kv_bytes_total": after.get("kvq_kv_bytes_total", 0),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvq", default="build/kvq", help="the kvq binary (to start servers)")
    ap.add_argument("-m", "--model", default="models/ref")
    ap.add_argument("--url", help="drive this running server instead of starting one")
    ap.add_argument("--caches", default="bf16,int2", help="comma-separated: names of CACHES or name=flags")
    ap.add_argument("--prompt-tokens", default="2048,8064", help="comma-separated prompt lengths in tokens")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="comma-separated client counts")
    ap.add_argument("--gen", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--requests", type=int, default=0, help="requests per point (0: --per-client x concurrency, at "
                    "least --min-requests)")
    ap.add_argument("--per-client", type=int, default=2, help="requests per client and point (with --requests 0)")
    ap.add_argument("--min-requests", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192, help="prompt ids are drawn from [1, vocab)")
    ap.add_argument("--serve-args", default="", help="extra kvq serve flags")
    ap.add_argument("--start-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=3600)
    ap.add_argument("--shared-prefix", type=int, default=0,
                    help="tokens of a prefix every request of a point shares, before its own --prompt-tokens")
    ap.add_argument("--warm-prefix", action="store_true",
                    help="with --shared-prefix: before each point's clients start, one untimed request of the shared "
                    "prefix and one own token (the system prompt a running server has already seen)")
    ap.add_argument("--sampling", type=json.loads, default={},
                    help='request fields that replace greedy decoding, as JSON, e.g. '
                         '\'{"temperature": 0.8, "top_k": 40}\'')
    ap.add_argument("--json", help="append one JSON object per point to this file")
    args = ap.parse_args()

    lengths = [int(x) for x in args.prompt_tokens.split(",")]
    levels = [int(x) for x in args.concurrency.split(",")]
    caches = []
    for c in args.caches.split(","):
        name, _, flags = c.partition("=")
        caches.append((name, shlex.split(flags) if flags else CACHES[name]))
    if args.url:
        caches = [("server", None)]
    ctx = args.shared_prefix + max(lengths) + args.gen
    print(f"{'cache':8} {'prompt':>6} {'conc':>4} {'reqs':>4} {'gen tok/s':>10} {'prompt tok/s':>12} "
          f"{'TTFT p50':>9} {'TTFT p99':>9} {'ITL ms':>7} {'peak run':>8} {'preempt':>7} {'err':>3}"
          + (f" {'cached':>7}" if args.shared_prefix else ""))
    for name, flags in caches:
        proc, url = (None, args.url) if flags is None else start_server(args, flags, ctx, max(levels))
        try:
            for length in lengths:
                for conc in levels:
                    p = run_point(url, args, length, conc, seed=length + conc)
                    p["cache"] = name
                    p["cache_flags"] = flags
                    print(f"{name:8} {length:6d} {conc:4d} {p['requests']:4d} {p['generated_tok_s']:10.1f} "
                          f"{p['prompt_tok_s']:12.1f} {p['ttft_p50_s']:8.3f}s {p['ttft_p99_s']:8.3f}s "
                          f"{1e3 * p['itl_mean_s']:7.1f} {p['peak_running']:8.0f} {p['preemptions']:7.0f} "
                          f"{p['errors']:3d}" + (f" {p['cached_tokens_mean']:7.0f}" if args.shared_prefix else ""),
                          flush=True)
                    if p["errors"]:
                        print(f"  first error: {p['first_error']}", flush=True)
                    if args.json:
                        with open(args.json, "a") as f:
                            f.write(json.dumps(p) + "\n")
        finally:
            if proc:
                stop_server(proc)


if __name__ == "__main__":
    main()
