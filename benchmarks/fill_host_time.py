"""Host time of fill + bind per decode step: vendor_graph's fill against a straightforward fill that copies
each buffer separately, both arms in one run on the same plain CPU tensors.

Three arms, each running a vendor spec's fill + bind_context (source lookups, checks, binding, constants,
held attributes):

* ``vendor_graph``: ``BufferSpec.fill`` + ``bind_context`` as they are: one ``_foreach_copy_`` per call
  carrying the live copies and padding resets, views cached per (extent, high water);
* ``separate_copies``: the same code with only the write swapped for the straightforward one (a
  ``copy_`` per field plus a ``fill_`` per shrunk dimension, slices built each step;
  ``benchmarks/_common.py``): isolates what the single foreach saves;
* ``previous_fill``: the fill vendor_graph had before (commit 040be91, ``benchmarks/_previous_fill.py``),
  which copies each buffer separately: the baseline the issue's goal names.

The steps' inputs are made before timing; the arms alternate in blocks of steps and their buffers are
compared after every block. Each schedule lists the live batches of consecutive steps (cycled) in a
graph of ``graph`` rows.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fill_host_time.py [--reps 4000] [--block 200]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import _previous_fill  # noqa: E402
import torch  # noqa: E402, I001

NUM_BLOCKS = 64
# (name, graph batch, [(live batch, block-table columns) of consecutive steps])
SCHEDULES = (
    ("37 of 64, steady", 64, [(37, 24)]),
    ("37 of 64 after 45 (resets every other step)", 64, [(45, 28), (37, 24)]),
    ("5 of 8, steady", 8, [(5, 24)]),
    ("200 of 256, steady", 256, [(200, 24)]),
)
ARMS = ("vendor_graph", "separate_copies", "previous_fill")


def fresh(step: tuple) -> tuple:
    """Shallow copies of a prepared step (fill rebinds attributes of what it is given)."""
    inputs, attn, ctx = step
    return dict(inputs), SimpleNamespace(**vars(attn)), SimpleNamespace(**vars(ctx))


def setup(spec, name: str, graph: int, schedule: list, variants: int = 8):
    meta = _common.graph_meta(graph, NUM_BLOCKS)
    inputs, attn, ctx = _common.decode_step(name, *schedule[0], seed=0)
    meta.input_buffers = spec.make(meta, inputs, attn)
    spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    steps = [_common.decode_step(name, *schedule[i % len(schedule)], seed=1 + i)
             for i in range(variants * len(schedule))]
    return meta, steps


def run_case(spec, name: str, graph: int, schedule: list, reps: int, block: int) -> dict:
    state = {arm: setup(spec, name, graph, schedule) for arm in ARMS}
    times: dict[str, list[int]] = {arm: [] for arm in ARMS}
    cursor = 0
    perf = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        while len(times["vendor_graph"]) < reps:
            for arm in ARMS:
                meta, steps = state[arm]
                ctx_mgr = {"separate_copies": _common.separate_copies,
                           "previous_fill": _previous_fill.previous_fill}.get(arm, _nullcontext)()
                with ctx_mgr:
                    for i in range(block):
                        inputs, attn, ctx = fresh(steps[(cursor + i) % len(steps)])
                        t0 = perf()
                        spec.fill(meta, inputs, attn)
                        spec.bind_context(meta, ctx)
                        times[arm].append(perf() - t0)
            cursor += block
            a, *others = (state[arm][0].input_buffers for arm in ARMS)
            for b in others:
                for key in a:
                    if not torch.equal(a[key], b[key]):
                        raise AssertionError(f"{name} {graph}: the arms' buffer {key!r} differs")
    finally:
        gc.enable()
    out = {}
    for arm in ARMS:
        t = sorted(times[arm])
        out[arm] = {"min_us": t[0] / 1e3, "median_us": statistics.median(t) / 1e3,
                    "p90_us": t[int(0.9 * len(t))] / 1e3, "reps": len(t)}
    for base in ARMS[1:]:
        out[f"speedup_vs_{base}"] = {"median": out[base]["median_us"] / out["vendor_graph"]["median_us"],
                                     "min": out[base]["min_us"] / out["vendor_graph"]["min_us"]}
    return out


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=4000, help="timed steps per arm and case")
    parser.add_argument("--block", type=int, default=200, help="consecutive steps per arm before switching")
    args = parser.parse_args()
    results = []
    for name, spec in _common.specs().items():
        for label, graph, schedule in SCHEDULES:
            r = run_case(spec, name, graph, schedule, args.reps, args.block)
            results.append({"spec": name, "schedule": label, "graph_batch": graph,
                            "steps": [list(s) for s in schedule]} | r)
            print(f"{name:12s} {label:46s} " + "  ".join(
                f"{arm} {r[arm]['median_us']:6.1f}" for arm in ARMS) + " us (median)", flush=True)
    payload = {"benchmark": "fill_host_time", "what": "host time of BufferSpec.fill + bind_context per step, "
               "plain CPU tensors", "args": vars(args), "environment": _common.environment(),
               "results": results}
    table = ["| spec | live batch of graph | vendor_graph µs min / median | previous fill µs min / median | "
             "**speedup vs previous** median (min) | same code, separate copies µs min / median | "
             "speedup vs separate copies median (min) |", "|---|---|---|---|---|---|---|"]
    for r in results:
        a, b, c = r["vendor_graph"], r["previous_fill"], r["separate_copies"]
        sp, ss = r["speedup_vs_previous_fill"], r["speedup_vs_separate_copies"]
        table.append(f"| {r['spec']} | {r['schedule']} | {a['min_us']:.1f} / {a['median_us']:.1f} | "
                     f"{b['min_us']:.1f} / {b['median_us']:.1f} | **{sp['median']:.2f}x** ({sp['min']:.2f}x) | "
                     f"{c['min_us']:.1f} / {c['median_us']:.1f} | {ss['median']:.2f}x ({ss['min']:.2f}x) |")
    json_path, md_path = _common.write_results("fill_host_time", payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
