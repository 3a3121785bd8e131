"""The fill vendor_graph shipped before the one-``_foreach_copy_`` fill (commit 040be91), kept as a
benchmark baseline: per field one ``copy_`` of the live extent and one ``fill_`` per dimension whose
extent shrank, source paths split and every field walked on every call. Our own code, reproduced so the
benchmark keeps measuring the same baseline after the library moves on."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from vendor_graph.buffers import BufferField, BufferSpec, GraphBuffers, GraphInputsChanged, Ref, graph_buffers


def _get(ref: Ref, root: Any) -> Any:
    obj = root
    for part in ref.path.split("."):
        if obj is None:
            return None
        obj = obj.get(part) if isinstance(obj, Mapping) else getattr(obj, part, None)
    return obj


def _set(ref: Ref, root: Any, value: Any) -> None:
    *parents, last = ref.path.split(".")
    obj = root
    for part in parents:
        obj = obj[part] if isinstance(obj, Mapping) else getattr(obj, part)
    if isinstance(obj, dict):
        obj[last] = value
    else:
        setattr(obj, last, value)


def fill(self: BufferSpec, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any) -> dict[str, Any]:
    state = graph_buffers(graph_meta)
    roots = {"kwarg": inputs, "attn": attn_metadata}
    for f in self.fields:
        if f.source is None or f.source.kind == "context":
            continue
        _fill_field(self, f, state, _get(f.source, roots[f.source.kind]))
    new_inputs = dict(inputs)
    _bind(self, state, {"attn": attn_metadata, "kwarg": new_inputs})
    for name, make_value in self.constants.items():
        _set(Ref.attn(name), attn_metadata, make_value(state.dims, attn_metadata))
    for held in self.held:
        ref = Ref.attn(held.path)
        if held.path not in state.held:
            state.held[held.path] = _get(ref, attn_metadata)
        _set(ref, attn_metadata, state.held[held.path])
    return new_inputs


def bind_context(self: BufferSpec, graph_meta: Any, context: Any) -> None:
    state = graph_buffers(graph_meta)
    for f in self.fields:
        if f.source is None or f.source.kind != "context":
            continue
        src = _get(f.source, context)
        if not state.sealed and f.name not in state.fields:  # capture runs with the current code
            raise RuntimeError("the previous fill is a replay baseline: make and capture with BufferSpec")
        _fill_field(self, f, state, src)
    _bind(self, state, {"context": context})
    state.sealed = True


def _bind(self: BufferSpec, state: GraphBuffers, roots: Mapping[str, Any]) -> None:
    for f in self.fields:
        st = state.fields.get(f.name)
        if st is None:
            continue
        for ref in f.bind:
            if ref.kind in roots:
                _set(ref, roots[ref.kind], st.tensor)


def _fill_field(self: BufferSpec, f: BufferField, state: GraphBuffers, src: Any) -> None:
    st = state.fields.get(f.name)
    if st is None:
        if src is not None:
            raise GraphInputsChanged(f"captured without {f.source}")
        return
    if f.is_static:
        return
    if src is None:
        raise GraphInputsChanged(f"captured with {f.source}")
    if not isinstance(src, torch.Tensor):
        src = torch.as_tensor(src)
    dst = st.tensor
    if src.dim() != dst.dim():
        raise GraphInputsChanged(f"{f.source} has shape {tuple(src.shape)}")
    extent = list(src.shape)
    for d, (n, cap) in enumerate(zip(extent, dst.shape, strict=True)):
        if n > cap:
            raise GraphInputsChanged(f"{f.source} needs {n} along dim {d}")
    live = tuple(slice(0, n) for n in extent)
    dst[live].copy_(src)
    for d, (n, hw) in enumerate(zip(extent, st.high_water, strict=True)):
        if n < hw:
            idx = [slice(0, e) for e in extent]
            idx[d] = slice(n, hw)
            for later in range(d + 1, len(extent)):
                idx[later] = slice(0, max(extent[later], st.high_water[later]))
            box = dst[tuple(idx)]
            box.fill_(f.pad) if st.pad_full is None else box.copy_(st.pad_full[tuple(idx)])
    st.high_water = tuple(extent)


@contextlib.contextmanager
def previous_fill() -> Iterator[None]:
    """Swap the previous fill and bind into ``BufferSpec`` for the block."""
    saved = BufferSpec.fill, BufferSpec.bind_context
    BufferSpec.fill, BufferSpec.bind_context = fill, bind_context  # type: ignore[method-assign]
    try:
        yield
    finally:
        BufferSpec.fill, BufferSpec.bind_context = saved  # type: ignore[method-assign]
