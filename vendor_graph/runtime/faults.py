"""Capture faults: what a failed capture means and how to word it (runner-agnostic).

A runner captures inside ``try``; on any exception it must leave nothing half-made (reset the
partial graph, drop its buffers and registrations, release the pool when no graph uses it), mark the
key eager with :func:`capture_failure_reason` and return a correct result for the step. API:

* ``is_oom(exc)``: an out-of-memory error (``torch.OutOfMemoryError``, or a ``RuntimeError`` whose
  text says out of memory, as vendor runtimes raise it);
* ``capture_failure_reason(exc, hint)``: the one-line reason stored for the key and logged, with the
  remedy (``hint``: a vendor's translation of its error codes, e.g.
  ``vendor_graph.vendors.ascend.limits.explain_capture_error``);
* ``StepMetadata(attn_metadata, context)`` before a fill, ``.restore()`` before an eager fallback.
"""

from __future__ import annotations

from typing import Any

import torch

OOM_REMEDY = ("out of device memory while capturing: capture fewer or smaller sizes "
              "(cudagraph_capture_batch_sizes, max_batch_size) or leave more memory outside the KV cache "
              "(a lower cache_max_entry_count)")


def is_oom(exc: BaseException) -> bool:
    oom_type = getattr(torch, "OutOfMemoryError", None)
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if oom_type is not None and isinstance(exc, oom_type):
            return True
        if isinstance(exc, (RuntimeError, MemoryError)) and "out of memory" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def capture_failure_reason(exc: BaseException, hint: str | None = None) -> str:
    reason = f"capture failed: {type(exc).__name__}: {exc}"
    if is_oom(exc):
        reason += f"; {OOM_REMEDY}"
    if hint:
        reason += f"; {hint}"
    return reason


class StepMetadata:
    """What a step's ``attn_metadata`` and ``StepContext`` hold before a graph's fill re-binds them to the
    graph's (padded) buffers; :meth:`restore` gives it back, so an eager fallback after a failed capture
    or a refused replay computes on the step's own metadata. Costs a shallow copy of two ``__dict__``s."""

    __slots__ = ("_saved",)

    def __init__(self, *objects: Any):
        self._saved = [(obj, dict(obj.__dict__)) for obj in objects if hasattr(obj, "__dict__")]

    def restore(self) -> None:
        for obj, state in self._saved:
            obj.__dict__.clear()
            obj.__dict__.update(state)


__all__ = ["OOM_REMEDY", "StepMetadata", "capture_failure_reason", "is_oom"]
