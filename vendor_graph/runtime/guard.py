"""Stale-graph guard: a captured graph reads addresses it does not own (the KV caches in ``past_key_values``,
the model's weights); replaying it after one of them moved would read, and for KV caches write, freed or foreign
memory. Each foreign tensor's data_ptr, shape, dtype and stride are recorded at capture and checked before a
replay; sleep, wake-up and weight updates drop every graph through the runner's ``reset()``
(docs/internals.md).

Cost per replay: O(1) while ``past_key_values`` is the container verified last (lmdeploy passes its cache
engine's list every step) and no recorded tensor was freed (a weakref callback says so); otherwise, and every
``FULL_CHECK_EVERY`` checks, a compare of the flattened caches. Weights are compared every ``weights_every``
checks: walking a large model's parameters costs more than a step should.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ..config import settings

logger = logging.getLogger("vendor_graph")

WEIGHTS_EVERY_ENV = settings.variable("guard_weights_every")
DEFAULT_WEIGHTS_EVERY = settings.Settings().guard_weights_every
FOREIGN_KWARGS = ("past_key_values",)
# lmdeploy passes the cache engine's own list every step: while the containers are the ones verified
# last and no recorded tensor was freed, a check is O(1); every this many checks it looks inside anyway.
FULL_CHECK_EVERY = 64


@dataclass(frozen=True)
class Stale:
    """Why a graph must not be replayed; ``all_graphs``: every graph of the runner is stale."""

    reason: str
    all_graphs: bool = False


def _flatten(value: Any, out: list[torch.Tensor]) -> None:
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor):
                out.append(item)
            else:
                _flatten(item, out)


def _identity(t: torch.Tensor) -> tuple:
    return (t.data_ptr(), tuple(t.shape), t.dtype, t.stride())


def _signature(tensors: Iterable[torch.Tensor]) -> tuple:
    return tuple(_identity(t) for t in tensors)


_DATA_PTR = operator.methodcaller("data_ptr")  # not torch.Tensor.data_ptr: wrapper subclasses override it


class _Record:
    __slots__ = ("names", "ptrs", "ids", "sig", "dead", "epoch", "refs", "outer", "fast_left", "__weakref__")

    def __init__(self, names: tuple[str, ...], flat: list[torch.Tensor], epoch: int):
        self.names = names
        self.epoch = epoch
        self.outer: tuple = ()
        self.fast_left = 0
        self.adopt(flat)

    def adopt(self, flat: list[torch.Tensor]) -> None:
        self.ptrs = tuple(map(_DATA_PTR, flat))
        self.ids = tuple(map(id, flat))
        self.sig = _signature(flat)
        self.dead = False
        me = weakref.ref(self)

        def died(_ref, me=me) -> None:  # a recorded tensor was freed: the next check looks closely
            record = me()
            if record is not None:
                record.dead = True

        try:
            self.refs = [weakref.ref(t, died) for t in flat]
        except TypeError:  # pragma: no cover - a tensor subclass without weakref support
            self.refs = []
            self.dead = True


def _describe(names: tuple[str, ...], old: tuple, new: tuple) -> str:
    if len(old) != len(new):
        return f"{'/'.join(names)}: {len(new)} tensors now, {len(old)} at capture"
    for i, (a, b) in enumerate(zip(old, new, strict=True)):
        if a != b:
            what = [f"{label} {x} -> {y}" for label, x, y in zip(("data_ptr", "shape", "dtype", "stride"), a, b,
                                                                   strict=True) if x != y]
            where = f"{names[0]}[{i}]" if len(names) == 1 else f"{'/'.join(names)} tensor {i}"
            if isinstance(a[0], int) and isinstance(b[0], int):
                what = [w.replace(f"{a[0]} -> {b[0]}", f"{a[0]:#x} -> {b[0]:#x}") for w in what]
            return f"{where} changed since capture ({', '.join(what)})"
    return "unchanged"


class StaleGraphGuard:
    """Records what each graph reads but does not own; says before a replay whether that moved."""

    def __init__(self, model: Any = None, *, foreign: tuple[str, ...] = FOREIGN_KWARGS,
                 weights_every: int | None = None):
        self.model = model
        self.foreign = foreign
        if weights_every is None:
            weights_every = settings.current().guard_weights_every
        self.weights_every = max(0, weights_every)
        self._records: dict[Any, _Record] = {}
        self._epoch = 0
        self._why_invalid = ""
        self._weights: tuple | None = None
        self._weight_tensors: list[torch.Tensor] = []
        self._checks = 0

    # -- what the runner calls --------------------------------------------------------------------

    def record(self, key: Any, kwargs: dict[str, Any]) -> None:
        """After capturing ``key`` from this step's ``kwargs``."""
        names = tuple(n for n in self.foreign if kwargs.get(n) is not None)
        self._records[key] = _Record(names, self._flat(names, kwargs), self._epoch)
        if self.weights_every and self._weights is None and self.model is not None:
            self._weight_tensors = self._model_tensors()
            self._weights = tuple(map(_DATA_PTR, self._weight_tensors))

    def check(self, key: Any, kwargs: dict[str, Any]) -> Stale | None:
        """Before replaying ``key``: None when what it reads is where it was at capture."""
        rec = self._records.get(key)
        if rec is None:
            return None
        if rec.epoch != self._epoch:
            return Stale(self._why_invalid, all_graphs=False)
        if self.weights_every:
            self._checks += 1
            if self._checks >= self.weights_every:
                self._checks = 0
                moved = self.check_weights()
                if moved is not None:
                    return moved
        outer = tuple(map(kwargs.get, rec.names))
        if rec.fast_left and not rec.dead and all(map(operator.is_, outer, rec.outer)):
            rec.fast_left -= 1  # the very containers verified last time, no recorded tensor freed
            return None
        flat = self._flat(rec.names, kwargs)
        if rec.dead or tuple(map(_DATA_PTR, flat)) != rec.ptrs or tuple(map(id, flat)) != rec.ids:
            sig = _signature(flat)
            if sig != rec.sig:
                return Stale(_describe(rec.names, rec.sig, sig))
            rec.adopt(flat)  # new tensors at the same addresses with the same layout: the graph reads them right
        rec.outer = outer
        rec.fast_left = FULL_CHECK_EVERY
        return None

    def check_weights(self) -> Stale | None:
        """Compare the model's parameters and buffers with capture time now (every graph reads them)."""
        if self._weights is None or self.model is None:
            return None
        tensors = self._model_tensors()
        if len(tensors) == len(self._weight_tensors) and tuple(map(_DATA_PTR, tensors)) == self._weights:
            return None
        now = tuple(map(_DATA_PTR, tensors))
        moved = sum(a != b for a, b in zip(self._weights, now, strict=False)) + abs(len(now) - len(self._weights))
        reason = (f"model weights moved since capture ({moved} of {len(self._weights)} parameters/buffers at a "
                  f"new address or added/removed)")
        self.invalidate(reason)
        return Stale(reason, all_graphs=True)

    def forget(self, key: Any) -> None:
        self._records.pop(key, None)

    def invalidate(self, reason: str) -> None:
        """Every graph recorded so far is stale (sleep, wake-up, weight update); each key's next
        :meth:`check` returns ``reason``."""
        self._epoch += 1
        self._why_invalid = reason
        self._weights = None
        self._weight_tensors = []

    def clear(self) -> None:
        """Forget everything (the runner's ``reset()``)."""
        self._records.clear()
        self._weights = None
        self._weight_tensors = []
        self._checks = 0

    # -- helpers ----------------------------------------------------------------------------------

    @staticmethod
    def _flat(names: tuple[str, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for name in names:
            _flatten(kwargs.get(name), out)
        return out

    def _model_tensors(self) -> list[torch.Tensor]:
        model = self.model
        if not isinstance(model, torch.nn.Module):
            model = getattr(model, "get_model", lambda: None)() if hasattr(model, "get_model") else None
        if not isinstance(model, torch.nn.Module):
            return []
        return [*model.parameters(), *model.buffers()]


__all__ = ["DEFAULT_WEIGHTS_EVERY", "FOREIGN_KWARGS", "WEIGHTS_EVERY_ENV", "Stale", "StaleGraphGuard"]
