"""lmdeploy's CUDA graph runner, adopted by vendor_graph for Camb and MACA (``vendor_graph.runtime.adopted``):
faults cost speed, never answers. Runs on the simulator and, with ``--graph-backend cuda``, on real
CUDA graphs."""

from __future__ import annotations

import logging

import pytest
from vendor_graph_sim import harness

from vendor_graph.buffers import GraphInputsChanged
from vendor_graph.upstream import compat

RELEASE = compat.series(compat.installed_lmdeploy_version())
pytestmark = pytest.mark.skipif(RELEASE not in compat.SUPPORTED_SERIES["camb"],
                                reason=f"Camb/MACA unsupported on lmdeploy {RELEASE}")


def _wrap_builder(monkeypatch, patch_runner):
    build = harness._build_runner

    def building(*args, **kwargs):
        runner = build(*args, **kwargs)
        patch_runner(runner)
        return runner

    monkeypatch.setattr(harness, "_build_runner", building)


@pytest.mark.parametrize("vendor", ["camb", "maca"])
def test_the_runner_is_lmdeploys_own_class_adopted(cuda_style_backend, vendor):
    pair = harness.run(vendor, 0, steps=12, num_seqs=6, backend=cuda_style_backend)
    assert not pair.mismatches, pair.mismatches[:3]
    runner = pair.runner
    assert isinstance(runner, compat.cuda_graph_runner_class())
    assert type(runner).__name__.startswith("VendorGraph")
    assert runner.stats.replays + sum(b.captures for b in runner.stats.buckets.values()) == 12


def test_a_capture_that_fails_leaves_no_graph_and_its_key_runs_eager(cuda_style_backend, monkeypatch, caplog):
    failed = []

    def patch_runner(runner):
        model = runner.model
        original = type(model).update_context_cudagraph

        def update_then_fail(graph_meta, context):
            live = context.q_seqlens.size(0)
            original(model, graph_meta, context)  # the fill has re-bound attn_metadata and the context
            # the first capture for a padded batch: eager must not see the padded buffers
            capturing = not graph_meta.output_buffers  # lmdeploy sets them when the capture ends
            if capturing and live < graph_meta.max_batchs and not failed:
                failed.append(graph_meta.max_batchs)
                raise RuntimeError("CUDA out of memory (injected during capture)")

        monkeypatch.setattr(model, "update_context_cudagraph", update_then_fail, raising=False)

    _wrap_builder(monkeypatch, patch_runner)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        pair = harness.run("camb", 5, steps=24, num_seqs=8, backend=cuda_style_backend)  # first capture: 5 in 8
    assert len(failed) == 1
    # the failed step and every later step of that bucket ran eager on the step's own metadata: exact
    assert not pair.mismatches, pair.mismatches[:3]
    runner = pair.runner
    assert failed[0] not in {key.padded_batch for key in runner.graphs()}
    (reason,) = runner.eager_reasons().values()
    assert "out of memory" in reason
    assert runner.stats.eager_steps[reason] >= 1
    assert any("failed; it runs eager from now on" in r.getMessage() for r in caplog.records)


def test_a_batch_beyond_the_largest_size_runs_eager_with_one_warning(cuda_style_backend, caplog):
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        pair = harness.run("maca", 1, steps=20, num_seqs=10, max_batches=4, backend=cuda_style_backend)
    assert not pair.mismatches, pair.mismatches[:3]
    eager = pair.runner.stats.eager_steps["batch above the largest captured size"]
    assert eager > 0
    warnings = [r for r in caplog.records if "above the largest captured size" in r.getMessage()]
    assert len(warnings) == 1 and "raise max_batch_size" in warnings[0].getMessage()


def test_a_replay_whose_inputs_changed_runs_that_step_eager(cuda_style_backend, monkeypatch):
    from vendor_graph.vendors.cuda_style import CAMB as PROFILE

    spec = PROFILE.spec
    fill = type(spec).fill
    calls = []

    def fill_that_refuses_one_padded_replay(self, graph_meta, inputs, attn_metadata, context=None):
        live = inputs["input_ids"].size(-1)
        new_inputs = fill(self, graph_meta, inputs, attn_metadata, context)  # re-binds attn_metadata first
        replaying = bool(graph_meta.output_buffers)
        if replaying and live < graph_meta.max_batchs and not calls:
            calls.append(live)
            raise GraphInputsChanged("injected: a source appeared after capture")
        return new_inputs

    monkeypatch.setattr(type(spec), "fill", fill_that_refuses_one_padded_replay)
    pair = harness.run("camb", 2, steps=16, num_seqs=6, backend=cuda_style_backend)
    assert calls, "no padded replay happened"
    assert not pair.mismatches, pair.mismatches[:3]
    reasons = [r for r in pair.runner.stats.eager_steps if "inputs differ from the capture" in r]
    assert reasons and pair.runner.stats.eager_steps[reasons[0]] == 1


def test_camb_needs_its_max_kv_seq_len_at_minus_one(cuda_style_backend, monkeypatch):
    """Keeping lmdeploy's per-step ``max_kv_seq_len`` freezes the capture step's maximum into the graph:
    later, longer sequences are cut short (silently wrong). The spec's -1 is what keeps graphs right."""
    import dataclasses

    from vendor_graph.vendors.cuda_style import CAMB as PROFILE

    constants = {**PROFILE.spec.constants, "max_kv_seq_len": lambda dims, attn: attn.max_kv_seq_len}
    monkeypatch.setitem(PROFILE.__dict__, "spec", dataclasses.replace(PROFILE.spec, constants=constants))
    pair = harness.run("camb", 0, steps=32, num_seqs=8, backend=cuda_style_backend)
    assert any("differ" in m for m in pair.mismatches), "a frozen max_kv_seq_len went unnoticed"


@pytest.mark.parametrize("guarded", [True, False], ids=["guard", "no-guard"])
def test_reallocated_kv_caches_are_recaptured(cuda_style_backend, guarded, caplog):
    import gc

    with caplog.at_level(logging.WARNING, logger="vendor_graph"), \
            harness.cuda_style_pair("camb", cuda_style_backend) as pair:
        if not guarded:
            pair.runner.guard.check = lambda key, kwargs: None  # the guard removed
        for _ in range(3):
            pair.step([0, 1, 2])
        assert not pair.mismatches
        # a rebuilt cache engine: the same contents in fresh memory, the old tensors dropped
        pair.graph.kv_caches = [tuple(t.clone() for t in layer) for layer in pair.graph.kv_caches]
        gc.collect()
        for _ in range(3):
            pair.step([0, 1, 2])
        buckets = pair.runner.stats.buckets
    if guarded:
        assert not pair.mismatches, pair.mismatches[:3]
        assert buckets[4].stale_recaptures == 1 and buckets[4].captures == 2
        assert "recapturing its graph: past_key_values[0] changed since capture" in caplog.text
    else:  # the old graph keeps writing into the old cache: the new one misses this step's KV
        assert any("cache differs" in m for m in pair.mismatches), pair.mismatches[:3]


@pytest.mark.parametrize("action", ["eager", "log", "off"])
def test_the_shadow_check_catches_a_wrong_graph(cuda_style_backend, monkeypatch, action, caplog):
    """A Camb graph with max_kv_seq_len frozen at capture goes wrong once sequences outgrow it; with
    VENDOR_GRAPH_SHADOW=1 every replay is compared with eager on the same inputs."""
    import dataclasses

    from vendor_graph.vendors.cuda_style import CAMB as PROFILE

    constants = {**PROFILE.spec.constants, "max_kv_seq_len": lambda dims, attn: attn.max_kv_seq_len}
    monkeypatch.setitem(PROFILE.__dict__, "spec", dataclasses.replace(PROFILE.spec, constants=constants))
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "0" if action == "off" else "1")
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW_ACTION", "eager" if action == "off" else action)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"), \
            harness.cuda_style_pair("camb", cuda_style_backend, num_seqs=4) as pair:
        for _ in range(20):  # batch 4 throughout: sequences grow past the capture step's maximum
            pair.step([0, 1, 2, 3])
        runner = pair.runner
    if action == "off":
        assert pair.mismatches, "the frozen length should have gone wrong unnoticed"
        return
    assert "shadow check: graph" in caplog.text
    if action == "eager":
        assert not pair.mismatches, pair.mismatches[:3]  # the diverged step returned eager's answer
        assert any("shadow check: graph differed from eager" in r for r in runner.eager_reasons().values())
    else:
        assert pair.mismatches and not runner.eager_reasons()


def test_a_replay_step_asks_lmdeploy_for_its_key_once(cuda_style_backend, monkeypatch):
    """The adopted runner's replay goes straight to the key's captured graph: lmdeploy's ``__call__`` would
    compute the graph-mode check and the key a second time for the same step."""
    calls = {"get_graph_key": 0, "enable_graph": 0, "steps": 0}

    def patch_runner(runner):
        key, enable = runner.get_graph_key, runner.enable_graph

        def counted_key(**kwargs):
            calls["get_graph_key"] += 1
            return key(**kwargs)

        def counted_enable(**kwargs):
            calls["enable_graph"] += 1
            return enable(**kwargs)

        runner.get_graph_key, runner.enable_graph = counted_key, counted_enable

    _wrap_builder(monkeypatch, patch_runner)
    single = compat.cuda_single_graph_runner_class()
    forward = single.forward

    def counted_forward(self, **kwargs):
        calls["forward"] = calls.get("forward", 0) + 1
        return forward(self, **kwargs)

    monkeypatch.setattr(single, "forward", counted_forward)
    pair = harness.run("camb", 1, steps=16, num_seqs=6, backend=cuda_style_backend)
    assert not pair.mismatches, pair.mismatches[:3]
    assert calls.get("forward", 0) == 0  # replays skip forward's per-step record_function range too
    replays = pair.runner.stats.replays
    captures = sum(b.captures for b in pair.runner.stats.buckets.values())
    assert replays >= 8
    assert calls["get_graph_key"] == replays + 2 * captures  # a capture goes through lmdeploy's __call__
    assert calls["enable_graph"] == replays + 2 * captures
