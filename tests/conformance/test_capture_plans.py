"""Capture sizes applied without editing code, on every vendor: lmdeploy's ``cudagraph_capture_batch_sizes``,
``VENDOR_GRAPH_CAPTURE_SIZES`` and ``VENDOR_GRAPH_PLAN=auto`` (a plan fitted to the previous run's stats
file, carried over a restart), with their precedence, conflicts and the batch histogram that feeds them.
Ascend runs vendor_graph's runner; Camb and MACA lmdeploy's CUDA runner, adopted."""

from __future__ import annotations

import json
import logging
from collections import Counter

import pytest
from packaging.version import Version
from vendor_graph_sim import harness

from vendor_graph.ops import reports
from vendor_graph.sizing import capacity
from vendor_graph.sizing.capacity import CapturePlanError
from vendor_graph.upstream import compat

RELEASE = compat.series(compat.installed_lmdeploy_version())
VENDORS = [v for v in ("ascend", "camb", "maca") if RELEASE in compat.SUPPORTED_SERIES[v]]
# The plan reaches lmdeploy through cache_config and the runners' get_capture_batch_sizes, alike in 0.16-0.18:
# once per test run, on the newest release every vendor supports (all three runners' kinds).
ALL_VENDORS = max((s for s in compat.SUPPORTED_SERIES["ascend"] if all(
    s in compat.SUPPORTED_SERIES[v] for v in ("camb", "maca"))), key=Version)
pytestmark = pytest.mark.skipif(RELEASE != ALL_VENDORS, reason=f"runs once per test run, on lmdeploy {ALL_VENDORS}")
# Camb and MACA share lmdeploy's adopted runner: the checks that are about the runner take one of them each.
RUNNERS = [v for v in ("ascend", "camb") if v in VENDORS] or VENDORS[:1]
OTHER_RUNNERS = [v for v in ("ascend", "maca") if v in VENDORS] or VENDORS[:1]


def _run(vendor, seed=0, **kwargs):
    kwargs.setdefault("steps", 16)
    kwargs.setdefault("num_seqs", 8)
    kwargs.setdefault("max_batches", 8)
    backend = kwargs.pop("backend", "sim")
    return harness.run(vendor, seed, backend=backend, **kwargs)


def _padded_batches(runner) -> set[int]:
    return {key.padded_batch for key in runner.graphs()}


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_environment_sizes_are_what_the_runner_captures(vendor, monkeypatch, sim_backend):
    monkeypatch.setenv("VENDOR_GRAPH_CAPTURE_SIZES", "5, 3")
    pair = _run(vendor)
    assert not pair.mismatches, pair.mismatches[:3]
    runner = pair.runner
    assert runner.get_capture_batch_sizes() == [3, 5, 8]  # normalised as lmdeploy does: max_batch_size added
    assert runner.capture_plan.source == capacity.EXPLICIT_ENV
    assert _padded_batches(runner) <= {3, 5, 8}
    assert set(runner.stats.buckets) <= {3, 5, 8}


@pytest.mark.parametrize("vendor", RUNNERS)
def test_lmdeploys_own_sizes_are_honoured(vendor, sim_backend):
    pair = _run(vendor, capture_sizes=[2, 6])
    assert not pair.mismatches, pair.mismatches[:3]
    assert pair.runner.get_capture_batch_sizes() == [2, 6, 8]
    assert pair.runner.capture_plan.source == capacity.EXPLICIT_LMDEPLOY
    assert _padded_batches(pair.runner) <= {2, 6, 8}


@pytest.mark.parametrize("vendor", OTHER_RUNNERS)
def test_the_same_sizes_in_both_places_are_fine_different_ones_are_an_error(vendor, monkeypatch, sim_backend):
    monkeypatch.setenv("VENDOR_GRAPH_CAPTURE_SIZES", "6,2,8")
    assert _run(vendor, steps=3, capture_sizes=[2, 6]).runner.get_capture_batch_sizes() == [2, 6, 8]
    monkeypatch.setenv("VENDOR_GRAPH_CAPTURE_SIZES", "3")
    with pytest.raises(CapturePlanError, match=r"cudagraph_capture_batch_sizes \[2, 6, 8\] and "
                                               r"VENDOR_GRAPH_CAPTURE_SIZES \[3, 8\].*differ"):
        _run(vendor, steps=3, capture_sizes=[2, 6])


def test_plan_auto_with_explicit_sizes_is_an_error_naming_the_way_out(monkeypatch, tmp_path, sim_backend):
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(tmp_path / "s.json"))
    monkeypatch.setenv("VENDOR_GRAPH_CAPTURE_SIZES", "3")
    with pytest.raises(CapturePlanError, match="unset one.*--from-stats"):
        _run(VENDORS[0], steps=3)


def test_plan_auto_needs_a_stats_file(monkeypatch, sim_backend):
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    with pytest.raises(CapturePlanError, match="needs VENDOR_GRAPH_STATS_FILE"):
        _run(VENDORS[0], steps=3)


@pytest.mark.parametrize("vendor", OTHER_RUNNERS)
def test_every_decode_step_is_counted_by_its_real_batch(vendor, sim_backend):
    pair = _run(vendor, seed=4, steps=18, num_seqs=9, max_batches=9)
    expected = Counter(len(active) for active in harness.schedule(9, 18, 4))
    assert pair.runner.stats.batch_histogram() == dict(sorted(expected.items()))


@pytest.mark.parametrize("vendor", RUNNERS)
def test_plan_auto_carries_the_fitted_sizes_over_a_restart(vendor, monkeypatch, tmp_path, caplog, sim_backend):
    path = tmp_path / "stats.json"
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    monkeypatch.setenv("VENDOR_GRAPH_STATS_EVERY", "0")
    with caplog.at_level(logging.INFO, logger="vendor_graph"):
        first = _run(vendor, seed=2, steps=24, num_seqs=12, max_batches=12)
    assert any("no stats file" in r.getMessage() and "a first run" in r.getMessage() for r in caplog.records)
    assert first.runner.capture_plan.source == capacity.DEFAULT
    default_sizes = first.runner.get_capture_batch_sizes()
    assert reports.write_stats_file("exit") == str(path)
    recorded = json.loads(path.read_text())
    assert recorded["batch_histogram"] == {str(b): n for b, n in sorted(first.runner.stats.batch_histogram().items())}
    before = first.runner.stats.padded_fraction
    del first

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vendor_graph"):
        second = _run(vendor, seed=2, steps=24, num_seqs=12, max_batches=12)  # the restart: same workload
    assert not second.mismatches, second.mismatches[:3]
    plan = second.runner.capture_plan
    assert plan.source == capacity.AUTO
    sizes = second.runner.get_capture_batch_sizes()
    assert len(sizes) <= len(default_sizes) and sizes[-1] == 12
    assert {int(b) for b in recorded["batch_histogram"]} <= set(sizes) or len(sizes) == len(default_sizes)
    assert second.runner.stats.padded_fraction <= before
    said = [r.getMessage() for r in caplog.records if "VENDOR_GRAPH_PLAN=auto: capture sizes" in r.getMessage()]
    assert said and str(sizes) in said[0] and str(path) in said[0]
    # the next file holds both runs' steps
    reports.write_stats_file("exit")
    assert json.loads(path.read_text())["decode_steps"] == 2 * recorded["decode_steps"]


def test_plan_auto_on_a_file_of_another_max_batch_size_keeps_the_defaults(monkeypatch, tmp_path, caplog, sim_backend):
    path = tmp_path / "stats.json"
    path.write_text(json.dumps({"format": reports.FORMAT, "vendor": VENDORS[0], "max_batches": 64,
                                "capture_sizes": [64], "batch_histogram": {"3": 9}}))
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        pair = _run(VENDORS[0], steps=4)
    assert pair.runner.capture_plan.source == capacity.DEFAULT
    assert any("max_batch_size 64, not" in r.getMessage() for r in caplog.records)


def test_plan_auto_on_a_corrupt_stats_file_is_an_error_naming_it(monkeypatch, tmp_path, sim_backend):
    path = tmp_path / "stats.json"
    path.write_text("{not json")
    monkeypatch.setenv("VENDOR_GRAPH_STATS_FILE", str(path))
    monkeypatch.setenv("VENDOR_GRAPH_PLAN", "auto")
    with pytest.raises(CapturePlanError, match=str(path)):
        _run(VENDORS[0], steps=3)
