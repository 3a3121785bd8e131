"""Graphs sized to the workload and to the memory, inside lmdeploy's real PyTorch engine on a CUDA GPU
(vendor_graph's CUDA reference vendor, ``import vendor_graph.cuda``), on a random-weight Llama with
grouped-query attention (:data:`MODEL`: hidden 1536, 28 layers, 12 query / 2 KV heads, MLP 3072, vocab
32000, bf16: 648,893,952 parameters). ``benchmarks/h200.sh part4`` runs it; ``report_capacity.py`` reports.

    python benchmarks/capacity_engine.py gen MODEL_DIR
    python benchmarks/capacity_engine.py run {default,fitted,oom} MODEL_DIR OUT.json [--label L] [--round N]
        [--stats-file P] [--workload {full,short}] [--max-batch-size N] [--cache-max-entry-count F]
        [--max-prefill-token-num N] [--lmdeploy-own]
    python benchmarks/capacity_engine.py ensure-plan STATS.json PLAN.json   # plan.json usable, else a fallback
    python benchmarks/capacity_engine.py fake MODE OUT.json [...]            # made-up results, CPU dry run
    python benchmarks/capacity_engine.py selftest
    python benchmarks/capacity_engine.py preflight   # the vendor_graph imported here has what part4 measures

One engine per process (vendor_graph's patches are process-wide); the caller sets the ``VENDOR_GRAPH_*``
variables (``VENDOR_GRAPH_STATS_FILE``, ``VENDOR_GRAPH_CAPTURE_SIZES``, ``VENDOR_GRAPH_PLAN``,
``VENDOR_GRAPH_GRAPH_MEMORY``), which the output records.

Modes. ``default``: vendor_graph.cuda with its default sizes (1, 2, 4, ..., 64), or with
``VENDOR_GRAPH_PLAN=auto`` the sizes fitted at start to a previous run's stats file. ``fitted``: the sizes of
``VENDOR_GRAPH_CAPTURE_SIZES`` (the caller points it at ``vendor-graph plan --from-stats ... --json``'s
output). Both: ``PytorchEngineConfig(device_type="cuda", max_batch_size=64, cache_max_entry_count=0.1,
session_len=4096, dtype="bfloat16")``. ``oom``: :data:`OOM_MAX_BATCH` = 256, :data:`OOM_CACHE` = 0.9999 of
the free memory (after lmdeploy's runtime estimate) to the KV cache -- lmdeploy requires the fraction below 1
-- and :data:`OOM_PREFILL` = 2048 prefill tokens, whose runtime estimate ((2048 + 2 x 256) x vocab x 2 bytes,
156 MiB) is about what the eager steps need (cuBLAS workspace, warm-up prefill) but not the 9 graphs of up to
256 rows: on an H200 the graphs' block tables alone (256 + 128 + ... + 1 rows x ~80k KV blocks x 4 bytes) are
about 160 MiB. Run with ``VENDOR_GRAPH_GRAPH_MEMORY=off`` (no reservation: captures are expected to fail)
and with ``VENDOR_GRAPH_GRAPH_MEMORY`` at its default, ``auto``, over a copy of round 1's stats file (the
reservation vendor_graph derives from it: that run's pool scaled to 256 rows, plus this plan's buffers at
this cache's KV blocks); ``--lmdeploy-own``: the same
configuration under lmdeploy's own graph mode (no vendor_graph; expected to fail at warm-up).

The workload (full, modes default/fitted), every constant fixed here: :data:`N_REQUESTS` = 96 requests
drawn with ``random.Random(SEED)``, SEED = 0, each (in this order) a prompt length log-uniform in
:data:`PROMPT_LEN` = [16, 768] tokens, an output length log-uniform in :data:`OUTPUT_LEN` = [8, 320] and the
prompt's token ids uniform in [4, 32000). They arrive in :data:`WAVES`: 60 requests at 0 s, 10 at 1.0 s, 18 at
2.0 s and 8 at 3.0 s, the requests of a wave :data:`WAVE_GAP_S` = 2 ms apart, so that the decode batch rises
and decays irregularly through most sizes between 1 and ~55 (:func:`simulate_batches`, one token per running
request every 4-6 ms: peaks of 50-55, ~48 distinct sizes, power-of-two sizes pad ~28% of graph tokens and the
best 7 sizes ~15-19%; waves of 40/9/30/17 at 0/1.5/3/4.5 s peaked at ~31-35 only). Greedy
(``top_k=1``), ``ignore_eos=True``. Before it, one warm pass: :data:`WARM_REQUESTS` = 8 requests of 32
prompt tokens x 24 new tokens (lmdeploy's warm-up has already captured every size). The short workload
(``oom``, and the ``auto_r1`` sizes check): :data:`SHORT_REQUESTS` = 16 requests of 32 prompt tokens x 32
new tokens, all at once.

Measured, from each streamed output's arrival time: decode throughput = output tokens after each request's
first output / (first first-output to last last-output); TPOT = median over requests with >= 16 tokens of
(last output time - first output time) / (tokens - tokens of the first output); TTFT; wall. The greedy
tokens of every request (default and fitted must agree: padding rows never touch real rows; a batch's
composition can still differ between runs, so the report compares runs of one mode too). vendor_graph's
counters in process (``vendor_graph.runtime.counters.live_runners()``), the measured workload only (bucket counters
snapshot before it and subtracted): replays, real / padded tokens and padded fraction per bucket, graphs
captured, sizes never replayed, eager steps, capture failures; then ``write_stats_file(reason="on demand")``
(``os._exit`` skips atexit) and its document is embedded.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import math
import operator
import os
import random
import statistics
import sys
import time
import traceback
from pathlib import Path

T0 = time.perf_counter()

# -- the model --------------------------------------------------------------------------------------------
MODEL = {"hidden_size": 1536, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 12,
         "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 4096}
VOCAB = MODEL["vocab_size"]
FIRST_ID = 4  # ids 0-3: <unk> <s> </s> <pad>

# -- the workload -----------------------------------------------------------------------------------------
SEED = 0
N_REQUESTS = 96
WAVES = ((0.0, 60), (1.0, 10), (2.0, 18), (3.0, 8))  # (offset after the first request, requests)
WAVE_GAP_S = 0.002  # between two requests of one wave
PROMPT_LEN = (16, 768)  # log-uniform, inclusive
OUTPUT_LEN = (8, 320)  # log-uniform, inclusive
WARM_REQUESTS, WARM_PROMPT, WARM_TOKENS = 8, 32, 24
SHORT_REQUESTS, SHORT_PROMPT, SHORT_TOKENS = 16, 32, 32
TPOT_MIN_TOKENS = 16
# Requests unfinished by then are recorded as such (the results still get written before h200.sh's step limit).
WARM_TIMEOUT_S = 30.0
FULL_TIMEOUT_S = 60.0  # the measured workload takes ~5-10 s
SHORT_TIMEOUT_S = 45.0

# -- engine configurations --------------------------------------------------------------------------------
MAX_BATCH = 64
CACHE = 0.1
SESSION_LEN = 4096
OOM_MAX_BATCH = 256
OOM_CACHE = 0.9999  # lmdeploy asserts 0 < cache_max_entry_count < 1
OOM_PREFILL = 2048

# -- the reservation for the oom run with graph memory ----------------------------------------------------
FAKE_RESERVED = 300 << 20  # the dry run's made-up reservation (VENDOR_GRAPH_GRAPH_MEMORY=auto)

BUCKET_FIELDS = ("captures", "replays", "real_tokens", "padded_tokens", "capture_bytes", "capture_failures",
                 "stale_recaptures")
DEFAULT_SIZES_64 = [1, 2, 4, 8, 16, 32, 64]


def model_params(cfg: dict = MODEL) -> int:
    """Parameters of the Llama of ``cfg`` (untied embeddings, no biases)."""
    h, i, layers, heads, kv = (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"],
                               cfg["num_attention_heads"], cfg["num_key_value_heads"])
    head_dim = h // heads
    attn = 2 * h * h + 2 * h * kv * head_dim
    per_layer = attn + 3 * h * i + 2 * h
    return layers * per_layer + 2 * cfg["vocab_size"] * h + h


def kv_bytes_per_token(cfg: dict = MODEL) -> int:
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    return cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * head_dim * 2  # K and V, bf16


# -- the workload -----------------------------------------------------------------------------------------


def _log_uniform(rng: random.Random, low: int, high: int) -> int:
    return min(high, max(low, int(round(math.exp(rng.uniform(math.log(low), math.log(high)))))))


def workload() -> list[dict]:
    """The measured requests, in arrival order: index, wave, arrival_s, prompt_len, output_len, ids."""
    rng = random.Random(SEED)
    out = []
    for wave, (offset, count) in enumerate(WAVES):
        for j in range(count):
            prompt_len = _log_uniform(rng, *PROMPT_LEN)
            output_len = _log_uniform(rng, *OUTPUT_LEN)
            ids = [rng.randrange(FIRST_ID, VOCAB) for _ in range(prompt_len)]
            out.append({"index": len(out), "wave": wave, "arrival_s": round(offset + j * WAVE_GAP_S, 6),
                        "prompt_len": prompt_len, "output_len": output_len, "ids": ids})
    assert len(out) == N_REQUESTS, len(out)
    return out


def fixed_requests(count: int, prompt: int, tokens: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"index": i, "wave": 0, "arrival_s": 0.0, "prompt_len": prompt, "output_len": tokens,
             "ids": [rng.randrange(FIRST_ID, VOCAB) for _ in range(prompt)]} for i in range(count)]


def warm_requests() -> list[dict]:
    return fixed_requests(WARM_REQUESTS, WARM_PROMPT, WARM_TOKENS, SEED + 1)


def short_requests() -> list[dict]:
    return fixed_requests(SHORT_REQUESTS, SHORT_PROMPT, SHORT_TOKENS, SEED + 2)


def workload_constants() -> dict:
    reqs = workload()
    return {"seed": SEED, "requests": N_REQUESTS, "waves": [list(w) for w in WAVES], "wave_gap_s": WAVE_GAP_S,
            "prompt_len": list(PROMPT_LEN), "output_len": list(OUTPUT_LEN), "distribution": "log-uniform",
            "warm": [WARM_REQUESTS, WARM_PROMPT, WARM_TOKENS], "short": [SHORT_REQUESTS, SHORT_PROMPT, SHORT_TOKENS],
            "tpot_min_tokens": TPOT_MIN_TOKENS, "greedy": "top_k=1", "ignore_eos": True,
            "prompt_tokens": sum(r["prompt_len"] for r in reqs), "output_tokens": sum(r["output_len"] for r in reqs)}


def metrics(records: list[dict]) -> dict:
    """Decode throughput, TPOT, TTFT and wall from per-request records (times relative to the start):
    sent_s, first_s, last_s (None without output), n_first (tokens in the first output), n (tokens)."""
    got = [r for r in records if r.get("first_s") is not None]
    decode_tokens = sum(r["n"] - r["n_first"] for r in got)
    span = (max(r["last_s"] for r in got) - min(r["first_s"] for r in got)) if got else None
    tpots = [(r["last_s"] - r["first_s"]) / (r["n"] - r["n_first"])
             for r in got if r["n"] >= TPOT_MIN_TOKENS and r["n"] > r["n_first"]]
    ttfts = [r["first_s"] - r["sent_s"] for r in got]
    return {
        "requests": len(records), "requests_with_output": len(got),
        "requests_complete": sum(1 for r in records if r.get("n") == r.get("output_len")),
        "output_tokens": sum(r.get("n", 0) for r in records), "decode_tokens": decode_tokens,
        "decode_span_s": span,
        "decode_tok_s": decode_tokens / span if span else None,
        "tpot_ms": 1e3 * statistics.median(tpots) if tpots else None,
        "tpot_p90_ms": 1e3 * statistics.quantiles(tpots, n=10)[-1] if len(tpots) >= 2 else None,
        "tpot_requests": len(tpots),
        "ttft_median_ms": 1e3 * statistics.median(ttfts) if ttfts else None,
        "wall_s": max((r["last_s"] for r in got), default=None),
    }


# -- capture sizes: an independent optimum, for the plan's fallback and the report's check ----------------


def bucket_of(sizes: list[int], batch: int) -> int | None:
    sizes = sorted(sizes)
    at = bisect.bisect_left(sizes, batch)
    return sizes[at] if at < len(sizes) else None


def padding(hist: dict[int, int], sizes: list[int]) -> dict:
    """Padded and graph tokens of ``hist`` (real batch -> decode steps, query length 1) under ``sizes``;
    batches above every size run eager and are counted apart."""
    padded = graph = eager = 0
    for batch, steps in hist.items():
        bucket = bucket_of(sizes, batch)
        if bucket is None:
            eager += steps
            continue
        padded += steps * (bucket - batch)
        graph += steps * bucket
    return {"padded_tokens": padded, "graph_tokens": graph, "eager_steps": eager,
            "padded_fraction": padded / graph if graph else 0.0}


def best_sizes(hist: dict[int, int], max_batches: int, max_graphs: int) -> list[int]:
    """At most ``max_graphs`` sizes, ``max_batches`` among them, with the fewest padded tokens for ``hist``:
    dynamic programme over the observed batches (an optimal size is always an observed batch or the max)."""
    cands = sorted({b for b, n in hist.items() if n > 0 and b < max_batches} | {max_batches})
    pts = [0] + cands
    steps = [0] * len(pts)
    mass = [0] * len(pts)
    for t, c in enumerate(cands, 1):
        steps[t] = steps[t - 1] + hist.get(c, 0)
        mass[t] = mass[t - 1] + hist.get(c, 0) * c

    def cost(i: int, j: int) -> int:  # sizes pts[i] < b <= pts[j] padded to pts[j]
        return pts[j] * (steps[j] - steps[i]) - (mass[j] - mass[i])

    n = len(pts) - 1
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(max_graphs + 1)]  # best[k][j]: k sizes, the largest pts[j]
    back = [[0] * (n + 1) for _ in range(max_graphs + 1)]
    best[0][0] = 0
    for k in range(1, max_graphs + 1):
        for j in range(1, n + 1):
            for i in range(j):
                v = best[k - 1][i] + cost(i, j)
                if v < best[k][j]:
                    best[k][j], back[k][j] = v, i
    k = min(range(1, max_graphs + 1), key=lambda k: (best[k][n], k))
    sizes, j = [], n
    while k:
        sizes.append(pts[j])
        j, k = back[k][j], k - 1
    return sorted(sizes)


def simulate_batches(step_s: float = 0.005, prefill_s: float = 0.02) -> dict[int, int]:
    """A crude model of the decode batch over the workload (one token per running request per step, a
    request decoding from the first step ``prefill_s`` after it arrives): real batch -> steps. For made-up
    results and for checking the workload's spread; the engine measures the real one."""
    reqs = workload()
    hist: dict[int, int] = {}
    left = {r["index"]: r["output_len"] - 1 for r in reqs}  # the prefill gives the first token
    t = 0.0
    while any(left.values()):
        running = [r["index"] for r in reqs if r["arrival_s"] + prefill_s <= t and left[r["index"]] > 0]
        if running:
            hist[len(running)] = hist.get(len(running), 0) + 1
            for i in running:
                left[i] -= 1
        t += step_s
    return dict(sorted(hist.items()))


# -- gen --------------------------------------------------------------------------------------------------


def gen(model_dir: str) -> None:
    from engine_tpot import save_random_llama

    config = {k: v for k, v in MODEL.items() if k != "vocab_size"}  # engine_tpot's tokenizer fixes 32000
    params = save_random_llama(model_dir, **config)
    print(json.dumps({"model_dir": model_dir, "params": params, "params_expected": model_params(),
                      "config": MODEL}))


# -- run --------------------------------------------------------------------------------------------------


def vendor_env() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("VENDOR_GRAPH_")}


def write_json(path: str, payload: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(payload, f, indent=1)
    os.replace(tmp, path)


def _tail(text: str, n: int = 4000) -> str:
    return text if len(text) <= n else "..." + text[-n:]


def memory_info() -> dict:
    import torch

    out: dict = {}
    try:
        free, total = torch.cuda.mem_get_info()
        out.update(free_bytes=int(free), total_bytes=int(total))
    except Exception as exc:  # noqa: BLE001 - a report
        out["mem_get_info_error"] = repr(exc)
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        try:
            out[name] = int(getattr(torch.cuda, name)())
        except Exception as exc:  # noqa: BLE001
            out[f"{name}_error"] = repr(exc)
    return out


def engine_facts(engine) -> dict:
    """KV blocks and the effective cache settings (lmdeploy internals: several places, each may move)."""
    out: dict = {"kv_blocks": None}
    for path in ("cache_config.num_gpu_blocks", "executor.cache_config.num_gpu_blocks",
                 "engine_config.num_gpu_blocks"):
        try:
            value = operator.attrgetter(path)(engine)
        except AttributeError:
            continue
        if isinstance(value, int) and value > 0:
            out.update(kv_blocks=value, kv_blocks_from=path)
            break
    for name in ("block_size", "max_prefill_token_num", "max_batches", "cache_max_entry_count"):
        for root in ("cache_config", "executor.cache_config"):
            try:
                out[name] = operator.attrgetter(f"{root}.{name}")(engine)
                break
            except AttributeError:
                continue
    if out["kv_blocks"] and isinstance(out.get("block_size"), int):
        out["kv_tokens"] = out["kv_blocks"] * out["block_size"]
        out["kv_bytes"] = out["kv_tokens"] * kv_bytes_per_token()
    return out


def _runners() -> list:
    try:
        from vendor_graph.runtime.counters import live_runners
    except ImportError:
        return []
    return [r for r in live_runners() if getattr(r, "stats", None) is not None]


def snapshot(runners: list) -> dict:
    """Counters of every runner now (id -> buckets, eager steps, histogram), to subtract later."""
    out = {}
    for r in runners:
        s = r.stats
        buckets = {int(size): {f: getattr(b, f, None) for f in BUCKET_FIELDS} for size, b in list(s.buckets.items())}
        hist: dict[int, int] = {}
        for key, steps in list((getattr(s, "histogram", None) or {}).items()):
            batch = key[0] if isinstance(key, tuple) else int(key)
            hist[batch] = hist.get(batch, 0) + steps
        out[id(r)] = {"buckets": buckets, "eager": dict(s.eager_steps), "hist": hist}
    return out


def _sub(a, b):
    if a is None:
        return None
    return a - (b or 0)


def graph_section(runners: list, before: dict, after: dict) -> dict:
    """vendor_graph's counters over the measured workload (after - before) and in total."""
    per = []
    for r in runners:
        a, b = after.get(id(r)), before.get(id(r), {"buckets": {}, "eager": {}, "hist": {}})
        if a is None:
            continue
        try:
            sizes = list(r.capture_sizes())
        except Exception as exc:  # noqa: BLE001
            sizes = None
            print(f"capture_sizes(): {exc!r}", file=sys.stderr)
        buckets = {}
        for size in sorted(a["buckets"]):
            now, then = a["buckets"][size], b["buckets"].get(size, {})
            d = {f: _sub(now.get(f), then.get(f)) for f in ("replays", "real_tokens", "padded_tokens")}
            d.update(captures_total=now.get("captures"), capture_failures_total=now.get("capture_failures"),
                     capture_bytes=now.get("capture_bytes"), stale_recaptures_total=now.get("stale_recaptures"))
            d["padded_fraction"] = (1 - d["real_tokens"] / d["padded_tokens"]) if d["padded_tokens"] else None
            buckets[str(size)] = d
        real = sum(v["real_tokens"] or 0 for v in buckets.values())
        graph = sum(v["padded_tokens"] or 0 for v in buckets.values())
        eager = {k: v - b["eager"].get(k, 0) for k, v in a["eager"].items() if v - b["eager"].get(k, 0)}
        hist = {k: v - b["hist"].get(k, 0) for k, v in sorted(a["hist"].items()) if v - b["hist"].get(k, 0)}
        try:
            reasons = {str(k): str(v) for k, v in r.eager_reasons().items()}
        except Exception as exc:  # noqa: BLE001
            reasons = {"error": repr(exc)}
        plan = getattr(r, "capture_plan", None)
        try:
            live_graphs = len(r.graphs())
        except Exception:  # noqa: BLE001
            live_graphs = None
        captured = sorted(int(s) for s, v in buckets.items() if (v["captures_total"] or 0) > 0)
        entry = {
            "runner": type(r).__qualname__, "label": getattr(r, "label", None),
            "capture_sizes": sizes,
            "capture_plan": None if plan is None else {
                "sizes": list(getattr(plan, "sizes", ()) or ()), "source": getattr(plan, "source", None),
                "max_batches": getattr(plan, "max_batches", None),
                "reserved_bytes": getattr(plan, "reserved_bytes", None), "note": getattr(plan, "note", None)},
            "graphs": len(sizes) if sizes is not None else None,
            "graphs_captured": len(captured), "captured_sizes": captured, "live_graphs": live_graphs,
            "never_replayed": [s for s in (sizes or []) if not (buckets.get(str(s), {}).get("replays") or 0)],
            "workload": {"replays": sum(v["replays"] or 0 for v in buckets.values()), "real_tokens": real,
                         "graph_tokens": graph, "padded_tokens": graph - real,
                         "padded_fraction": (1 - real / graph) if graph else None,
                         "eager_steps": eager, "batch_histogram": {str(k): v for k, v in hist.items()},
                         "padding_from_histogram": padding(hist, sizes) if sizes and hist else None},
            "buckets": buckets,
            "capture_failures": sum(v["capture_failures_total"] or 0 for v in buckets.values()),
            "failed_sizes": sorted(int(s) for s, v in buckets.items() if v["capture_failures_total"]),
            "eager_reasons": reasons,
            "eager_steps_total": dict(r.stats.eager_steps),
            "replays_total": r.stats.replays, "captures_total": r.stats.captures,
        }
        try:
            entry["summary"] = r.stats.summary()
        except Exception:  # noqa: BLE001
            pass
        per.append(entry)
    out = {"runners": per}
    if per:
        out.update({k: per[0][k] for k in ("capture_sizes", "graphs", "graphs_captured", "never_replayed",
                                           "workload", "buckets", "capture_failures", "failed_sizes",
                                           "eager_reasons")})
    return out


def stats_document() -> dict:
    """``vendor_graph.ops.reports.write_stats_file(reason="on demand")`` and the document it wrote."""
    try:
        from vendor_graph.ops import reports as vg_reports
    except ImportError as exc:
        return {"error": repr(exc)}
    write = getattr(vg_reports, "write_stats_file", None)
    if write is None:
        return {"error": "vendor_graph.ops.reports has no write_stats_file"}
    try:
        path = write(reason="on demand")
    except Exception as exc:  # noqa: BLE001
        return {"error": repr(exc), "traceback": _tail(traceback.format_exc())}
    out: dict = {"path": path}
    if path:
        try:
            out["document"] = json.loads(Path(path).read_text())
        except Exception as exc:  # noqa: BLE001
            out["read_error"] = repr(exc)
    return out


def run(args: argparse.Namespace) -> None:
    mode, own = args.mode, args.lmdeploy_own
    if own and mode != "oom":
        raise SystemExit("--lmdeploy-own is for the oom configuration only")
    if args.stats_file:
        os.environ["VENDOR_GRAPH_STATS_FILE"] = args.stats_file  # before vendor_graph reads its settings
    if mode == "fitted" and not os.environ.get("VENDOR_GRAPH_CAPTURE_SIZES"):
        raise SystemExit("fitted: set VENDOR_GRAPH_CAPTURE_SIZES (the plan file)")
    oom = mode == "oom"
    max_batch = args.max_batch_size or (OOM_MAX_BATCH if oom else MAX_BATCH)
    cache = args.cache_max_entry_count or (OOM_CACHE if oom else CACHE)
    prefill = args.max_prefill_token_num or (OOM_PREFILL if oom else None)
    kind = args.workload or ("short" if oom else "full")
    result: dict = {
        "mode": mode, "label": args.label or mode, "round": args.round, "lmdeploy_own": own,
        "graph_mode": "lmdeploy" if own else "vendor_graph.cuda", "workload_kind": kind,
        "config": {"device_type": "cuda", "max_batch_size": max_batch, "cache_max_entry_count": cache,
                   "max_prefill_token_num": prefill, "session_len": SESSION_LEN, "dtype": "bfloat16"},
        "model": {**MODEL, "params": model_params()}, "workload_constants": workload_constants(),
        "env": vendor_env(), "pid": os.getpid(), "stage": "importing", "marks_s": {}}
    out = args.out

    def save(stage: str) -> None:
        result["stage"] = stage
        result["marks_s"][stage] = time.perf_counter() - T0
        write_json(out, result)

    save("importing")
    if not own:
        import vendor_graph.cuda  # noqa: F401  (before lmdeploy builds its engine)
    import torch
    from lmdeploy import GenerationConfig, PytorchEngineConfig
    from lmdeploy.pytorch.engine import Engine

    result["versions"] = {"torch": torch.__version__, "lmdeploy": sys.modules["lmdeploy"].__dict__.get("__version__"),
                          "vendor_graph_imported": "vendor_graph" in sys.modules,
                          "vendor_graph_file": getattr(sys.modules.get("vendor_graph"), "__file__", None)}
    kwargs = dict(device_type="cuda", max_batch_size=max_batch, cache_max_entry_count=cache, session_len=SESSION_LEN,
                  dtype="bfloat16")
    if prefill:
        kwargs["max_prefill_token_num"] = prefill
    save("building engine")
    start = time.perf_counter()
    try:
        cfg = PytorchEngineConfig(**kwargs)
        engine = Engine.from_pretrained(args.model_dir, engine_config=cfg)
    except BaseException as exc:  # lmdeploy's checks call exit(1); CUDA OOM at warm-up: keep the reason
        text = traceback.format_exc()
        print(text, file=sys.stderr, flush=True)
        result.update(engine_built=False, engine_error=repr(exc)[:2000], traceback_tail=_tail(text),
                      engine_build_s=time.perf_counter() - start)
        try:
            result["memory_after_failure"] = memory_info()
        except Exception:  # noqa: BLE001
            pass
        if not own:
            try:  # what the runner saw before the failure (capture failures, eager reasons)
                result["vendor_graph"] = graph_section(_runners(), {}, snapshot(_runners()))
                result["stats_file"] = stats_document()
            except Exception as exc2:  # noqa: BLE001 - a report
                result["vendor_graph_error"] = repr(exc2)
        save("engine construction failed")
        os._exit(0 if oom else 1)
    result.update(engine_built=True, engine_build_s=time.perf_counter() - start, engine=engine_facts(engine),
                  memory_after_start=memory_info())
    runners = _runners()
    result["vendor_graph_start"] = graph_section(runners, {}, snapshot(runners)) if runners else None
    save("engine built")
    session = iter(range(1, 10**9))

    async def one(req: dict, t_start: float) -> dict:
        delay = t_start + req["arrival_s"] - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent = time.perf_counter()
        rec = {"index": req["index"], "wave": req["wave"], "prompt_len": req["prompt_len"],
               "output_len": req["output_len"], "sent_s": sent - t_start, "first_s": None, "last_s": None,
               "n_first": 0, "n": 0, "outputs": 0, "status": None, "tokens": []}
        inst = engine.create_instance()
        # top_k=1: greedy. The engine API ignores do_sample (only lmdeploy's pipeline maps it).
        gen = GenerationConfig(max_new_tokens=req["output_len"], ignore_eos=True, top_k=1)
        async for output in inst.async_stream_infer(next(session), req["ids"], gen_config=gen):
            now = time.perf_counter() - t_start
            rec["outputs"] += 1
            rec["status"] = str(getattr(output, "status", None))
            ids = list(output.token_ids)
            if ids:
                rec["tokens"] += ids
                rec["n"] = len(rec["tokens"])
                if rec["first_s"] is None:
                    rec["first_s"], rec["n_first"] = now, rec["n"]
                rec["last_s"] = now
        return rec

    async def batch(reqs: list[dict], timeout: float) -> tuple[list[dict], float, bool]:
        t_start = time.perf_counter()
        tasks = [asyncio.ensure_future(one(r, t_start)) for r in reqs]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for t in pending:
            t.cancel()
        records = []
        for r, t in zip(reqs, tasks, strict=True):
            if t in done and not t.cancelled() and t.exception() is None:
                records.append(t.result())
            else:
                err = "timed out" if t in pending else "cancelled" if t.cancelled() else repr(t.exception())
                records.append({"index": r["index"], "wave": r["wave"], "prompt_len": r["prompt_len"],
                                "output_len": r["output_len"], "sent_s": None, "first_s": None, "last_s": None,
                                "n_first": 0, "n": 0, "status": err, "tokens": []})
        return records, time.perf_counter() - t_start, not pending

    async def main() -> None:
        try:
            await measure()
        except BaseException as exc:  # noqa: BLE001 - keep what was measured and why it stopped
            text = traceback.format_exc()
            print(text, file=sys.stderr, flush=True)
            result.update(run_error=repr(exc)[:2000], run_traceback_tail=_tail(text))
            save("failed after the engine was built")
            os._exit(1)
        save("done")
        os._exit(0)  # the results are written; do not wait for the engine loop to wind down

    async def measure() -> None:
        engine.start_loop()
        if kind == "full":
            warm, wall, finished = await batch(warm_requests(), WARM_TIMEOUT_S)
            result["warm"] = {"wall_s": wall, "finished": finished, "tokens": sum(r["n"] for r in warm)}
            save("warm pass done")
        reqs = workload() if kind == "full" else short_requests()
        runners = _runners()
        before = snapshot(runners)
        records, wall, finished = await batch(reqs, FULL_TIMEOUT_S if kind == "full" else SHORT_TIMEOUT_S)
        after = snapshot(runners)
        m = metrics(records)
        result["workload"] = {"kind": kind, "finished": finished, "wall_s": wall, **m,
                              "completed": finished and m["requests_complete"] == len(reqs)}
        result["requests"] = [{k: v for k, v in r.items() if k != "tokens"} for r in records]
        result["tokens"] = [r["tokens"] for r in records]
        result["memory_after_workload"] = memory_info()
        if not own:
            result["vendor_graph"] = graph_section(runners, before, after)
            result["stats_file"] = stats_document()
        w = result["workload"]
        vg = result.get("vendor_graph") or {}
        print(f"{result['label']}: {w['requests_complete']}/{w['requests']} complete, decode "
              f"{w['decode_tok_s']} tok/s, TPOT {w['tpot_ms']} ms, wall {wall:.2f} s; sizes {vg.get('capture_sizes')}, "
              f"padded "
              f"{(vg.get('workload') or {}).get('padded_fraction')}, capture failures {vg.get('capture_failures')}",
              file=sys.stderr, flush=True)

    asyncio.run(main())


# -- plan fallback and the reservation --------------------------------------------------------------------


def _load(path: str) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _histogram_of(doc: dict) -> dict[int, int]:
    return {int(b): int(n) for b, n in (doc.get("batch_histogram") or {}).items()}


def ensure_plan(stats_path: str, plan_path: str) -> int:
    """Keep ``plan_path`` when it holds a plan (``capture_sizes``, whole numbers); else write the optimum of
    :func:`best_sizes` for the stats file's histogram, marked as a fallback, so the fitted runs still run."""
    plan = _load(plan_path)
    sizes = plan.get("capture_sizes") if isinstance(plan, dict) else None
    if isinstance(sizes, list) and sizes and all(type(s) is int and s >= 1 for s in sizes):
        print(f"plan ok: {sizes}")
        return 0
    stats = _load(stats_path)
    if not isinstance(stats, dict) or not stats.get("batch_histogram"):
        print(f"no plan in {plan_path} and no histogram in {stats_path}: the fitted runs cannot run", file=sys.stderr)
        return 1
    hist = _histogram_of(stats)
    max_batches = int(stats.get("max_batches") or MAX_BATCH)
    graphs = len(stats.get("capture_sizes") or DEFAULT_SIZES_64)
    sizes = best_sizes(hist, max_batches, graphs)
    before = padding(hist, stats.get("capture_sizes") or DEFAULT_SIZES_64)
    after = padding(hist, sizes)
    raw = Path(plan_path).read_text()[:2000] if Path(plan_path).exists() else None
    write_json(plan_path, {"capture_sizes": sizes, "padded_fraction_before": before["padded_fraction"],
                           "padded_fraction_after": after["padded_fraction"], "max_graphs": graphs,
                           "max_batches": max_batches, "fallback": True,
                           "fallback_reason": "vendor-graph plan --from-stats gave no plan", "plan_output": raw})
    print(f"plan fallback (vendor-graph plan gave none): {sizes}", file=sys.stderr)
    return 0


# -- fake results for the CPU dry run ---------------------------------------------------------------------


def _fake_buckets(hist: dict[int, int], sizes: list[int]) -> dict:
    buckets = {}
    for size in sorted(sizes):
        served = {b: n for b, n in hist.items() if bucket_of(sizes, b) == size}
        replays = sum(served.values())
        real = sum(b * n for b, n in served.items())
        graph = size * replays
        buckets[str(size)] = {"replays": replays, "real_tokens": real, "padded_tokens": graph,
                              "captures_total": 1, "capture_failures_total": 0,
                              "capture_bytes": (24 << 20) if size == max(sizes) else 0, "stale_recaptures_total": 0,
                              "padded_fraction": (1 - real / graph) if graph else None}
    return buckets


def _fake_graph_section(hist: dict[int, int], sizes: list[int], source: str) -> dict:
    buckets = _fake_buckets(hist, sizes)
    real = sum(v["real_tokens"] for v in buckets.values())
    graph = sum(v["padded_tokens"] for v in buckets.values())
    entry = {"runner": "VendorGraphCUDAGraphRunner (fake)", "label": "vendor_graph.cuda", "capture_sizes": sizes,
             "capture_plan": {"sizes": sizes, "source": source, "max_batches": max(sizes), "reserved_bytes": None,
                              "note": None},
             "graphs": len(sizes), "graphs_captured": len(sizes), "captured_sizes": sizes, "live_graphs": len(sizes),
             "never_replayed": [s for s in sizes if not buckets[str(s)]["replays"]],
             "workload": {"replays": sum(v["replays"] for v in buckets.values()), "real_tokens": real,
                          "graph_tokens": graph, "padded_tokens": graph - real,
                          "padded_fraction": (1 - real / graph) if graph else None, "eager_steps": {},
                          "batch_histogram": {str(k): v for k, v in hist.items()},
                          "padding_from_histogram": padding(hist, sizes)},
             "buckets": buckets, "capture_failures": 0, "failed_sizes": [], "eager_reasons": {},
             "eager_steps_total": {"not a decode step": 150}}
    out = {"runners": [entry]}
    out.update({k: entry[k] for k in ("capture_sizes", "graphs", "graphs_captured", "never_replayed", "workload",
                                      "buckets", "capture_failures", "failed_sizes", "eager_reasons")})
    return out


def _fake_stats_doc(hist: dict[int, int], sizes: list[int], source: str) -> dict:
    """A stats document in the schema of vendor_graph.ops.reports (format vendor_graph.stats/1)."""
    buckets = _fake_buckets(hist, sizes)
    real = sum(v["real_tokens"] for v in buckets.values())
    graph = sum(v["padded_tokens"] for v in buckets.values())
    return {"format": "vendor_graph.stats/1", "rank": 0, "world_size": 1, "pid": 0, "reason": "on demand",
            "vendor": "cuda", "max_batches": max(sizes), "capture_sizes": sizes, "capture_source": source,
            "num_layers": MODEL["num_hidden_layers"], "batch_histogram": {str(k): v for k, v in hist.items()},
            "query_len_histogram": {"1": {str(k): v for k, v in hist.items()}},
            "decode_steps": sum(hist.values()), "carried_steps": 0,
            "replays": sum(v["replays"] for v in buckets.values()), "captures": len(sizes),
            "padded_fraction": (1 - real / graph) if graph else 0.0, "graph_memory_bytes": 24 << 20,
            "reserved_graph_memory_bytes": None,
            "buckets": {s: {"captures": 1, "replays": v["replays"], "real_tokens": v["real_tokens"],
                            "padded_tokens": v["padded_tokens"], "capture_seconds": 0.05,
                            "capture_bytes": v["capture_bytes"], "capture_failures": 0, "stale_recaptures": 0,
                            "shadow_checks": 0, "shadow_divergences": 0} for s, v in buckets.items()},
            "eager_steps": {"not a decode step": 150}, "fake": True}


def _plan_sizes(path: str | None) -> list[int] | None:
    doc = _load(path) if path else None
    sizes = doc.get("capture_sizes") if isinstance(doc, dict) else None
    return sorted(sizes) if isinstance(sizes, list) and sizes else None


def fake(args: argparse.Namespace) -> None:
    """A made-up result in ``run``'s schema (``"fake": true``) for the CPU dry run of the reporter."""
    mode, label = args.mode, args.label or args.mode
    rng = random.Random(f"{label}-{args.round}")
    oom = mode == "oom"
    variant = args.variant or ("own" if args.lmdeploy_own else None)
    if oom and variant is None:  # the outcome the design expects for the caller's setting
        variant = "off" if os.environ.get("VENDOR_GRAPH_GRAPH_MEMORY") == "off" else "reserved"
    kind = args.workload or ("short" if oom else "full")
    reqs = short_requests() if kind == "short" else workload()
    env = vendor_env()
    plan_sizes = _plan_sizes(args.plan or env.get("VENDOR_GRAPH_CAPTURE_SIZES"))
    if plan_sizes is None and env.get("VENDOR_GRAPH_PLAN") == "auto":  # fitted at start, as the runner does
        recorded = _load(env.get("VENDOR_GRAPH_STATS_FILE") or "")
        if isinstance(recorded, dict) and recorded.get("batch_histogram"):
            plan_sizes = best_sizes(_histogram_of(recorded), int(recorded.get("max_batches") or MAX_BATCH),
                                    len(recorded.get("capture_sizes") or DEFAULT_SIZES_64))
    if mode == "fitted" or (mode == "default" and env.get("VENDOR_GRAPH_PLAN") == "auto"):
        sizes = plan_sizes or [3, 9, 16, 24, 32, 42, 64]
        source = "VENDOR_GRAPH_CAPTURE_SIZES" if mode == "fitted" else "VENDOR_GRAPH_PLAN=auto"
    elif oom:
        sizes, source = [1, 2, 4, 8, 16, 32, 64, 128, 256], "default"
    else:
        sizes, source = list(DEFAULT_SIZES_64), "default"
    hist = simulate_batches() if kind == "full" else {SHORT_REQUESTS: SHORT_TOKENS - 1}
    pad = padding(hist, sizes)["padded_fraction"]
    step_ms = 4.0 * (1 + 0.35 * pad) * (1 + 0.04 * rng.random())
    records = []
    for r in reqs:
        sent = r["arrival_s"] + 0.001
        first = sent + 0.03 + 0.01 * rng.random()
        n = r["output_len"]
        records.append({"index": r["index"], "wave": r["wave"], "prompt_len": r["prompt_len"], "output_len": n,
                        "sent_s": sent, "first_s": first, "last_s": first + (n - 1) * step_ms / 1e3, "n_first": 1,
                        "n": n, "outputs": n, "status": "ResponseType.FINISH",
                        "tokens": [r["ids"][(k * 7) % len(r["ids"])] for k in range(n)]})
    m = metrics(records)
    max_batch = args.max_batch_size or (OOM_MAX_BATCH if oom else MAX_BATCH)
    cache = args.cache_max_entry_count or (OOM_CACHE if oom else CACHE)
    result: dict = {
        "mode": mode, "label": label, "round": args.round, "lmdeploy_own": variant == "own",
        "graph_mode": "lmdeploy" if variant == "own" else "vendor_graph.cuda", "workload_kind": kind,
        "config": {"device_type": "cuda", "max_batch_size": max_batch, "cache_max_entry_count": cache,
                   "max_prefill_token_num": args.max_prefill_token_num or (OOM_PREFILL if oom else None),
                   "session_len": SESSION_LEN, "dtype": "bfloat16"},
        "model": {**MODEL, "params": model_params()}, "workload_constants": workload_constants(), "env": env,
        "fake": True, "dry_run": True, "stage": "done", "marks_s": {}, "engine_built": True,
        "engine_build_s": 25.0 + rng.random(),
        "engine": {"kv_blocks": 80000 if oom else 7900, "block_size": 64},
        "memory_after_start": {"free_bytes": 1 << 30, "total_bytes": 150 << 30}}
    blocks = result["engine"]["kv_blocks"]
    if variant == "own":
        result.update(engine_built=False, engine_error="OutOfMemoryError('CUDA out of memory (fake)')",
                      traceback_tail="Traceback (fake)\ntorch.OutOfMemoryError: CUDA out of memory (fake)",
                      stage="engine construction failed", engine={"kv_blocks": None})
        result.pop("memory_after_start")
        write_json(args.out, result)
        return
    vg = _fake_graph_section(hist, sizes, source)
    if variant == "off":
        entry = vg["runners"][0]
        for size in (256, 128):
            entry["buckets"][str(size)]["capture_failures_total"] = 1
            entry["buckets"][str(size)]["captures_total"] = 0
            entry["eager_reasons"][f"GraphKey(padded_batch={size}, decoding=True)"] = (
                "CUDA out of memory while capturing (fake)")
        entry.update(capture_failures=2, failed_sizes=[128, 256], graphs_captured=7,
                     captured_sizes=[s for s in sizes if s < 128])
        vg.update(capture_failures=2, failed_sizes=[128, 256], eager_reasons=entry["eager_reasons"],
                  graphs_captured=7)
    if variant == "reserved":
        reserved = env.get("VENDOR_GRAPH_GRAPH_MEMORY")
        vg["runners"][0]["capture_plan"]["reserved_bytes"] = int(reserved) if (reserved or "").isdigit() else (
            FAKE_RESERVED)
        result["engine"]["kv_blocks"] = blocks - 700
    result["workload"] = {"kind": kind, "finished": True, "wall_s": m["wall_s"], **m, "completed": True}
    result["requests"] = [{k: v for k, v in r.items() if k != "tokens"} for r in records]
    result["tokens"] = [r["tokens"] for r in records]
    result["vendor_graph"] = vg
    doc = _fake_stats_doc(hist, sizes, source)
    if variant == "reserved":
        doc["reserved_graph_memory_bytes"] = vg["runners"][0]["capture_plan"]["reserved_bytes"]
    stats_path = args.stats_file or env.get("VENDOR_GRAPH_STATS_FILE")
    if stats_path:
        write_json(stats_path, doc)
    result["stats_file"] = {"path": stats_path, "document": doc}
    write_json(args.out, result)


# -- preflight --------------------------------------------------------------------------------------------


def preflight() -> int:
    """Whether the vendor_graph this script imports (the same ``sys.path`` as ``run``) has what part4 measures:
    the stats file writer, the plan command's planner and the capacity module. Prints its path; 1 if not."""
    try:
        import vendor_graph
    except ImportError as exc:
        print(f"vendor_graph does not import: {exc!r}")
        return 1
    missing = []
    for module, name in (("vendor_graph.sizing.capacity", None), ("vendor_graph.sizing.planning", "fit_sizes"),
                         ("vendor_graph.ops.reports", "write_stats_file")):
        try:
            mod = __import__(module, fromlist=["_"])
        except ImportError as exc:
            missing.append(f"{module} ({exc})")
            continue
        if name and not hasattr(mod, name):
            missing.append(f"{module}.{name}")
    print(f"vendor_graph {getattr(vendor_graph, '__version__', '?')} from {vendor_graph.__file__}"
          + (f"; lacks {', '.join(missing)}" if missing else ""))
    return 1 if missing else 0


# -- selftest ---------------------------------------------------------------------------------------------


def selftest() -> None:
    """The pieces that run without a GPU: workload constants, metrics, the optimum against brute force."""
    import itertools

    reqs = workload()
    assert len(reqs) == N_REQUESTS == sum(c for _, c in WAVES)
    assert all(PROMPT_LEN[0] <= r["prompt_len"] <= PROMPT_LEN[1] for r in reqs)
    assert all(OUTPUT_LEN[0] <= r["output_len"] <= OUTPUT_LEN[1] for r in reqs)
    assert all(FIRST_ID <= i < VOCAB for r in reqs for i in r["ids"])
    assert reqs == workload(), "the workload is not deterministic"
    assert max(r["prompt_len"] + r["output_len"] for r in reqs) <= SESSION_LEN
    assert model_params() == 648_893_952, model_params()
    recs = [{"sent_s": 0.0, "first_s": 0.1, "last_s": 1.1, "n_first": 1, "n": 101, "output_len": 101},
            {"sent_s": 0.5, "first_s": 0.6, "last_s": 0.9, "n_first": 2, "n": 12, "output_len": 12},
            {"sent_s": 0.5, "first_s": None, "last_s": None, "n_first": 0, "n": 0, "output_len": 8}]
    m = metrics(recs)
    assert m["decode_tokens"] == 110 and abs(m["decode_span_s"] - 1.0) < 1e-12
    assert abs(m["tpot_ms"] - 10.0) < 1e-9 and m["tpot_requests"] == 1 and m["requests_complete"] == 2
    rng = random.Random(7)
    for trial in range(200):
        top = rng.choice([6, 9, 12])
        hist = {b: rng.randrange(0, 9) for b in rng.sample(range(1, top + 1), rng.randrange(1, top + 1))}
        if not any(hist.values()):
            continue
        k = rng.randrange(1, 5)
        got = best_sizes(hist, top, k)
        assert top in got and len(got) <= k, (hist, k, got)
        best = min(padding(hist, list(c) + [top])["padded_tokens"]
                   for n in range(0, k) for c in itertools.combinations(range(1, top), n))
        assert padding(hist, got)["padded_tokens"] == best, (trial, hist, k, got, best)
    sim = simulate_batches()
    print(json.dumps({"selftest": "ok", "simulated_batches": len(sim), "simulated_steps": sum(sim.values()),
                      "simulated_max_batch": max(sim), "padded_default": padding(sim, DEFAULT_SIZES_64),
                      "padded_best7": padding(sim, best_sizes(sim, MAX_BATCH, 7)),
                      "workload": workload_constants()}))


def cli(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("model_dir")
    for name in ("run", "fake"):
        r = sub.add_parser(name)
        r.add_argument("mode", choices=("default", "fitted", "oom"))
        if name == "run":
            r.add_argument("model_dir")
        r.add_argument("out")
        r.add_argument("--label", default=None, help="the run's name in the report (default: the mode)")
        r.add_argument("--round", type=int, default=None)
        r.add_argument("--stats-file", default=None, help="VENDOR_GRAPH_STATS_FILE for this run")
        r.add_argument("--workload", choices=("full", "short"), default=None,
                       help="full: the measured 96-request workload (default for default/fitted); short: 16 x 32")
        r.add_argument("--max-batch-size", type=int, default=None, help=f"default {MAX_BATCH} (oom: {OOM_MAX_BATCH})")
        r.add_argument("--cache-max-entry-count", type=float, default=None,
                       help=f"default {CACHE} (oom: {OOM_CACHE})")
        r.add_argument("--max-prefill-token-num", type=int, default=None,
                       help=f"default lmdeploy's (oom: {OOM_PREFILL})")
        r.add_argument("--lmdeploy-own", action="store_true", help="oom: lmdeploy's own graph mode, no vendor_graph")
        if name == "fake":
            r.add_argument("--variant", choices=("off", "reserved", "own"), default=None,
                           help="oom: the outcome to make up")
            r.add_argument("--plan", default=None, help="the plan file whose sizes a fitted / auto run captures")
    e = sub.add_parser("ensure-plan")
    e.add_argument("stats")
    e.add_argument("plan")
    sub.add_parser("selftest")
    sub.add_parser("preflight", help="does the vendor_graph imported here have the features part4 measures")
    args = p.parse_args(argv)
    if args.cmd == "gen":
        gen(args.model_dir)
    elif args.cmd == "run":
        run(args)
    elif args.cmd == "fake":
        fake(args)
    elif args.cmd == "ensure-plan":
        return ensure_plan(args.stats, args.plan)
    elif args.cmd == "preflight":
        return preflight()
    else:
        selftest()
    return 0


if __name__ == "__main__":  # lmdeploy's environment check spawns processes: everything under the guard
    sys.exit(cli())
