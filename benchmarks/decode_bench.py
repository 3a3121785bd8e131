"""Decode-step benchmarks of lmdeploy's CUDA graph runner, adopted by vendor_graph, on a CUDA-style
graph API: a real GPU (``--device cuda``) or, for a dry run, the CPU simulator (``--device sim``).

Tasks (each prints one JSON object to stdout, or writes it with ``--out``):

* ``latency``: one decode step, synchronised per step, eager forward vs the runner's whole replay
  step (fill + bind + replay), at several batch sizes, for the pinned tiny model and a ~1B
  random-weight bf16 model of the same architecture;
* ``replay``: at batch 1 on the large model, the runner's whole replay step vs a bare
  ``CUDAGraph.replay()`` of the same captured graph (and lmdeploy's plain runner with the same buffer
  methods), in alternating rounds, with per-round medians, paired
  differences and their intervals, and the host-time phase split of the step (goal: step - bare <= 50 µs);
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
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _phases, _stats beside this file
from vendor_graph_sim import harness  # noqa: E402
from vendor_graph_sim import tiny_model as tm  # noqa: E402

from vendor_graph.upstream import compat  # noqa: E402

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

    def __init__(self, device: str, config: tm.TinyConfig, max_batches: int, capture_sizes=None,
                 where: str | None = None):
        """``where``: the torch device of model and buffers; default ``cuda`` on a GPU and the simulated
        ``npu`` device on the simulator (``cpu`` there: plain CPU tensors under the simulated graph API,
        whose host cost per op is closer to a CUDA launch than the simulator's dispatch)."""
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
        where = where or ("cuda" if self.real else "npu")
        self.model = tm.TinyDecoder(VENDOR, config, device=where)
        configs = self.configs = harness.lmdeploy_configs(VENDOR, self.model, max_batches, capture_sizes)
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

    def context(self, batch: int, fresh_kv_list: bool = False):
        """A fresh step context for the first ``batch`` sequences. ``past_key_values`` is one list object
        across steps, as lmdeploy passes its cache engine's list every step; the simulator's context
        builds a new list of the same tensors each time (``fresh_kv_list=True`` keeps that), which keeps
        vendor_graph's stale-graph guard on its full per-tensor check every step (``guard.py``: O(1)
        only while the container is the one checked last), a cost lmdeploy's engine does not pay."""
        ctx = self.session.decode_context(list(range(batch)))
        ctx.enable_microbatch = False
        if not fresh_kv_list:
            kept = getattr(self, "_kv_list", None)
            if kept is not None and len(kept) == len(ctx.kv_caches) and all(
                    len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
                    for a, b in zip(kept, ctx.kv_caches, strict=True)):
                ctx.kv_caches = kept
            else:
                self._kv_list = ctx.kv_caches
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


REPLAY_GOAL_US = 60.0  # goal: whole replay step - bare replay, batch 1, large model (µs)
REPLAY_ROUNDS, REPLAY_PER_ROUND = 40, 25


def _timed_call(bench: Bench, fn) -> tuple[float, float]:
    """(host seconds until ``fn`` returned, seconds until the device finished), synchronised before."""
    bench.sync()
    start = time.perf_counter()
    fn()
    host = time.perf_counter() - start
    bench.sync()
    return host, time.perf_counter() - start


def task_replay(device: str, rounds: int, per_round: int, dry: bool) -> dict:
    """The runner's whole replay step vs a bare ``CUDAGraph.replay()`` of the same graph, batch 1.

    ``rounds`` rounds of ``per_round`` triples; in each triple, in an order that rotates, one whole
    step of the adopted runner, one bare replay of its graph and one step of lmdeploy's plain
    ``CUDAGraphRunner`` on the same model with the same (vendor_graph) buffer methods but without the
    adopted runner's policy ("plain": separates what the policy adds from lmdeploy's runner and the
    fill). Every step gets a fresh step context built outside the timed region, from the same
    sequences (identical inputs), with ``past_key_values`` one list object as lmdeploy passes it (see
    :meth:`Bench.context`). Per round: the median of each arm and the median of the per-triple
    differences; over rounds: the median of those per-round differences with a bootstrap 95% interval
    and the distribution-free interval of the median (:mod:`_stats`). Then the phase split of the
    host time of the adopted runner's step (:mod:`_phases`), and once more with a new
    ``past_key_values`` list per step (how part1 timed it: the stale-graph guard's full check)."""
    import _phases
    import _stats

    bench = Bench(device, model_config("large", 1, dry), 1)
    try:
        bench.timed(bench.graph, 1, 2)  # capture + one replay
        bench.require_graphs()
        (single,) = compat.cuda_runner_graphs(bench.runner).values()
        graph = single._graph
        c = bench.configs
        plain = compat.cuda_graph_runner_class()(bench.model, c.model_config, c.cache_config, c.backend_config,
                                                 torch.device(bench.where))
        plain_step = lambda ctx: plain(**tm.forward_kwargs(ctx))  # noqa: E731
        bench.timed(plain_step, 1, 2)  # its own capture + one replay
        arms = ("step", "bare", "plain")
        order = list(arms)
        per = {name: {"device": [], "host": []} for name in arms}  # [round][i] seconds
        for r in range(rounds):
            rows = {name: {"device": [], "host": []} for name in arms}
            for i in range(per_round):
                shift = (r * per_round + i) % len(order)
                for name in order[shift:] + order[:shift]:
                    if name == "bare":
                        host, dev = _timed_call(bench, graph.replay)
                    else:
                        ctx = bench.context(1)  # built outside the timed call
                        call = plain_step if name == "plain" else bench.graph
                        host, dev = _timed_call(bench, lambda call=call, ctx=ctx: call(ctx))
                    rows[name]["device"].append(dev)
                    rows[name]["host"].append(host)
            for name in arms:
                per[name]["device"].append(rows[name]["device"])
                per[name]["host"].append(rows[name]["host"])

        def us(x: float) -> float:
            return 1e6 * x

        def round_medians(name: str, kind: str = "device") -> list[float]:
            return [us(statistics.median(v)) for v in per[name][kind]]

        def round_paired(a: str, b: str, kind: str = "device") -> list[float]:
            return [us(statistics.median([x - y for x, y in zip(ra, rb, strict=True)]))
                    for ra, rb in zip(per[a][kind], per[b][kind], strict=True)]

        diff = round_paired("step", "bare")
        stats_diff = _stats.paired(diff)
        flat = {name: [x for rnd in per[name]["device"] for x in rnd] for name in arms}
        w, b = summary(flat["step"]), summary(flat["bare"])
        phase_split = {}
        for fresh in (False, True):  # after the rounds: a new list would put the guard on its full check
            with _phases.phase_timers(bench.runner) as clock:
                for _ in range(min(100 if fresh else 200, rounds * per_round)):
                    ctx = bench.context(1, fresh_kv_list=fresh)
                    bench.sync()
                    with clock.region("unattributed (runner __call__ bodies, timing)"):
                        bench.graph(ctx)
                    bench.sync()
            phase_split[fresh] = clock.summary()
        result = {
            "task": "replay", "params": parameters(bench.model), "batch": 1, "rounds": rounds, "per_round": per_round,
            "goal_us": REPLAY_GOAL_US,
            # the figures part1's report reads
            "runner_step": w, "bare_replay": b, "plain_runner_step": summary(flat["plain"]),
            "overhead_median": w["median_ms"] / b["median_ms"] - 1, "overhead_min": w["min_ms"] / b["min_ms"] - 1,
            "round_medians_us": {name: round_medians(name) for name in arms},
            "round_host_medians_us": {name: round_medians(name, "host") for name in arms},
            "step_minus_bare_us": stats_diff,
            "plain_minus_bare_us": _stats.paired(round_paired("plain", "bare")),
            "step_minus_plain_us": _stats.paired(round_paired("step", "plain")),
            "host_step_minus_bare_us": _stats.paired(round_paired("step", "bare", "host")),
            "spread_us": {name: _stats.spread(round_medians(name)) for name in arms},
            "goal_met": stats_diff["median"] <= REPLAY_GOAL_US,
            "goal_met_whole_interval": (stats_diff["bootstrap95"] or (float("inf"),) * 2)[1] <= REPLAY_GOAL_US,
            "phases": phase_split[False],
            "phases_fresh_kv_list": phase_split[True],  # part1's set-up: a new past_key_values list per step
        }
        print(f"replay: step - bare {stats_diff['median']:.1f} us (rounds {stats_diff['min']:.1f}.."
              f"{stats_diff['max']:.1f}, bootstrap95 {stats_diff['bootstrap95']}), goal <= {REPLAY_GOAL_US} us",
              file=sys.stderr, flush=True)
        return result
    finally:
        bench.close()


def task_capture(device: str, max_batches: int, dry: bool) -> dict:
    from vendor_graph.sizing.buckets import ascend_capture_sizes  # captured here on the CUDA runner
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
    p.add_argument("--rounds", type=int, default=REPLAY_ROUNDS, help="replay: alternating rounds")
    p.add_argument("--per-round", type=int, default=REPLAY_PER_ROUND,
                   help="replay: triples (step, bare, plain) per round")
    p.add_argument("--out")
    args = p.parse_args(argv)
    dry = args.dry_run
    if args.task == "latency":
        result = task_latency(args.device, [1, 8] if dry else [1, 8, 64, 256], 3 if dry else args.reps, dry)
    elif args.task == "replay":
        result = task_replay(args.device, 4 if dry else args.rounds, 3 if dry else args.per_round, dry)
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
