"""Ascend capture limits: the ExternalEvent budget of captured graphs, and the ACL capture errors.

Every attention task of a captured Ascend decode graph holds an ``ExternalEvent`` for the graph's lifetime, and
past what the device has, capture fails with ACL error 207008. :func:`fit_capture_sizes` keeps the capture sizes
that fit ``VENDOR_GRAPH_NPU_EVENT_BUDGET`` before anything is captured, largest first;
:func:`explain_capture_error` turns the known ACL capture error codes into remedies. The budget's default and
its sources: ``docs/ascend.md`` (Event budget).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ...config import settings
from .seqlen import GRAPH_UPDATE, PATHS, TASK_UPDATE

EVENT_BUDGET_ENV = settings.variable("npu_event_budget")
DEFAULT_EVENT_BUDGET = settings.Settings().npu_event_budget
# Paths whose captured tasks each hold one ExternalEvent (and one task group) for the graph's lifetime.
EVENT_PATHS = frozenset({GRAPH_UPDATE, TASK_UPDATE})


def event_budget(environ: Mapping[str, str] | None = None) -> int | None:
    """``VENDOR_GRAPH_NPU_EVENT_BUDGET`` (default :data:`DEFAULT_EVENT_BUDGET`; None: no limit) in the current
    settings, or in ``environ`` when given."""
    if environ is None:
        return settings.current().npu_event_budget
    return settings.declared("npu_event_budget").parse(environ.get(EVENT_BUDGET_ENV))


def events_per_graph(num_attention_layers: int, paths: str | Iterable[str] | Mapping[str, str] = TASK_UPDATE) -> int:
    """ExternalEvents one captured decode graph holds.

    ``paths``: the seq-len update path of each attention op one layer issues (a single path for a layer
    with one attention op, an iterable of paths, or ``{op name: path}``). ``none`` ops hold no event
    (a graph with such an op runs eager anyway).
    """
    if num_attention_layers < 0:
        raise ValueError(f"num_attention_layers must be >= 0, got {num_attention_layers}")
    if isinstance(paths, str):
        paths = [paths]
    elif isinstance(paths, Mapping):
        paths = list(paths.values())
    per_layer = 0
    for path in paths:
        if path not in PATHS:
            raise ValueError(f"unknown seq-len update path {path!r}; one of {PATHS}")
        per_layer += path in EVENT_PATHS
    return num_attention_layers * per_layer


@dataclass(frozen=True)
class CaptureBudget:
    """Which capture sizes fit the event budget, and why."""

    kept: list[int]  # ascending, as capture size lists are
    dropped: list[int] = field(default_factory=list)
    per_graph: int = 0  # events one graph holds
    graphs_per_size: int = 1
    needed: int = 0  # events for every requested size
    budget: int | None = DEFAULT_EVENT_BUDGET
    message: str | None = None  # None when nothing was dropped
    # Why graph mode is off when no size fits (the eager steps' reason); None when one fits.
    off_reason: str | None = None

    @property
    def fits(self) -> bool:
        return not self.dropped


def fit_capture_sizes(num_attention_layers: int, capture_sizes: Sequence[int],
                      paths: str | Iterable[str] | Mapping[str, str] = TASK_UPDATE, *,
                      graphs_per_size: int = 1, budget: int | None | str = "env") -> CaptureBudget:
    """Keep the capture sizes whose graphs fit the ExternalEvent budget, largest first.

    ``capture_sizes``: what the runner would capture (``max_batches`` is the largest).
    ``graphs_per_size``: graphs captured per size (more than 1 with several decode query lengths or
    microbatch keys). ``budget``: events available (``"env"``: :func:`event_budget`; None: no limit).
    """
    sizes = sorted(set(int(s) for s in capture_sizes))
    if budget == "env":
        budget = event_budget()
    if graphs_per_size < 1:
        raise ValueError(f"graphs_per_size must be >= 1, got {graphs_per_size}")
    per_graph = events_per_graph(num_attention_layers, paths) * graphs_per_size
    needed = per_graph * len(sizes)
    if budget is None or needed <= budget or per_graph == 0:
        return CaptureBudget(kept=sizes, per_graph=per_graph, graphs_per_size=graphs_per_size, needed=needed,
                             budget=budget)
    affordable = budget // per_graph
    kept = sorted(sorted(sizes, reverse=True)[:affordable])
    dropped = [s for s in sizes if s not in kept]
    off_reason = None if kept else (
        f"{EVENT_BUDGET_ENV}={budget}: not even one decode graph fits (each needs {per_graph} ExternalEvents); "
        f"raise it to {per_graph} or more, or set it to 0 for no limit")
    return CaptureBudget(kept=kept, dropped=dropped, per_graph=per_graph, graphs_per_size=graphs_per_size,
                         needed=needed, budget=budget,
                         message=_message(sizes, kept, dropped, per_graph, num_attention_layers, needed, budget),
                         off_reason=off_reason)


def _message(sizes, kept, dropped, per_graph, layers, needed, budget) -> str:
    head = (f"vendor_graph.ascend: capturing {len(sizes)} decode graphs needs about {needed} ExternalEvents "
            f"({per_graph} per graph: {layers} attention layers, one event per attention task), more than the "
            f"budget of {budget} ({EVENT_BUDGET_ENV}; beyond it capture fails with ACL error 207008). ")
    if not kept:
        body = (f"Not even one graph fits: every decode step runs eager. Fix: run with eager_mode=True to say "
                f"so, or raise {EVENT_BUDGET_ENV} if this device has more event resources")
    else:
        body = (f"Dropped capture sizes {dropped}; kept {kept}: batches up to {kept[0]} pad to {kept[0]}, and "
                f"max_batches {kept[-1]} stays captured. Fix: lower max_batch_size or pass fewer "
                f"cudagraph_capture_batch_sizes (each size costs {per_graph} events), or raise {EVENT_BUDGET_ENV} "
                f"if this device has more event resources")
    return head + body


# -- ACL capture errors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureError:
    code: int
    meaning: str
    phrases: tuple[str, ...]  # message fragments that identify it without the code
    remedy: str


CAPTURE_ERRORS: dict[int, CaptureError] = {e.code: e for e in (
    CaptureError(207008, "stream resources are insufficient", ("stream resources are insufficient",),
                 "the captured graphs hold more streams/ExternalEvents than the device has. Capture fewer "
                 "sizes: lower max_batch_size, pass fewer cudagraph_capture_batch_sizes, or set "
                 f"{EVENT_BUDGET_ENV} lower so vendor_graph drops sizes before capturing; eager_mode=True "
                 "turns graph mode off"),
    CaptureError(207005, "alloc sq cq fail", ("alloc sq cq fail",),
                 "the driver could not allocate a submission/completion queue for the graph; upgrade the "
                 "Ascend HDK (driver) to 25.5.1 or newer, and capture fewer sizes"),
    CaptureError(107030, "current capture mode does not support this operation",
                 ("current capture mode does not support",),
                 "a synchronous runtime call (a blocking memcpy such as .item()/.cpu()/.tolist() of a device "
                 "tensor, or a synchronize) ran while a graph was being captured, in the model or in another "
                 "thread (seen under memory pressure); move it out of the decode step, keep other threads "
                 "from issuing synchronous copies during capture, and free device memory"),
    CaptureError(107033, "aclmdlRICaptureEnd failed", ("aclmdlricaptureend",),
                 "the runtime rejected the captured graph at the end of capture: the model contains work that "
                 "cannot be captured (seen with Qwen3-Next). Run this model with eager_mode=True and report the "
                 "model with the log"),
)}


def _texts(exc: BaseException) -> list[str]:
    seen, out = set(), []
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(f"{type(exc).__name__}: {exc}")
        exc = exc.__cause__ or exc.__context__
    return out


def explain_capture_error(exc: BaseException) -> str | None:
    """What a known Ascend capture failure means and how to fix it; None for anything else."""
    text = "\n".join(_texts(exc))
    lowered = text.lower()
    for error in CAPTURE_ERRORS.values():
        if re.search(rf"(?<!\d){error.code}(?!\d)", text) or any(p in lowered for p in error.phrases):
            return f"ACL error {error.code} ({error.meaning}): {error.remedy}"
    return None


__all__ = ["CAPTURE_ERRORS", "DEFAULT_EVENT_BUDGET", "EVENT_BUDGET_ENV", "CaptureBudget", "event_budget",
           "events_per_graph", "explain_capture_error", "fit_capture_sizes"]
