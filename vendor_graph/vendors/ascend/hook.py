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
The scope is a context variable owned by one runner's capture, not a process-wide flag, so two runners
(a draft model's) never see each other's.
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


def _meta_like(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_like(v) for v in value)
    return value


def out_variant(op: Any, spec: AttentionOp, overload: str, args: tuple, kwargs: dict[str, Any]
                ) -> tuple[Any, dict[str, Any], Any]:
    """(the ``.out`` overload, ``kwargs`` with preallocated outputs, the value the functional call returns).

    The outputs are sized by the op's meta kernel on meta copies of the inputs (host lengths stay host
    values), then allocated on the query's device.
    """
    packet = getattr(op, "overloadpacket", op)
    out_op = getattr(packet, "out", None)
    if out_op is None:
        raise NoSeqLenUpdate(
            f"{spec.name}{overload} needs the task-update path here, which re-issues the op into the same "
            f"outputs, and this torch_npu has no {spec.name}.out overload to capture instead")
    functional = packet.default if overload in ("", ".default") else op
    try:
        shapes = functional(*_meta_like(args), **{k: v if k == spec.key else _meta_like(v) for k, v in kwargs.items()})
    except Exception as exc:  # noqa: BLE001 - no meta kernel, or it refused these inputs
        raise NoSeqLenUpdate(
            f"{spec.name}{overload} needs the task-update path here, and its .out overload's outputs cannot be "
            f"sized ({type(exc).__name__}: {exc})") from exc
    metas = shapes if isinstance(shapes, (tuple, list)) else (shapes,)
    query = args[0] if args else kwargs.get("query")
    device = query.device if isinstance(query, torch.Tensor) else None
    outs = [torch.empty_strided(m.size(), m.stride(), dtype=m.dtype, device=device) for m in metas]
    names = [a.name for a in out_op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(names) != len(outs):
        raise NoSeqLenUpdate(f"{spec.name}.out writes {names}, but the functional call returns {len(outs)} outputs")
    result = outs[0] if not isinstance(shapes, (tuple, list)) else type(shapes)(outs)
    return out_op, {**kwargs, **dict(zip(names, outs, strict=True))}, result


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
        result = None
        if path == TASK_UPDATE and overload != ".out" and not spec.writes_given_output:
            # A re-issued functional op would write a fresh tensor, not the one the graph's later
            # tasks read: capture its .out overload into preallocated outputs instead, as torch_npu's
            # own dispatcher does on the generations that intercept it.
            op, kwargs, result = out_variant(op, spec, overload, args, kwargs)
            overload = ".out"
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
        return out if result is None else result

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
