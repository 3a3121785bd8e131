"""The simulated torch_npu of each generation, checked against the wheel facts it is generated from."""

import inspect

import pytest
import torch
from sim_test_ops import ops
from vendor_graph_sim import device as sim

from vendor_graph.vendors.ascend.releases import GENERATION_FACTS, GENERATIONS, RELEASES

GRAPH_GENERATIONS = [g for g in GENERATIONS if GENERATION_FACTS[g]["graph_api"]]
UPDATE_GENERATIONS = [g for g in GENERATIONS if GENERATION_FACTS[g]["update"]]


def _params(entry):
    return [p["name"] for p in entry["params"]]


@pytest.mark.parametrize("generation", GENERATIONS)
def test_module_surface_matches_the_manifest(generation):
    version, _ = sim.resolve(generation)
    manifest = sim.load_manifest(version)
    with sim.use_torch_npu(generation) as torch_npu:
        import torch_npu as imported

        assert imported is torch_npu and torch.npu is torch_npu.npu
        assert torch_npu.__version__ == version
        for name in manifest["npu_exports"]:
            assert hasattr(torch.npu, name), name
        for absent in ("NPUGraph", "graph", "ExternalEvent", "ExternalStream", "graph_task_group_begin",
                       "register_npu_graph_handler"):
            if absent not in manifest["npu_exports"]:
                assert not hasattr(torch.npu, absent), absent
        if GENERATION_FACTS[generation]["graph_api"]:
            classes = manifest["graph_api"]["classes"]
            init = inspect.signature(torch.npu.graph.__init__)
            assert list(init.parameters) == _params(classes["graph"]["methods"]["__init__"])
            for method, spec in classes["NPUGraph"]["methods"].items():
                assert list(inspect.signature(getattr(torch.npu.NPUGraph, method)).parameters) == _params(spec)
            assert hasattr(torch.npu.NPUGraph, "update") == GENERATION_FACTS[generation]["update"]
            for name, spec in manifest["graph_api"]["functions"].items():
                assert list(inspect.signature(getattr(torch.npu, name)).parameters) == _params(spec)
    assert torch.npu is not torch_npu.npu


def test_version_strings_select_their_generation():
    for release in RELEASES[::7]:
        assert sim.torch_npu_module(release.version).npu.__sim_generation__ == release.generation


def test_g1_graph_rejects_auto_dispatch_capture_like_the_real_one():
    with sim.use_torch_npu("G1"):
        g = torch.npu.NPUGraph()
        with pytest.raises(TypeError, match="auto_dispatch_capture"):
            torch.npu.graph(g, auto_dispatch_capture=True)
        assert not hasattr(g, "update")


@pytest.mark.parametrize("generation", UPDATE_GENERATIONS)
def test_update_needs_auto_dispatch_capture(generation):
    with sim.use_torch_npu(generation):
        g = torch.npu.NPUGraph()
        q = torch.ones(2, 2, device="npu")
        with torch.npu.graph(g):
            ops.npu_fused_infer_attention_score(q, q, q, actual_seq_lengths_kv=[1, 2])
        with pytest.raises(RuntimeError, match="auto_dispatch_capture=True"):
            g.update([{"actual_seq_lengths_kv": [3, 4]}])


# one call per op family, with its host lengths where the real schema has them
def _call_fia(q, lens):
    return ops.npu_fused_infer_attention_score(q, q, q, actual_seq_lengths_kv=lens)[0]


def _call_fia_v2(q, lens):
    return ops.npu_fused_infer_attention_score_v2(q, q, q, actual_seq_kvlen=lens)[0]


def _call_pa(q, lens):
    out = torch.empty_like(q)
    ops._npu_paged_attention(q, q, q, 1, 1, 1.0, q, torch.tensor(lens, dtype=torch.int32), out)
    return out


def _call_mla_out(q, lens):
    out = torch.empty_like(q)
    ops.npu_multi_head_latent_attention.out(q, q, q, q, q, lens, 1, attn_out=out)
    return out


def _call_mla(q, lens):
    return ops.npu_multi_head_latent_attention(q, q, q, q, q, lens, 1)


def _call_pa_mla(q, lens):
    out = torch.empty_like(q)
    ops._npu_paged_attention_mla(q, q, 1, 1, 1.0, q, torch.tensor(lens, dtype=torch.int32), 1, out)
    return out


# (family, dispatched op name, positional arg count, kwargs present at capture, update key, new value)
FAMILIES = {
    "fia": (_call_fia, "npu_fused_infer_attention_score.default", 3, {"actual_seq_lengths_kv"},
            "actual_seq_lengths_kv", [7, 9]),
    "fia_v2": (_call_fia_v2, "npu_fused_infer_attention_score_v2.default", 3, {"actual_seq_kvlen"},
               "actual_seq_kvlen", [7, 9]),
    "pa": (_call_pa, "_npu_paged_attention.default", 9, set(), "context_lens", torch.tensor([7, 9], dtype=torch.int32)),
    "mla_out": (_call_mla_out, "npu_multi_head_latent_attention.out", 7, {"attn_out"}, "context_lens", [7, 9]),
    "mla": (_call_mla, "npu_multi_head_latent_attention.default", 7, set(), "context_lens", [7, 9]),
    "pa_mla": (_call_pa_mla, "_npu_paged_attention_mla.default", 9, set(), "context_lens",
               torch.tensor([7, 9], dtype=torch.int32)),
}


def expected_from_facts(generation, op_name, n_args, kwarg_keys, key):
    """(recorded?, patched?) as GENERATION_FACTS describe update() for this call."""
    facts = GENERATION_FACTS[generation]
    spec = facts["update_ops"].get(op_name)
    if spec is None:
        return False, False
    rule = spec["kwargs"]
    via_kwargs = (rule == "any_key" or (rule == "existing_keys_only" and key in kwarg_keys)
                  or (rule == "any_key if len(args) < 2" and n_args < 2))
    via_args = any(k == key and (i < n_args if i >= 0 else n_args >= -i) for i, k in spec["args"])
    return True, via_kwargs or via_args


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("generation", UPDATE_GENERATIONS)
def test_update_patches_exactly_what_the_facts_say(generation, family):
    call, op_name, n_args, kwarg_keys, key, new = FAMILIES[family]
    recorded, patched = expected_from_facts(generation, op_name, n_args, kwarg_keys, key)
    with sim.use_torch_npu(generation):
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = call(q, [3, 5])
        records = g.graph_dispatch_mode.graph_dispatch_records
        assert len(records) == int(recorded)
        g.update([{key: new}])
        g.replay()
        assert out.cpu()[:, 0].tolist() == ([7.0, 9.0] if patched else [3.0, 5.0])


def test_g2a_plain_name_switch_records_default_calls():
    with sim.use_torch_npu("G2a"), sim.configured(g2a_plain_name_matches_default=True):
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = _call_fia(q, [3, 5])
        assert len(g.graph_dispatch_mode.graph_dispatch_records) == 1
        g.update([{"actual_seq_lengths_kv": [7, 9]}])
        g.replay()
        assert out.cpu()[:, 0].tolist() == [7.0, 9.0]


@pytest.mark.parametrize("generation", UPDATE_GENERATIONS)
def test_length_mismatch(generation):
    with sim.use_torch_npu(generation):
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            a = ops.npu_fused_infer_attention_score.out(
                q, q, q, actual_seq_lengths_kv=[3, 5], attention_out=torch.empty_like(q),
                softmax_lse=torch.empty(2, device="npu"))[0]
            b = ops.npu_fused_infer_attention_score.out(
                q, q, q, actual_seq_lengths_kv=[3, 5], attention_out=torch.empty_like(q),
                softmax_lse=torch.empty(2, device="npu"))[0]
        assert len(g.graph_dispatch_mode.graph_dispatch_records) == 2
        three = [{"actual_seq_lengths_kv": [7, 9]}, {"actual_seq_lengths_kv": [8, 8]}, {}]
        if GENERATION_FACTS[generation]["update_length_check"] == "raises_on_mismatch":
            with pytest.raises(RuntimeError):
                g.update(three)
            return
        g.update(three)  # zip truncates silently
        g.replay()
        assert (a.cpu()[:, 0].tolist(), b.cpu()[:, 0].tolist()) == ([7.0, 9.0], [8.0, 8.0])


@pytest.mark.parametrize("generation", ["G3a", "G3b", "G4", "G5"])
def test_positional_key_missing_from_the_update_dict(generation):
    with sim.use_torch_npu(generation):
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = _call_pa(q, [3, 5])
        if GENERATION_FACTS[generation]["positional_key_guarded"]:
            g.update([{"actual_seq_lengths_kv": [7, 9]}])
            g.replay()
            assert out.cpu()[:, 0].tolist() == [3.0, 5.0]
        else:
            with pytest.raises(KeyError, match="context_lens"):
                g.update([{"actual_seq_lengths_kv": [7, 9]}])


@pytest.mark.parametrize("generation", UPDATE_GENERATIONS)
def test_replay_without_update_holds_the_stream_when_the_suspicion_holds(generation):
    with sim.use_torch_npu(generation):
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = ops.npu_fused_infer_attention_score.out(
                q, q, q, actual_seq_lengths_kv=[3, 5], attention_out=torch.empty_like(q),
                softmax_lse=torch.empty(2, device="npu"))[0]
        g.update([{"actual_seq_lengths_kv": [4, 4]}])
        g.replay()
        assert out.cpu()[:, 0].tolist() == [4.0, 4.0]
        g.replay()  # no update: the captured task waits on its ExternalEvent
        with pytest.raises(sim.SimDeadlockError, match="update"):
            out.cpu()
        g.update([{"actual_seq_lengths_kv": [6, 6]}])  # the update releases the held replay
        assert out.cpu()[:, 0].tolist() == [6.0, 6.0]
        with sim.configured(external_event_blocks_replay=False):
            q.fill_(2)
            g.replay()
            assert out.cpu()[:, 0].tolist() == [12.0, 12.0]


@pytest.mark.parametrize("generation", GRAPH_GENERATIONS)
def test_task_group_api_replaces_the_recorded_work(generation):
    """The manual path every G1+ wheel offers: group at capture, update + ExternalEvent per step."""
    with sim.use_torch_npu(generation):
        npu = torch.npu
        q = torch.ones(2, 3, device="npu")
        out = torch.empty(2, 3, device="npu")
        lens = torch.tensor([3, 5], dtype=torch.int32)
        stream, update_stream = npu.Stream(), npu.Stream()
        event = npu.ExternalEvent()
        g = npu.NPUGraph()
        with npu.graph(g, stream=stream):
            event.wait(stream)
            event.reset(stream)
            npu.graph_task_group_begin(stream)
            ops._npu_paged_attention(q, q, q, 1, 1, 1.0, q, lens, out)
            handle = npu.graph_task_group_end(stream)
        for step_lens in ([4, 6], [8, 2]):
            with npu.stream(update_stream):
                npu.graph_task_update_begin(update_stream, handle)
                ops._npu_paged_attention(q, q, q, 1, 1, 1.0, q, torch.tensor(step_lens, dtype=torch.int32), out)
                npu.graph_task_update_end(update_stream)
                event.record(update_stream)
            g.replay()
            assert out.cpu()[:, 0].tolist() == [float(v) for v in step_lens]


def test_task_update_with_fresh_outputs_leaves_the_captured_output_stale():
    """Re-issuing a functional op writes the re-issue's own outputs: the captured one is no longer written."""
    with sim.use_torch_npu("G1"):
        npu = torch.npu
        q = torch.ones(2, 3, device="npu")
        s = npu.Stream()
        g = npu.NPUGraph()
        with npu.graph(g, stream=s):
            npu.graph_task_group_begin(s)
            captured = _call_mla(q, [3, 5])
            handle = npu.graph_task_group_end(s)
        g.replay()
        npu.graph_task_update_begin(s, handle)
        _call_mla(q, [7, 9])
        npu.graph_task_update_end(s)
        q.fill_(2)
        g.replay()
        assert captured.cpu()[:, 0].tolist() == [3.0, 5.0]


def test_g0_has_no_graph_api():
    with sim.use_torch_npu("G0") as torch_npu:
        assert not hasattr(torch.npu, "NPUGraph") and not hasattr(torch_npu.npu, "graph")
        assert torch.npu.is_available() and torch.zeros(1, device="npu").is_npu
