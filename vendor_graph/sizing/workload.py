"""Stats files read back: the checked document of one (:func:`read_stats`) and the decode steps of several
merged into a :class:`Workload` (:func:`load_workload`), what the planner fits capture sizes to.

The writer is :mod:`vendor_graph.ops.reports`; the format, :data:`STATS_FORMAT`, and the per-rank file names
(:func:`rank_path`, :func:`stats_files`) live here, below both, so that the planner and the capacity check read
the files without importing the writer. A file is user input: every field is bounded and a bad one is a
:class:`PlanError` naming the path and the fix. Pure Python: neither torch nor lmdeploy is imported.
"""

from __future__ import annotations

import os
import re
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import values as _values
from ..config.userfiles import UserFileError, read_json
from .buckets import MAX_BATCHES_LIMIT

STATS_FORMAT = "vendor_graph.stats/1"
MAX_QUERY_LEN = 1024  # decode steps graphed: 1 token per sequence, a few more with speculative decoding
MAX_COUNT = 2**63 - 1  # the most steps, layers or bytes a stats file may record (what a 64-bit counter holds)
STATS_VENDORS = ("cuda", "ascend", "camb", "maca")
REQUIRED_KEYS = ("vendor", "max_batches", "capture_sizes", "batch_histogram")
_DECIMAL = re.compile(r"[1-9][0-9]*")


class PlanError(ValueError):
    """Stats or planning arguments that cannot give a plan; the message names the fix."""


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


@dataclass(frozen=True)
class Workload:
    """Decode steps recorded in one or more stats files, merged."""

    vendor: str
    max_batches: int
    capture_sizes: tuple[int, ...]  # what the recorded run captured
    steps: dict[int, int]  # real batch -> decode steps
    weights: dict[int, int]  # real batch -> tokens (steps x query length, summed over query lengths)
    query_lens: tuple[int, ...] = (1,)
    num_layers: int = 0
    files: tuple[str, ...] = ()
    graph_memory_bytes: int | None = None
    # (batch, query length) -> steps: what steps and weights are summed from
    histogram: dict[tuple[int, int], int] = field(default_factory=dict, compare=False)

    @property
    def decode_steps(self) -> int:
        return sum(self.steps.values())


def _short(value: Any) -> str:
    """``repr(value)`` cut to a few dozen characters: a message stays one readable line whatever a file holds."""
    return reprlib.repr(value)


def _fail(path: Any, problem: str) -> PlanError:
    return PlanError(f"{path}: {problem}")


def _histogram(path: Any, key: str, value: Any) -> dict[int, int]:
    fix = "write it with vendor_graph's stats writer (VENDOR_GRAPH_STATS_FILE) or fix it by hand"
    if not isinstance(value, dict):
        raise _fail(path, f"{key} is {type(value).__name__}, not an object of batch size -> steps; {fix}")
    if len(value) > MAX_BATCHES_LIMIT:
        raise _fail(path, f"{key} holds {len(value)} batch sizes, more than max_batch_size can be "
                          f"({MAX_BATCHES_LIMIT}, vendor_graph's bound); {fix}")
    out = {}
    for batch, steps in value.items():
        if not isinstance(batch, str) or not _DECIMAL.fullmatch(batch):
            raise _fail(path, f"{key} key {_short(batch)} is not a batch size (a decimal string such as \"8\"); {fix}")
        if len(batch) > 9 or int(batch) > MAX_BATCHES_LIMIT:
            raise _fail(path, f"{key} key {_short(batch)} is above {MAX_BATCHES_LIMIT}, vendor_graph's bound on "
                              f"max_batch_size; {fix}")
        if isinstance(steps, bool) or not isinstance(steps, int) or not 0 <= steps <= MAX_COUNT:
            raise _fail(path, f"{key}[{_short(batch)}] = {_short(steps)} is not a step count (a whole number from 0 "
                              f"to 2**63-1); {fix}")
        out[int(batch)] = steps
    return out


def read_stats(path: str | Path) -> dict:
    """The stats document at ``path``, checked: PlanError naming the path and the fix when it is not one."""
    fix = "give a file written by vendor_graph (VENDOR_GRAPH_STATS_FILE=PATH while the workload runs)"
    _values.path("path", path, PlanError)
    try:
        doc = read_json(path, fix=fix, what="stats file")
    except UserFileError as exc:
        raise PlanError(str(exc)) from None
    if not isinstance(doc, dict):
        raise _fail(path, f"holds a JSON {type(doc).__name__}, not an object; {fix}")
    if doc.get("format") != STATS_FORMAT:
        raise _fail(path, f"format is {_short(doc.get('format'))}, not {STATS_FORMAT!r}: not a vendor_graph stats file "
                          f"(or one from another version); {fix}")
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise _fail(path, f"lacks {', '.join(missing)}; {fix}")
    if doc["vendor"] not in STATS_VENDORS:
        raise _fail(path, f"vendor {_short(doc['vendor'])} is not one of {', '.join(STATS_VENDORS)}; {fix}")
    max_batches = doc["max_batches"]
    if isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 1:
        raise _fail(path, f"max_batches {_short(max_batches)} is not a whole number of 1 or more; {fix}")
    if max_batches > MAX_BATCHES_LIMIT:
        raise _fail(path, f"max_batches {_short(max_batches)} is above {MAX_BATCHES_LIMIT}, vendor_graph's bound on "
                          f"max_batch_size (lmdeploy's defaults are 128-1024): no run records that; {fix}")
    sizes = doc["capture_sizes"]
    if not isinstance(sizes, list) or not all(type(s) is int and 1 <= s <= MAX_BATCHES_LIMIT for s in sizes):
        raise _fail(path, f"capture_sizes {_short(sizes)} is not a list of whole numbers from 1 to "
                          f"{MAX_BATCHES_LIMIT}; {fix}")
    steps = _histogram(path, "batch_histogram", doc["batch_histogram"])
    by_query = doc.get("query_len_histogram")
    if by_query is not None:
        if not isinstance(by_query, dict):
            raise _fail(path, f"query_len_histogram is {type(by_query).__name__}, not an object; {fix}")
        summed: dict[int, int] = {}
        for q, histogram in by_query.items():
            if not isinstance(q, str) or not _DECIMAL.fullmatch(q):
                raise _fail(path, f"query_len_histogram key {_short(q)} is not a query length (a decimal string); "
                                  f"{fix}")
            if len(q) > 9 or int(q) > MAX_QUERY_LEN:
                raise _fail(path, f"query length {q} is above {MAX_QUERY_LEN}: decode steps of one token per sequence, "
                                  f"or a few with speculative decoding, are graphed; {fix}")
            for batch, n in _histogram(path, f"query_len_histogram[{q!r}]", histogram).items():
                summed[batch] = summed.get(batch, 0) + n
        disagree = sorted(b for b in set(summed) | set(steps) if summed.get(b, 0) != steps.get(b, 0))
        if disagree:
            b = disagree[0]
            raise _fail(path, f"batch {b}: query_len_histogram counts {summed.get(b, 0)} steps, batch_histogram "
                              f"{steps.get(b, 0)}; the two histograms must agree; {fix}")
    for key in ("num_layers", "graph_memory_bytes"):
        value = doc.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT):
            raise _fail(path, f"{key} {_short(value)} is not a whole number from 0 to 2**63-1; {fix}")
    return doc


def load_workload(paths: Sequence[str | Path]) -> Workload:
    """The decode steps of several stats files (one per rank, or several runs), summed.

    They must share vendor, max_batches and capture_sizes; num_layers and graph_memory_bytes are the largest.
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    if paths is not None and not isinstance(paths, (list, tuple)):
        if isinstance(paths, (bytes, Mapping)) or not isinstance(paths, Iterable):
            raise PlanError(f"paths must be a path or a sequence of paths (str or pathlib.Path), got "
                            f"{_values.show(paths)}")
        paths = list(paths)
    for i, path in enumerate(paths or ()):
        _values.path(f"paths[{i}]", path, PlanError)
    if not paths:
        raise PlanError("no stats files given; give one or more files written with VENDOR_GRAPH_STATS_FILE")
    steps: dict[int, int] = {}
    weights: dict[int, int] = {}
    pairs: dict[tuple[int, int], int] = {}
    query_lens: set[int] = set()
    first: tuple[str, dict] | None = None
    num_layers, memory = 0, None
    for path in paths:
        doc = read_stats(path)
        if first is None:
            first = (str(path), doc)
        else:
            for key in ("vendor", "max_batches", "capture_sizes"):
                mine, theirs = doc[key], first[1][key]
                if key == "capture_sizes":
                    mine, theirs = sorted(set(mine)), sorted(set(theirs))
                if mine != theirs:
                    raise PlanError(f"{first[0]} has {key} {theirs!r} but {path} has {mine!r}; plan "
                                    f"from files of one deployment (same vendor, max_batch_size and capture "
                                    f"sizes) at a time")
        for b, n in doc["batch_histogram"].items():
            steps[int(b)] = steps.get(int(b), 0) + n
        by_query = doc.get("query_len_histogram")
        if by_query is None:
            by_query = {"1": doc["batch_histogram"]}
        for q, histogram in by_query.items():
            for b, n in histogram.items():
                weights[int(b)] = weights.get(int(b), 0) + n * int(q)
                pairs[(int(b), int(q))] = pairs.get((int(b), int(q)), 0) + n
                if n:
                    query_lens.add(int(q))
        num_layers = max(num_layers, doc.get("num_layers") or 0)
        if doc.get("graph_memory_bytes") is not None:
            memory = max(memory or 0, doc["graph_memory_bytes"])
    assert first is not None
    doc = first[1]
    return Workload(vendor=doc["vendor"], max_batches=doc["max_batches"],
                    capture_sizes=tuple(sorted(set(doc["capture_sizes"]))), steps=dict(sorted(steps.items())),
                    weights=dict(sorted(weights.items())), query_lens=tuple(sorted(query_lens)) or (1,),
                    num_layers=num_layers, files=tuple(str(p) for p in paths), graph_memory_bytes=memory,
                    histogram=pairs)


__all__ = ["MAX_COUNT", "MAX_QUERY_LEN", "STATS_FORMAT", "STATS_VENDORS", "PlanError", "Workload", "load_workload",
           "rank_path", "read_stats", "stats_files"]
