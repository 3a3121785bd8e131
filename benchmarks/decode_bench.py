"""Decode-step benchmarks of lmdeploy's CUDA graph runner, adopted by vendor_graph, on a CUDA-style
graph API: a real GPU (``--device cuda``) or, for a dry run, the CPU simulator (``--device sim``).

Tasks (each prints one JSON object to stdout, or writes it with ``--out``):

* ``latency``: one decode step, synchronised per step, eager forward vs the runner's whole replay
  step (fill + bind + replay), at several batch sizes, for the pinned tiny model and a ~1B
  random-weight bf16 model of the same architecture;
* ``replay``: at batch 1 on the large model, the runner's whole replay step vs a bare
  ``CUDAGraph.replay()`` of the same captured graph, interleaved;
* ``capture``: capture time and graph memory of every Ascend bucket (three-tier rule) at
  ``max_batches`` 256 on the large model, captured largest first into one pool as the Ascend runner
  does.

The model runs the Camb buffer spec (lmdeploy 0.16/0.17's Camb backend builds its metadata) on the
emulated Camb attention, registered for CUDA too. Attention is that emulation (float64, gathers the
whole block table), not a production kernel: figures compare graph against eager on the same kernels.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict

import torch
from vendor_graph_sim import harness
from vendor_graph_sim import tiny_model as tm

from vendor_graph import compat, patching

VENDOR = "camb"
# ~0.9B parameters: 16 layers of hidden 2048 (16 heads, 8 KV heads of 128), SwiGLU 5632, vocab 32000.
LARGE = dict(num_layers=16, hidden_size=2048, num_heads=16, num_kv_heads=8, head_dim=128,
             intermediate_size=5632, vocab_size=32000, dtype=torch.bfloat16)
SMALL_DRY = dict(num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128,
                 vocab_size=256, dtype=torch.bfloat16)


def model_config(name: str, max_batch: int, dry: bool) -> tm.TinyConfig:
    blocks = 2 * max_batch + 8  # prompts of up to 30 tokens: 2 blocks of 16 each, plus block 0
    if name == "tiny":
        return tm.TinyConfig(num_blocks=blocks)
    return tm.TinyConfig(num_blocks=blocks, **(SMALL_DRY if dry else LARGE))


def parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Bench:
    """A model, lmdeploy's CUDA runner adopted by vendor_graph, and decode sessions per batch size."""

    def __init__(self, device: str, config: tm.TinyConfig, max_batches: int, capture_sizes=None):
        import vendor_graph

        self.device = device
        self.real = device == "cuda"
        self._stack = contextlib.ExitStack()
        if not self.real:
            from vendor_graph_sim import device as sim

            sim.install()
            self._stack.enter_context(sim.cuda_graph_api())
        self._stack.enter_context(torch.inference_mode())
        self._stack.enter_context(torch.cuda.stream(torch.cuda.Stream()))
        vendor_graph.uninstall()
        __import__(f"vendor_graph.{VENDOR}")
        sys.modules[f"vendor_graph.{VENDOR}"].activate()
        where = "cuda" if self.real else "npu"
        self.model = tm.TinyDecoder(VENDOR, config, device=where)
        configs = harness.lmdeploy_configs(VENDOR, self.model, max_batches, capture_sizes)
        self.mgr = self._stack.enter_context(harness.step_manager(VENDOR, configs.model_config))
        self.runner = harness._build_runner(VENDOR, self.model, configs, self.mgr, where)
        self.where = where
        # One session of max_batches sequences; a batch of b decodes its first b (prefill is slow).
        self.session = tm.DecodeSession(self.model, harness.prompts(max_batches, seed=0), device=where)

    def close(self) -> None:
        self._stack.close()

    def sync(self) -> None:
        if self.real:
            torch.cuda.synchronize()

    def context(self, batch: int):
        ctx = self.session.decode_context(list(range(batch)))
        ctx.enable_microbatch = False
        self.mgr.set_context(ctx)
        return ctx

    def eager(self, ctx):
        return self.model(**tm.forward_kwargs(ctx))

    def graph(self, ctx):
        return self.runner(**tm.forward_kwargs(ctx))

    def require_graphs(self) -> None:
        """A benchmark of graphs that silently ran eager would be a wrong number: refuse it."""
        reasons = self.runner.eager_reasons()
        if reasons or not compat.cuda_runner_graphs(self.runner):
            raise RuntimeError(f"no graph to measure: {reasons or 'nothing captured'}")

    def timed(self, step, batch: int, reps: int) -> list[float]:
        """Seconds per step, synchronised before and after each, on a fresh step context each time."""
        out = []
        for _ in range(reps):
            ctx = self.context(batch)
            self.sync()
            start = time.perf_counter()
            step(ctx)
            self.sync()
            out.append(time.perf_counter() - start)
        return out


def summary(times: list[float]) -> dict:
    return {"min_ms": 1e3 * min(times), "median_ms": 1e3 * statistics.median(times), "reps": len(times)}


def task_latency(device: str, batches: list[int], reps: int, dry: bool) -> dict:
    rows = []
    for name in ("tiny", "large"):
        bench = Bench(device, model_config(name, max(batches), dry), max(batches))
        try:
            for batch in batches:
                bench.timed(bench.eager, batch, 2)  # warm-up (allocator, kernels)
                eager = bench.timed(bench.eager, batch, reps)
                bench.timed(bench.graph, batch, 2)  # the first call captures
                bench.require_graphs()
                graph = bench.timed(bench.graph, batch, reps)
                e, g = summary(eager), summary(graph)
                rows.append({"model": name, "params": parameters(bench.model), "batch": batch,
                             "eager": e, "graph": g, "speedup_median": e["median_ms"] / g["median_ms"]})
                print(f"latency {name} b={batch}: eager {e['median_ms']:.3f} ms graph {g['median_ms']:.3f} ms "
                      f"x{rows[-1]['speedup_median']:.2f}", file=sys.stderr, flush=True)
            rows.append({"model": name, "stats": bench.runner.stats.summary()})
        finally:
            bench.close()
    return {"task": "latency", "rows": rows}


def task_replay(device: str, reps: int, dry: bool) -> dict:
    bench = Bench(device, model_config("large", 1, dry), 1)
    try:
        bench.timed(bench.graph, 1, 2)  # capture + one replay
        bench.require_graphs()
        (single,) = compat.cuda_runner_graphs(bench.runner).values()
        graph = single._graph
        whole, bare = [], []
        for _ in range(reps):  # interleaved, so drift hits both arms alike
            whole += bench.timed(bench.graph, 1, 1)
            bench.sync()
            start = time.perf_counter()
            graph.replay()
            bench.sync()
            bare.append(time.perf_counter() - start)
        w, b = summary(whole), summary(bare)
        return {"task": "replay", "params": parameters(bench.model), "batch": 1, "runner_step": w,
                "bare_replay": b, "overhead_median": w["median_ms"] / b["median_ms"] - 1,
                "overhead_min": w["min_ms"] / b["min_ms"] - 1}
    finally:
        bench.close()


def task_capture(device: str, max_batches: int, dry: bool) -> dict:
    with patching.quiet_imports():  # the Ascend sizes, captured here on the CUDA runner
        from vendor_graph.ascend.buckets import ascend_capture_sizes
    sizes = ascend_capture_sizes(max_batches)
    bench = Bench(device, model_config("large", max_batches, dry), max_batches, capture_sizes=sizes)
    try:
        if bench.real:
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
        for size in sorted(sizes, reverse=True):  # largest first: smaller graphs reuse its pool
            bench.timed(bench.graph, size, 1)
        bench.require_graphs()
        rows = []
        for size, stats in sorted(bench.runner.stats.buckets.items()):
            rows.append({"bucket": size, **{k: v for k, v in asdict(stats).items()
                                            if k in ("captures", "capture_seconds", "capture_bytes")}})
        total = None
        if bench.real:
            torch.cuda.synchronize()
            total = torch.cuda.memory_allocated() - base
        return {"task": "capture", "max_batches": max_batches, "sizes": sizes, "params": parameters(bench.model),
                "rows": rows, "total_capture_seconds": sum(r["capture_seconds"] for r in rows),
                "graph_memory_bytes_total": total}
    finally:
        bench.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("task", choices=("latency", "replay", "capture"))
    p.add_argument("--device", choices=("cuda", "sim"), default="cuda")
    p.add_argument("--dry-run", action="store_true", help="small models and sizes (a CPU check of the code)")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--out")
    args = p.parse_args(argv)
    dry = args.dry_run
    if args.task == "latency":
        result = task_latency(args.device, [1, 8] if dry else [1, 8, 64, 256], 3 if dry else args.reps, dry)
    elif args.task == "replay":
        result = task_replay(args.device, 3 if dry else args.reps * 4, dry)
    else:
        result = task_capture(args.device, 16 if dry else 256, dry)
    result.update(device=torch.cuda.get_device_name() if args.device == "cuda" else "CPU simulator (dry run)",
                  torch=torch.__version__, lmdeploy=str(compat.installed_lmdeploy_version()), dry_run=dry)
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
