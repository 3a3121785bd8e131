"""The declaration language a vendor writes: which tensors of a decode step change with the batch, their shape
in graph dimensions, their padding, where each is read from and where it is bound. See docs/buffers.md."""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BATCH",
    "BATCH_PLUS_ONE",
    "BLOCKS",
    "SOURCE",
    "TOKENS",
    "BufferField",
    "Dim",
    "GraphDims",
    "GraphInputsChanged",
    "HeldAttr",
    "Placement",
    "Ref",
]


class Dim(str, enum.Enum):
    """A symbolic dimension of a field's shape, sized per graph when its buffers are made."""

    BATCH = "batch"  # graph_meta.max_batchs
    TOKENS = "tokens"  # graph_meta.max_tokens
    BLOCKS = "blocks"  # graph_meta.num_blocks (block table columns)
    BATCH_PLUS_ONE = "batch+1"  # cumulative starts
    SOURCE = "source"  # the size of the source's dimension at capture (hidden size of inputs_embeds)


BATCH = Dim.BATCH
TOKENS = Dim.TOKENS
BLOCKS = Dim.BLOCKS
BATCH_PLUS_ONE = Dim.BATCH_PLUS_ONE
SOURCE = Dim.SOURCE
_ROW_DIMS = (BATCH, TOKENS, BATCH_PLUS_ONE)


class Placement(enum.Enum):
    """Where a buffer lives: on the graph's device, or on the host for kernels that read a host value."""

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
    """The sizes of one graph the symbolic dimensions resolve to (``query_len``: tokens per sequence)."""

    batch: int
    tokens: int
    blocks: int
    query_len: int
