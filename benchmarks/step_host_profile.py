"""Where the adopted runner's whole replay step spends host time beyond the bare ``CUDAGraph.replay()``,
on the CPU: the decode benchmark's runner (lmdeploy's ``CUDAGraphRunner`` adopted by vendor_graph, the
Camb buffer spec: what ``decode_bench.py replay`` measures on the H200) over the simulator's CUDA-style
graph API.

    PYTHONPATH=.h200/pkgs017:.h200/stubs OMP_NUM_THREADS=1 .venv/bin/python benchmarks/step_host_profile.py

``--where cpu`` (default): model and graph buffers are plain CPU tensors, so each torch op costs what
torch's CPU dispatch costs (a few µs, the order of a CUDA launch's host cost) and the simulated replay
of a graph captured on CPU tensors is nearly free: the step's time is its host overhead. ``--where
npu``: the simulator's device (every op through Python dispatch: inflated op costs, real replays).

Three measurements per batch, alternating where it matters:

* step vs bare replay (host wall, no device to wait for);
* the phase split (:mod:`_phases`): exclusive host time of each piece of the step;
* ``cProfile``: the top functions by own time per step, with ``file:line`` (cProfile's own cost
  inflates small calls: read its ranking, the phase split for the µs).

Writes ``benchmarks/results/step_host_profile.{json,md}`` (or ``--name``).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import _phases  # noqa: E402
import decode_bench as db  # noqa: E402

FRESH = False  # --fresh-kv-list: a new past_key_values list per step, as decode_bench did before part3


def _short(path: str) -> str:
    """A profiled file as ``vendor_graph/x.py`` / ``lmdeploy/...`` / ``torch/...``."""
    for marker in ("/vendor_graph_sim/", "/vendor_graph/", "/lmdeploy/", "/torch/"):
        i = path.rfind(marker)
        if i >= 0:
            return path[i + 1:]
    return os.path.basename(path) if path.startswith("/") else path


def cprofile_rows(bench: db.Bench, batch: int, steps: int, top: int) -> list[dict]:
    prof = cProfile.Profile()
    for _ in range(steps):
        ctx = bench.context(batch, FRESH)
        kwargs = db.tm.forward_kwargs(ctx)
        prof.enable()
        bench.runner(**kwargs)
        prof.disable()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, func), (_cc, ncalls, tottime, cumtime, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"where": f"{_short(path)}:{line}", "function": func, "calls_per_step": ncalls / steps,
                     "own_us_per_step": 1e6 * tottime / steps, "cum_us_per_step": 1e6 * cumtime / steps})
    by_own = sorted(rows, key=lambda r: -r["own_us_per_step"])[:top]
    by_cum = sorted(rows, key=lambda r: -r["cum_us_per_step"])[:top]
    return {"by_own_time": by_own, "by_cumulative_time": by_cum}


def measure(bench: db.Bench, batch: int, pairs: int, cprofile_steps: int, top: int) -> dict:
    bench.timed(bench.graph, batch, 3)  # capture + replays
    bench.require_graphs()
    graphs = db.compat.cuda_runner_graphs(bench.runner)
    single = next(g for k, g in graphs.items() if k[0] >= batch)
    graph = single._graph
    step, bare = [], []
    for i in range(pairs):
        ctx = bench.context(batch, FRESH)
        kwargs = db.tm.forward_kwargs(ctx)
        first, second = (graph.replay, lambda kwargs=kwargs: bench.runner(**kwargs))
        if i % 2 == 0:
            first, second = second, first
        t0 = time.perf_counter_ns()
        first()
        t1 = time.perf_counter_ns()
        second()
        t2 = time.perf_counter_ns()
        (bare if i % 2 else step).append(t1 - t0)
        (step if i % 2 else bare).append(t2 - t1)
    diffs = [(s - b) / 1e3 for s, b in zip(step, bare, strict=True)]
    # lmdeploy's plain CUDAGraphRunner on the same model and the same (vendor_graph) buffer methods: what
    # the step costs without the adopted runner's policy
    c = bench.configs
    import torch

    plain = db.compat.cuda_graph_runner_class()(bench.model, c.model_config, c.cache_config, c.backend_config,
                                                torch.device(bench.where))
    for _ in range(3):
        plain(**db.tm.forward_kwargs(bench.context(batch, FRESH)))
    plain_ns, step2 = [], []
    for _ in range(pairs):
        kw1 = db.tm.forward_kwargs(bench.context(batch, FRESH))
        kw2 = db.tm.forward_kwargs(bench.context(batch, FRESH))
        t0 = time.perf_counter_ns()
        plain(**kw1)
        t1 = time.perf_counter_ns()
        bench.runner(**kw2)
        t2 = time.perf_counter_ns()
        plain_ns.append(t1 - t0)
        step2.append(t2 - t1)
    policy = [(a - b) / 1e3 for a, b in zip(step2, plain_ns, strict=True)]
    with _phases.phase_timers(bench.runner) as clock:
        for _ in range(pairs):
            ctx = bench.context(batch, FRESH)
            kwargs = db.tm.forward_kwargs(ctx)
            with clock.region("unattributed (runner __call__ bodies, timing)"):
                bench.runner(**kwargs)
    return {"batch": batch, "padded_batch": single.meta.max_batchs, "pairs": pairs,
            "step_median_us": statistics.median(step) / 1e3, "bare_median_us": statistics.median(bare) / 1e3,
            "step_minus_bare_median_us": statistics.median(diffs),
            "step_min_us": min(step) / 1e3, "bare_min_us": min(bare) / 1e3,
            "plain_median_us": statistics.median(plain_ns) / 1e3,
            "step_minus_plain_median_us": statistics.median(policy),
            "phases": clock.summary(), "cprofile": cprofile_rows(bench, batch, cprofile_steps, top)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--where", choices=("cpu", "npu"), default="cpu")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--pairs", type=int, default=400)
    p.add_argument("--cprofile-steps", type=int, default=300)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--name", default="step_host_profile")
    p.add_argument("--layers", type=int, default=16,
                   help="decoder layers on small dims (0: the pinned tiny model, 2 layers); default 16, as the "
                        "large model")
    p.add_argument("--fresh-kv-list", action="store_true",
                   help="a new past_key_values list per step (the guard's full check every step)")
    args = p.parse_args(argv)
    global FRESH
    FRESH = args.fresh_kv_list
    import vendor_graph

    max_b = max(args.batches)
    if args.layers:  # the large model's layer count (16) on small dims: per-layer host costs (the guard) as there
        config = db.tm.TinyConfig(num_blocks=2 * max_b + 8, **dict(db.SMALL_DRY, num_layers=args.layers))
    else:
        config = db.model_config("tiny", max_b, False)
    bench = db.Bench("sim", config, max_b, where=args.where)
    try:
        rows = [measure(bench, b, args.pairs, args.cprofile_steps, args.top) for b in args.batches]
    finally:
        bench.close()
    payload = {"where": args.where, "fresh_kv_list": FRESH, "layers": args.layers or 2, "vendor": db.VENDOR,
               "lmdeploy": str(db.compat.installed_lmdeploy_version()),
               "vendor_graph_file": vendor_graph.__file__, "environment": _common.environment(), "rows": rows}
    table = [f"# Host time of the adopted runner's replay step (CPU, `--where {args.where}`, lmdeploy "
             f"{payload['lmdeploy']}, {db.VENDOR} spec, {args.layers or 2} layers on small dims; past_key_values "
             f"{'a new list per step' if FRESH else 'one list across steps, as lmdeploy passes it'})", ""]
    for r in rows:
        table += [f"## batch {r['batch']} (graph of {r['padded_batch']})", "",
                  f"step {r['step_median_us']:.1f} µs, bare replay {r['bare_median_us']:.1f} µs (medians of "
                  f"{r['pairs']} alternating pairs); step - bare: median {r['step_minus_bare_median_us']:.1f} µs; "
                  f"lmdeploy's plain runner with the same buffer methods {r['plain_median_us']:.1f} µs, adopted - "
                  f"plain (what the policy adds): median {r['step_minus_plain_median_us']:.1f} µs", "",
                  *_phases.markdown(r["phases"], "Phase split"), "",
                  "cProfile, top functions by own time (µs per step, cProfile-inflated):", "",
                  "| function | where | calls / step | own µs | cumulative µs |", "|---|---|---:|---:|---:|"]
        for c in r["cprofile"]["by_own_time"]:
            table.append(f"| {c['function']} | {c['where']} | {c['calls_per_step']:g} | {c['own_us_per_step']:.1f} | "
                         f"{c['cum_us_per_step']:.1f} |")
        table.append("")
    json_path, md_path = _common.write_results(args.name, payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
