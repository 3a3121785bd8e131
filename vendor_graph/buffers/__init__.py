"""Declarative graph buffers: each batch-dependent tensor is declared once and make / fill / bind all walk the
same declarations, so a field cannot be filled but not bound, or bound but not made.

A captured graph reads fixed addresses, so every tensor that changes with the batch lives in a buffer sized for
the graph (lmdeploy's ``graph_meta.max_batchs`` / ``max_tokens`` / ``num_blocks``). Fill rules, each a classic
graph-mode failure when broken: pad to the graph's batch, never to a size computed here; reset every padding row
a previous, larger batch left behind (a stale ``kv_start_indices`` writes a live sequence's KV slot); treat a
source that appears or disappears after capture as an error, not a silent stale read.

Cost per step, a design constraint: one device ``torch._foreach_copy_`` per step carrying every live copy and
every padding reset (the fill, given the step's ``StepContext``, writes its sources too, and ``bind_context`` only
binds; on CUDA one per dtype group, torch's one-kernel route); one host copy for host-placed fields (no device
work, as lmdeploy builds those sources on the host); nothing for static fields. A step whose sources have shapes
already seen after the same previous extents repeats the learnt write without re-validating (the fast fill).
A host source bound for a device buffer is staged through pinned memory and copied without blocking where the
platform has pinned memory, else copied blocking from pageable memory (CPU-only torch, the simulator).
"""

from __future__ import annotations

import enum
import functools
import logging
import math
import operator
import sys
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

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


# type -> whether it is a Mapping (an ABC check per source per step is a measurable part of a fill)
_MAPPING_TYPES: dict[type, bool] = {dict: True}


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

    @functools.cached_property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    def get(self, root: Any) -> Any:
        obj = root
        for part in self.parts:
            if obj is None:
                return None
            obj = obj.get(part) if type(obj) is dict or isinstance(obj, Mapping) else getattr(obj, part, None)
        return obj

    @functools.cached_property
    def getter(self) -> Callable[[Any], Any]:
        """``get`` compiled for this path (the per-step fill reads every source through it)."""
        if len(self.parts) > 1:
            return self.get
        last = self.parts[0]

        def get_one(root: Any) -> Any:
            if root is None:
                return None
            mapping = _MAPPING_TYPES.get(type(root))
            if mapping is None:
                mapping = _MAPPING_TYPES[type(root)] = isinstance(root, Mapping)
            return root.get(last) if mapping else getattr(root, last, None)

        return get_one

    @functools.cached_property
    def setter(self) -> Callable[[Any, Any], None]:
        """``set`` compiled for this path (the per-step bind calls it for every target)."""
        if len(self.parts) > 1:
            return self.set
        last = self.parts[0]

        def set_one(root: Any, value: Any) -> None:
            if isinstance(root, dict):
                root[last] = value
            else:
                setattr(root, last, value)

        return set_one

    def set(self, root: Any, value: Any) -> None:
        *parents, last = self.parts
        obj = root
        for part in parents:
            obj = obj[part] if type(obj) is dict or isinstance(obj, Mapping) else getattr(obj, part)
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
    ``required`` names why a missing source is an error at capture. ``absent_is_padding``: a source
    present at capture may be absent on a later step, meaning "all padding" (lmdeploy passes adapter ids
    in its warm-up but None while no request uses an adapter); the buffer is then reset to ``pad``.
    ``pad`` is one value for every padding element, or a function ``(dims, graph_meta)`` giving the
    whole buffer's padding content (a value per element, such as a distinct slot per padding row).
    """

    name: str
    shape: tuple
    dtype: torch.dtype | None
    pad: int | float | bool | Callable[[GraphDims, Any], Any]
    bind: tuple[Ref, ...]
    source: Ref | None = None
    placement: Placement = Placement.DEVICE
    static: Callable[[GraphDims], list | torch.Tensor] | None = None
    required: Callable[[Any], str | None] | None = None
    absent_is_padding: bool = False

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
    high_water: tuple[int, ...] = ()
    # (extent, high water) -> the writes of a fill with that extent after one with that high water:
    # the live view, then (stale box, pad source) pairs. Built once per pair, reused every step.
    plans: dict = field(default_factory=dict)
    # One element holding the pad value (same dtype and device), expanded to each stale box; or, for a
    # field whose padding differs per element, the whole buffer's padding content, narrowed like the box.
    pad_one: torch.Tensor | None = None
    pad_full: torch.Tensor | None = None
    pad: int | float | bool = 0
    on_host: bool = False
    device: str = "cpu"  # the buffer's device type

    def padding(self) -> torch.Tensor:
        """The whole buffer as padding: what every element past the live extent holds."""
        return self.pad_full if self.pad_full is not None else torch.full_like(self.tensor, self.pad)

    @functools.cached_property
    def no_rows(self) -> torch.Tensor:
        """A source with no live rows (an absent field that is all padding), made once."""
        return self.tensor.new_empty([0] * self.tensor.dim())

    def plain(self, src: Any) -> bool:
        """Whether ``src`` is a tensor of exactly the buffer's own type: what a fresh tensor on its device is (a
        subclass, such as a Parameter, may not behave as one), so the cached plans and the fast fill may take it."""
        return type(src) is type(self.tensor)


_MAX_PLANS = 256  # per field; a schedule touches a handful of extents per graph
logger = logging.getLogger("vendor_graph")
# device types whose torch build has no _foreach_copy_ kernel (found at the first fill): copied per pair
_NO_FOREACH: set[str] = set()


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor], device: str, non_blocking: bool = False) -> None:
    """``torch._foreach_copy_``, or one ``copy_`` per pair where the ``device``'s torch lacks that kernel."""
    if device not in _NO_FOREACH:
        try:
            torch._foreach_copy_(dsts, srcs, non_blocking=non_blocking)
            return
        except NotImplementedError as exc:
            _NO_FOREACH.add(device)
            logger.warning("vendor_graph: torch._foreach_copy_ is not implemented for %r (%s); graph buffer "
                           "fills fall back to one copy per buffer (more device operations per step)",
                           device, str(exc).splitlines()[0])
    for dst, src in zip(dsts, srcs, strict=True):
        dst.copy_(src, non_blocking=non_blocking)


def _copy_host(dsts: list[torch.Tensor], srcs: list[torch.Tensor]) -> None:
    """Host buffers (no device work): one pair is cheaper as a plain ``copy_`` than as a foreach."""
    if len(dsts) == 1:
        dsts[0].copy_(srcs[0])
    else:
        _copy_all(dsts, srcs, "cpu")


@functools.lru_cache(maxsize=1)
def pinned_staging_available() -> bool:
    """Whether host sources can be staged through pinned (page-locked) memory on this platform.

    True where an accelerator runtime with pinned memory is present (``torch.cuda.is_available()``, or a
    loaded ``torch_npu`` / ``torch_mlu`` that says it is available) and a pinned allocation succeeds.
    False where a pinned allocation fails (CPU-only torch, the simulator): there host sources are copied
    from pageable memory, blocking. Cached for the process (``pinned_staging_available.cache_clear()``).
    """
    candidates = []
    if torch.cuda.is_available():
        candidates.append(torch.cuda)
    for name in ("npu", "mlu"):
        module = getattr(torch, name, None)
        if module is None:
            continue
        if f"torch_{name}" not in sys.modules:  # a vendor module only counts with its runtime loaded
            continue
        available = getattr(module, "is_available", None)
        if callable(available) and available():
            candidates.append(module)
    if not candidates:
        return False
    try:
        torch.empty(1, pin_memory=True)
    except Exception:  # noqa: BLE001 - no pinned allocator here: fall back to pageable copies
        return False
    return True


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


def _stage(src: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, bool]:
    """A host source bound for a device buffer: a pinned copy in the buffer's dtype where the platform
    has pinned memory (returns it and True), else the source itself (False)."""
    if pinned_staging_available():
        staged = torch.empty(src.shape, dtype=dtype, pin_memory=True)
        staged.copy_(src)
        return staged, True
    return src, False


@dataclass
class GraphBuffers:
    """What one captured graph owns: its buffers and the fill bookkeeping."""

    dims: GraphDims
    fields: dict[str, _FieldState]
    held: dict[str, Any]
    sealed: bool = False
    # once sealed: per bind step, the (root kind, attribute or None, setter, buffer) of every target
    binds: dict[str, list] = field(default_factory=dict)
    # the steady-state fill (built after sealing, per whether fill is given the StepContext)
    fast: _FastFill | None = None
    # the extents of the fast fill's write fields as the buffers now hold them (None: not known yet);
    # ``hw_dirty``: the fast fill moved them without updating each field's ``high_water``
    last_sig: tuple | None = None
    hw_dirty: bool = False
    # the StepContext whose sources this step's fill already wrote (bind_context then only binds)
    context_filled: Any = None


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

    dev_calls: list[tuple[list[torch.Tensor], Callable[[tuple], tuple], list[torch.Tensor]]]
    host_dsts: list[torch.Tensor]
    host_live: Callable[[tuple], tuple]
    host_pads: list[torch.Tensor]


def _fusable(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether torch's CUDA ``_foreach_copy_`` can take this pair on its one-kernel route (dense pairs of
    equal shape and strides; the route also needs one source dtype and one destination dtype per call)."""
    return dst.is_contiguous() and src.is_contiguous() and dst.shape == src.shape


def _device_calls(pairs: list[tuple[torch.Tensor, torch.Tensor, int | None]], by_dtype: bool) -> list:
    """The device copy calls of a program from its (destination, source seen now, source slot or None for
    a padding reset) triples: one foreach over all, or (CUDA, ``by_dtype``) one per (destination dtype,
    source dtype) group of fusable pairs plus one for the rest, pad values made dense so they fuse too."""
    groups: dict[Any, list] = {}
    for dst, src, slot in pairs:
        if slot is None and by_dtype and dst.is_contiguous() and not src.is_contiguous():
            src = src.contiguous()  # an expanded pad value: dense, made once for this program
        key = "all" if not by_dtype else (dst.dtype, src.dtype) if _fusable(dst, src) else "rest"
        groups.setdefault(key, []).append((dst, src, slot))
    calls = []
    for members in groups.values():
        live = [m for m in members if m[2] is not None]
        pads = [m for m in members if m[2] is None]
        calls.append(([m[0] for m in live + pads], _picker([m[2] for m in live]), [m[1] for m in pads]))
    return calls


_MAX_PROGRAMS = 256


class _FastFill:
    """The fill of a sealed graph in its steady state: every source read in a few C-level calls, the
    step matched by its sources' shapes (and the extents the buffers hold) to a write learnt by the
    checked fill, then one ``_foreach_copy_`` and the binds. Anything it does not know (a source that
    appears or vanishes, a new shape, a non-tensor, another metadata type) goes to the checked fill."""

    def __init__(self, spec: BufferSpec, state: GraphBuffers, with_context: bool, roots: Mapping[str, Any]) -> None:
        self.with_context = with_context
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
        self.copy_device = (functools.partial(_copy_all, device=self.device) if self.device in _NO_FOREACH
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
        return tuple([st.high_water for st in self.writes])

    def learn(self, writes: list, before: tuple, after: tuple) -> None:
        """Remember the checked fill's write of this step, when the fast fill can repeat it exactly."""
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
        try:
            found = self.sources(inputs, attn, context)
        except AttributeError:  # a source that is not a tensor, a path that no longer resolves
            return None
        if found is None:  # another metadata type, or a source this graph was captured without
            return None
        srcs, sig = found
        program = self.programs.get((sig, state.last_sig))
        if program is None:
            return None
        try:
            for dsts, live, pads in program.dev_calls:
                self.copy_device(dsts, [*live(srcs), *pads])
            if program.host_dsts:
                _copy_host(program.host_dsts, [*program.host_live(srcs), *program.host_pads])
        except (TypeError, RuntimeError):
            return None  # not what it learnt after all (a non-tensor with a shape): rewritten checked
        state.last_sig = sig
        state.hw_dirty = True
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
        if type(context) is not self.context_type:  # not the type the one-update bind was checked for
            for setter, value in self.context_binds_by_setter:
                setter(context, value)
            return
        for _kind, flat, deep in self.context_binds:
            if flat:
                (context if isinstance(context, dict) else context.__dict__).update(flat)
            for setter, value in deep:
                setter(context, value)


@dataclass(frozen=True)
class BufferSpec:
    """A vendor's batch-dependent tensors, for one lmdeploy release.

    ``constants`` are ``attn_metadata`` attributes set on every fill (a Python int there is frozen
    into the graph at capture, so it must be a value right for every replay).
    ``check_meta`` rejects graph configurations the vendor cannot serve, before anything is allocated.
    """

    # False: every step takes the checked fill (benchmarks and tests that swap ``_write`` set it)
    fast_fill: ClassVar[bool] = True

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
        setattr(graph_meta, _STATE_ATTR, state)
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
    def _allocate(f: BufferField, dims: GraphDims, graph_meta: Any, src: Any) -> _FieldState:
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
            return _FieldState(tensor=tensor, high_water=tuple(tensor.shape), on_host=tensor.device.type == "cpu",
                               device=tensor.device.type)
        if callable(f.pad):
            pad_full = torch.as_tensor(f.pad(dims, graph_meta), dtype=dtype).reshape(shape).to(where)
            return _FieldState(tensor=pad_full.clone(), high_water=(0,) * len(shape), pad_full=pad_full,
                               pad=f.pad, on_host=pad_full.device.type == "cpu", device=pad_full.device.type)
        tensor = torch.full(shape, f.pad, dtype=dtype, device=where)
        pad_one = torch.full((1,) * len(shape), f.pad, dtype=dtype, device=where)
        return _FieldState(tensor=tensor, high_water=(0,) * len(shape), pad_one=pad_one, pad=f.pad,
                           on_host=tensor.device.type == "cpu", device=tensor.device.type)

    # -- fill ---------------------------------------------------------------------------------------

    def fill(self, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any, context: Any = None
             ) -> dict[str, Any]:
        """Copy this step's kwarg- and attn-sourced data in, bind ``attn_metadata``; return the kwargs
        to call the model with (the caller's kwargs, with buffers in place of batch-dependent ones).

        Given the step's ``context`` (the ``StepContext`` that :meth:`bind_context` will receive), its
        sources are copied in the same device operation, and ``bind_context`` only binds."""
        state = graph_buffers(graph_meta)
        fast = state.fast
        if fast is not None and fast.with_context == (context is not None) and self.fast_fill:
            new_inputs = fast.fill(state, inputs, attn_metadata, context)
            if new_inputs is not None:
                self._set_constants(state, attn_metadata)
                return new_inputs
        return self._fill_checked(state, graph_meta, inputs, attn_metadata, context)

    def _fill_checked(self, state: GraphBuffers, graph_meta: Any, inputs: Mapping[str, Any], attn_metadata: Any,
                      context: Any) -> dict[str, Any]:
        """:meth:`fill` with every source validated; teaches the fast fill this step's shapes."""
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
        fast = state.fast
        if state.sealed and (fast is None or fast.with_context != with_context):
            fast = state.fast = _FastFill(self, state, with_context, roots)
        before = fast.extents() if fast is not None else None
        if writes:
            self._write(writes)
        if fast is not None:
            state.last_sig = fast.extents()
            fast.learn(writes, before, state.last_sig)
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

    @staticmethod
    def _settle(state: GraphBuffers) -> None:
        """Give each field the high water the fast fill left it (the checked path plans from it)."""
        if state.hw_dirty:
            for st, extent in zip(state.fast.writes, state.last_sig, strict=True):
                st.high_water = extent
            state.hw_dirty = False

    def bind_context(self, graph_meta: Any, context: Any) -> None:
        """Copy context-sourced data in (unless this step's fill did) and point the ``StepContext`` at
        the buffers."""
        state = graph_buffers(graph_meta)
        if state.context_filled is not None and state.context_filled is context:
            state.context_filled = None
            state.fast.bind_context(context)
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
            if state.fast is not None:
                state.last_sig = state.fast.extents()
        if state.fast is not None:
            state.fast.bind_context(context)
        else:
            self._bind(state, "context", self._context_binds, {"context": context})
        state.sealed = True

    def _planned_write(self, f: BufferField, state: GraphBuffers, st: _FieldState | None, src: Any):
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
                      ) -> tuple[_FieldState, Any, tuple[int, ...], tuple] | None:
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
    def _plan(st: _FieldState, extent: tuple[int, ...]) -> tuple[torch.Tensor | None, list]:
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

    def _write(self, writes: list[tuple[_FieldState, Any, tuple[int, ...], tuple]]) -> None:
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
                    src, pinned = _stage(src, live.dtype)
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
            _copy_all(dev_dst, dev_src, device, non_blocking=staged_pinned and not staged_pageable)
        if host_dst:
            _copy_host(host_dst, host_src)

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
                    "shape": "(" + ", ".join(d.value if isinstance(d, _Dim) else str(d) for d in f.shape) + ")",
                    "dtype": str(f.dtype).replace("torch.", "") if f.dtype is not None else "as source",
                    "where": f.placement.value,
                    "pad": "static" if f.is_static else
                           f"per element ({f.pad.__name__})" if callable(f.pad) else repr(f.pad),
                    "from": str(f.source) if f.source is not None and not f.is_static else "-",
                    "bound to": ", ".join(str(r) for r in f.bind),
                }
            )
        return rows
