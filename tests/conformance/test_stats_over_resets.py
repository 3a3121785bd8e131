"""The stats a run leaves hold the whole run. lmdeploy resets the graph runner on sleep, after a weight update
and when a pipeline is closed, and builds a new one on a wake-up from ``sleep(level=2)``: the summaries, the
stats file written at exit and the next run's graph memory (``VENDOR_GRAPH_GRAPH_MEMORY=auto``) keep every
capture, replay, capture time and memory, eager reason and decode step."""

from __future__ import annotations

import gc
import json
import weakref

import pytest
import torch
from vendor_graph_sim import harness

from vendor_graph import vendors
from vendor_graph.config import settings
from vendor_graph.ops import reports
from vendor_graph.sizing import capacity

MiB = 2**20


@pytest.fixture
def stats_file(monkeypatch, tmp_path):
    path = tmp_path / "stats.json"
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_STATS_EVERY", "0")
    settings.load()
    return path


class _Allocator:
    """``torch.npu.memory_reserved`` growing by ``per_capture`` across each capture (read before and after it)."""

    def __init__(self) -> None:
        self.held = 0
        self.per_capture = 0

    def memory_reserved(self, device=None) -> int:
        now = self.held
        self.held += self.per_capture
        return now


def _served_with_resets(monkeypatch) -> harness.SideBySide:
    """Graphs of batch 4 (4 MiB) and 1 (1 MiB); a reset (sleep); batch 4 captured again (2 MiB: the allocator
    kept part of its memory); a reset (the pipeline closed)."""
    allocator = _Allocator()
    with harness.ascend_pair("G5") as pair:
        monkeypatch.setattr(torch.npu, "memory_reserved", allocator.memory_reserved)
        allocator.per_capture = 4 * MiB
        pair.step([0, 1, 2])
        pair.step([0, 1, 2])
        allocator.per_capture = 1 * MiB
        pair.step([0])
        pair.step([0])
        pair.runner.reset()
        allocator.per_capture = 2 * MiB
        pair.step([0, 1, 2])
        pair.step([0, 1, 2])
        pair.runner.reset()
        assert not pair.runner.graphs()
    assert not pair.mismatches, pair.mismatches[:3]
    return pair


def test_the_stats_file_after_resets_holds_the_whole_run(sim_backend, monkeypatch, stats_file):
    pair = _served_with_resets(monkeypatch)
    assert reports.write_stats_file("exit") == str(stats_file)
    doc = json.loads(stats_file.read_text())
    assert (doc["captures"], doc["replays"], doc["decode_steps"]) == (3, 3, 6)
    assert doc["batch_histogram"] == {"1": 2, "3": 4}
    b4, b1 = doc["buckets"]["4"], doc["buckets"]["1"]
    assert (b4["captures"], b4["replays"], b4["real_tokens"], b4["padded_tokens"]) == (2, 2, 6, 8)
    assert (b1["captures"], b1["replays"]) == (1, 1)
    assert b4["capture_seconds"] > 0 and b1["capture_seconds"] > 0
    assert (b4["capture_bytes"], b1["capture_bytes"]) == (4 * MiB, 1 * MiB)  # the most one capture took
    # the graphs alive at once (batch 4 and 1): 5 MiB, not the 7 MiB summed over every capture
    assert doc["graph_memory_bytes"] == 5 * MiB
    (name, table), = reports.summaries().items()
    assert f"{id(pair.runner):#x}" in name
    assert "     4         2        2            6              8  25.0%" in table


def test_the_next_run_reserves_the_graph_memory_of_a_run_that_ended_with_a_reset(sim_backend, monkeypatch,
                                                                                  stats_file):
    _served_with_resets(monkeypatch)
    reports.write_stats_file("exit")
    doc = json.loads(stats_file.read_text())
    settings.load()  # the next run: VENDOR_GRAPH_GRAPH_MEMORY=auto (the default) reads the file
    reserved = capacity.reservation(doc["max_batches"], spec=vendors.profile("ascend").spec)
    assert reserved.source == "stats file", reserved.detail
    assert reserved.bytes == int(5 * MiB * capacity.MARGIN)


def test_a_runner_rebuilt_on_a_wake_up_adds_to_the_one_it_replaced(sim_backend, monkeypatch, stats_file):
    allocator = _Allocator()
    with harness.ascend_pair("G5") as first:
        monkeypatch.setattr(torch.npu, "memory_reserved", allocator.memory_reserved)
        allocator.per_capture = 3 * MiB
        for active in ([0, 1, 2], [0, 1, 2], [0, 1], [0, 1]):
            first.step(active)
        first.runner.reset()  # sleep(level=2); the wake-up builds another runner
    gone = weakref.ref(first.runner)
    del first
    gc.collect()
    assert gone() is None
    with harness.ascend_pair("G5") as second:
        monkeypatch.setattr(torch.npu, "memory_reserved", allocator.memory_reserved)
        allocator.per_capture = 2 * MiB
        for active in ([0, 1, 2], [0, 1, 2], [0]):
            second.step(active)
        second.runner.reset()  # the pipeline closed
    assert not second.mismatches, second.mismatches[:3]
    reports.write_stats_file("exit")
    doc = json.loads(stats_file.read_text())
    assert "runners" not in doc  # one runner, rebuilt
    assert doc["batch_histogram"] == {"1": 1, "2": 2, "3": 4}
    assert (doc["captures"], doc["replays"]) == (4, 3)
    assert doc["buckets"]["4"]["captures"] == 2 and doc["buckets"]["2"]["captures"] == 1
    assert doc["graph_memory_bytes"] == 6 * MiB  # the first runner's two graphs
