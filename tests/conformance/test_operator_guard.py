"""Stale-graph guard on the Ascend runner: KV caches reallocated, weights moved, explicit invalidation.

Each test that proves the guard also runs with the guard's check switched off and asserts the stale
graph then breaks parity: the test cannot pass with the guard removed."""

from __future__ import annotations

import gc
import logging

import pytest
from vendor_graph_sim import harness


def _reallocate_kv(pair) -> None:
    """What a wake-up (or a cache engine rebuilt) does: the same contents in fresh memory; the old
    tensors are dropped."""
    pair.reallocate_kv()
    gc.collect()


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "no-guard"])
@pytest.mark.parametrize("generation", ["G1", "G5"])  # task-update and graph-update paths
def test_reallocated_kv_caches_are_recaptured(sim_backend, generation, guarded, caplog):
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair(generation) as pair:
        if not guarded:
            pair.runner.guard.check = lambda key, kwargs: None  # the guard removed
        for _ in range(3):
            pair.step([0, 1, 2])
        assert not pair.mismatches
        _reallocate_kv(pair)
        for _ in range(3):
            pair.step([0, 1, 2])
        buckets = pair.runner.stats.buckets
    if guarded:
        assert not pair.mismatches, pair.mismatches[:3]
        assert buckets[4].stale_recaptures == 1 and buckets[4].captures == 2
        assert "recapturing its graph: past_key_values[0] changed since capture (data_ptr" in caplog.text
    else:  # the old graph keeps writing into the old cache: the new one misses this step's KV
        assert any("cache differs" in m for m in pair.mismatches), pair.mismatches[:3]


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "no-guard"])
def test_moved_weights_recapture_every_graph(sim_backend, monkeypatch, guarded, caplog):
    """A weight update that registers new parameter tensors (as lmdeploy's FusedMoE update does): with
    VENDOR_GRAPH_GUARD_WEIGHTS_EVERY=1 the next replay notices and every graph is recaptured."""
    monkeypatch.setenv("VENDOR_GRAPH_GUARD_WEIGHTS_EVERY", "1")
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G5") as pair:
        if not guarded:
            pair.runner.guard.check = lambda key, kwargs: None
        for active in ([0, 1], [0, 1], [0, 1, 2, 3], [0, 1, 2, 3]):
            pair.step(active)
        assert len(pair.runner.graphs()) == 2 and not pair.mismatches
        for module in pair.model.modules():  # new tensors (new values, new memory) in place of the old ones
            for name, param in list(module._parameters.items()):
                if param is not None:
                    module._parameters[name] = param * 1.5
        for active in ([0, 1], [0, 1], [0, 1, 2, 3]):
            pair.step(active)
        graphs = len(pair.runner.graphs())
    if guarded:
        assert not pair.mismatches, pair.mismatches[:3]
        assert "recapturing every graph: model weights moved since capture" in caplog.text
        assert graphs == 2
    else:
        assert any("hidden states differ" in m for m in pair.mismatches)


def test_invalidate_recaptures_with_the_reason(sim_backend, caplog):
    """guard.invalidate(reason): what a runner calls on sleep / wake-up / weight update when its
    reset() is not called; each key's next replay recaptures and logs why."""
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G3b") as pair:
        for _ in range(2):
            pair.step([0, 1])
        pair.runner.guard.invalidate("woken up from sleep")
        pair.step([0, 1])
        pair.step([0, 1])
        assert pair.runner.stats.buckets[2].stale_recaptures == 1
    assert "recapturing its graph: woken up from sleep" in caplog.text
    assert not pair.mismatches


def test_reset_then_new_caches_is_a_clean_start(sim_backend):
    """lmdeploy's sleep -> reset(); wake-up -> new KV caches, warmup captures again: no stale record."""
    with harness.ascend_pair("G4") as pair:
        for _ in range(2):
            pair.step([0, 1, 2])
        pair.runner.reset()
        _reallocate_kv(pair)
        for _ in range(3):
            pair.step([0, 1, 2])
        assert pair.runner.stats.buckets[4].stale_recaptures == 0
        assert pair.runner.stats.buckets[4].captures == 2  # the run's: once before the reset, once after
    assert not pair.mismatches
