"""Declarative graph buffers: each batch-dependent tensor declared once, make / fill / bind derived.

A captured graph reads fixed addresses, so every tensor whose shape or content changes with the batch
lives in a buffer sized for the graph's batch (``graph_meta.max_batchs``) and token count
(``graph_meta.max_tokens``). A :class:`BufferSpec` lists them as :class:`BufferField` declarations:

* where the live data comes from (``source``): a model kwarg, an ``attn_metadata`` attribute or a
  ``StepContext`` attribute; or nothing, for a *static* field whose whole content follows from the
  graph's shape (the query lengths of a decode graph);
* where the buffer is bound (``bind``): the same three kinds of place;
* shape, dtype, host or device placement, and the value padding rows hold.

:meth:`BufferSpec.make`, :meth:`BufferSpec.fill` and :meth:`BufferSpec.bind_context` all walk the same
declarations, so a field cannot be filled but not bound, or bound but not made.

Fill rules (each one a classic graph-mode failure when broken):
* pad to the graph's batch, never to a size computed here;
* write the live rows, then reset every padding row a previous, larger batch left behind, so padding
  never carries a stale ``kv_start_indices`` (which would write a live sequence's KV slot);
* a field whose source appears or disappears after capture is an error, not a silent stale read.

Cost per step: one copy per sourced field, plus one fill per field whose live extent shrank; static
fields cost nothing. High-water marks make the resets exact without touching untouched padding.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "BATCH",
    "BLOCKS",
    "TOKENS",
    "BufferField",
    "BufferSpec",
    "GraphInputsChanged",
    "HeldAttr",
    "Placement",
    "Ref",
    "SOURCE",
]


class _Dim(str, enum.Enum):
    BATCH = "batch"  # graph_meta.max_batchs
    TOKENS = "tokens"  # graph_meta.max_tokens
    BLOCKS = "blocks"  # graph_meta.num_blocks (block table columns)
    BATCH_PLUS_ONE = "batch+1"  # cumulative starts
    SOURCE = "source"  # the size of the source's dimension at capture (hidden size of inputs_embeds)


BATCH = _Dim.BATCH
TOKENS = _Dim.TOKENS
BLOCKS = _Dim.BLOCKS
BATCH_PLUS_ONE = _Dim.BATCH_PLUS_ONE
SOURCE = _Dim.SOURCE
_ROW_DIMS = (BATCH, TOKENS, BATCH_PLUS_ONE)


class Placement(enum.Enum):
    DEVICE = "device"
    HOST = "host"  # read by the vendor kernel as a host value (Ascend seq lens); never on the device


class GraphInputsChanged(ValueError):
    """A step's inputs do not match what its graph was captured with; replaying would be wrong."""


@dataclass(frozen=True)
class Ref:
    """A place a tensor is read from or bound to: ``kwarg``, ``attn`` or ``context``, plus a dotted path."""

    kind: str
    path: str

    def __post_init__(self) -> None:
        if self.kind not in ("kwarg", "attn", "context"):
            raise ValueError(f"Ref kind must be kwarg, attn or context, got {self.kind!r}")

    @classmethod
    def kwarg(cls, name: str) -> Ref:
        return cls("kwarg", name)

    @classmethod
    def attn(cls, path: str) -> Ref:
        return cls("attn", path)

    @classmethod
    def context(cls, path: str) -> Ref:
        return cls("context", path)

    def __str__(self) -> str:
        return f"{'attn_metadata' if self.kind == 'attn' else self.kind}.{self.path}"

    def get(self, root: Any) -> Any:
        obj = root
        for part in self.path.split("."):
            if obj is None:
                return None
            obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
        return obj

    def set(self, root: Any, value: Any) -> None:
        *parents, last = self.path.split(".")
        obj = root
        for part in parents:
            obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
        if isinstance(obj, dict):
            obj[last] = value
        else:
            setattr(obj, last, value)


@dataclass(frozen=True)
class BufferField:
    """One batch-dependent tensor of a graph.

    ``shape`` mixes ints and the symbols BATCH, TOKENS, BATCH_PLUS_ONE (the row dimension, exactly one),
    BLOCKS and SOURCE. ``dtype=None`` takes the source's dtype at capture. A field without ``source`` is
    static: ``static`` computes its whole content once. ``static`` together with ``source`` makes a
    static field that exists only when the source does (the source is never copied).
    ``required`` names why a missing source is an error at capture.
    """

    name: str
    shape: tuple
    dtype: torch.dtype | None
    pad: int | float | bool
    bind: tuple[Ref, ...]
    source: Ref | None = None
    placement: Placement = Placement.DEVICE
    static: Callable[[GraphDims], list | torch.Tensor] | None = None
    required: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        rows = [d for d in self.shape if d in _ROW_DIMS]
        if len(rows) != 1:
            raise ValueError(f"{self.name}: shape {self.shape} needs exactly one of BATCH/TOKENS/BATCH_PLUS_ONE")
        if self.source is None and self.static is None:
            raise ValueError(f"{self.name}: a field needs a source, a static content, or both")
        if not self.bind:
            raise ValueError(f"{self.name}: a buffer bound nowhere is dead weight; give it a bind target")

    @property
    def row_dim(self) -> int:
        return next(i for i, d in enumerate(self.shape) if d in _ROW_DIMS)

    @property
    def is_static(self) -> bool:
        return self.static is not None


@dataclass(frozen=True)
class HeldAttr:
    """An ``attn_metadata`` attribute whose capture-time value the graph keeps reading.

    The value (a mask list, say) is held at capture and re-bound on every replay, so the tensor the
    graph recorded stays alive and in place even when lmdeploy builds a new one each step.
    """

    path: str


@dataclass(frozen=True)
class GraphDims:
    batch: int
    tokens: int
    blocks: int
    query_len: int


@dataclass
class _FieldState:
    tensor: torch.Tensor
    # The live extent written by the last fill, per dimension; everything beyond holds padding.
    high_water: list[int] = field(default_factory=list)


@dataclass
class GraphBuffers:
    """What one captured graph owns: its buffers and the fill bookkeeping."""

    dims: GraphDims
    fields: dict[str, _FieldState]
    held: dict[str, Any]
    sealed: bool = False


_STATE_ATTR = "_vendor_graph_buffers"


def graph_buffers(graph_meta: Any) -> GraphBuffers:
    state = getattr(graph_meta, _STATE_ATTR, None)
    if state is None:
        raise RuntimeError(
            "fill/bind called on a graph whose buffers vendor_graph did not make; another patch replaced "
            "make_buffers_cudagraph between capture and replay (see `vendor-graph doctor`)"
        )
    return state


def _dims(graph_meta: Any) -> GraphDims:
    batch = int(graph_meta.max_batchs)
    tokens = int(graph_meta.max_tokens)
    return GraphDims(
        batch=batch,
        tokens=tokens,
        blocks=int(graph_meta.num_blocks),
        query_len=int(getattr(graph_meta, "decode_query_len", 1) or 1),
    )


@dataclass(frozen=True)
class BufferSpec:
    """A vendor's batch-dependent tensors, for one lmdeploy release.

    ``constants`` are ``attn_metadata`` attributes set on every fill (a Python int there is frozen
    into the graph at capture, so it must be a value right for every replay).
    ``check_meta`` rejects graph configurations the vendor cannot serve, before anything is allocated.
    """

    vendor: str
    fields: tuple[BufferField, ...]
    constants: Mapping[str, Callable[[GraphDims, Any], Any]] = field(default_factory=dict)
    held: tuple[HeldAttr, ...] = ()
    check_meta: Callable[[Any], None] | None = None

    def __post_init__(self) -> None:
        names = [f.name for f in self.fields]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"{self.vendor}: buffer fields declared twice: {sorted(dupes)}")
        targets = [str(r) for f in self.fields for r in f.bind]
        dupes = {t for t in targets if targets.count(t) > 1}
        if dupes:
            raise ValueError(f"{self.vendor}: two fields bound to the same place: {sorted(dupes)}")

    def field(self, name: str) -> BufferField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    # -- make ---------------------------------------------------------------------------------------

    def make(self, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any) -> dict[str, torch.Tensor]:
        """Allocate the buffers of one graph from its capture step's inputs; returns ``input_buffers``.

        Context-sourced fields are made at the first :meth:`bind_context`, which lmdeploy's runners
        call right after the capture fill.
        """
        if self.check_meta is not None:
            self.check_meta(graph_meta)
        dims = _dims(graph_meta)
        state = GraphBuffers(dims=dims, fields={}, held={})
        roots = {"kwarg": inputs, "attn": attn_metadata}
        for f in self.fields:
            if f.source is not None and f.source.kind == "context":
                continue
            src = f.source.get(roots[f.source.kind]) if f.source is not None else None
            self._check_required(f, graph_meta, src)
            if f.source is not None and src is None:
                continue
            state.fields[f.name] = self._allocate(f, dims, graph_meta.device, src)
        setattr(graph_meta, _STATE_ATTR, state)
        return {name: st.tensor for name, st in state.fields.items()}

    def _check_required(self, f: BufferField, graph_meta: Any, src: Any) -> None:
        if src is None and f.source is not None and f.required is not None:
            why = f.required(graph_meta)
            if why:
                raise ValueError(f"{self.vendor}: {f.source} is required ({why}) but this step has none")

    @staticmethod
    def _allocate(f: BufferField, dims: GraphDims, device: Any, src: Any) -> _FieldState:
        sizes = {BATCH: dims.batch, TOKENS: dims.tokens, BLOCKS: dims.blocks, BATCH_PLUS_ONE: dims.batch + 1}
        shape = []
        for i, d in enumerate(f.shape):
            if d == SOURCE:
                shape.append(src.shape[i])
            else:
                shape.append(sizes.get(d, d))
        dtype = f.dtype if f.dtype is not None else src.dtype
        where = "cpu" if f.placement is Placement.HOST else device
        if f.is_static:
            content = f.static(dims)
            tensor = torch.as_tensor(content, dtype=dtype).reshape(shape).to(where)
            return _FieldState(tensor=tensor, high_water=list(tensor.shape))
        tensor = torch.full(shape, f.pad, dtype=dtype, device=where)
        return _FieldState(tensor=tensor, high_water=[0] * len(shape))

    # -- fill ---------------------------------------------------------------------------------------

    def fill(self, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any) -> dict[str, Any]:
        """Copy this step's kwarg- and attn-sourced data in, bind ``attn_metadata``; return the kwargs
        to call the model with (the caller's kwargs, with buffers in place of batch-dependent ones)."""
        state = graph_buffers(graph_meta)
        roots = {"kwarg": inputs, "attn": attn_metadata}
        for f in self.fields:
            if f.source is None or f.source.kind == "context":
                continue
            self._fill_field(f, state, f.source.get(roots[f.source.kind]))

        new_inputs = dict(inputs)
        self._bind(state, {"attn": attn_metadata, "kwarg": new_inputs})
        for name, make_value in self.constants.items():
            Ref.attn(name).set(attn_metadata, make_value(state.dims, attn_metadata))
        for held in self.held:
            ref = Ref.attn(held.path)
            if held.path not in state.held:
                state.held[held.path] = ref.get(attn_metadata)
            ref.set(attn_metadata, state.held[held.path])
        return new_inputs

    def bind_context(self, graph_meta: Any, context: Any) -> None:
        """Copy context-sourced data in and point the ``StepContext`` at the buffers."""
        state = graph_buffers(graph_meta)
        for f in self.fields:
            if f.source is None or f.source.kind != "context":
                continue
            src = f.source.get(context)
            if not state.sealed and f.name not in state.fields:
                self._check_required(f, graph_meta, src)
                if src is not None:
                    state.fields[f.name] = self._allocate(f, state.dims, graph_meta.device, src)
                    graph_meta.input_buffers[f.name] = state.fields[f.name].tensor
            self._fill_field(f, state, src)
        self._bind(state, {"context": context})
        state.sealed = True

    def _bind(self, state: GraphBuffers, roots: Mapping[str, Any]) -> None:
        """Point every bind target of the given kinds at its field's buffer."""
        for f in self.fields:
            st = state.fields.get(f.name)
            if st is None:
                continue
            for ref in f.bind:
                if ref.kind in roots:
                    ref.set(roots[ref.kind], st.tensor)

    def _fill_field(self, f: BufferField, state: GraphBuffers, src: Any) -> None:
        st = state.fields.get(f.name)
        if st is None:
            if src is not None:
                raise GraphInputsChanged(
                    f"{self.vendor} graph for batch {state.dims.batch} was captured without {f.source}, "
                    f"but this step has one; the graph would ignore it. Run this step eager "
                    f"(the vendor_graph runner does so itself) or capture with it present"
                )
            return
        if f.is_static:
            return
        if src is None:
            raise GraphInputsChanged(
                f"{self.vendor} graph for batch {state.dims.batch} was captured with {f.source}, "
                f"but this step has none; replaying would read the previous step's values"
            )
        if not isinstance(src, torch.Tensor):
            src = torch.as_tensor(src)
        dst = st.tensor
        if src.dim() != dst.dim():
            raise GraphInputsChanged(
                f"{self.vendor}: {f.source} has shape {tuple(src.shape)}, buffer {f.name!r} expects "
                f"{dst.dim()} dims like {tuple(dst.shape)}"
            )
        extent = list(src.shape)
        for d, (n, cap) in enumerate(zip(extent, dst.shape, strict=True)):
            if n > cap:
                raise GraphInputsChanged(
                    f"{self.vendor}: {f.source} needs {n} along dim {d} but the graph's buffer {f.name!r} "
                    f"holds {cap}: this step was routed to a graph smaller than its batch "
                    f"(graphs must be looked up by padded batch)"
                )
        live = tuple(slice(0, n) for n in extent)
        dst[live].copy_(src)
        # Reset what earlier, larger steps left beyond this step's extent, dimension by dimension.
        for d, (n, hw) in enumerate(zip(extent, st.high_water, strict=True)):
            if n < hw:
                idx = [slice(0, e) for e in extent]
                idx[d] = slice(n, hw)
                # Rows before d are covered by this extent; the stale box is [n:hw) in d, live elsewhere,
                # except dims after d, which may also have been wider: use their high water there.
                for later in range(d + 1, len(extent)):
                    idx[later] = slice(0, max(extent[later], st.high_water[later]))
                dst[tuple(idx)].fill_(f.pad)
        st.high_water = extent

    # -- introspection ------------------------------------------------------------------------------

    def describe(self) -> list[dict[str, str]]:
        """One row per field, for `vendor-graph plan` and the docs."""
        rows = []
        for f in self.fields:
            rows.append(
                {
                    "buffer": f.name,
                    "shape": "(" + ", ".join(d.value if isinstance(d, _Dim) else str(d) for d in f.shape) + ")",
                    "dtype": str(f.dtype).replace("torch.", "") if f.dtype is not None else "as source",
                    "where": f.placement.value,
                    "pad": "static" if f.is_static else repr(f.pad),
                    "from": str(f.source) if f.source is not None and not f.is_static else "-",
                    "bound to": ", ".join(str(r) for r in f.bind),
                }
            )
        return rows
