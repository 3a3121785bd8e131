"""The stats file: what every runner saw (the batch histogram, per-bucket stats, its capture plan), written
atomically at exit, periodically and on demand, one file per rank."""

from __future__ import annotations

import gc
import json
import os
import threading
from types import SimpleNamespace

import pytest
from once_per_run import newest_release_only

from vendor_graph.config import settings
from vendor_graph.ops import reports
from vendor_graph.runtime import counters
from vendor_graph.runtime.counters import GraphStats
from vendor_graph.sizing import capacity

pytestmark = newest_release_only


class FakeRunner:
    def __init__(self, vendor="cuda", sizes=(1, 2, 4, 8), source=capacity.DEFAULT, carried=None):
        self.vendor = vendor
        self.label = f"vendor_graph.{vendor}"
        self.stats = GraphStats()
        self._sizes = list(sizes)
        self.capture_plan = capacity.CapturePlan(tuple(sizes), source, max(sizes), num_layers=4,
                                                 carried=carried or {}, reserved_bytes=1024)

    def capture_sizes(self):
        return self._sizes


@pytest.fixture
def registry(monkeypatch):
    """A registry of this test's runners only."""
    monkeypatch.setattr(counters, "_REGISTRY", counters._Registry())


def _served(runner, batches, query_len=1):
    for batch in batches:
        runner.stats.decoded(batch, query_len)
        size = next(s for s in runner.capture_sizes() if s >= batch)
        runner.stats.replayed(size, batch * query_len, size * query_len)


def test_the_document_holds_the_histogram_and_the_plan(registry, tmp_path, monkeypatch):
    runner = FakeRunner()
    counters.register(runner)
    _served(runner, [3, 3, 5, 1, 8])
    runner.stats.captured(4, 0.1, 2048)
    runner.stats.captured(8, 0.1, 4096)
    path = reports.write_stats_file(path=tmp_path / "s.json")
    doc = json.loads(open(path).read())
    assert doc["format"] == reports.FORMAT
    assert doc["vendor"] == "cuda" and doc["max_batches"] == 8 and doc["capture_sizes"] == [1, 2, 4, 8]
    assert doc["batch_histogram"] == {"1": 1, "3": 2, "5": 1, "8": 1}
    assert doc["query_len_histogram"] == {"1": {"1": 1, "3": 2, "5": 1, "8": 1}}
    assert doc["decode_steps"] == 5 and doc["replays"] == 5
    # padded: 3->4 twice (2), 5->8 (3), 1 and 8 exact: 5 of 4+4+8+1+8 = 25 graph tokens
    assert doc["padded_fraction"] == pytest.approx(5 / 25)
    assert doc["graph_memory_bytes"] == 6144 and doc["reserved_graph_memory_bytes"] == 1024
    assert doc["buckets"]["4"]["replays"] == 2 and doc["buckets"]["4"]["capture_bytes"] == 2048
    assert doc["capture_source"] == "default" and doc["num_layers"] == 4
    assert "runners" not in doc


def test_query_lengths_are_kept_apart(registry, tmp_path):
    runner = FakeRunner()
    counters.register(runner)
    _served(runner, [2, 2], query_len=1)
    _served(runner, [2, 5], query_len=3)
    doc = json.loads(open(reports.write_stats_file(path=tmp_path / "s.json")).read())
    assert doc["batch_histogram"] == {"2": 3, "5": 1}
    assert doc["query_len_histogram"] == {"1": {"2": 2}, "3": {"2": 1, "5": 1}}


def test_steps_carried_from_the_previous_run_are_written_again(registry, tmp_path):
    runner = FakeRunner(carried={(3, 1): 10, (7, 1): 2})
    counters.register(runner)
    _served(runner, [3, 4])
    doc = json.loads(open(reports.write_stats_file(path=tmp_path / "s.json")).read())
    assert doc["batch_histogram"] == {"3": 11, "4": 1, "7": 2}
    assert doc["decode_steps"] == 14 and doc["carried_steps"] == 12 and doc["replays"] == 2


def test_several_runners_the_busiest_is_the_top_level(registry, tmp_path):
    main, draft = FakeRunner(sizes=(4, 8)), FakeRunner(sizes=(1, 2))
    counters.register(draft)
    counters.register(main)
    _served(main, [5, 6, 7])
    _served(draft, [1])
    doc = json.loads(open(reports.write_stats_file(path=tmp_path / "s.json")).read())
    assert doc["capture_sizes"] == [4, 8] and doc["decode_steps"] == 3
    assert [r["capture_sizes"] for r in doc["runners"]] == [[4, 8], [1, 2]]


def test_a_reset_releases_the_graphs_and_keeps_the_runs_counts():
    from vendor_graph.runtime.step import StepPolicy

    released = []
    policy = StepPolicy.__new__(StepPolicy)
    policy.backend = SimpleNamespace(release=released.append, label="x")
    policy.stats = GraphStats()
    policy.guard = SimpleNamespace(clear=lambda: None, forget=lambda key: None)
    policy.eager_reasons = {"k": "why"}
    policy._progress = None
    policy.stats.decoded(3, 1)
    policy.stats.captured(4, 0.5, 1000, key="k4")
    policy.stats.replayed(4, 3, 4)
    policy.stats.eager("why")
    policy.reset()
    assert released == [None] and policy.eager_reasons == {}
    assert policy.stats.histogram == {(3, 1): 1} and policy.stats.replays == 1 and policy.stats.captures == 1
    assert policy.stats.buckets[4].capture_seconds == 0.5 and policy.stats.eager_steps == {"why": 1}
    assert policy.stats.graph_memory == 1000 and policy.stats.alive_bytes == {}
    policy.stats.captured(4, 0.25, 1000, key="k4")  # the same graph again after the reset: not twice the memory
    assert policy.stats.graph_memory == 1000 and policy.stats.buckets[4].captures == 2


def test_graph_memory_is_the_most_the_graphs_alive_at_once_took():
    graph_stats = GraphStats()
    graph_stats.captured(8, 0.1, 800, key="k8")
    graph_stats.captured(4, 0.1, 400, key="k4")
    assert graph_stats.graph_memory == 1200
    graph_stats.released("k8")  # a stale graph, captured again (the allocator kept its memory: it grows less)
    graph_stats.captured(8, 0.1, 100, key="k8")
    assert graph_stats.graph_memory == 1200 and graph_stats.buckets[8].capture_bytes == 800
    graph_stats.released(None)  # a reset: every graph captured again, with more memory this time
    graph_stats.captured(8, 0.1, 900, key="k8")
    graph_stats.captured(4, 0.1, 500, key="k4")
    assert graph_stats.graph_memory == 1400
    assert (graph_stats.buckets[8].capture_bytes, graph_stats.buckets[4].capture_bytes) == (900, 500)
    assert GraphStats().graph_memory is None


def test_a_runner_gone_and_the_one_rebuilt_after_it_are_one_runner_in_the_file(registry, tmp_path):
    first = FakeRunner(carried={(3, 1): 10})
    counters.register(first)
    _served(first, [3, 3, 5])
    first.stats.captured(4, 0.5, 4000)
    first.stats.captured(8, 0.5, 8000)
    first.stats.eager("injected")
    del first
    gc.collect()
    assert counters.live_runners() == []
    (name,) = reports.summaries()
    assert name.endswith(" (gone)")  # a closed pipeline's runner: still reported
    doc = json.loads(open(reports.write_stats_file("exit", path=tmp_path / "s.json")).read())
    assert (doc["captures"], doc["replays"], doc["graph_memory_bytes"]) == (2, 3, 12000)
    # rebuilt on a wake-up: its plan read the file this run had written meanwhile
    second = FakeRunner(carried={(3, 1): 12, (5, 1): 1})
    counters.register(second)
    _served(second, [3, 1])
    second.stats.captured(4, 0.25, 3000)
    other = FakeRunner(sizes=(1, 2))  # a draft model's runner: another runner
    counters.register(other)
    _served(other, [1])
    doc = json.loads(open(reports.write_stats_file("exit", path=tmp_path / "s.json")).read())
    assert doc["capture_sizes"] == [1, 2, 4, 8] and [r["capture_sizes"] for r in doc["runners"]] == [[1, 2, 4, 8],
                                                                                                   [1, 2]]
    assert doc["batch_histogram"] == {"1": 1, "3": 13, "5": 1}  # carried once, from the first plan
    assert (doc["decode_steps"], doc["carried_steps"], doc["replays"], doc["captures"]) == (15, 10, 5, 3)
    assert doc["buckets"]["4"]["captures"] == 2 and doc["buckets"]["4"]["capture_seconds"] == 0.75
    assert doc["buckets"]["4"]["capture_bytes"] == 4000 and doc["graph_memory_bytes"] == 12000
    assert doc["eager_steps"] == {"injected": 1}
    tables = reports.summaries()
    assert len(tables) == 2 and f"{id(second):#x}" in next(iter(tables))


def test_the_write_is_atomic_a_failed_write_leaves_the_old_file(registry, tmp_path, monkeypatch):
    runner = FakeRunner()
    counters.register(runner)
    target = tmp_path / "s.json"
    _served(runner, [1])
    reports.write_stats_file(path=target)
    before = target.read_text()
    _served(runner, [2])

    def crash(src, dst):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="injected"):
        reports.write_stats_file(path=target)
    assert target.read_text() == before  # the old document, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]  # no temporary left behind


def test_a_reader_never_sees_part_of_a_file(registry, tmp_path):
    runner = FakeRunner()
    counters.register(runner)
    target = tmp_path / "s.json"
    _served(runner, list(range(1, 9)) * 50)
    reports.write_stats_file(path=target)
    stop, bad = threading.Event(), []

    def read():
        while not stop.is_set():
            try:
                json.loads(target.read_text())
            except ValueError as exc:
                bad.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    for _ in range(200):
        _served(runner, [3])
        reports.write_stats_file(path=target)
    stop.set()
    reader.join()
    assert not bad


def test_one_file_per_rank(registry, tmp_path, monkeypatch):
    assert reports.rank_path(tmp_path / "s.json", 0, 1) == tmp_path / "s.json"
    assert reports.rank_path(tmp_path / "s.json", 1, 2) == tmp_path / "s.rank1.json"
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(tmp_path / "s.json"))
    monkeypatch.setattr(counters, "process_rank", lambda: (1, 2))
    settings.load()
    runner = FakeRunner()
    counters.register(runner)
    _served(runner, [2])
    written = reports.write_stats_file()
    assert written == str(tmp_path / "s.rank1.json")
    doc = json.loads(open(written).read())
    assert doc["rank"] == 1 and doc["world_size"] == 2
    (tmp_path / "s.rank0.json").write_text(open(written).read())
    assert reports.stats_files(tmp_path / "s.json") == [tmp_path / "s.rank0.json", tmp_path / "s.rank1.json"]


def test_periodic_writes_and_the_exit_write(registry, tmp_path, monkeypatch):
    target = tmp_path / "s.json"
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(target))
    settings.load()
    writer = reports._StatsWriter()
    monkeypatch.setattr(reports, "_writer", writer)
    runner = FakeRunner()
    counters.register(runner)
    assert writer.thread is None  # registering a runner (the step path) starts no writer
    reports.start_writer()  # what activation and the runner builder call: every 5 minutes by default
    assert writer.thread is not None and writer.thread.daemon
    _served(runner, [2, 2])
    writer.write("exit")
    assert json.loads(target.read_text())["reason"] == "exit"
    writer.stop.set()
    writer.thread.join(timeout=5)
    assert not writer.thread.is_alive()

    fast = reports._StatsWriter()
    done = threading.Event()
    original = fast.write

    def write(reason):
        original(reason)
        done.set()
        fast.stop.set()

    fast.write = write
    thread = threading.Thread(target=fast._loop, args=(0.01,))
    thread.start()
    assert done.wait(5)
    thread.join(5)
    assert json.loads(target.read_text())["reason"] == "periodic"


def test_a_stats_file_in_a_missing_directory_is_refused_when_parsed_and_where_the_runner_is_built(
        registry, tmp_path, monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(tmp_path / "nope" / "s.json"))
    with pytest.raises(settings.SettingsError, match="does not exist; create it"):
        settings.load()
    (tmp_path / "nope").mkdir()
    settings.load()
    (tmp_path / "nope").rmdir()  # gone after the settings were read: the runner still refuses to start
    monkeypatch.setattr(reports, "_writer", reports._StatsWriter())
    with pytest.raises(ValueError, match="does not exist; create it"):
        counters.register(FakeRunner())
    with pytest.raises(ValueError, match="does not exist; create it"):
        reports.start_writer()


def test_a_failing_periodic_write_warns_once_and_serving_goes_on(registry, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(tmp_path / "s.json"))
    settings.load()
    counters.register(FakeRunner())
    writer = reports._StatsWriter()

    def broken(reason):
        raise OSError("read-only file system (injected)")

    monkeypatch.setattr(reports, "write_stats_file", broken)
    writer.write("periodic")
    writer.write("periodic")
    warnings = [r for r in caplog.records if "could not write the stats file" in r.getMessage()]
    assert len(warnings) == 1 and "injected" in warnings[0].getMessage()


def _recorded(path, **extra):
    doc = {"format": reports.FORMAT, "vendor": "ascend", "max_batches": 64, "capture_sizes": [1, 2, 4, 8, 16, 32, 64],
           "batch_histogram": {"3": 50, "5": 40, "17": 30, "40": 20}, "graph_memory_bytes": 100 * 2**20}
    path.write_text(json.dumps({**doc, **extra}))


def test_the_doctor_shows_the_plan_and_the_reservation_the_stats_file_gives(tmp_path, monkeypatch):
    from vendor_graph.ops import doctor

    path = tmp_path / "s.json"
    _recorded(path)
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    lines = doctor.capacity_lines()
    text = "\n".join(t for t, _ in lines)
    assert not any(problem for _, problem in lines), text
    assert "140 decode steps of ascend at max_batch_size 64" in text
    assert "capture sizes: [3, 5, 17, 40, 64] (VENDOR_GRAPH_PLAN=auto" in text and "-> 0.0%" in text
    assert "MiB reserved for the graphs" in text and str(path) in text


def test_the_doctor_flags_a_stats_file_it_cannot_read_and_contradicting_sizes(tmp_path, monkeypatch):
    from vendor_graph.ops import doctor

    path = tmp_path / "s.json"
    path.write_text("{half a file")
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    monkeypatch.setenv("VENDOR_GRAPH_CAPTURE_SIZES", "4,8")
    problems = [t for t, problem in doctor.capacity_lines() if problem]
    assert any("is not JSON" in t for t in problems)
    assert any("both given: runners refuse to start; unset one" in t for t in problems)


def test_the_doctor_without_a_stats_file_says_histograms_are_not_kept(monkeypatch):
    from vendor_graph.ops import doctor

    text = "\n".join(t for t, _ in doctor.capacity_lines())
    assert "batch histograms are not kept" in text and "nothing reserved for the graphs" in text
