"""What an operator sees: per-bucket stats (capture time and memory included), the summary on demand
and once at exit, the capture progress bar, profiler ranges with the real and padded batch,
VENDOR_GRAPH_DEBUG and VENDOR_GRAPH_DISABLE."""

from __future__ import annotations

import io
import logging

import torch
from vendor_graph_sim import harness

from vendor_graph.config import settings, switches
from vendor_graph.install import patching
from vendor_graph.ops import reports


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_stats_summary_on_demand_and_once_at_exit(sim_backend, monkeypatch, caplog):
    reserved = {"bytes": 0}

    def memory_reserved(device=None):
        reserved["bytes"] += 3 << 20  # the allocator grows 3 MiB between any two reads
        return reserved["bytes"]

    with harness.ascend_pair("G5") as pair:
        monkeypatch.setattr(torch.npu, "memory_reserved", memory_reserved)
        for active in ([0, 1, 2], [0, 1, 2], [0], [0]):
            pair.step(active)
        b4 = pair.runner.stats.buckets[4]
        assert (b4.captures, b4.replays, b4.real_tokens, b4.padded_tokens) == (1, 1, 3, 4)
        assert b4.capture_bytes == 3 << 20 and b4.capture_seconds > 0
        assert abs(b4.padding_waste - 0.25) < 1e-9
        tables = reports.summaries()
        (label, table), = [(k, v) for k, v in tables.items() if f"{id(pair.runner):#x}" in k]
        assert "capture MiB" in table and "     4         1        1            3              4  25.0%" in table
        monkeypatch.setattr(reports, "_REPORTED", False)
        with caplog.at_level(logging.INFO, logger="vendor_graph"):
            reports._at_exit()
            reports._at_exit()  # once
        assert caplog.text.count(f"vendor_graph graph stats, {label} (at shutdown)") == 1
    assert not pair.mismatches


def test_progress_bar_while_capturing_every_size_up_front(sim_backend, monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with harness.ascend_pair("G4", num_seqs=6) as pair:
        sizes = pair.runner.get_capture_batch_sizes()
        for size in reversed(sizes):  # lmdeploy's warmup: every size, largest first
            pair.step(list(range(size)))
        pair.step([0, 1])  # a replay
        pair.runner.reset()
        pair.step([0, 1])  # one capture before a replay: no bar
        pair.step([0, 1])
    out = terminal.getvalue()
    assert f"\rvendor_graph: capturing graphs [{'#' * 24}] {len(sizes)}/{len(sizes)} (batch 1)" in out
    assert out.count("\n") == 1 and out.endswith("\n") and "1/4" not in out
    assert not pair.mismatches


def test_no_bar_off_a_terminal(sim_backend, monkeypatch):
    plain = io.StringIO()
    monkeypatch.setattr("sys.stderr", plain)
    with harness.ascend_pair("G4", num_seqs=4) as pair:
        for size in (4, 2, 1):
            pair.step(list(range(size)))
    assert plain.getvalue() == ""


def test_profiler_ranges_carry_the_real_and_padded_batch(sim_backend):
    with harness.ascend_pair("G5") as pair:
        pair.step([0, 1, 2])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            pair.step([0, 1, 2])
    names = {e.name for e in prof.events()}
    assert "vendor_graph.ascend.replay batch=3 padded=4" in names


def test_debug_logs_each_step(sim_backend, monkeypatch, caplog):
    monkeypatch.setenv("VENDOR_GRAPH_DEBUG", "1")
    try:
        with caplog.at_level(logging.DEBUG, logger="vendor_graph"), harness.ascend_pair("G5") as pair:
            for _ in range(3):
                pair.step([0, 1, 2])
    finally:
        monkeypatch.delenv("VENDOR_GRAPH_DEBUG")
        settings.load()
        switches.apply_debug()
        logging.getLogger("vendor_graph").setLevel(logging.NOTSET)
    assert caplog.text.count("replayed GraphKey(padded_batch=4") == 2


def test_disable_forces_eager_says_so_once_and_keeps_the_buffer_patches(sim_backend, monkeypatch, caplog):
    monkeypatch.setenv("VENDOR_GRAPH_DISABLE", "1")
    monkeypatch.setattr(switches, "_ANNOUNCED", False)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G5") as pair:
        second = harness._build_runner("ascend", pair.model, harness.lmdeploy_configs("ascend", pair.model, 6),
                                       pair.model.ctx_mgr)
        for active in ([0, 1], [0, 1], [0, 1, 2, 3]):
            pair.step(active)
        assert not pair.runner.graphs() and not second.graphs()
        assert pair.runner.stats.eager_steps == {"VENDOR_GRAPH_DISABLE=1": 3}
        activation = patching.active()
        mixin = [p for p in activation.patches if p.target.endswith("fill_buffers_cudagraph")]
        assert mixin and all(p.owned() for p in mixin)
    assert caplog.text.count("VENDOR_GRAPH_DISABLE=1: graph mode is off") == 1
    assert not pair.mismatches


def test_disable_also_turns_off_lmdeploys_own_runner(sim_backend, monkeypatch):
    """Camb/MACA run lmdeploy's CUDAGraphRunner, built through the same builder wrapper."""
    from vendor_graph.upstream import compat

    vendor = next((v for v in ("camb", "maca") if v in compat.vendors_supporting(
        compat.installed_lmdeploy_version())), None)
    if vendor is None:
        return
    monkeypatch.setenv("VENDOR_GRAPH_DISABLE", "1")
    monkeypatch.setattr(switches, "_ANNOUNCED", False)
    pair = harness.run(vendor, seed=1, steps=6, num_seqs=4)
    assert not pair.mismatches and not compat.cuda_runner_graphs(pair.runner)
