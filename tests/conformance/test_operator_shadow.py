"""Shadow check (VENDOR_GRAPH_SHADOW=N): every Nth replay also runs eagerly on the step's own inputs
and is compared. Safe for the KV cache (verified here byte for byte), silent on a healthy
graph, and catches a graph gone wrong (the seq-len refresh re-sending stale lengths: attention reads
KV lengths of an earlier step)."""

from __future__ import annotations

import logging

import pytest
import torch
from vendor_graph_sim import harness

SCHEDULE = [[0, 1, 2]] * 4 + [[0, 1, 2, 3, 4]] * 3 + [[1, 2]] * 3


def test_a_healthy_graph_passes_and_the_eager_rerun_writes_the_same_kv(sim_backend, monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "1")
    rewrites = []
    with harness.ascend_pair("G5") as pair:
        runner = pair.runner
        checked = runner.policy._shadow

        def spy(key, kwargs, outputs, own):
            before = [t.cpu().clone() for layer in kwargs["past_key_values"] for t in layer]
            result = checked(key, kwargs, outputs, own)
            after = [t.cpu() for layer in kwargs["past_key_values"] for t in layer]
            rewrites.append(all(torch.equal(a, b) for a, b in zip(before, after, strict=True)))
            return result

        runner.policy._shadow = spy
        for active in SCHEDULE:
            pair.step(active)
        checks = sum(b.shadow_checks for b in runner.stats.buckets.values())
        diverged = sum(b.shadow_divergences for b in runner.stats.buckets.values())
    assert checks == runner.stats.replays == len(rewrites) > 0 and diverged == 0
    assert all(rewrites)  # the eager rerun wrote exactly the bytes the replay had written
    assert not pair.mismatches, pair.mismatches[:3]


@pytest.mark.parametrize("mode", ["eager", "log", "off"])
def test_a_graph_with_stale_seqlens_is_caught(sim_backend, monkeypatch, caplog, mode):
    if mode != "off":
        monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "1")
        monkeypatch.setenv("VENDOR_GRAPH_SHADOW_ACTION", mode)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), harness.ascend_pair("G5") as pair:
        refresh, frozen = pair.runner._refresh_seqlens, {}

        def stale_refresh(graph, lens):  # the corruption: every update re-sends the first lengths it saw
            return refresh(graph, frozen.setdefault(graph.key, lens))

        pair.runner._refresh_seqlens = stale_refresh
        for active in SCHEDULE[:4]:
            pair.step(active)
        reasons = pair.runner.eager_reasons()
        stats = pair.runner.stats.buckets[4]
    # Replay 1 is right (its lengths are the ones frozen); from replay 2 on they are stale.
    if mode == "eager":  # caught at replay 2, answered eagerly, key eager from then on
        assert stats.shadow_divergences == 1 and stats.replays == 2
        (key, reason), = reasons.items()
        assert key.padded_batch == 4 and reason.startswith("shadow check: graph differed from eager")
        assert not pair.mismatches, pair.mismatches[:3]
    elif mode == "log":  # caught at every stale replay, logged, graph kept (and wrong)
        assert stats.shadow_divergences == 2 and stats.replays == 3 and not reasons
        assert pair.mismatches
    else:  # without the shadow check nothing notices
        assert stats.shadow_checks == 0 and pair.mismatches
    if mode != "off":
        assert ("shadow check: graph GraphKey(padded_batch=4, decoding=True, microbatch=False, query_len=1, "
                "extra=()) (live batch 3, padded 4) differs from eager: hidden_states: max abs difference"
                ) in caplog.text


def test_every_nth_step_only(sim_backend, monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "3")
    with harness.ascend_pair("G3b") as pair:
        for _ in range(10):
            pair.step([0, 1])
        assert pair.runner.stats.buckets[2].replays == 9
        assert pair.runner.stats.buckets[2].shadow_checks == 3
    assert not pair.mismatches


def test_bad_settings_name_the_fix(monkeypatch):
    from vendor_graph.runtime.shadow import ShadowCheck

    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "often")
    with pytest.raises(ValueError, match="expected a whole number N"):
        ShadowCheck()
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "2")
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW_ACTION", "panic")
    with pytest.raises(ValueError, match="expected one of eager, log"):
        ShadowCheck()
