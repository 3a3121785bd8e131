"""dlinfer's Ascend decode attention routed through vendor_graph.vendors.ascend.hook.call_attention (stand-in dlinfer).

The stand-in modules (the simulator package's dlinfer/vendor/ascend/{attention,torch_npu_ops}.py and
dlinfer/framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py) have dlinfer main's layout and signatures and
call the same operators with the same keyword spellings; ``vendor_graph_sim.kernels`` gives those operators
CPU kernels (it is not the simulator).
"""

import importlib
import logging
import os
import sys
import types

import pytest
import torch
from vendor_graph_sim import kernels  # noqa: F401  (registers the emulated Ascend operators)

import vendor_graph
from vendor_graph.install import patching
from vendor_graph.vendors.ascend import dlinfer_adapter, hook, releases
from vendor_graph.vendors.ascend.seqlen import GRAPH_UPDATE, TASK_UPDATE, Capabilities

ATTENTION = dlinfer_adapter.ATTENTION_MODULE
OPS = dlinfer_adapter.OPS_MODULE
# Where dlinfer keeps its capture flag and graph params; importing it reassigns CudaGraphMixin's methods.
CUDAGRAPH = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph"
STANDIN = (ATTENTION, OPS, CUDAGRAPH)
MIXIN_METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph",
                 "support_cuda_graph")


def _forget_standins():
    for name in STANDIN:
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            delattr(sys.modules[parent], child)


@pytest.fixture(autouse=True)
def fresh_standins():
    """Each test imports the stand-ins itself; none (nor their CudaGraphMixin displacement, nor dlinfer's
    graph params) stay behind for later tests."""
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    saved = {name: CudaGraphMixin.__dict__.get(name) for name in MIXIN_METHODS}
    _forget_standins()
    yield
    _forget_standins()
    for name, method in saved.items():
        if method is None:
            if name in CudaGraphMixin.__dict__:
                delattr(CudaGraphMixin, name)
        else:
            setattr(CudaGraphMixin, name, method)


def dlinfer_cudagraph():
    """dlinfer's capture state (``AscendGraphRunner.capturing``, graph params), as its attention imports it."""
    return importlib.import_module(CUDAGRAPH)


def activate_adapter():
    """An activation holding only the adapter's patches (what ``vendor_graph.ascend`` adds to its own)."""
    return patching.activate("ascend", dlinfer_adapter.install)


def import_ops():
    return importlib.import_module(OPS)


def current(module_name, name):
    return sys.modules[module_name].__dict__[name]


class FakeScope:
    """Stands in for the runner's CaptureScope: records each routed call, then runs it."""

    def __init__(self):
        self.calls = []

    def call(self, op, args, kwargs):
        self.calls.append((op, args, kwargs))
        return op(*args, **kwargs)


@pytest.fixture
def fake_scope():
    scope = FakeScope()
    token = hook._SCOPE.set(scope)
    try:
        yield scope
    finally:
        hook._SCOPE.reset(token)


def decode_inputs(batch=3, heads=4, kv_heads=2, dim=8, v_dim=8, block_size=4, blocks=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(batch, heads, dim, generator=g)
    key_cache = torch.randn(blocks, block_size, kv_heads, dim, generator=g)
    value_cache = torch.randn(blocks, block_size, kv_heads, v_dim, generator=g)
    block_table = torch.arange(batch * 2, dtype=torch.int32).reshape(batch, 2)
    kv_lens = torch.tensor([5, 1, 8][:batch], dtype=torch.int32)
    return dict(query=query, key_cache=key_cache, value_cache=value_cache, block_table=block_table,
                block_size=block_size, q_seq_len=list(range(1, batch + 1)),  # TND: cumulative query ends
                kv_seq_len=kv_lens, max_kv_seq_len=8, num_q_heads=heads, num_kv_heads=kv_heads,
                softmax_scale=None, alibi_slopes=None, kv_scales=None, kv_zeros=None, quant_bits=0)


def run_paged(ops, variant, **overrides):
    """One call of dlinfer's (stand-in) torch_npu_ops.paged_decode_attention, every argument given as dlinfer
    requires: 'fia' (equal head sizes: npu_fused_infer_attention_score) or 'mla' (_npu_paged_attention_mla)."""
    if variant == "mla":
        inputs = decode_inputs(dim=12, v_dim=8)
        out = torch.zeros(inputs["query"].shape[0], inputs["num_q_heads"], 8)
    else:
        inputs = decode_inputs()
        out = torch.zeros_like(inputs["query"])
        inputs["kv_seq_len"] = inputs["kv_seq_len"].tolist()  # FIA takes its lengths as host lists
    inputs.update(overrides)
    return ops.paged_decode_attention(attn_output=out, **inputs)


# -- patched after import, in both orders -------------------------------------------------------------


def assert_routed_everywhere():
    for module_name in (ATTENTION, OPS):
        for name in dlinfer_adapter.FUNCTIONS:
            assert dlinfer_adapter.is_routed(current(module_name, name)), f"{module_name}.{name} not routed"
    # torch_npu_ops imports the functions by name: it must see the same routed objects.
    for name in dlinfer_adapter.FUNCTIONS:
        assert current(OPS, name) is current(ATTENTION, name)


def test_patched_when_dlinfer_is_imported_after_activation():
    activate_adapter()
    assert ATTENTION not in sys.modules
    import_ops()
    assert_routed_everywhere()


def test_patched_when_dlinfer_was_imported_before_activation():
    import_ops()
    assert not dlinfer_adapter.is_routed(current(ATTENTION, "decode_attention"))
    activate_adapter()
    assert_routed_everywhere()


def test_install_twice_adds_no_second_layer():
    activation = activate_adapter()
    import_ops()
    count = len(activation.patches)
    dlinfer_adapter.install(activation)
    assert len(activation.patches) == count == 4
    assert_routed_everywhere()


def test_ascend_activation_wires_the_adapter(activate):
    import_ops()
    activate("ascend")
    if not dlinfer_adapter.is_routed(current(ATTENTION, "decode_attention")):
        pytest.skip("vendor_graph.ascend does not call vendor_graph.vendors.ascend.dlinfer_adapter.install yet")
    assert_routed_everywhere()


# -- calls go through call_attention during a capture, and only then ----------------------------------


class FakeEvent:
    def wait(self, stream):
        pass

    def reset(self, stream):
        pass


def fake_npu():
    """The torch.npu calls a capture scope and dlinfer's own capture branch make."""
    return types.SimpleNamespace(ExternalEvent=FakeEvent, current_stream=lambda: "stream",
                                 graph_task_group_begin=lambda s: None, graph_task_group_end=lambda s: "handle")


def capabilities(generation):
    return Capabilities("2.9.0", generation, dict(releases.GENERATION_FACTS[generation]), "table")


@pytest.mark.parametrize("variant, op_name", [
    ("fia", "npu_fused_infer_attention_score"),
    ("mla", "_npu_paged_attention_mla"),
])
def test_attention_is_routed_during_capture_only(variant, op_name):
    ops = import_ops()
    cudagraph = dlinfer_cudagraph()
    cudagraph.set_graph_params({3})  # as dlinfer's runner sizes them; ours never does
    try:
        expected = run_paged(ops, variant)  # dlinfer's function, not patched
        activate_adapter()
        eager = run_paged(ops, variant)  # patched, no capture: a plain call
        scope = FakeScope()
        token = hook._SCOPE.set(scope)
        try:
            captured = run_paged(ops, variant)
        finally:
            hook._SCOPE.reset(token)
        assert [hook.op_identity(op)[0].name for op, _, _ in scope.calls] == [op_name]
        torch.testing.assert_close(eager, expected)
        torch.testing.assert_close(captured, expected)
        # dlinfer's own bookkeeping (keyed on its global flag) recorded nothing.
        params = cudagraph.get_graph_params()
        assert params.events[3] == params.attn_params[3] == params.handles[3] == []
    finally:
        cudagraph.clear_graph_params()


def test_routed_tasks_register_with_a_capture_scope_and_refresh():
    """A real CaptureScope (torch_npu G3b facts, a fake torch.npu): FIA takes NPUGraph.update, MLA the
    task-group path; re-issuing the MLA task with new lengths changes its output."""
    activate_adapter()
    ops = import_ops()
    scope = hook.CaptureScope(npu=fake_npu(), capabilities=capabilities("G3b"), stream="stream",
                              auto_dispatch=True)
    with scope:
        run_paged(ops, "fia")
        mla_out = run_paged(ops, "mla")
    assert [(t.spec.name, t.path) for t in scope.tasks] == [
        ("npu_fused_infer_attention_score", GRAPH_UPDATE),
        ("_npu_paged_attention_mla", TASK_UPDATE),
    ]
    mla = scope.tasks[1]
    assert mla.handle == "handle" and mla.event is not None
    before = mla_out.clone()
    mla.call_with([1, 1, 1])  # what the runner does after each fill, on the update stream
    refreshed = run_paged(ops, "mla", kv_seq_len=torch.tensor([1, 1, 1], dtype=torch.int32))
    torch.testing.assert_close(mla_out, refreshed)  # the captured output buffer was rewritten in place
    assert not torch.allclose(before, mla_out)


def test_functional_fia_on_the_task_update_path_is_captured_as_out_and_refreshed():
    """G1: dlinfer's decode FIA is functional and its lengths can only be refreshed by re-issuing the task;
    the scope captures FIA.out into preallocated outputs, hands those back, and a re-issue rewrites them."""
    activate_adapter()
    ops = import_ops()
    scope = hook.CaptureScope(npu=fake_npu(), capabilities=capabilities("G1"), stream="stream")
    with scope:
        out = run_paged(ops, "fia")
    (task,) = scope.tasks
    assert (task.spec.name, task.path) == ("npu_fused_infer_attention_score", TASK_UPDATE)
    assert task.op is torch.ops.npu.npu_fused_infer_attention_score.out
    assert task.kwargs["attention_out"] is out and task.handle == "handle"
    torch.testing.assert_close(out, run_paged(ops, "fia"))
    task.call_with([2, 3, 4])
    torch.testing.assert_close(out, run_paged(ops, "fia", kv_seq_len=[2, 3, 4]))


def test_dlinfer_capture_flag_during_our_capture_is_refused(fake_scope):
    activate_adapter()
    ops = import_ops()
    cudagraph = dlinfer_cudagraph()
    cudagraph.AscendGraphRunner.capturing = True
    try:
        with pytest.raises(dlinfer_adapter.DlinferCaptureConflict, match="decode_attention"):
            run_paged(ops, "fia")
    finally:
        cudagraph.AscendGraphRunner.capturing = False
    assert cudagraph.get_graph_params() is None  # dlinfer's bookkeeping was not reached
    assert fake_scope.calls == []


@pytest.mark.parametrize("variant, op_name, is_mla", [
    ("fia", "_npu_paged_attention", False),
    ("mla", "_npu_paged_attention_mla", True),
])
def test_dlinfers_own_capture_outside_ours_is_left_to_dlinfer(monkeypatch, variant, op_name, is_mla):
    """dlinfer's flag set with no vendor_graph capture (dlinfer's own runner capturing): the routed function
    does not route; dlinfer opens its own task group (paged attention, as below torch_npu 2.8.0.post1)."""
    npu = fake_npu()
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    activate_adapter()
    ops = import_ops()
    cudagraph = dlinfer_cudagraph()
    assert not cudagraph.aclgraph_use_torch_npu_update()  # no torch_npu here
    seen = []

    class Seen(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.name().split("::")[-1].partition(".")[0])
            return func(*args, **(kwargs or {}))

    cudagraph.set_graph_params({3})
    cudagraph.AscendGraphRunner.capturing = True
    try:
        with Seen():  # paged attention takes its lengths as a tensor
            out = run_paged(ops, variant, kv_seq_len=torch.tensor([5, 1, 8], dtype=torch.int32))
        params = cudagraph.get_graph_params()
        assert [p[-1] for p in params.attn_params[3]] == [out]  # attn_output, written in place
        assert len(params.events[3]) == 1 and params.handles[3] == ["handle"] and params.is_mla is is_mla
    finally:
        cudagraph.AscendGraphRunner.capturing = False
        cudagraph.clear_graph_params()
    assert op_name in seen and "npu_fused_infer_attention_score" not in seen


def test_ops_level_call_as_lmdeploy_makes_it_reaches_the_routed_function(fake_scope):
    """lmdeploy 0.16-0.18 call dlinfer.ops.paged_decode_attention with ten positional arguments (q_seqlens
    sixth) and head_size_v= among the keywords; dlinfer drops head_size_v before the vendor's function."""
    import dlinfer.ops as ext_ops

    activate_adapter()
    inputs = decode_inputs()
    kv = inputs["kv_seq_len"].tolist()
    out = ext_ops.paged_decode_attention(
        inputs["query"], inputs["key_cache"], inputs["value_cache"], inputs["block_table"], inputs["block_size"],
        inputs["q_seq_len"], kv, inputs["max_kv_seq_len"], inputs["num_q_heads"], inputs["num_kv_heads"],
        head_size_v=inputs["value_cache"].shape[-1], softmax_scale=None, attn_output=torch.zeros_like(inputs["query"]),
        kv_scales=None, kv_zeros=None, quant_bits=0)
    assert [hook.op_identity(op)[0].name for op, _, _ in fake_scope.calls] == ["npu_fused_infer_attention_score"]
    torch.testing.assert_close(out, run_paged(import_ops(), "fia"))


# -- uninstall, missing functions ---------------------------------------------------------------------


def test_uninstall_restores_dlinfers_functions():
    ops = import_ops()
    attention = sys.modules[ATTENTION]
    originals = {(m.__name__, n): m.__dict__[n] for m in (attention, ops) for n in dlinfer_adapter.FUNCTIONS}
    activate_adapter()
    assert_routed_everywhere()
    vendor_graph.uninstall()
    for (module_name, name), original in originals.items():
        assert current(module_name, name) is original


def test_uninstall_restores_when_imported_after_activation():
    activate_adapter()
    ops = import_ops()
    vendor_graph.uninstall()
    for module in (sys.modules[ATTENTION], ops):
        for name in dlinfer_adapter.FUNCTIONS:
            func = module.__dict__[name]
            assert not dlinfer_adapter.is_routed(func)
            assert func.__module__ == ATTENTION


def test_missing_function_is_reported_by_name(caplog):
    fake = types.ModuleType(ATTENTION)
    fake.decode_attention = lambda *a, **k: None  # decode_attention_mla is missing
    sys.modules[ATTENTION] = fake
    with caplog.at_level(logging.ERROR, logger="vendor_graph"):
        activation = activate_adapter()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any(f"{ATTENTION}.decode_attention_mla is missing" in e for e in errors), errors
    assert dlinfer_adapter.is_routed(fake.decode_attention)
    assert [p.name for p in activation.patches] == ["decode_attention"]


# -- both dlinfer generations: the capture flag where it lives, the generation by content ---------------------

POST_350_ATTENTION = '''
import torch

def decode_attention(query, key_cache, value_cache, num_q_heads, num_kv_heads, scale_value, block_table, block_size,
                     q_seq_len, kv_seq_len, softmax_scale, attn_output):
    return attn_output

def decode_attention_mla(*args, **kwargs):
    return None
'''


def test_dlinfer_capture_flag_is_read_where_it_lives_after_pr_350(fake_scope):
    """After dlinfer PR #350 its attention module no longer imports AscendGraphRunner: the conflict check reads
    the flag on ascend_cudagraph (looking only in the function's globals would answer 'no conflict')."""
    cudagraph = dlinfer_cudagraph()
    attention = types.ModuleType(ATTENTION)
    exec(compile(POST_350_ATTENTION, f"<{ATTENTION}>", "exec"), attention.__dict__)
    assert "AscendGraphRunner" not in attention.decode_attention.__globals__
    sys.modules[ATTENTION] = attention
    activate_adapter()
    out = torch.zeros(2)
    assert attention.decode_attention(*([None] * 11), out) is out  # routed, no dlinfer capture: runs
    cudagraph.AscendGraphRunner.capturing = True
    try:
        with pytest.raises(dlinfer_adapter.DlinferCaptureConflict, match="decode_attention"):
            attention.decode_attention(*([None] * 11), out)
    finally:
        cudagraph.AscendGraphRunner.capturing = False
    assert fake_scope.calls == []


def _write_tree(root, files):
    for relative, text in files.items():
        path = root / "dlinfer" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root / "dlinfer"


POST_350_FILES = {
    "vendor/ascend/version.py": "def ensure_ascend_runtime(torch_version=None, torch_npu_version=None):\n    pass\n",
    "framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py":
        "class AscendGraphRunner:\n    capturing = False\n\n"
        "    def __init__(self, model, model_config, cache_config, backend_config, device, is_mla=False):\n"
        "        pass\n",
    "vendor/ascend/attention.py": "import torch\n\ndef decode_attention():\n    pass\n",
}
A50184E_FILES = {
    "framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py":
        "from dataclasses import dataclass\n\n@dataclass\nclass GraphParams:\n    is_mla: bool\n\n"
        "class AscendGraphRunner:\n    capturing = False\n\n"
        "    def __init__(self, model, model_config, cache_config, backend_config, device):\n        pass\n",
    "vendor/ascend/attention.py": "from dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph import (\n"
                                  "    AscendGraphRunner, get_graph_params)\n",
}


@pytest.mark.parametrize("files, name", [
    (POST_350_FILES, dlinfer_adapter.POST_350),
    (A50184E_FILES, dlinfer_adapter.A50184E_ERA),
    ({**POST_350_FILES, "framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py":
      A50184E_FILES["framework/lmdeploy_ext/cudagraph/ascend_cudagraph.py"]}, None),  # version.py and GraphParams
    ({}, None),
])
def test_dlinfer_generation_is_recognised_by_content(monkeypatch, tmp_path, files, name):
    package = _write_tree(tmp_path, files)
    monkeypatch.setattr(dlinfer_adapter, "_package_root", lambda: package)
    found = dlinfer_adapter.dlinfer_generation()
    assert found.name == name, found.evidence
    if name == dlinfer_adapter.POST_350:
        assert "2.8.0.post1" in found.torch_npu() and "major.minor" in found.torch_npu()
        assert "G0, G1, G2a" in found.torch_npu()
    assert found.label() == (name or "unrecognised (neither a50184e-era nor post-#350)")


def test_the_standin_dlinfer_is_a50184e_era_and_no_dlinfer_is_none(monkeypatch):
    assert dlinfer_adapter.dlinfer_generation().name == dlinfer_adapter.A50184E_ERA
    monkeypatch.setattr(dlinfer_adapter, "_package_root", lambda: None)
    nothing = dlinfer_adapter.dlinfer_generation()
    assert (nothing.name, nothing.label(), nothing.evidence) == (None, "none", ())


@pytest.mark.parametrize("torch_version, torch_npu_version, refused", [
    ("2.13.0+cpu", "2.13.0", None),
    ("2.8.0", "2.8.0.post2", None),
    ("2.8.0", "2.8.0", "needs >= 2.8.0.post1"),  # G2b
    ("2.13.0", "2.7.1.post11", "needs >= 2.8.0.post1"),  # G5 of the 2.7.1 train
    ("2.13.0", "2.12.0.post3", "major.minor"),
    ("2.3.1", "2.3.1.post6", "refuses torch 2.3.1"),
])
def test_post_350_refuses_what_its_runtime_check_refuses(torch_version, torch_npu_version, refused):
    post = dlinfer_adapter.DlinferGeneration(dlinfer_adapter.POST_350, "here", ("x",))
    answer = post.refusal(torch_version, torch_npu_version)
    assert (answer is None) if refused is None else (refused in answer), answer
    earlier = dlinfer_adapter.DlinferGeneration(dlinfer_adapter.A50184E_ERA, "here", ("x",))
    assert earlier.refusal(torch_version, torch_npu_version) is None


@pytest.mark.parametrize("files, name", [(POST_350_FILES, dlinfer_adapter.POST_350),
                                         (A50184E_FILES, dlinfer_adapter.A50184E_ERA)])
def test_doctor_names_the_dlinfer_generation_and_what_it_refuses(monkeypatch, tmp_path, files, name):
    """``vendor-graph doctor`` says which dlinfer generation it found (with the evidence) and, for a post-#350
    dlinfer, that its import refuses the simulated G5 (2.9.0.post9 beside torch 2.13) but not 2.13.0."""
    from vendor_graph.ops import doctor

    monkeypatch.setattr(dlinfer_adapter, "_package_root", lambda: _write_tree(tmp_path, files))
    for variable in [v for v in os.environ if v.startswith("VENDOR_GRAPH_")]:
        monkeypatch.delenv(variable)
    monkeypatch.setenv("VENDOR_GRAPH_SIM", "G5")
    lines, problems = doctor.report()
    text = "\n".join(lines)
    assert f"dlinfer generation: {name} (" in text
    assert "AscendGraphRunner takes is_mla: " + ("yes" if name == dlinfer_adapter.POST_350 else "no") in text
    refusal = "! post-#350 dlinfer refuses torch 2.13.0 with torch_npu 2.9.0.post9 (their major.minor must be the same)"
    assert (refusal in text) == (name == dlinfer_adapter.POST_350), text
    assert problems == (1 if name == dlinfer_adapter.POST_350 else 0), text
    monkeypatch.setenv("VENDOR_GRAPH_SIM", "2.13.0")
    lines, problems = doctor.report()
    assert "post-#350 dlinfer refuses" not in "\n".join(lines) and problems == 0
