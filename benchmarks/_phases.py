"""Host time of a graph runner's replay step, split by phase, with ``perf_counter_ns`` wrappers put on
the live objects for a measurement and taken off after it (no code of vendor_graph or lmdeploy is
changed): the adopted runner's policy steps (``StepPolicy.step``, the runner's one view of the step, the
stale-graph guard, stats), lmdeploy's ``CUDAGraphRunner.__call__`` pieces (``_prepare_inputs``,
``enable_graph``, ``get_graph_key``), the single graph's ``forward``, the model's buffer fill,
context bind, output slicing, and ``CUDAGraph.replay()`` itself.

Each wrapper records its call's *exclusive* time (its own time minus that of wrapped calls inside it),
so the phases add up to the measured step; what no wrapper covers is the exclusive time of the
``total`` region (the runner's own ``__call__`` bodies). A wrapper costs roughly
:func:`wrapper_overhead_ns` per call; that cost lands in the caller's exclusive time.

Used by ``decode_bench.py replay`` (lmdeploy 0.17, Camb spec: GPU or simulator),
``kernel_counts.py`` (lmdeploy 0.18, both runners on the GPU) and ``step_host_profile.py`` (CPU).
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

_MISSING = object()


class PhaseClock:
    """Exclusive host nanoseconds per label, per step."""

    def __init__(self) -> None:
        self._stack: list[list[int]] = []  # [start_ns, child_ns] per open call
        self._now: dict[str, int] = defaultdict(int)
        self._calls: dict[str, int] = defaultdict(int)
        self.steps: list[dict[str, int]] = []
        self.calls: list[dict[str, int]] = []

    def wrap(self, fn, label: str):
        clock = self

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            frame = [time.perf_counter_ns(), 0]
            clock._stack.append(frame)
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = time.perf_counter_ns() - frame[0]
                clock._stack.pop()
                clock._now[label] += elapsed - frame[1]
                clock._calls[label] += 1
                if clock._stack:
                    clock._stack[-1][1] += elapsed

        timed.__vendor_graph_phase__ = label  # type: ignore[attr-defined]
        return timed

    @contextlib.contextmanager
    def region(self, label: str = "total") -> Iterator[None]:
        """Time the block as ``label`` (the step itself) and close the step's record after it."""
        frame = [time.perf_counter_ns(), 0]
        self._stack.append(frame)
        try:
            yield
        finally:
            elapsed = time.perf_counter_ns() - frame[0]
            self._stack.pop()
            self._now[label] += elapsed - frame[1]
            self._now["__inclusive__"] += elapsed
            self._calls[label] += 1
            if not self._stack:
                self.steps.append(dict(self._now))
                self.calls.append(dict(self._calls))
                self._now.clear()
                self._calls.clear()

    def summary(self) -> dict[str, Any]:
        """Per label: median / mean exclusive µs per step and calls per step, largest first."""
        labels = sorted({k for s in self.steps for k in s} - {"__inclusive__"})
        rows = []
        for label in labels:
            us = [s.get(label, 0) / 1e3 for s in self.steps]
            calls = [c.get(label, 0) for c in self.calls]
            rows.append({"phase": label, "median_us": statistics.median(us), "mean_us": statistics.fmean(us),
                         "calls_per_step": statistics.median(calls)})
        rows.sort(key=lambda r: -r["median_us"])
        total = [s["__inclusive__"] / 1e3 for s in self.steps]
        return {"steps": len(self.steps), "step_median_us": statistics.median(total) if total else None,
                "sum_of_phase_medians_us": sum(r["median_us"] for r in rows), "phases": rows,
                "wrapper_overhead_ns_per_call": wrapper_overhead_ns()}


@functools.cache
def wrapper_overhead_ns() -> float:
    """What one wrapper adds around a call (median over many calls of a no-op)."""
    clock = PhaseClock()
    noop = clock.wrap(lambda: None, "noop")
    bare = lambda: None  # noqa: E731
    best = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(2000):
            noop()
        t1 = time.perf_counter_ns()
        for _ in range(2000):
            bare()
        t2 = time.perf_counter_ns()
        best.append(((t1 - t0) - (t2 - t1)) / 2000)
    return statistics.median(best)


class _ReplayProxy:
    """Stands in for a ``torch.cuda.CUDAGraph`` where lmdeploy calls ``self._graph.replay()``."""

    def __init__(self, graph, replay):
        self._vg_graph = graph
        self.replay = replay

    def __getattr__(self, name):
        return getattr(self._vg_graph, name)


def _targets(runner: Any) -> list[tuple[Any, str, str]]:
    """(owner, attribute, label) for every phase present on this runner (adopted or lmdeploy's own)."""
    from vendor_graph.upstream import compat

    model = runner.model
    out: list[tuple[Any, str, str]] = []
    policy = getattr(runner, "policy", None)
    if policy is not None:  # vendor_graph's adopted runner
        import vendor_graph.install.patching as patching
        import vendor_graph.runtime.counters as counters
        import vendor_graph.runtime.step as step

        out += [(policy, "step", "vg StepPolicy.step (own)"),
                (patching, "ensure_owned", "vg patching.ensure_owned"),
                (runner, "view", "vg view (own: batch, key, graph)"),
                (policy.guard, "check", "vg guard.check (stale graph)"),
                (step, "StepMetadata", "vg StepMetadata (own)"),
                (counters, "profile_range", "vg stats.profile_range"),
                (policy.stats, "replayed", "vg stats.replayed"),
                (policy.shadow, "due", "vg shadow.due"),
                (runner, "replay", "vg adopted replay (own)")]
    out += [(runner, "_prepare_inputs", "lmdeploy _prepare_inputs"),
            (runner, "enable_graph", "lmdeploy enable_graph / support_cuda_graph"),
            (runner, "get_graph_key", "lmdeploy get_graph_key"),
            (runner, "_should_use_full_graph", "lmdeploy _should_use_full_graph (own)"),
            (runner, "_forward_full_graph", "lmdeploy _forward_full_graph (own)")]
    for single in compat.cuda_runner_graphs(runner).values():
        out += [(single, "forward", "lmdeploy single.forward (own, incl. record_function)"),
                (single, "_bind_inputs", "lmdeploy single._bind_inputs (own)")]
    out += [(model, "fill_buffers_cudagraph", "model fill_buffers_cudagraph"),
            (model, "update_context_cudagraph", "model update_context_cudagraph"),
            (model, "get_outputs_cudagraph", "model get_outputs_cudagraph"),
            (model, "get_cudagraph_extra_key", "model get_cudagraph_extra_key")]
    return out


@contextlib.contextmanager
def phase_timers(runner: Any) -> Iterator[PhaseClock]:
    """Wrap every phase of ``runner``'s replay step for the block; yields the :class:`PhaseClock`.
    Everything is restored on exit (instance attributes removed again where there were none)."""
    from vendor_graph.upstream import compat

    clock = PhaseClock()
    undo: list[tuple[Any, str, Any]] = []
    try:
        for owner, name, label in _targets(runner):
            current = getattr(owner, name, _MISSING)
            if current is _MISSING or getattr(current, "__vendor_graph_phase__", None):
                continue
            own = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
            setattr(owner, name, clock.wrap(current, label))
            undo.append((owner, name, own))
        for single in compat.cuda_runner_graphs(runner).values():
            graph = getattr(single, "_graph", None)
            if graph is not None:
                single._graph = _ReplayProxy(graph, clock.wrap(graph.replay, "CUDAGraph.replay (host)"))
                undo.append((single, "_graph", graph))
        yield clock
    finally:
        for owner, name, own in reversed(undo):
            if own is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, own)


def markdown(summary: dict[str, Any], title: str) -> list[str]:
    lines = [f"{title}: {summary['steps']} steps, step median {summary['step_median_us']:.1f} µs (host, "
             f"instrumented); wrapper cost ~{summary['wrapper_overhead_ns_per_call']:.0f} ns per wrapped call", "",
             "| phase (exclusive host time) | median µs / step | mean µs / step | calls / step |",
             "|---|---:|---:|---:|"]
    for r in summary["phases"]:
        lines.append(f"| {r['phase']} | {r['median_us']:.1f} | {r['mean_us']:.1f} | {r['calls_per_step']:g} |")
    return lines


__all__ = ["PhaseClock", "markdown", "phase_timers", "wrapper_overhead_ns"]

if __name__ == "__main__":  # a smoke check of the clock alone
    c = PhaseClock()
    f = c.wrap(lambda: time.sleep(0.001), "sleep")
    for _ in range(3):
        with c.region():
            f()
    print(c.summary(), file=sys.stderr)
