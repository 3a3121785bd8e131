"""dlinfer's Ascend decode attention routed through vendor_graph.ascend.hook.call_attention (stand-in dlinfer).

The stand-in modules (the simulator package's dlinfer/vendor/ascend/{attention,torch_npu_ops}.py) call the
same operators with the same keyword spellings as dlinfer; ``vendor_graph_sim.kernels`` gives those
operators CPU kernels (it is not the simulator).
"""

import importlib
import logging
import sys
import types

import pytest
import torch
from vendor_graph_sim import kernels  # noqa: F401  (registers the emulated Ascend operators)

import vendor_graph
from vendor_graph import patching
from vendor_graph.ascend import dlinfer_adapter, hook, releases
from vendor_graph.ascend.seqlen import GRAPH_UPDATE, TASK_UPDATE, Capabilities

ATTENTION = dlinfer_adapter.ATTENTION_MODULE
OPS = dlinfer_adapter.OPS_MODULE
STANDIN = (ATTENTION, OPS, "dlinfer.vendor.ascend.graph_state")


def _forget_standins():
    for name in STANDIN:
        sys.modules.pop(name, None)
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and hasattr(sys.modules[parent], child):
            delattr(sys.modules[parent], child)


@pytest.fixture(autouse=True)
def fresh_standins():
    """Each test imports the stand-ins itself; none stay behind for later tests' activations."""
    _forget_standins()
    yield
    _forget_standins()


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
                block_size=block_size, kv_seq_len=kv_lens, max_kv_seq_len=8, num_q_heads=heads,
                num_kv_heads=kv_heads, softmax_scale=None, alibi_slopes=None)


def run_paged(ops, variant, **overrides):
    """One call of the stand-in's paged_decode_attention: 'pa' (0.2.7), 'fia' (main) or 'mla'."""
    if variant == "mla":
        inputs = decode_inputs(dim=12, v_dim=8)
        out = torch.zeros(inputs["query"].shape[0], inputs["num_q_heads"], 8)
    else:
        inputs = decode_inputs()
        out = torch.zeros_like(inputs["query"])
    inputs.update(overrides)
    extra = {}
    if variant == "fia":
        extra["q_seq_len"] = list(range(1, inputs["query"].shape[0] + 1))  # TND: cumulative query ends
        inputs["kv_seq_len"] = inputs["kv_seq_len"].tolist()
    return ops.paged_decode_attention(attn_output=out, **inputs, **extra)


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
        pytest.skip("vendor_graph.ascend does not call vendor_graph.ascend.dlinfer_adapter.install yet")
    assert_routed_everywhere()


# -- calls go through call_attention during a capture, and only then ----------------------------------


@pytest.mark.parametrize("variant, op_name", [
    ("pa", "_npu_paged_attention"),
    ("fia", "npu_fused_infer_attention_score"),
    ("mla", "_npu_paged_attention_mla"),
])
def test_attention_is_routed_during_capture_only(variant, op_name):
    ops = import_ops()
    from dlinfer.vendor.ascend import graph_state

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
    assert graph_state.get_graph_params().records == []


def test_routed_tasks_register_with_a_capture_scope_and_refresh():
    """A real CaptureScope (torch_npu G3b facts, a fake torch.npu): PA and FIA take NPUGraph.update, MLA
    the task-group path; re-issuing the MLA task with new lengths changes its output."""
    activate_adapter()
    ops = import_ops()

    class Event:
        def wait(self, stream):
            pass

        def reset(self, stream):
            pass

    npu = types.SimpleNamespace(ExternalEvent=Event, graph_task_group_begin=lambda s: None,
                                graph_task_group_end=lambda s: "handle")
    caps = Capabilities("2.9.0", "G3b", dict(releases.GENERATION_FACTS["G3b"]), "table")
    scope = hook.CaptureScope(npu=npu, capabilities=caps, stream="stream", auto_dispatch=True)
    with scope:
        run_paged(ops, "pa")
        run_paged(ops, "fia")
        mla_out = run_paged(ops, "mla")
    assert [(t.spec.name, t.path) for t in scope.tasks] == [
        ("_npu_paged_attention", GRAPH_UPDATE),
        ("npu_fused_infer_attention_score", GRAPH_UPDATE),
        ("_npu_paged_attention_mla", TASK_UPDATE),
    ]
    mla = scope.tasks[2]
    assert mla.handle == "handle" and mla.event is not None
    before = mla_out.clone()
    mla.call_with([1, 1, 1])  # what the runner does after each fill, on the update stream
    refreshed = run_paged(ops, "mla", kv_seq_len=torch.tensor([1, 1, 1], dtype=torch.int32))
    torch.testing.assert_close(mla_out, refreshed)  # the captured output buffer was rewritten in place
    assert not torch.allclose(before, mla_out)


def test_dlinfer_capture_flag_during_our_capture_is_refused(fake_scope):
    activate_adapter()
    ops = import_ops()
    from dlinfer.vendor.ascend import graph_state

    graph_state.AscendGraphRunner.capturing = True
    try:
        with pytest.raises(dlinfer_adapter.DlinferCaptureConflict, match="decode_attention"):
            run_paged(ops, "pa")
    finally:
        graph_state.AscendGraphRunner.capturing = False
    assert graph_state.get_graph_params().records == []
    assert fake_scope.calls == []


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
