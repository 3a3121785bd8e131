"""What graph mode did, counted on the step path: per-bucket and per-runner counters, the capture progress
bar, profiler ranges, and the registry of runners that the reports (:mod:`vendor_graph.ops.reports`) read.

Runner-agnostic: the Ascend runner wires it through :class:`~vendor_graph.runtime.step.StepPolicy`, and any other
runner (a subclass of lmdeploy's ``CUDAGraphRunner``) can do the same. Per step the cost is a dict lookup and a few
integer additions; :func:`profile_range` is a shared no-op unless a torch profiler is recording. Nothing here
writes a file or logs a report: the step path never imports ``ops/``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import settings

PROGRESS_ENV = settings.variable("progress")  # on: always draw the capture bar; off: never (default: on a terminal)
STATS_FILE_ENV = settings.variable("stats_file")


@dataclass
class BucketStats:
    """One capture size's counters over the run."""

    captures: int = 0
    replays: int = 0
    real_tokens: int = 0
    padded_tokens: int = 0
    capture_seconds: float = 0.0
    capture_bytes: int | None = None  # the most one capture of this size took (recaptures do not add up)
    capture_failures: int = 0
    stale_recaptures: int = 0
    shadow_checks: int = 0
    shadow_divergences: int = 0

    @property
    def padding_waste(self) -> float:
        return 0.0 if not self.padded_tokens else 1 - self.real_tokens / self.padded_tokens


@dataclass
class GraphStats:
    """One runner's counters over the whole run (a draft model's runner has its own). A reset of the runner
    releases its graphs but keeps the counts: the stats file and the summaries report the run."""

    buckets: dict[int, BucketStats] = field(default_factory=dict)
    eager_steps: Counter = field(default_factory=Counter)
    # (real batch, query length) -> decode steps that reached graph mode's decision, whatever it was.
    histogram: dict[tuple[int, int], int] = field(default_factory=dict)
    # The graphs alive now (graph key, or padded batch where none is given) -> the memory their capture took.
    alive_bytes: dict[Any, int] = field(default_factory=dict)
    peak_bytes: int | None = None  # the largest total alive_bytes reached

    def decoded(self, batch: int, query_len: int) -> None:
        key = (batch, query_len)
        self.histogram[key] = self.histogram.get(key, 0) + 1

    def bucket(self, padded_batch: int) -> BucketStats:
        stats = self.buckets.get(padded_batch)
        if stats is None:
            stats = self.buckets[padded_batch] = BucketStats()
        return stats

    def captured(self, padded_batch: int, seconds: float, nbytes: int | None = None, key: Any = None) -> None:
        stats = self.bucket(padded_batch)
        stats.captures += 1
        stats.capture_seconds += seconds
        if nbytes is not None:
            nbytes = max(0, nbytes)
            stats.capture_bytes = max(stats.capture_bytes or 0, nbytes)
            self.alive_bytes[padded_batch if key is None else key] = nbytes
            self.peak_bytes = max(self.peak_bytes or 0, sum(self.alive_bytes.values()))

    def released(self, key: Any = None) -> None:
        """The graph of ``key`` (every graph for None) is gone: a later capture of it does not add to
        :attr:`graph_memory`."""
        if key is None:
            self.alive_bytes.clear()
        else:
            self.alive_bytes.pop(key, None)

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
        return not self.buckets and not self.eager_steps and not self.histogram

    @property
    def decode_steps(self) -> int:
        return sum(self.histogram.values())

    def batch_histogram(self) -> dict[int, int]:
        """Real batch -> decode steps, over every query length."""
        out: dict[int, int] = {}
        for (batch, _), steps in list(self.histogram.items()):
            out[batch] = out.get(batch, 0) + steps
        return dict(sorted(out.items()))

    def query_len_histogram(self) -> dict[int, dict[int, int]]:
        """Query length -> real batch -> decode steps."""
        out: dict[int, dict[int, int]] = {}
        for (batch, query_len), steps in sorted(list(self.histogram.items()), key=lambda kv: (kv[0][1], kv[0][0])):
            out.setdefault(query_len, {})[batch] = steps
        return out

    @property
    def padded_fraction(self) -> float:
        """Padding tokens over graph tokens, across every replay."""
        graph = sum(b.padded_tokens for b in self.buckets.values())
        return 0.0 if not graph else 1 - sum(b.real_tokens for b in self.buckets.values()) / graph

    @property
    def graph_memory(self) -> int | None:
        """Device memory the graphs needed: the most that the graphs alive at one time took to capture
        (allocator growth around each capture), None where never measured.

        A graph released and captured again (a stale graph, a runner reset on sleep, a weight update or a
        closed pipeline) counts once, not once per capture: this is the memory the graphs hold together,
        which is what the next run keeps out of its KV cache (:func:`vendor_graph.sizing.capacity.reservation`)."""
        return self.peak_bytes

    def merged(self, later: GraphStats) -> GraphStats:
        """These counts followed by ``later``'s (a runner lmdeploy rebuilt: its graphs replace these):
        counts add up; a bucket's capture memory and the graph memory are the larger of the two."""
        buckets = {size: dataclasses.replace(b) for size, b in list(self.buckets.items())}
        for size, b in list(later.buckets.items()):
            mine = buckets.get(size)
            if mine is None:
                buckets[size] = dataclasses.replace(b)
                continue
            for f in dataclasses.fields(BucketStats):
                if f.name != "capture_bytes":
                    setattr(mine, f.name, getattr(mine, f.name) + getattr(b, f.name))
            mine.capture_bytes = _larger(mine.capture_bytes, b.capture_bytes)
        histogram = dict(self.histogram)
        for key, steps in list(later.histogram.items()):
            histogram[key] = histogram.get(key, 0) + steps
        eager = Counter(dict(self.eager_steps))
        eager.update(dict(later.eager_steps))
        return GraphStats(buckets=buckets, eager_steps=eager, histogram=histogram,
                          peak_bytes=_larger(self.peak_bytes, later.peak_bytes))

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


def _larger(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


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


# -- the runner registry: every runner of the process, for the summaries and the stats file -----------------

@dataclass
class RunnerRecord:
    """What the summaries and the stats file need of one registered runner, kept after the runner is gone
    (a closed pipeline's, or the one lmdeploy replaces on a wake-up from ``sleep(level=2)``)."""

    label: str
    vendor: str
    kind: str  # the runner's class, module.qualname
    sizes: list[int]
    capture_plan: Any
    stats: GraphStats
    ident: int  # id() of the runner: the summaries name it by it
    runner: Any  # a weak reference to it

    def capture_sizes(self) -> list[int]:
        return self.sizes

    @property
    def lineage(self) -> tuple:
        """Runners with the same label, capture sizes, max_batch_size and layer count are taken for one runner
        rebuilt, and reported as one (so are two such runners alive at once: two engines of one model)."""
        plan = self.capture_plan
        return (self.label, self.vendor, tuple(self.sizes), getattr(plan, "max_batches", None),
                getattr(plan, "num_layers", 0))

    def followed_by(self, later: RunnerRecord) -> RunnerRecord:
        """One record for both: the first one's capture plan (what it carried from the previous run's stats
        file is carried once), the later one's name and runner, the counts of both."""
        return dataclasses.replace(later, capture_plan=self.capture_plan, stats=self.stats.merged(later.stats))


class _Registry:
    def __init__(self) -> None:
        self.records: list[RunnerRecord] = []  # registered runners, alive when last looked at
        self.gone: dict[tuple, RunnerRecord] = {}  # lineage -> its runners that are gone, merged

    def sweep(self) -> None:
        for record in [r for r in self.records if r.runner() is None]:
            self.records.remove(record)
            earlier = self.gone.get(record.lineage)
            self.gone[record.lineage] = record if earlier is None else earlier.followed_by(record)


_REGISTRY = _Registry()
_LOCK = threading.Lock()


def check_stats_directory() -> None:
    """ValueError where ``VENDOR_GRAPH_STATS_FILE``'s directory is gone since the settings were read: the runner
    (and the stats writer) refuse to start rather than serve a run whose stats cannot be written."""
    current = settings.current()
    if not current.stats_file:
        return
    parent = Path(current.stats_file).expanduser().parent
    if not parent.is_dir():
        raise ValueError(f"{STATS_FILE_ENV}={current.stats_file}: directory {parent} does not exist; create it "
                         f"or point {STATS_FILE_ENV} at a file in an existing directory")


def register(runner: Any, graph_stats: GraphStats | None = None) -> None:
    """Count ``runner`` (it has ``label``, ``capture_sizes()`` and, unless ``graph_stats`` is given, ``stats``)
    among :func:`live_runners`, and in :func:`runs` for the rest of the process. A stats file that can no longer
    be written refuses the runner (:func:`check_stats_directory`); activation starts the writer."""
    check_stats_directory()
    record = RunnerRecord(label=runner.label, vendor=getattr(runner, "vendor", None) or runner.label.rsplit(".", 1)[-1],
                          kind=f"{type(runner).__module__}.{type(runner).__qualname__}",
                          sizes=list(runner.capture_sizes()), capture_plan=getattr(runner, "capture_plan", None),
                          stats=runner.stats if graph_stats is None else graph_stats, ident=id(runner),
                          runner=weakref.ref(runner))
    with _LOCK:
        _REGISTRY.sweep()
        if not any(r.runner() is runner for r in _REGISTRY.records):
            _REGISTRY.records.append(record)


def live_runners() -> list[Any]:
    """Every vendor_graph runner alive in this process (``.stats`` says what it did)."""
    with _LOCK:
        return [r for r in (record.runner() for record in _REGISTRY.records) if r is not None]


def runs() -> list[RunnerRecord]:
    """Every runner of this process, alive or gone, over its whole run (its resets do not take counts away),
    with a runner and the ones rebuilt after it as one record (:attr:`RunnerRecord.lineage`)."""
    with _LOCK:
        _REGISTRY.sweep()
        merged = dict(_REGISTRY.gone)
        for record in _REGISTRY.records:
            earlier = merged.get(record.lineage)
            merged[record.lineage] = record if earlier is None else earlier.followed_by(record)
    return list(merged.values())


def process_rank() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed's when initialised, else RANK / WORLD_SIZE."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # noqa: BLE001 - a report, never a failure
        pass
    try:
        return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1
