"""The fast fill: a cache over the checked fill (buffers/fill.py) for a sealed graph's steady state. A step
whose sources have shapes already seen after the same previous extents repeats the write the checked fill
made for them, without re-validating; anything else goes to the checked fill. Why: docs/buffers.md."""

from __future__ import annotations

import functools
import operator
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .copies import copy_all, copy_host, foreach_missing
from .declare import BufferField, Ref
from .fill import CheckedBufferSpec
from .state import GraphBuffers, graph_buffers

__all__ = ["BufferSpec", "FastFill"]


def _picker(indices: list[int]) -> Callable[[tuple], tuple]:
    """``itemgetter`` that always returns a tuple."""
    if not indices:
        return lambda values: ()
    if len(indices) == 1:
        i = indices[0]
        return lambda values: (values[i],)
    return operator.itemgetter(*indices)


def _resolves(root: Any, path: str) -> bool:
    try:
        operator.attrgetter(path)(root)
    except AttributeError:
        return False
    return True


_GENERIC_SETATTR = (object.__setattr__, types.SimpleNamespace.__setattr__)


def _plain_attrs(obj: Any, names: list[str]) -> bool:
    """Whether setting these attributes of ``obj`` is exactly an update of its ``__dict__``."""
    cls = type(obj)
    if cls.__setattr__ not in _GENERIC_SETATTR or not hasattr(obj, "__dict__"):
        return False
    return not any(hasattr(getattr(cls, n, None), "__set__") for n in names)


def _compile_sources(vendor: str, present: list[BufferField], absent: list[BufferField], fields: dict,
                     roots: Mapping[str, Any]) -> Callable[[Any, Any, Any], tuple | None]:
    """One function reading a step's sources the way the roots seen at build time hold them:
    ``(sources of the write fields, their shapes)``, or None for another root type or a source this graph was
    captured without. Generated, so a step costs plain attribute reads (the fast fill's largest share
    otherwise); paths that did not resolve at build time keep their ``Ref.getter``."""
    names = {"kwarg": "inputs", "attn": "attn", "context": "context"}
    namespace: dict[str, Any] = {}
    lines = ["def sources(inputs, attn, context):"]
    checks = []
    for kind, var in names.items():
        if any(f.source.kind == kind for f in present + absent):
            namespace[f"T_{var}"] = type(roots.get(kind))
            checks.append(f"type({var}) is not T_{var}")
    if checks:
        lines.append(f"    if {' or '.join(checks)}:")
        lines.append("        return None")

    def read(f: BufferField, slot: str) -> str:
        ref, root = f.source, roots.get(f.source.kind)
        var = names[ref.kind]
        plain = all(part.isidentifier() for part in ref.parts)
        if isinstance(root, Mapping) and len(ref.parts) == 1 and plain:
            return f"{var}.get({ref.path!r})"
        if not isinstance(root, Mapping) and plain and _resolves(root, ref.path):
            return f"{var}.{ref.path}"
        namespace[f"G_{slot}"] = ref.getter
        return f"G_{slot}({var})"

    for i, f in enumerate(absent):
        lines.append(f"    if {read(f, f'a{i}')} is not None:")
        lines.append("        return None")
    for i, f in enumerate(present):
        lines.append(f"    w{i} = {read(f, f'w{i}')}")
        if f.absent_is_padding:
            namespace[f"E_w{i}"] = fields[f.name].no_rows
            lines.append(f"    if w{i} is None:")
            lines.append(f"        w{i} = E_w{i}")
    items = [f"w{i}" for i in range(len(present))]
    lines.append(f"    return ({''.join(v + ', ' for v in items)}), ({''.join(v + '.shape, ' for v in items)})")
    source = "\n".join(lines)
    exec(compile(source, f"<vendor_graph {vendor} fast fill sources>", "exec"), namespace)  # noqa: S102
    namespace["sources"].source = source
    return namespace["sources"]


@dataclass
class _Program:
    """One learnt step of the fast fill: per copy call, its destinations, which of the write fields'
    sources go first (a picker), then the pad sources of the padding resets."""

    dev_calls: list[tuple[list[torch.Tensor], Callable[[tuple], tuple], list[torch.Tensor], bool]]
    host_dsts: list[torch.Tensor]
    host_live: Callable[[tuple], tuple]
    host_pads: list[torch.Tensor]


def _fusable(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether torch's CUDA ``_foreach_copy_`` can take this pair on its one-kernel route (dense pairs of
    equal shape and strides; the route also needs one source dtype and one destination dtype per call)."""
    return dst.is_contiguous() and src.is_contiguous() and dst.shape == src.shape


_AS_BYTES = operator.methodcaller("view", torch.uint8)


def _device_calls(pairs: list[tuple[torch.Tensor, torch.Tensor, int | None]], by_dtype: bool) -> list:
    """The device copy calls of a program from its (destination, source seen now, source slot or None for
    a padding reset) triples: one foreach over all, or (CUDA, ``by_dtype``) one kernel's worth per call: every
    fusable pair without a dtype conversion in one call over byte views (int64 and int32 fields in one kernel),
    a call per converting (destination, source) dtype pair, one for the rest; pad values made dense so they
    fuse too. A call's last element says its live sources are viewed as bytes at each step."""
    groups: dict[Any, list] = {}
    for dst, src, slot in pairs:
        if slot is None and by_dtype and dst.is_contiguous() and not src.is_contiguous():
            src = src.contiguous()  # an expanded pad value: dense, made once for this program
        if not by_dtype:
            key = "all"
        elif not _fusable(dst, src):
            key = "rest"
        elif dst.dtype == src.dtype and dst.dim() > 0 and dst.stride(-1) == 1 and src.stride(-1) == 1:
            key = "bytes"
        else:
            key = (dst.dtype, src.dtype)
        groups.setdefault(key, []).append((dst, src, slot))
    calls = []
    for key, members in groups.items():
        live = [m for m in members if m[2] is not None]
        pads = [m for m in members if m[2] is None]
        dsts, pad_srcs = [m[0] for m in live + pads], [m[1] for m in pads]
        if key == "bytes":
            dsts, pad_srcs = list(map(_AS_BYTES, dsts)), list(map(_AS_BYTES, pad_srcs))
        calls.append((dsts, _picker([m[2] for m in live]), pad_srcs, key == "bytes"))
    return calls


_MAX_PROGRAMS = 256


class FastFill:
    """The fill of a sealed graph in its steady state: every source read in a few C-level calls, the
    step matched by its sources' shapes (and the extents the buffers hold) to a write learnt by the
    checked fill, then one ``_foreach_copy_`` and the binds. Anything it does not know (a source that
    appears or vanishes, a new shape, a non-tensor, another metadata type) goes to the checked fill."""

    def __init__(self, spec: CheckedBufferSpec, state: GraphBuffers, with_context: bool, roots: Mapping[str, Any]
                 ) -> None:
        self.with_context = with_context
        # the extents of the write fields as the buffers now hold them (None: not known yet); ``hw_dirty``:
        # a fast fill moved them without updating each field's ``high_water``
        self.last_sig: tuple | None = None
        self.hw_dirty = False
        entries = spec._step_fields + (spec._context_fields if with_context else ())
        fields = state.fields
        present = [f for f, *_ in entries if f.name in fields and f.static is None]
        present.sort(key=lambda f: fields[f.name].on_host)  # device writes first
        self.writes = [fields[f.name] for f in present]
        absent = [f for f, *_ in entries if f.name not in fields]
        self.sources = _compile_sources(spec.vendor, present, absent, fields, roots)
        self.device = next((st.device for st in self.writes if not st.on_host), "cpu")
        self.programs: dict[tuple, _Program] = {}
        fill_binds = {kind: (flat, deep) for kind, flat, deep in
                      self._binds(spec._fill_binds, fields, roots, state.held, spec._held_refs)}
        self.kwarg_binds, self.kwarg_setters = fill_binds.get("kwarg", ({}, []))
        self.attn_binds, self.attn_setters = fill_binds.get("attn", ({}, []))
        # no foreach kernel on this device (found by the checked fills before): a copy per pair
        self.copy_device = (functools.partial(copy_all, device=self.device) if foreach_missing(self.device)
                            else torch._foreach_copy_)
        self.context_binds = self._binds(spec._context_binds, fields, roots, {}, ())
        self.context_type = type(roots.get("context"))
        self.context_binds_by_setter = [(s, v) for _k, flat, deep in self.context_binds
                                        for s, v in [*((Ref("context", n).setter, t) for n, t in flat.items()), *deep]]

    @staticmethod
    def _binds(binds: tuple, fields: dict, roots: Mapping[str, Any], held: dict, held_refs: tuple) -> list:
        """Per root kind: (kind, {attribute: tensor} set in one update, [(setter, value)] for the rest)."""
        plan = []
        for kind in ("kwarg", "attn", "context"):
            flat: dict[str, Any] = {}
            deep: list = []
            for name, ref in binds:
                if ref.kind == kind and name in fields:
                    (flat.__setitem__(ref.path, fields[name].tensor) if len(ref.parts) == 1
                     else deep.append((ref.setter, fields[name].tensor)))
            if kind == "attn":
                for ref in held_refs:
                    if len(ref.parts) == 1:
                        flat[ref.path] = held[ref.path]
                    else:
                        deep.append((ref.setter, held[ref.path]))
            root = roots.get(kind)
            if flat and kind != "kwarg" and not (isinstance(root, dict) or _plain_attrs(root, list(flat))):
                deep.extend((Ref(kind, n).setter, v) for n, v in flat.items())
                flat = {}
            if flat or deep:
                plan.append((kind, flat, deep))
        return plan

    def extents(self) -> tuple:
        """The extents the write fields' buffers hold now, as the checked fill left them."""
        return tuple([st.high_water for st in self.writes])

    def settle(self) -> None:
        """Give each field the high water the fast fills left it (the checked fill plans from it)."""
        if self.hw_dirty:
            for st, extent in zip(self.writes, self.last_sig, strict=True):
                st.high_water = extent
            self.hw_dirty = False

    def rebase(self) -> None:
        """The checked fill wrote outside a learnt step: the buffers' extents are its, read them again."""
        self.last_sig = self.extents()

    def learn(self, writes: list, before: tuple) -> None:
        """Remember the checked fill's write of this step, when the fast fill can repeat it exactly."""
        after = self.last_sig = self.extents()
        by_state = {id(w[0]): w for w in writes}
        device_pairs: list[tuple[torch.Tensor, torch.Tensor, int | None]] = []
        host_dsts, host_live, host_pad_dsts, host_pads = [], [], [], []
        for i, st in enumerate(self.writes):
            write = by_state.get(id(st))
            if write is None:
                return
            _st, src, extent, (live, boxes) = write
            if not st.plain(src) or src.shape != extent or \
                    src.device.type != ("cpu" if st.on_host else st.device):
                return  # a converted, staged or cross-device source: always checked
            if st.on_host:
                if live is not None:
                    host_dsts.append(live)
                    host_live.append(i)
                host_pad_dsts.extend(box for box, _ in boxes)
                host_pads.extend(pad for _, pad in boxes)
                continue
            if live is not None:
                device_pairs.append((live, src, i))
            device_pairs.extend((box, pad, None) for box, pad in boxes)
        calls = _device_calls(device_pairs, by_dtype=self.device == "cuda" and self.copy_device is torch._foreach_copy_)
        if len(self.programs) >= _MAX_PROGRAMS:
            self.programs.clear()
        self.programs[(after, before)] = _Program(calls, host_dsts + host_pad_dsts, _picker(host_live), host_pads)

    def fill(self, state: GraphBuffers, inputs: Mapping[str, Any], attn: Any, context: Any) -> dict[str, Any] | None:
        """The step's write and binds when it repeats a learnt one; None (nothing written): fill it checked."""
        try:
            found = self.sources(inputs, attn, context)
        except AttributeError:  # a source that is not a tensor, a path that no longer resolves
            return None
        if found is None:  # another metadata type, or a source this graph was captured without
            return None
        srcs, sig = found
        program = self.programs.get((sig, self.last_sig))
        if program is None:
            return None
        try:
            for dsts, live, pads, as_bytes in program.dev_calls:
                self.copy_device(dsts, [*map(_AS_BYTES, live(srcs)), *pads] if as_bytes else [*live(srcs), *pads])
            if program.host_dsts:
                copy_host(program.host_dsts, [*program.host_live(srcs), *program.host_pads])
        except (TypeError, RuntimeError):
            return None  # not what it learnt after all (a non-tensor with a shape): rewritten checked
        self.last_sig = sig
        self.hw_dirty = True
        state.context_filled = context if self.with_context else None
        new_inputs = dict(inputs)
        new_inputs.update(self.kwarg_binds)
        for setter, value in self.kwarg_setters:
            setter(new_inputs, value)
        if self.attn_binds:
            (attn if type(attn) is dict else attn.__dict__).update(self.attn_binds)
        for setter, value in self.attn_setters:
            setter(attn, value)
        return new_inputs

    def bind_context(self, context: Any) -> None:
        """Point the ``StepContext`` at the buffers: one ``__dict__`` update where its type allows."""
        if type(context) is not self.context_type:  # not the type the one-update bind was checked for
            for setter, value in self.context_binds_by_setter:
                setter(context, value)
            return
        for _kind, flat, deep in self.context_binds:
            if flat:
                (context if isinstance(context, dict) else context.__dict__).update(flat)
            for setter, value in deep:
                setter(context, value)



class BufferSpec(CheckedBufferSpec):
    """A vendor's batch-dependent tensors for one lmdeploy release (what a vendor declares): the checked fill,
    with each sealed graph's steady state served by a :class:`FastFill`."""

    # False: every step takes the checked fill (benchmarks and tests that swap ``_write`` set it); the cache
    # keeps learning either way, so switching it back on never replays a write learnt before other ones
    fast_fill: ClassVar[bool] = True

    def fill(self, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any, context: Any = None
             ) -> dict[str, Any]:
        """:meth:`CheckedBufferSpec.fill`, served by the graph's fast fill when the step repeats a learnt one."""
        state = graph_buffers(graph_meta)
        fast = state.cache
        if fast is not None and fast.with_context == (context is not None) and self.fast_fill:
            new_inputs = fast.fill(state, inputs, attn_metadata, context)
            if new_inputs is not None:
                self._set_constants(state, attn_metadata)
                return new_inputs
        return self._fill_checked(state, graph_meta, inputs, attn_metadata, context)

    def _cache(self, state: GraphBuffers, with_context: bool, roots: Mapping[str, Any]) -> FastFill:
        fast = state.cache
        if fast is None or fast.with_context != with_context:
            fast = state.cache = FastFill(self, state, with_context, roots)
        return fast
