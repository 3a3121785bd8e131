"""The operator's reports on what graph mode did: the summary tables (on demand, and logged once at interpreter
exit) and the stats file (the batch histogram, per-bucket stats and capture plan of every runner, one file per
rank, written atomically at exit, every ``VENDOR_GRAPH_STATS_EVERY`` minutes and on demand), which the next run's
plan reads back (:mod:`vendor_graph.sizing.workload`).

Off the step path: the runners only count (:mod:`vendor_graph.runtime.counters`); activation imports this module,
which arms the exit report, and starts the periodic writer (:func:`start_writer`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ..config import settings
from ..runtime import counters
from ..runtime.counters import STATS_FILE_ENV, GraphStats, runs
from ..sizing.workload import STATS_FORMAT, rank_path, stats_files

logger = logging.getLogger("vendor_graph")

FORMAT = STATS_FORMAT

# -- the summaries: one table per runner -----------------------------------------------------------------------


def summaries() -> dict[str, str]:
    """``<label> runner <id>`` -> summary table of every runner of :func:`~vendor_graph.runtime.counters.runs`
    that did anything (on demand); `` (gone)`` follows the name of one no longer alive."""
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


def _keyed(mapping: dict[int, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in sorted(mapping.items())}


def runner_document(runner: Any) -> dict[str, Any]:
    """One runner's part of the stats file (``runner``: a runner or a
    :class:`~vendor_graph.runtime.counters.RunnerRecord`): its capture plan, the batch histogram and per-bucket
    stats."""
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


def document(reason: str) -> dict[str, Any] | None:
    """The stats file's document for every runner of :func:`~vendor_graph.runtime.counters.runs` (None when there
    is none): the top level is the runner with the most decode steps, and ``runners`` lists each when there are
    several."""
    runners = runs()
    if not runners:
        return None
    parts = [runner_document(r) for r in runners]
    parts.sort(key=lambda d: -d["decode_steps"])
    rank, world_size = counters.process_rank()
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
        counters.check_stats_directory()
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
_REPORTED = False


def start_writer() -> None:
    """Write the stats file every ``VENDOR_GRAPH_STATS_EVERY`` minutes from now on, where
    ``VENDOR_GRAPH_STATS_FILE`` is set (idempotent); activation and the runner builder call it, the step path
    never does. ValueError where the file's directory is gone."""
    _writer.start()


def _at_exit() -> None:
    """The exit report, once: the stats file's last write, then every runner's summary."""
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

__all__ = ["FORMAT", "document", "log_summaries", "rank_path", "runner_document", "start_writer", "stats_files",
           "summaries", "write_atomic", "write_stats_file"]
