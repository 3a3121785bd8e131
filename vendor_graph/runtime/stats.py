"""Counters of what graph mode did, and the operator-facing reporting around them (a summary per runner,
logged once at interpreter exit and on demand, a capture progress bar, and the stats file: the batch
histogram, per-bucket stats and capture plan of every runner, for the next run's plan).

Runner-agnostic: the Ascend runner wires it through :class:`~vendor_graph.runtime.step.StepPolicy`, and any other runner
(a subclass of lmdeploy's ``CUDAGraphRunner``) can do the same. Per step the cost is a dict lookup and a few
integer additions; :func:`profile_range` is a shared no-op unless a torch profiler is recording.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import sys
import tempfile
import threading
import time
import weakref
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import settings
from ..sizing.planning import STATS_FORMAT

logger = logging.getLogger("vendor_graph")

PROGRESS_ENV = settings.variable("progress")  # on: always draw the capture bar; off: never (default: on a terminal)


@dataclass
class BucketStats:
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

# -- the runner registry: summaries on demand and once at exit, and what the stats file reports -------

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
_REPORTED = False


def register(runner: Any, graph_stats: GraphStats | None = None) -> None:
    """Count ``runner`` (it has ``label``, ``capture_sizes()`` and, unless ``graph_stats`` is given, ``stats``)
    among :func:`live_runners`, and in :func:`runs` for the rest of the process; the first runner of a process
    with ``VENDOR_GRAPH_STATS_FILE`` set starts the periodic stats file writer."""
    record = RunnerRecord(label=runner.label, vendor=getattr(runner, "vendor", None) or runner.label.rsplit(".", 1)[-1],
                          kind=f"{type(runner).__module__}.{type(runner).__qualname__}",
                          sizes=list(runner.capture_sizes()), capture_plan=getattr(runner, "capture_plan", None),
                          stats=runner.stats if graph_stats is None else graph_stats, ident=id(runner),
                          runner=weakref.ref(runner))
    with _LOCK:
        _REGISTRY.sweep()
        if not any(r.runner() is runner for r in _REGISTRY.records):
            _REGISTRY.records.append(record)
    _writer.start()


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


def summaries() -> dict[str, str]:
    """``<label> runner <id>`` -> summary table of every runner of :func:`runs` that did anything (on
    demand); `` (gone)`` follows the name of one no longer alive."""
    return {f"{r.label} runner {r.ident:#x}{'' if r.runner() is not None else ' (gone)'}": r.stats.summary()
            for r in runs() if not r.stats.empty()}


def log_summaries(reason: str = "on demand") -> str:
    """Log every registered runner's summary (INFO, logger ``vendor_graph``); returns the text."""
    text = "\n".join(f"vendor_graph graph stats, {label} ({reason}):\n{table}"
                     for label, table in summaries().items())
    if text:
        logger.info("%s", text)
    return text


# -- the stats file: what the runners saw, kept for the next run's plan -------------------------------

FORMAT = STATS_FORMAT
STATS_FILE_ENV = settings.variable("stats_file")


def _keyed(mapping: dict[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in sorted(mapping.items())}


def runner_document(runner: Any) -> dict[str, Any]:
    """One runner's part of the stats file (``runner``: a runner or a :class:`RunnerRecord`): its capture plan,
    the batch histogram and per-bucket stats."""
    graph_stats: GraphStats = runner.stats
    plan = getattr(runner, "capture_plan", None)
    histogram = dict(graph_stats.histogram)
    for key, steps in (getattr(plan, "carried", None) or {}).items():
        histogram[key] = histogram.get(key, 0) + steps
    merged = GraphStats(histogram=histogram)
    return {
        "vendor": getattr(runner, "vendor", None) or runner.label.rsplit(".", 1)[-1],
        "runner": getattr(runner, "kind", None) or f"{type(runner).__module__}.{type(runner).__qualname__}",
        "max_batches": getattr(plan, "max_batches", None) or max(runner.capture_sizes()),
        "capture_sizes": list(runner.capture_sizes()),
        "capture_source": getattr(plan, "source", "default"),
        "num_layers": getattr(plan, "num_layers", 0),
        "num_gpu_blocks": getattr(plan, "num_blocks", 0),
        "batch_histogram": _keyed(merged.batch_histogram()),
        "query_len_histogram": {str(q): _keyed(h) for q, h in merged.query_len_histogram().items()},
        "decode_steps": merged.decode_steps,
        "carried_steps": merged.decode_steps - graph_stats.decode_steps,
        "replays": graph_stats.replays,
        "captures": graph_stats.captures,
        "padded_fraction": graph_stats.padded_fraction,
        "graph_memory_bytes": graph_stats.graph_memory,
        "reserved_graph_memory_bytes": getattr(plan, "reserved_bytes", None),
        "buckets": {str(size): {**dataclasses.asdict(b), "padding_waste": b.padding_waste}
                    for size, b in sorted(graph_stats.buckets.items())},
        "eager_steps": dict(graph_stats.eager_steps.most_common()),
    }


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


def rank_path(base: str | os.PathLike, rank: int, world_size: int) -> Path:
    """Where rank ``rank`` writes: ``base`` itself for one rank, ``<stem>.rank<N><suffix>`` for several."""
    base = Path(base).expanduser()
    if world_size <= 1:
        return base
    return base.with_name(f"{base.stem}.rank{rank}{base.suffix}")


def stats_files(base: str | os.PathLike) -> list[Path]:
    """Every stats file written for ``base``: itself and its per-rank files, those that exist."""
    base = Path(base).expanduser()
    found = [base] if base.is_file() else []
    found += sorted(base.parent.glob(f"{base.stem}.rank*{base.suffix}")) if base.parent.is_dir() else []
    return found


def document(reason: str) -> dict[str, Any] | None:
    """The stats file's document for every runner of :func:`runs` (None when there is none): the top level
    is the runner with the most decode steps, and ``runners`` lists each when there are several."""
    runners = runs()
    if not runners:
        return None
    parts = [runner_document(r) for r in runners]
    parts.sort(key=lambda d: -d["decode_steps"])
    rank, world_size = process_rank()
    doc = {"format": FORMAT, "rank": rank, "world_size": world_size, "pid": os.getpid(),
           "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "reason": reason, **parts[0]}
    if len(parts) > 1:
        doc["runners"] = parts
    return doc


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_stats_file(reason: str = "on demand", path: str | os.PathLike | None = None) -> str | None:
    """Write the stats document of this process to ``path`` (default: ``VENDOR_GRAPH_STATS_FILE``, per rank);
    returns the path written, None when there is no path or no runner."""
    base = path if path is not None else settings.current().stats_file
    if not base:
        return None
    doc = document(reason)
    if doc is None:
        return None
    target = rank_path(base, doc["rank"], doc["world_size"]) if path is None else Path(path)
    write_atomic(target, json.dumps(doc, indent=1) + "\n")
    return str(target)


class _StatsWriter:
    """Writes the stats file every ``VENDOR_GRAPH_STATS_EVERY`` minutes (a daemon thread) and at exit."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.warned = False

    def start(self) -> None:
        current = settings.current()
        if not current.stats_file:
            return
        parent = Path(current.stats_file).expanduser().parent
        if not parent.is_dir():
            raise ValueError(f"{STATS_FILE_ENV}={current.stats_file}: directory {parent} does not exist; create it "
                             f"or point {STATS_FILE_ENV} at a file in an existing directory")
        if self.thread is not None or not current.stats_every:
            return
        # The settings parser bounds VENDOR_GRAPH_STATS_EVERY by what Event.wait takes; Settings built by hand are not.
        seconds = min(current.stats_every * 60.0, threading.TIMEOUT_MAX)
        self.thread = threading.Thread(target=self._loop, args=(seconds,),
                                       name="vendor_graph-stats", daemon=True)
        self.thread.start()

    def _loop(self, seconds: float) -> None:
        while not self.stop.wait(seconds):
            self.write("periodic")

    def write(self, reason: str) -> None:
        try:
            path = write_stats_file(reason)
        except Exception as exc:  # noqa: BLE001 - the writer must never take serving down
            if not self.warned:
                self.warned = True
                logger.warning("vendor_graph: could not write the stats file (%s): %s", STATS_FILE_ENV, exc)
            return
        if path is not None:
            logger.debug("vendor_graph: stats written to %s (%s)", path, reason)


_writer = _StatsWriter()


def _at_exit() -> None:
    global _REPORTED
    if _REPORTED:
        return
    _REPORTED = True
    _writer.stop.set()
    with contextlib.suppress(Exception):
        _writer.write("exit")
    with contextlib.suppress(Exception):  # logging may already be torn down
        log_summaries("at shutdown")


atexit.register(_at_exit)
