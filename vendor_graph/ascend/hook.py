"""The attention-side hook: how a vendor attention op takes part in a graph capture.

An Ascend attention kernel reads its KV lengths as host values, frozen when the graph is captured.
So the runner must know every attention task it captured, to refresh them after each fill. Vendor
attention code calls its op through :func:`call_attention` instead of directly::

    out = call_attention(torch.ops.npu.npu_fused_infer_attention_score, q, k, v,
                         actual_seq_lengths_kv=kv_lens, ...)

Outside a capture this is a plain call. Inside one (the runner opens a :class:`CaptureScope`), the
scope decides per op, from the installed torch_npu, how the task is captured (plain, for
``NPUGraph.update``; inside a task group gated by an ``ExternalEvent``, for the task-update path) and
registers it. The registrations are what the runner checks after capture and updates every step.
This replaces the reference plugin's process-global "capturing" class flag: the scope is a context
variable owned by one runner's capture, so two runners (a draft model's) never see each other's.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from .seqlen import ATTENTION_OPS, GRAPH_UPDATE, NO_UPDATE, TASK_UPDATE, AttentionOp, Capabilities, intercepted

_SCOPE: contextvars.ContextVar[CaptureScope | None] = contextvars.ContextVar("vendor_graph_capture", default=None)


class NoSeqLenUpdate(RuntimeError):
    """An attention op was captured that no available update path can refresh."""


class NeedsTaskGroupCapture(RuntimeError):
    """A task-update op that torch_npu's dispatcher would also intercept: capture without auto dispatch."""


def op_identity(op: Any) -> tuple[AttentionOp, str]:
    """(attention op facts, overload suffix) of a ``torch.ops`` packet or overload."""
    name = getattr(op, "__name__", None) or getattr(op, "_qualified_op_name", "")
    name = name.split("::")[-1]
    base, _, overload = name.partition(".")
    if base not in ATTENTION_OPS:
        raise KeyError(
            f"{name!r} is not an attention op vendor_graph knows how to refresh; known: {sorted(ATTENTION_OPS)}"
        )
    # A call through the packet dispatches to .default, which is the name torch_npu's dispatcher sees.
    return ATTENTION_OPS[base], f".{overload}" if overload else ".default"


@dataclass
class AttentionTask:
    """One captured attention call and how to refresh its host KV lengths."""

    op: Callable[..., Any]
    spec: AttentionOp
    path: str
    args: tuple
    kwargs: dict[str, Any]
    handle: Any = None  # task-group handle (task-update path)
    event: Any = None  # ExternalEvent the captured task waits on (task-update path)

    @property
    def _by_keyword(self) -> bool:
        return self.spec.position is None or self.spec.key in self.kwargs

    def host_value(self, lens: list[int]) -> Any:
        """``lens`` in the form the op took at capture: a host list, or a host tensor of its dtype."""
        captured = self.kwargs[self.spec.key] if self._by_keyword else self.args[self.spec.position]
        if isinstance(captured, torch.Tensor):
            return torch.tensor(lens, dtype=captured.dtype)
        return list(lens)

    def call_with(self, lens: list[int]) -> Any:
        """Re-issue the op with new host KV lengths (task-update path)."""
        args, kwargs = list(self.args), dict(self.kwargs)
        by_keyword = self._by_keyword
        lens = self.host_value(lens)
        if by_keyword:
            kwargs[self.spec.key] = lens
        else:
            args[self.spec.position] = lens
        return self.op(*args, **kwargs)


@dataclass
class CaptureScope:
    """Registrations of one graph capture; opened by the runner around ``torch.npu.graph``."""

    npu: Any  # torch.npu
    capabilities: Capabilities
    stream: Any
    force_task_update: bool = False
    auto_dispatch: bool = False  # the graph is captured with auto_dispatch_capture=True
    tasks: list[AttentionTask] = field(default_factory=list)

    def path(self, spec: AttentionOp, overload: str) -> str:
        path = self.capabilities.path(spec, overload)
        if self.force_task_update and path == GRAPH_UPDATE:
            path = TASK_UPDATE
        if path == TASK_UPDATE and not self.capabilities.facts.get("task_group_api"):
            path = NO_UPDATE
        return path

    def call(self, op: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        spec, overload = op_identity(op)
        path = self.path(spec, overload)
        if path == NO_UPDATE:
            raise NoSeqLenUpdate(
                f"{spec.name}{overload}: torch_npu {self.capabilities.version} "
                f"({self.capabilities.generation or 'unknown generation'}) offers no way to refresh its "
                f"{spec.key} in a captured graph"
            )
        if path == TASK_UPDATE and overload != ".out" and not spec.writes_given_output:
            # A re-issued functional op would write a fresh tensor, not the one the graph's later
            # tasks read (torch_npu's own dispatcher swaps to .out for the same reason).
            raise NoSeqLenUpdate(
                f"{spec.name}{overload} needs the task-update path here, which re-issues the op: call "
                f"{spec.name}.out with preallocated outputs under capture"
            )
        if path == TASK_UPDATE and self.auto_dispatch and intercepted(self.capabilities.facts, spec, overload):
            # torch_npu would wrap this call in a task group of its own, and groups cannot nest.
            raise NeedsTaskGroupCapture(f"{spec.name}{overload} is intercepted by NPUGraph's dispatcher")
        task = AttentionTask(op=op, spec=spec, path=path, args=args, kwargs=kwargs)
        if path == GRAPH_UPDATE:
            out = op(*args, **kwargs)
        else:
            npu = self.npu
            task.event = npu.ExternalEvent()
            task.event.wait(self.stream)
            task.event.reset(self.stream)
            npu.graph_task_group_begin(self.stream)
            out = op(*args, **kwargs)
            task.handle = npu.graph_task_group_end(self.stream)
        self.tasks.append(task)
        return out

    def __enter__(self) -> CaptureScope:
        self._token = _SCOPE.set(self)
        return self

    def __exit__(self, *exc) -> None:
        _SCOPE.reset(self._token)


def call_attention(op: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call an Ascend attention op; registers it when a vendor_graph capture is in progress."""
    scope = _SCOPE.get()
    if scope is None:
        return op(*args, **kwargs)
    return scope.call(op, args, kwargs)


def capturing() -> bool:
    """Whether a vendor_graph capture is in progress in this context."""
    return _SCOPE.get() is not None
