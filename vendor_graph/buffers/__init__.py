"""Declarative graph buffers: a vendor declares each batch-dependent tensor once (``declare``), and make, fill
and bind all walk those declarations (``fill``, the checked fill), with a cache of the steady state over it
(``fast``). What the fills guarantee and why: docs/buffers.md."""

from .copies import pinned_staging_available
from .declare import (
    BATCH,
    BATCH_PLUS_ONE,
    BLOCKS,
    SOURCE,
    TOKENS,
    BufferField,
    GraphDims,
    GraphInputsChanged,
    HeldAttr,
    Placement,
    Ref,
)
from .fast import BufferSpec
from .state import GraphBuffers, graph_buffers

__all__ = [
    "BATCH",
    "BATCH_PLUS_ONE",
    "BLOCKS",
    "SOURCE",
    "TOKENS",
    "BufferField",
    "BufferSpec",
    "GraphBuffers",
    "GraphDims",
    "GraphInputsChanged",
    "HeldAttr",
    "Placement",
    "Ref",
    "graph_buffers",
    "pinned_staging_available",
]
