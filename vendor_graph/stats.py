"""Counters of what graph mode did, and the operator-facing reporting around them (a summary per runner,
logged once at interpreter exit and on demand, and a capture progress bar).

Runner-agnostic: the Ascend runner wires it through :class:`~vendor_graph.step.StepPolicy`, and any other runner
(a subclass of lmdeploy's ``CUDAGraphRunner``) can do the same. Per step the cost is a dict lookup and a few
integer additions; :func:`profile_range` is a shared no-op unless a torch profiler is recording.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from . import settings

logger = logging.getLogger("vendor_graph")

PROGRESS_ENV = settings.variable("progress")  # on: always draw the capture bar; off: never (default: on a terminal)


@dataclass
class BucketStats:
    captures: int = 0
    replays: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    capture_seconds: float = 0.0
    capture_bytes: int | None = None
    capture_failures: int = 0
    stale_recaptures: int = 0
    shadow_checks: int = 0
    shadow_divergences: int = 0

    @property
    def padding_waste(self) -> float:
        return 0.0 if not self.padded_tokens else 1 - self.real_tokens / self.padded_tokens


@dataclass
class GraphStats:
    """One runner's counters (a draft model's runner has its own)."""

    buckets: dict[int, BucketStats] = field(default_factory=dict)
    eager_steps: Counter = field(default_factory=Counter)

    def bucket(self, padded_batch: int) -> BucketStats:
        stats = self.buckets.get(padded_batch)
        if stats is None:
            stats = self.buckets[padded_batch] = BucketStats()
        return stats

    def captured(self, padded_batch: int, seconds: float, nbytes: int | None = None) -> None:
        stats = self.bucket(padded_batch)
        stats.captures += 1
        stats.capture_seconds += seconds
        if nbytes is not None:
            stats.capture_bytes = (stats.capture_bytes or 0) + max(0, nbytes)

    def capture_failed(self, padded_batch: int) -> None:
        self.bucket(padded_batch).capture_failures += 1

    def replayed(self, padded_batch: int, real_tokens: int, padded_tokens: int) -> None:
        stats = self.bucket(padded_batch)
        stats.replays += 1
        stats.real_tokens += real_tokens
        stats.padded_tokens += padded_tokens

    def stale(self, padded_batch: int) -> None:
        self.bucket(padded_batch).stale_recaptures += 1

    def shadowed(self, padded_batch: int, diverged: bool) -> None:
        stats = self.bucket(padded_batch)
        stats.shadow_checks += 1
        stats.shadow_divergences += int(diverged)

    def eager(self, reason: str) -> None:
        self.eager_steps[reason] += 1

    @property
    def replays(self) -> int:
        return sum(b.replays for b in self.buckets.values())

    @property
    def captures(self) -> int:
        return sum(b.captures for b in self.buckets.values())

    def empty(self) -> bool:
        return not self.buckets and not self.eager_steps

    def progress(self, total: int, stream: Any = None) -> CaptureProgress:
        return CaptureProgress(total, stream=stream)

    def summary(self) -> str:
        lines = ["bucket  captures  replays  real tokens  padded tokens  waste   capture s  capture MiB"
                 "  failed  stale  shadow (diverged)"]
        for size in sorted(self.buckets):
            b = self.buckets[size]
            mib = "-" if b.capture_bytes is None else f"{b.capture_bytes / 2**20:.1f}"
            shadow = f"{b.shadow_checks} ({b.shadow_divergences})"
            lines.append(f"{size:>6}  {b.captures:>8}  {b.replays:>7}  {b.real_tokens:>11}  {b.padded_tokens:>13}  "
                         f"{b.padding_waste:>5.1%}  {b.capture_seconds:>9.3f}  {mib:>11}  {b.capture_failures:>6}  "
                         f"{b.stale_recaptures:>5}  {shadow:>17}")
        for reason, count in self.eager_steps.most_common():
            lines.append(f"eager steps: {count} ({reason})")
        return "\n".join(lines)


def device_memory(device_module: Any) -> int | None:
    """Bytes the device allocator holds now (``memory_reserved``), None where it cannot say."""
    fn = getattr(device_module, "memory_reserved", None)
    if fn is None:
        return None
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - a report, never a failure
        return None


class CaptureProgress:
    """A one-line bar on stderr while several sizes are captured up front (``\\r`` updates, then a
    newline). Drawn only for a terminal (``VENDOR_GRAPH_PROGRESS=1`` forces it, ``0`` turns it off) and
    only when more than one size is to be captured."""

    def __init__(self, total: int, stream: Any = None):
        self.total = total
        self.count = 0
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.perf_counter()
        self.finished = False
        wanted = settings.current().progress
        if wanted is None:
            wanted = bool(getattr(self.stream, "isatty", lambda: False)())
        self.visible = wanted and total > 1

    def captured(self, padded_batch: int) -> None:
        if self.finished:
            return
        self.count += 1
        if self.visible and self.count >= 2:  # a bar only once a second size is captured before any replay
            width = 24
            filled = width * min(self.count, self.total) // self.total
            self.stream.write(f"\rvendor_graph: capturing graphs [{'#' * filled}{'.' * (width - filled)}] "
                              f"{self.count}/{self.total} (batch {padded_batch}) "
                              f"{time.perf_counter() - self.started:.1f}s")
            self.stream.flush()
        if self.count >= self.total:
            self.done()

    def done(self) -> None:
        if self.finished:
            return
        self.finished = True
        if self.visible and self.count >= 2:
            self.stream.write("\n")
            self.stream.flush()


_PROBE: Any = None


def _profiler_enabled() -> bool:
    global _PROBE
    if _PROBE is None:
        import torch

        _PROBE = getattr(getattr(torch._C, "_autograd", None), "_profiler_enabled", None) or (lambda: True)
    return bool(_PROBE())


def profile_range(name: str, real_batch: int, padded_batch: int):
    """``torch.profiler.record_function`` named with the real and padded batch, only while a profiler
    records (otherwise a shared no-op context: no string formatting, no profiler call)."""
    if not _profiler_enabled():
        return _NOTHING
    import torch

    return torch.profiler.record_function(f"{name} batch={real_batch} padded={padded_batch}")


class _NoOp:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


_NOTHING = _NoOp()

# -- the live-runner registry: summaries on demand and once at exit -----------------------------------

_RUNNERS: weakref.WeakSet = weakref.WeakSet()
_LOCK = threading.Lock()
_REPORTED = False


def register(runner: Any) -> None:
    """Count ``runner`` (it has ``label`` and ``stats``) among :func:`live_runners`."""
    with _LOCK:
        _RUNNERS.add(runner)


def live_runners() -> list[Any]:
    """Every vendor_graph runner alive in this process (``.stats`` says what it did)."""
    with _LOCK:
        return list(_RUNNERS)


def summaries() -> dict[str, str]:
    """``<label> runner <id>`` -> summary table of every live runner that did anything (on demand)."""
    return {f"{runner.label} runner {id(runner):#x}": runner.stats.summary()
            for runner in live_runners() if not runner.stats.empty()}


def log_summaries(reason: str = "on demand") -> str:
    """Log every registered runner's summary (INFO, logger ``vendor_graph``); returns the text."""
    text = "\n".join(f"vendor_graph graph stats, {label} ({reason}):\n{table}"
                     for label, table in summaries().items())
    if text:
        logger.info("%s", text)
    return text


def _at_exit() -> None:
    global _REPORTED
    if _REPORTED:
        return
    _REPORTED = True
    with contextlib.suppress(Exception):  # logging may already be torn down
        log_summaries("at shutdown")


atexit.register(_at_exit)
