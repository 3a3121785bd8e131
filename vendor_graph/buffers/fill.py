"""The checked fill: make, fill and bind of one graph's buffers, each walking the same declarations and
validating every source, so a field cannot be filled but not bound, or bound but not made. This is the
reference of what the buffers hold after a step; the fast fill (buffers/fast.py) only repeats its writes.
The fill rules and their reasons: docs/buffers.md."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from .copies import copy_all, copy_host, stage
from .declare import (
    BATCH,
    BATCH_PLUS_ONE,
    BLOCKS,
    SOURCE,
    TOKENS,
    BufferField,
    Dim,
    GraphDims,
    GraphInputsChanged,
    HeldAttr,
    Placement,
    Ref,
)
from .state import FieldState, FillCache, GraphBuffers, attach_graph_buffers, graph_buffers

__all__ = ["CheckedBufferSpec"]

_MAX_PLANS = 256  # per field; a schedule touches a handful of extents per graph


def _box_views(dst: torch.Tensor, extent: tuple[int, ...], high_water: tuple[int, ...], pad_one: torch.Tensor | None,
               pad_full: torch.Tensor | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The padding left stale by a fill of ``high_water`` followed by one of ``extent``, as disjoint boxes,
    each with its pad source."""
    boxes = []
    for d, (n, hw) in enumerate(zip(extent, high_water, strict=True)):
        if n < hw:
            # Dims before d: this extent (the rest of them was reset by an earlier box); dim d: [n, hw);
            # dims after d: whatever either step wrote.
            view, pad = dst, pad_full
            for e in range(len(extent)):
                if e < d:
                    start, stop = 0, extent[e]
                elif e == d:
                    start, stop = n, hw
                else:
                    start, stop = 0, max(extent[e], high_water[e])
                view = view.narrow(e, start, stop - start)
                pad = pad.narrow(e, start, stop - start) if pad is not None else None
            if view.numel():
                boxes.append((view, pad if pad is not None else pad_one.expand(view.shape)))
    return boxes


def _dims(graph_meta: Any) -> GraphDims:
    """The sizes of the graph lmdeploy describes in ``graph_meta``."""
    batch = int(graph_meta.max_batchs)
    tokens = int(graph_meta.max_tokens)
    return GraphDims(
        batch=batch,
        tokens=tokens,
        blocks=int(graph_meta.num_blocks),
        query_len=int(getattr(graph_meta, "decode_query_len", 1) or 1),
    )


@dataclass(frozen=True)
class CheckedBufferSpec:
    """A vendor's batch-dependent tensors for one lmdeploy release, filled with every source checked.

    ``constants`` are ``attn_metadata`` attributes set on every fill (a Python int there is frozen
    into the graph at capture, so it must be a value right for every replay).
    ``check_meta`` rejects graph configurations the vendor cannot serve, before anything is allocated.
    Vendors declare :class:`vendor_graph.buffers.BufferSpec`, this with the fast fill over it.
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

    def by_name(self, name: str) -> BufferField:
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
            state.fields[f.name] = self._allocate(f, dims, graph_meta, src)
        attach_graph_buffers(graph_meta, state)
        return {name: st.tensor for name, st in state.fields.items()}

    def device_bytes(self, dims: GraphDims) -> int:
        """Device bytes one graph's buffers take at ``dims``: what :meth:`make` allocates, less the fields
        whose size is a source's own (``inputs_embeds``: only with such inputs) and host fields."""
        sizes = {BATCH: dims.batch, TOKENS: dims.tokens, BLOCKS: dims.blocks, BATCH_PLUS_ONE: dims.batch + 1}
        total = 0
        for f in self.fields:
            if f.placement is Placement.HOST or f.dtype is None or SOURCE in f.shape:
                continue
            elements = math.prod(sizes.get(d, d) for d in f.shape)
            copies = 2 if callable(f.pad) and not f.is_static else 1  # the buffer and its padding content
            total += copies * elements * torch.empty((), dtype=f.dtype).element_size()
        return total

    def _check_required(self, f: BufferField, graph_meta: Any, src: Any) -> None:
        if src is None and f.source is not None and f.required is not None:
            why = f.required(graph_meta)
            if why:
                raise ValueError(f"{self.vendor}: {f.source} is required ({why}) but this step has none")

    @staticmethod
    def _allocate(f: BufferField, dims: GraphDims, graph_meta: Any, src: Any) -> FieldState:
        device = graph_meta.device
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
            return FieldState(tensor=tensor, high_water=tuple(tensor.shape), on_host=tensor.device.type == "cpu",
                               device=tensor.device.type)
        if callable(f.pad):
            pad_full = torch.as_tensor(f.pad(dims, graph_meta), dtype=dtype).reshape(shape).to(where)
            return FieldState(tensor=pad_full.clone(), high_water=(0,) * len(shape), pad_full=pad_full,
                               pad=f.pad, on_host=pad_full.device.type == "cpu", device=pad_full.device.type)
        tensor = torch.full(shape, f.pad, dtype=dtype, device=where)
        pad_one = torch.full((1,) * len(shape), f.pad, dtype=dtype, device=where)
        return FieldState(tensor=tensor, high_water=(0,) * len(shape), pad_one=pad_one, pad=f.pad,
                           on_host=tensor.device.type == "cpu", device=tensor.device.type)

    # -- fill ---------------------------------------------------------------------------------------

    def fill(self, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any, context: Any = None
             ) -> dict[str, Any]:
        """Copy this step's kwarg- and attn-sourced data in, bind ``attn_metadata``; return the kwargs
        to call the model with (the caller's kwargs, with buffers in place of batch-dependent ones).

        Given the step's ``context`` (the ``StepContext`` that :meth:`bind_context` will receive), its
        sources are copied in the same device operation, and ``bind_context`` only binds."""
        return self._fill_checked(graph_buffers(graph_meta), graph_meta, inputs, attn_metadata, context)

    def _fill_checked(self, state: GraphBuffers, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any,
                      context: Any) -> dict[str, Any]:
        """:meth:`fill` with every source validated; tells the graph's cache what it wrote."""
        self._settle(state)
        with_context = context is not None and state.sealed
        roots = {"kwarg": inputs, "attn": attn_metadata, "context": context}
        writes = []
        fields = state.fields
        step_fields = self._step_fields + self._context_fields if with_context else self._step_fields
        for f, kind, get, static in step_fields:
            src = get(roots[kind])
            st = fields.get(f.name)
            if st is not None and static:
                continue  # made at capture, content fixed: nothing to check or write
            write = self._planned_write(f, state, st, src)
            if write is not None:
                writes.append(write)
        cache = self._cache(state, with_context, roots) if state.sealed else None
        before = cache.extents() if cache is not None else None
        if writes:
            self._write(writes)
        if cache is not None:
            cache.learn(writes, before)
        state.context_filled = context if with_context else None

        new_inputs = dict(inputs)
        self._bind(state, "fill", self._fill_binds, {"attn": attn_metadata, "kwarg": new_inputs})
        self._set_constants(state, attn_metadata)
        for ref in self._held_refs:
            if ref.path not in state.held:
                state.held[ref.path] = ref.get(attn_metadata)
            ref.set(attn_metadata, state.held[ref.path])
        return new_inputs

    def _set_constants(self, state: GraphBuffers, attn_metadata: Any) -> None:
        dims = state.dims
        for setter, make_value in self._constant_setters:
            setter(attn_metadata, make_value(dims, attn_metadata))

    def _cache(self, state: GraphBuffers, with_context: bool, roots: Mapping[str, Any]) -> FillCache | None:
        """The cache of a sealed graph's steady state to tell of each checked write; None: no cache."""
        return None

    @staticmethod
    def _settle(state: GraphBuffers) -> None:
        """Give each field the high water the cache's fills left it (the checked fill plans from it)."""
        if state.cache is not None:
            state.cache.settle()

    def bind_context(self, graph_meta: Any, context: Any) -> None:
        """Copy context-sourced data in (unless this step's fill did) and point the ``StepContext`` at
        the buffers."""
        state = graph_buffers(graph_meta)
        if state.context_filled is not None and state.context_filled is context:
            state.context_filled = None
            self._bind_context(state, context)
            return
        state.context_filled = None
        self._settle(state)
        writes = []
        fields = state.fields
        for f, _kind, get, static in self._context_fields:
            src = get(context)
            st = fields.get(f.name)
            if st is None and not state.sealed:
                self._check_required(f, graph_meta, src)
                if src is not None:
                    st = fields[f.name] = self._allocate(f, state.dims, graph_meta, src)
                    graph_meta.input_buffers[f.name] = st.tensor
            if st is not None and static:
                continue
            write = self._planned_write(f, state, st, src)
            if write is not None:
                writes.append(write)
        if writes:
            self._write(writes)
            if state.cache is not None:
                state.cache.rebase()
        self._bind_context(state, context)
        state.sealed = True

    def _bind_context(self, state: GraphBuffers, context: Any) -> None:
        if state.cache is not None:
            state.cache.bind_context(context)
        else:
            self._bind(state, "context", self._context_binds, {"context": context})

    def _planned_write(self, f: BufferField, state: GraphBuffers, st: FieldState | None, src: Any):
        """This step's write for one field: the cached plan when the buffer has seen this extent after the
        same previous one (the steady state), else the checked source; None: nothing to write."""
        if st is not None and st.plain(src):
            plan = st.plans.get((src.shape, st.high_water))
            if plan is not None:
                return st, src, src.shape, plan
        return self._check_source(f, state, src)

    @staticmethod
    def _bind(state: GraphBuffers, which: str, binds: tuple[tuple[str, Ref], ...], roots: Mapping[str, Any]) -> None:
        """Point every bind target in ``binds`` at its field's buffer (fields this graph lacks: skipped)."""
        targets = state.binds.get(which)
        if targets is None:
            fields = state.fields
            targets = [(ref.kind, ref.parts[0] if len(ref.parts) == 1 else None, ref.setter, fields[name].tensor)
                       for name, ref in binds if name in fields]
            if state.sealed:  # no buffer is made after the first bind_context
                state.binds[which] = targets
        for kind, attr, setter, tensor in targets:
            root = roots[kind]
            if attr is not None and not isinstance(root, dict):
                setattr(root, attr, tensor)
            else:
                setter(root, tensor)

    @functools.cached_property
    def _fill_binds(self) -> tuple[tuple[str, Ref], ...]:
        return tuple((f.name, r) for f in self.fields for r in f.bind if r.kind != "context")

    @functools.cached_property
    def _context_binds(self) -> tuple[tuple[str, Ref], ...]:
        return tuple((f.name, r) for f in self.fields for r in f.bind if r.kind == "context")

    @functools.cached_property
    def _constant_refs(self) -> tuple[tuple[Ref, Callable[[GraphDims, Any], Any]], ...]:
        return tuple((Ref.attn(name), make_value) for name, make_value in self.constants.items())

    @functools.cached_property
    def _constant_setters(self) -> tuple[tuple[Callable[[Any, Any], None], Callable[[GraphDims, Any], Any]], ...]:
        return tuple((ref.setter, make_value) for ref, make_value in self._constant_refs)

    @functools.cached_property
    def _held_refs(self) -> tuple[Ref, ...]:
        return tuple(Ref.attn(held.path) for held in self.held)

    @functools.cached_property
    def _step_fields(self) -> tuple[tuple[BufferField, str, Callable[[Any], Any], bool], ...]:
        """Fields :meth:`fill` reads a source for (kwarg- and attn-sourced, static ones included: a
        source that appears after capture is an error for them too), with the source's kind and getter."""
        return tuple((f, f.source.kind, f.source.getter, f.static is not None) for f in self.fields
                     if f.source is not None and f.source.kind != "context")

    @functools.cached_property
    def _context_fields(self) -> tuple[tuple[BufferField, str, Callable[[Any], Any], bool], ...]:
        return tuple((f, f.source.kind, f.source.getter, f.static is not None) for f in self.fields
                     if f.source is not None and f.source.kind == "context")

    def _check_source(self, f: BufferField, state: GraphBuffers, src: Any
                      ) -> tuple[FieldState, Any, tuple[int, ...], tuple] | None:
        """Validate one field's source for this step; returns (state, source, extent, plan) to write, or
        None (a static field, or one this graph was made without and the step has no source for)."""
        st = state.fields.get(f.name)
        if st is None:
            if src is not None:
                raise GraphInputsChanged(
                    f"{self.vendor} graph for batch {state.dims.batch} was captured without {f.source}, "
                    f"but this step has one; the graph would ignore it. Run this step eager "
                    f"(the vendor_graph runner does so itself) or capture with it present"
                )
            return None
        if f.static is not None:
            return None
        if src is None and f.absent_is_padding:
            src = st.no_rows  # every written row is reset
        if src is None:
            raise GraphInputsChanged(
                f"{self.vendor} graph for batch {state.dims.batch} was captured with {f.source}, "
                f"but this step has none; replaying would read the previous step's values"
            )
        if not isinstance(src, torch.Tensor):
            src = torch.as_tensor(src)
        extent = src.shape
        plan = st.plans.get((extent, st.high_water))
        if plan is not None:
            return st, src, extent, plan  # an extent already checked against this buffer
        dst = st.tensor
        if src.dim() != dst.dim():
            raise GraphInputsChanged(
                f"{self.vendor}: {f.source} has shape {tuple(src.shape)}, buffer {f.name!r} expects "
                f"{dst.dim()} dims like {tuple(dst.shape)}"
            )
        for d, (n, cap) in enumerate(zip(extent, dst.shape, strict=True)):
            if n > cap:
                raise GraphInputsChanged(
                    f"{self.vendor}: {f.source} needs {n} along dim {d} but the graph's buffer {f.name!r} "
                    f"holds {cap}: this step was routed to a graph smaller than its batch "
                    f"(graphs must be looked up by padded batch)"
                )
        return st, src, extent, self._plan(st, extent)

    @staticmethod
    def _plan(st: FieldState, extent: tuple[int, ...]) -> tuple[torch.Tensor | None, list]:
        """The live view and the stale padding boxes of a fill of ``extent`` into ``st``, cached under
        (extent, high water)."""
        dst = st.tensor
        live = dst
        for d, n in enumerate(extent):
            live = live.narrow(d, 0, n)
        plan = (live if live.numel() else None, _box_views(dst, tuple(extent), st.high_water, st.pad_one, st.pad_full))
        if len(st.plans) >= _MAX_PLANS:
            st.plans.clear()
        st.plans[(extent, st.high_water)] = plan
        return plan

    def _write(self, writes: list[tuple[FieldState, Any, tuple[int, ...], tuple]]) -> None:
        """Write every live extent and reset every stale padding box of one call: one ``_foreach_copy_``
        for the device buffers, one for the host ones. Called only after every source was validated, so
        an error leaves the buffers as they were."""
        dev_dst: list[torch.Tensor] = []
        dev_src: list[torch.Tensor] = []
        host_dst: list[torch.Tensor] = []
        host_src: list[torch.Tensor] = []
        staged_pageable = staged_pinned = False
        device = "cpu"
        for st, src, extent, (live, boxes) in writes:
            on_host = st.on_host
            if on_host:
                dsts, srcs = host_dst, host_src
            else:
                dsts, srcs, device = dev_dst, dev_src, st.device
            if live is not None:
                if not on_host and src.device.type == "cpu":
                    src, pinned = stage(src, live.dtype)
                    staged_pinned |= pinned
                    staged_pageable |= not pinned
                dsts.append(live)
                srcs.append(src)
            for box, pad in boxes:
                dsts.append(box)
                srcs.append(pad)
            st.high_water = extent
        if dev_dst:
            # non_blocking only where every host source sits in pinned memory (the caching host allocator
            # keeps a staged block from reuse until its copy has run); a pageable source copies blocking.
            copy_all(dev_dst, dev_src, device, non_blocking=staged_pinned and not staged_pageable)
        if host_dst:
            copy_host(host_dst, host_src)

    # -- introspection ------------------------------------------------------------------------------

    @staticmethod
    def padding(graph_meta: Any, name: str) -> torch.Tensor:
        """Buffer ``name`` of the graph behind ``graph_meta`` as all padding (rows past the live batch hold it)."""
        return graph_buffers(graph_meta).fields[name].padding()

    def describe(self) -> list[dict[str, str]]:
        """One row per field, for `vendor-graph plan` and the docs."""
        rows = []
        for f in self.fields:
            rows.append(
                {
                    "buffer": f.name,
                    "shape": "(" + ", ".join(d.value if isinstance(d, Dim) else str(d) for d in f.shape) + ")",
                    "dtype": str(f.dtype).replace("torch.", "") if f.dtype is not None else "as source",
                    "where": f.placement.value,
                    "pad": "static" if f.is_static else
                           f"per element ({f.pad.__name__})" if callable(f.pad) else repr(f.pad),
                    "from": str(f.source) if f.source is not None and not f.is_static else "-",
                    "bound to": ", ".join(str(r) for r in f.bind),
                }
            )
        return rows
