"""Device operations a graph runner issues per replay step, counted exactly on the simulator.

:func:`replay_step_ops` drives the tiny decoder through a vendor's real runner (the conformance kit's
:func:`vendor_graph_sim.harness.run`) and records, for every call of the runner, the device work
issued inside it, split into the buffer fill (``BufferSpec.fill``), the context bind
(``BufferSpec.bind_context``), the Ascend seq-len update, the replay and anything else, and the host
waits on device work it made (``host_syncs``, device-to-host copies among them). Used by
``benchmarks/ops_per_step.py``, ``benchmarks/step_cost.py`` and the test that holds a replay step to one input
device op and no host wait.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

_UPDATE_OPS = ("graph.task_update",)


@dataclass
class StepOps:
    """The device work of one runner call. ``kind``: ``replay``, ``capture`` or ``eager``."""

    step: int
    batch: int
    kind: str
    total: int
    fill: int
    bind: int
    update: int
    update_calls: int
    replay: int
    other: int
    by_op: dict[str, int]
    # host waits on device work inside the call: synchronize / event synchronize / blocking host reads
    host_syncs: int = 0
    d2h: int = 0  # device-to-host copies among them

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _count_calls(runner: Any, log: list[StepOps], phases: dict[str, int]) -> None:
    """Make ``runner`` count the device work of each of its calls (a subclass swapped in, so
    ``isinstance`` checks on the runner still hold)."""
    from . import count_ops

    cls = type(runner)
    call = cls.__call__

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        for key in phases:
            phases[key] = 0
        with count_ops() as c:
            out = call(self, *args, **kwargs)
        by_op = dict(c.by_op)
        update = sum(n for op, n in by_op.items() if op in _UPDATE_OPS or op.startswith("task_update:"))
        # host calls that refresh the seq lens: NPUGraph.update (graph-update path), else one task update
        # per captured attention task (task-update path)
        update_calls = by_op.get("NPUGraph.update") or by_op.get("graph.task_update", 0)
        replay = by_op.get("graph.replay", 0)
        kind = "capture" if c.captured else ("replay" if c.replays else "eager")
        input_ids = kwargs.get("input_ids")
        batch = int(input_ids.shape[-1]) if input_ids is not None else -1
        fill, bind = phases["fill"], phases["bind"]
        log.append(StepOps(step=len(log), batch=batch, kind=kind, total=c.device_ops, fill=fill, bind=bind,
                           update=update, update_calls=update_calls, replay=replay,
                           other=c.device_ops - fill - bind - update - replay, by_op=by_op,
                           host_syncs=c.syncs, d2h=c.d2h))
        return out

    runner.__class__ = type(f"OpCounting{cls.__name__}", (cls,), {"__call__": __call__, "_vg_counting": True})


@contextlib.contextmanager
def _phase_counting(phases: dict[str, int]) -> Iterator[None]:
    from vendor_graph.buffers import BufferSpec

    from . import count_ops

    fill, bind = BufferSpec.fill, BufferSpec.bind_context

    def counted_fill(self: Any, *args: Any, **kwargs: Any) -> Any:
        with count_ops() as c:
            result = fill(self, *args, **kwargs)
        phases["fill"] += c.device_ops
        return result

    def counted_bind(self: Any, *args: Any, **kwargs: Any) -> Any:
        with count_ops() as c:
            result = bind(self, *args, **kwargs)
        phases["bind"] += c.device_ops
        return result

    BufferSpec.fill, BufferSpec.bind_context = counted_fill, counted_bind  # type: ignore[method-assign]
    try:
        yield
    finally:
        BufferSpec.fill, BufferSpec.bind_context = fill, bind  # type: ignore[method-assign]


def replay_step_ops(vendor: str, *, seqlen_path: str | None = None, seed: int = 0, steps: int = 48,
                    num_seqs: int = 20, generation: str | None = None) -> tuple[list[StepOps], list[str]]:
    """Every runner call of one seeded schedule (eager and graph side by side, as the conformance suite
    runs it), with its device work; and the schedule's parity mismatches (expected: none).

    ``seqlen_path`` (Ascend): ``graph-update`` or ``task-update``, forced through
    ``VENDOR_GRAPH_SEQLEN_UPDATE`` for the run.
    """
    from .. import harness

    log: list[StepOps] = []
    phases = {"fill": 0, "bind": 0}
    original = harness.SideBySide.graph_step

    def graph_step(self: Any, model: Any, ctx: Any) -> Any:
        if not getattr(self.runner, "_vg_counting", False):
            _count_calls(self.runner, log, phases)
        return original(self, model, ctx)

    saved_env = os.environ.get("VENDOR_GRAPH_SEQLEN_UPDATE")
    if seqlen_path is not None:
        os.environ["VENDOR_GRAPH_SEQLEN_UPDATE"] = seqlen_path
    harness.SideBySide.graph_step = graph_step  # type: ignore[method-assign]
    try:
        with _phase_counting(phases):
            pair = harness.run(vendor, seed, generation=generation, steps=steps, num_seqs=num_seqs)
    finally:
        harness.SideBySide.graph_step = original  # type: ignore[method-assign]
        if saved_env is None:
            os.environ.pop("VENDOR_GRAPH_SEQLEN_UPDATE", None)
        else:
            os.environ["VENDOR_GRAPH_SEQLEN_UPDATE"] = saved_env
    return log, pair.mismatches
