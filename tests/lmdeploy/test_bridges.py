"""vendor_graph.install.bridges: lmdeploy's real callers against dlinfer's real signatures.

Two layers. In this process: lmdeploy's own ``StateCacheEngine`` and dlinfer kernels (``paged_attention_fwd``,
``flash_attention_fwd``; on Camb and MACA from their own ``update_step_context`` and attention layers), calling
recorders that have the parameter lists of dlinfer main (a50184e), its Camb and MACA functions' included: what the
bridge hands dlinfer, value by value, and when it stands aside. In child processes: the real dlinfer on the
simulated NPU (:data:`PROBE`, ``vendor_graph_sim.realstack``), its own ``patch_state_cache_engine`` and
``dlinfer.ops`` down to the emulated Ascend kernels, against the values lmdeploy 0.16's Ascend backend passed; and
the Camb/MACA steps with their tensors on the simulator's device (:data:`CUDA_STYLE_PROBE`), whose lengths must
reach dlinfer on the device, as lmdeploy 0.16's Camb and MACA backends passed them.

Which bridge has work depends on the release installed, read from lmdeploy's source (not its version): 0.16/0.17
call ``allocate_caches(state_specs=...)``; 0.18 calls ``prefill_attention(..., actual_seq_lengths_cpu=...)``.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import vendor_graph
from vendor_graph.config import settings
from vendor_graph.install import bridges, patching
from vendor_graph.upstream import compat

RELEASE = compat.installed_lmdeploy_version()
ENV = bridges.BRIDGES_ENV
# tests/conftest.py puts the stand-in dlinfer on PYTHONPATH for child processes; the real-dlinfer child leaves it out
STANDINS = Path(__file__).resolve().parents[2] / "sim" / "vendor_graph_sim" / "data" / "standins"


def _state_cache_engine():
    from lmdeploy.pytorch.engine import cache_engine

    return cache_engine.StateCacheEngine


def _kernels():
    from lmdeploy.pytorch.kernels.dlinfer import flash_attention, pagedattention

    return pagedattention, flash_attention


def _keywords(forms):
    return {k for f in forms or () for k in f.keywords}


PASSES_STATE_SPECS = "state_specs" in _keywords(bridges.call_forms(_state_cache_engine(), "allocate_caches"))
PREFILL_BY_CPU_ENDS = "actual_seq_lengths_cpu" in _keywords(
    bridges.call_forms(_kernels()[0], "prefill_attention", receivers=("ext_ops",)))
needs_state_specs = pytest.mark.skipif(
    not PASSES_STATE_SPECS, reason=f"lmdeploy {RELEASE}'s StateCacheEngine does not call allocate_caches(state_specs=) "
                                   f"(0.16 and 0.17 do): the state-cache bridge has nothing to adapt here")
needs_018_prefill = pytest.mark.skipif(
    not PREFILL_BY_CPU_ENDS, reason=f"lmdeploy {RELEASE}'s dlinfer prefill kernel calls prefill_attention in the form "
                                    f"dlinfer main takes (0.18 passes actual_seq_lengths_cpu=): nothing to adapt here")


@pytest.fixture
def activate_bridges(monkeypatch):
    """Activate with only the bridges (what the vendor activation adds to its own patches); uninstalled before
    ``monkeypatch`` puts back what the test replaced."""

    def activate(**env: str) -> patching.Activation:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return patching.activate("ascend", bridges.install)

    yield activate
    vendor_graph.uninstall()


# -- the catalogue and the setting -------------------------------------------------------------------------------


def test_the_catalogue_names_each_bridge_its_fix_and_upstream_pair():
    assert bridges.NAMES == ("state-cache", "prefill-attention")
    for bridge in bridges.BRIDGES:
        assert "lmdeploy" in bridge.upstream and "dlinfer" in bridge.upstream and "TypeError" in bridge.fixes
    assert settings.declared("bridges").kind.values == ("auto", "off", *bridges.NAMES)


@pytest.mark.parametrize(("text", "value"), [
    ("", "auto"), ("AUTO", "auto"), (" off ", "off"), ("state-cache", ("state-cache",)),
    ("Prefill-Attention , state-cache,", ("prefill-attention", "state-cache")),
])
def test_the_setting_takes_auto_off_or_bridge_names(text, value):
    assert settings.parse({ENV: text}).bridges == value


@pytest.mark.parametrize("text", ["state_cache", "state-cache,prefil-attention", ",", "none"])
def test_an_unknown_bridge_name_is_refused_naming_the_valid_ones(text):
    with pytest.raises(settings.SettingsError) as info:
        settings.parse({ENV: text})
    message = str(info.value)
    assert message.startswith(f"{ENV}={text!r}: expected auto or off, or a comma-separated list of: "
                              "state-cache, prefill-attention"), message


def test_allowed_reads_the_setting():
    assert bridges.allowed("state-cache", "auto") and not bridges.allowed("state-cache", "off")
    assert bridges.allowed("state-cache", ("state-cache",)) and not bridges.allowed("prefill-attention",
                                                                                    ("state-cache",))


def test_a_call_form_fits_a_signature_exactly_when_the_call_would_bind():
    def callee(a, b, *, c=None):
        """A stand-in."""

    signature = inspect.signature(callee)
    assert bridges.CallForm("x", 2, ("c",)).fits(signature)
    assert bridges.CallForm("x", 1, ("b",)).fits(signature)
    assert not bridges.CallForm("x", 3, ()).fits(signature)
    assert not bridges.CallForm("x", 2, ("d",)).fits(signature)
    assert not bridges.CallForm("x", 1, ()).fits(signature)


# -- state-cache: lmdeploy 0.16/0.17's StateCacheEngine over dlinfer's allocate_caches ----------------------------


class DlinferAllocate:
    """Records each call; the parameter list of dlinfer main's ``patch_state_cache_engine`` replacement."""

    def __init__(self):
        self.calls = []

    def __call__(self, num_caches, state_shapes, device):
        self.calls.append(dict(num_caches=num_caches, state_shapes=list(state_shapes), device=device))
        caches = [torch.zeros((num_caches, *shape), dtype=dtype) for shape, dtype in state_shapes]
        return torch.empty((num_caches, sum(c[0].numel() * c.element_size() for c in caches))), caches


class LmdeployFormAllocate(DlinferAllocate):
    """A dlinfer whose allocate_caches takes lmdeploy's call."""

    def __call__(self, num_caches, state_shapes, device, state_specs=None, num_layers=None):
        return super().__call__(num_caches, state_shapes, device)


@pytest.fixture
def dlinfer_allocate(monkeypatch):
    """dlinfer's patch applied as dlinfer applies it: a static method on lmdeploy's StateCacheEngine."""
    fake = DlinferAllocate()
    monkeypatch.setattr(_state_cache_engine(), "allocate_caches", staticmethod(fake), raising=False)
    return fake


SHAPES = [((4, 8), torch.float16), ((3,), torch.float32)]


def _engine(specs=(), states_shapes=SHAPES, num_caches=5):
    cache_config = types.SimpleNamespace(states_shapes=list(states_shapes), num_state_caches=num_caches)
    model_config = types.SimpleNamespace(state_cache_specs=list(specs), num_layers=2)
    return _state_cache_engine()(cache_config, model_config)


def _spec(name, shape, dtype, **kw):
    from lmdeploy.pytorch.config import StateCacheSpec

    return StateCacheSpec(name, shape, dtype, **kw)


@needs_state_specs
def test_unbridged_lmdeploy_cannot_build_its_state_cache_engine_on_dlinfers_allocate(dlinfer_allocate):
    with pytest.raises(TypeError, match="unexpected keyword argument 'state_specs'"):
        _engine()
    assert dlinfer_allocate.calls == []


@needs_state_specs
def test_the_bridge_hands_dlinfer_lmdeploys_state_shapes(dlinfer_allocate, activate_bridges, caplog):
    with caplog.at_level(logging.INFO, logger="vendor_graph"):
        activation = activate_bridges()
        bridges.install(activation)  # a second install (the vendor activation runs once) changes nothing
    engine = _engine()
    assert dlinfer_allocate.calls == [dict(num_caches=5, state_shapes=SHAPES, device="cuda")]
    assert [tuple(c.shape) for c in engine.state_caches] == [(5, 4, 8), (5, 3)]
    target = "lmdeploy.pytorch.engine.cache_engine.StateCacheEngine.allocate_caches"
    assert bridges.applied() == (bridges.Applied("state-cache", bridges.STATE_CACHE.fixes, target),)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "bridge" in r.getMessage()]
    assert lines == [f"vendor_graph: bridge state-cache on {target}: {bridges.STATE_CACHE.fixes}"]


@needs_state_specs
def test_state_specs_replace_the_shapes_in_order_and_keep_their_names(dlinfer_allocate, activate_bridges):
    activate_bridges()
    specs = [_spec("a", (4, 8), torch.float16), _spec("b", (3,), torch.float32)]
    engine = _engine(specs, states_shapes=[((9,), torch.float16)])
    assert dlinfer_allocate.calls == [dict(num_caches=5, state_shapes=SHAPES, device="cuda")]
    assert list(engine.named_state_caches) == ["a", "b"]
    assert tuple(engine.named_state_caches["a"].shape) == (5, 4, 8)


@needs_state_specs
@pytest.mark.parametrize(("spec", "why"), [
    (("w", (4, 8), torch.float16, {"layer_ids": [0, 1]}), "layer_ids [0, 1]"),
    (("x", (4, 8), torch.float16, {"alignment": 1024}), "alignment 1024"),
])
def test_state_specs_dlinfer_cannot_lay_out_are_refused_not_dropped(dlinfer_allocate, activate_bridges, spec, why):
    activate_bridges()
    name, shape, dtype, kw = spec
    with pytest.raises(bridges.StateSpecsNotSupported) as info:
        _engine([_spec("plain", (2,), torch.float32), _spec(name, shape, dtype, **kw)])
    message = str(info.value)
    assert f"{name} ({why}" in message and "plain" not in message and "Fix:" in message
    assert dlinfer_allocate.calls == []


@needs_state_specs
def test_lmdeploys_state_cache_sizing_goes_through_the_bridge(dlinfer_allocate, activate_bridges):
    activate_bridges()
    engine = _state_cache_engine()
    assert engine.get_cache_state_size(SHAPES, state_specs=None, num_layers=2) > 0
    assert dlinfer_allocate.calls == [dict(num_caches=1, state_shapes=SHAPES, device="meta")]


@needs_state_specs
def test_uninstall_puts_dlinfers_allocate_back(dlinfer_allocate, activate_bridges):
    engine = _state_cache_engine()
    dlinfers = engine.__dict__["allocate_caches"]
    activate_bridges()
    assert engine.__dict__["allocate_caches"] is not dlinfers
    vendor_graph.uninstall()
    assert engine.__dict__["allocate_caches"] is dlinfers and bridges.applied() == ()
    with pytest.raises(TypeError, match="state_specs"):
        _engine()


@needs_state_specs
@pytest.mark.parametrize("value", ["off", "prefill-attention"])
def test_the_setting_leaves_the_state_cache_bridge_out(dlinfer_allocate, activate_bridges, value):
    activate_bridges(**{ENV: value})
    assert bridges.applied() == ()
    with pytest.raises(TypeError, match="state_specs"):
        _engine()


def test_the_state_cache_bridge_stands_aside_where_allocate_caches_takes_lmdeploys_call(activate_bridges, monkeypatch):
    """On every release: lmdeploy's own allocate_caches (0.16/0.17; 0.18 has none) and a dlinfer whose
    allocate_caches takes lmdeploy's keywords are left as they are, and lmdeploy's call reaches them."""
    engine = _state_cache_engine()
    own = engine.__dict__.get("allocate_caches")
    activate_bridges()
    assert engine.__dict__.get("allocate_caches") is own and bridges.applied() == ()
    vendor_graph.uninstall()
    fake = LmdeployFormAllocate()
    monkeypatch.setattr(engine, "allocate_caches", staticmethod(fake), raising=False)
    installed = engine.__dict__["allocate_caches"]
    activate_bridges()
    assert engine.__dict__["allocate_caches"] is installed and bridges.applied() == ()
    if PASSES_STATE_SPECS:
        _engine()
        assert fake.calls == [dict(num_caches=5, state_shapes=SHAPES, device="cuda")]


def test_dlinfers_allocate_is_left_alone_where_lmdeploy_never_calls_it(dlinfer_allocate, activate_bridges):
    if PASSES_STATE_SPECS:
        pytest.skip(f"lmdeploy {RELEASE}'s StateCacheEngine calls allocate_caches: the gap tests above")
    engine = _state_cache_engine()
    installed = engine.__dict__["allocate_caches"]
    activate_bridges()
    assert engine.__dict__["allocate_caches"] is installed and bridges.applied() == ()


# -- prefill-attention: lmdeploy 0.18's dlinfer kernels over dlinfer.ops -------------------------------------------

HEADS, KV_HEADS, DIM, BLOCK = 2, 1, 8, 4
Q_LENS, KV_LENS = [3, 5, 2], [7, 9, 4]


class Recorder:
    def __init__(self):
        self.calls = []


def a50184e_ops(recorder):
    """``prefill_attention`` / ``paged_prefill_attention`` with dlinfer main's (a50184e) parameter lists and
    defaults, recording what they are given."""

    def prefill_attention(query, key, value, key_cache, value_cache, q_start_loc, q_seq_len, kv_seq_len,
                          max_q_seq_len, num_q_heads, num_kv_heads, attn_mask, softmax_scale=None, alibi_slopes=None,
                          attn_output=None):
        recorder.calls.append(("prefill_attention", dict(locals())))
        return attn_output

    def paged_prefill_attention(query, key, value, key_cache, value_cache, block_table, block_size, q_start_loc,
                                q_seq_len, kv_seq_len, cu_seq_lens_kv, max_q_seq_len, max_kv_seq_len, num_q_heads,
                                num_kv_heads, attn_mask, head_size_v=0, softmax_scale=None, alibi_slopes=None,
                                attn_output=None, kv_scales=None, kv_zeros=None, quant_bits=0):
        recorder.calls.append(("paged_prefill_attention", dict(locals())))
        return attn_output

    return {"prefill_attention": prefill_attention, "paged_prefill_attention": paged_prefill_attention}


def lmdeploy_018_form_ops(recorder):
    """Ops that take lmdeploy 0.18's calls as written (a dlinfer that followed lmdeploy)."""

    def prefill_attention(query, key, value, key_cache, value_cache, q_seq_len, kv_seq_len, max_q_seq_len,
                          num_q_heads, num_kv_heads, attn_mask, softmax_scale=None, attn_output=None,
                          actual_seq_lengths_cpu=None):
        recorder.calls.append(("prefill_attention", dict(locals())))
        return attn_output

    def paged_prefill_attention(query, key, value, key_cache, value_cache, block_table, block_size, q_seq_len,
                                kv_seq_len, max_q_seq_len, max_kv_seq_len, num_q_heads, num_kv_heads, attn_mask,
                                head_size_v=0, softmax_scale=None, attn_output=None, kv_scales=None, kv_zeros=None,
                                quant_bits=0):
        recorder.calls.append(("paged_prefill_attention", dict(locals())))
        return attn_output

    return {"prefill_attention": prefill_attention, "paged_prefill_attention": paged_prefill_attention}


@pytest.fixture
def dlinfer_ops(monkeypatch):
    """Put ``ops`` (a dict of functions) on ``dlinfer.ops`` (the test stand-in, or an installed dlinfer) as its
    own attributes, removed again afterwards; returns the module."""
    import dlinfer.ops

    def install(ops):
        for name, fn in ops.items():
            monkeypatch.setitem(vars(dlinfer.ops), name, fn)
        return dlinfer.ops

    return install


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


def _prefill_inputs(paged: bool):
    tokens = sum(Q_LENS)
    q = torch.randn(tokens, HEADS, DIM)
    k, v = torch.randn(tokens, KV_HEADS, DIM), torch.randn(tokens, KV_HEADS, DIM)
    cache = torch.zeros(8, BLOCK, KV_HEADS, DIM)
    kv = KV_LENS if paged else Q_LENS
    return dict(query_states=q, key_states=k, value_states=v, attn_output=torch.empty_like(q), key_cache=cache,
                value_cache=cache.clone(), block_offsets=_i32([[1, 2, 3], [4, 5, 6], [7, 0, 0]]),
                q_seqlens=_i32(Q_LENS), kv_seqlens=_i32(kv), max_q_seq_len=max(Q_LENS), max_kv_seq_len=max(kv),
                is_decoding=False, block_size=BLOCK, num_heads=HEADS, num_kv_heads=KV_HEADS, v_head_size=DIM,
                cu_seqlens_q=_i32([0, 3, 8, 10]), cu_seqlens_q_cpu=_i32([0, 3, 8, 10]), kv_seqlens_cpu=_i32(kv),
                attn_mask=[torch.ones(16, 16)], softmax_scale=0.5, is_prefill_no_cache=not paged)


def rms_norm(hidden_states, weight, epsilon):
    """Any other dlinfer op."""


def _equal(a, b):
    return a is b or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                      and a.device == b.device and torch.equal(a, b))


@needs_018_prefill
def test_unbridged_018_prefill_raises_on_dlinfer_mains_signatures(dlinfer_ops):
    pagedattention, flash_attention = _kernels()
    dlinfer_ops(a50184e_ops(Recorder()))
    with pytest.raises(TypeError, match="unexpected keyword argument 'actual_seq_lengths_cpu'"):
        pagedattention.paged_attention_fwd(**_prefill_inputs(paged=False))
    with pytest.raises(TypeError, match="missing 2 required positional arguments: 'num_kv_heads' and 'attn_mask'"):
        pagedattention.paged_attention_fwd(**_prefill_inputs(paged=True))


@needs_018_prefill
def test_the_bridge_hands_dlinfer_the_per_sequence_host_lengths_016_passed(dlinfer_ops, activate_bridges, caplog):
    """Prefill without cache: lmdeploy 0.16's Ascend backend gave ``q_seq_len`` and ``kv_seq_len`` as the same
    per-sequence host tensor (int32), and no ``q_start_loc``; the bridge derives them from 0.18's cumulative
    host ends."""
    pagedattention, _ = _kernels()
    recorder = Recorder()
    ops = dlinfer_ops({**a50184e_ops(recorder), "rms_norm": rms_norm})
    with caplog.at_level(logging.INFO, logger="vendor_graph"):
        activate_bridges()
    assert pagedattention.ext_ops is not ops and pagedattention.ext_ops.rms_norm is rms_norm  # the rest: dlinfer's
    inputs = _prefill_inputs(paged=False)
    assert pagedattention.paged_attention_fwd(**inputs) is inputs["attn_output"]
    [(name, got)] = recorder.calls
    assert name == "prefill_attention"
    assert _equal(got["q_seq_len"], _i32(Q_LENS)) and _equal(got["kv_seq_len"], _i32(Q_LENS))
    assert _equal(got["q_start_loc"], _i32([0, 3, 8]))
    for ours, theirs in (("query", "query_states"), ("key", "key_states"), ("value", "value_states"),
                         ("key_cache", "key_cache"), ("value_cache", "value_cache"), ("attn_mask", "attn_mask"),
                         ("attn_output", "attn_output"), ("softmax_scale", "softmax_scale")):
        assert got[ours] is inputs[theirs], ours
    assert (got["max_q_seq_len"], got["num_q_heads"], got["num_kv_heads"], got["alibi_slopes"]) == (5, 2, 1, None)
    targets = sorted(a.target for a in bridges.applied())
    assert targets == [f"lmdeploy.pytorch.kernels.dlinfer.{m}.ext_ops" for m in ("flash_attention", "pagedattention")]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "bridge" in r.getMessage()]
    assert lines == [f"vendor_graph: bridge prefill-attention on {t}: {bridges.PREFILL_ATTENTION.fixes}"
                     for t in targets]


@needs_018_prefill
def test_paged_prefill_gets_cumulative_query_ends_and_per_sequence_kv_lengths(dlinfer_ops, activate_bridges):
    """Paged prefill: 0.16's Ascend backend gave the cumulative host query lengths (int32) and per-sequence host
    KV lengths, which 0.18 passes too (shifted by the two arguments it dropped); the bridge adds ``q_start_loc``
    and ``cu_seq_lens_kv`` derived from them."""
    pagedattention, _ = _kernels()
    recorder = Recorder()
    dlinfer_ops(a50184e_ops(recorder))
    activate_bridges()
    inputs = _prefill_inputs(paged=True)
    pagedattention.paged_attention_fwd(**inputs)
    [(name, got)] = recorder.calls
    assert name == "paged_prefill_attention"
    assert _equal(got["q_seq_len"], _i32([3, 8, 10])) and _equal(got["kv_seq_len"], _i32(KV_LENS))
    assert _equal(got["q_start_loc"], _i32([0, 3, 8])) and _equal(got["cu_seq_lens_kv"], _i32([0, 7, 16, 20]))
    assert got["block_table"] is inputs["block_offsets"] and got["attn_mask"] is inputs["attn_mask"]
    assert (got["block_size"], got["max_q_seq_len"], got["max_kv_seq_len"], got["num_q_heads"], got["num_kv_heads"],
            got["head_size_v"], got["softmax_scale"], got["quant_bits"]) == (BLOCK, 5, 9, HEADS, KV_HEADS, DIM, 0.5, 0)
    assert got["kv_scales"] is None and got["kv_zeros"] is None and got["alibi_slopes"] is None


@needs_018_prefill
def test_the_flash_attention_kernel_is_bridged_too(dlinfer_ops, activate_bridges):
    _, flash_attention = _kernels()
    recorder = Recorder()
    dlinfer_ops(a50184e_ops(recorder))
    activate_bridges()
    q = torch.randn(sum(Q_LENS), HEADS, DIM)
    out = torch.empty_like(q)
    starts = _i32([0, 3, 8])
    flash_attention.flash_attention_fwd(q, q, q, out, starts, _i32(Q_LENS), starts, _i32(Q_LENS), HEADS, HEADS,
                                        max_q_seqlen=5)
    [(_, got)] = recorder.calls
    assert _equal(got["q_seq_len"], _i32(Q_LENS)) and _equal(got["q_start_loc"], starts)
    assert got["attn_mask"] == [] and got["key_cache"] is None and got["attn_output"] is out


@needs_018_prefill
@pytest.mark.parametrize("vendor", [None, "ppu"])
def test_the_prefill_bridge_stands_aside_with_a_warning_for_a_vendor_whose_016_call_it_does_not_know(
        dlinfer_ops, activate_bridges, monkeypatch, caplog, vendor):
    """The bridge reproduces lmdeploy 0.16's call per dlinfer vendor (Ascend's host lengths, Camb's and MACA's
    device tensors); for another vendor, or none recognised, it says why it does not install rather than guess."""
    pagedattention, _ = _kernels()
    ops = dlinfer_ops(a50184e_ops(Recorder()))
    monkeypatch.setattr(bridges, "dlinfer_vendor", lambda: vendor)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        activate_bridges()
    assert pagedattention.ext_ops is ops and bridges.applied() == ()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(f"dlinfer's vendor here is {vendor}" in w and "pagedattention" in w and "ascend, camb, maca" in w
               for w in warnings), warnings


# -- prefill-attention on Camb and MACA: lmdeploy 0.18's step, in lmdeploy 0.16's device tensors -----------------

CUDA_STYLE = ("camb", "maca")
CU_SEQLENS = [0, 3, 8, 10]  # Q_LENS cumulated
BLOCKS = [[1, 2, 3], [4, 5, 6], [7, 0, 0]]


def cuda_style_ops(recorder):
    """``dlinfer.ops``' two prefill ops (a50184e's ``ops/llm.py`` parameter lists and defaults), handing their
    arguments to the vendor's function positionally as dlinfer does (``prefill_attention`` drops ``key_cache``,
    ``value_cache`` and ``kv_seq_len``, ``paged_prefill_attention`` drops ``head_size_v``): recorders with the
    parameter lists of dlinfer's ``vendor/camb/camb_ops.py`` and ``vendor/maca/maca_ops.py`` (the same for both).
    Plus a ``fill_kv_cache`` that writes nothing (lmdeploy's attention layer fills the cache first)."""

    def vendor_prefill_attention(query, key, value, q_start_loc, q_seq_len, max_q_seq_len, num_q_heads, num_kv_heads,
                                 attn_mask, softmax_scale, alibi_slopes, attn_output):
        arguments = dict(locals())
        del arguments["recorder"]  # locals() has the closure's free variable too
        recorder.calls.append(("prefill_attention", arguments))
        return attn_output

    def vendor_paged_prefill_attention(query, key, value, key_cache, value_cache, block_table, block_size,
                                       q_start_loc, q_seq_len, kv_seq_len, cu_seq_lens_kv, max_q_seq_len,
                                       max_kv_seq_len, num_q_heads, num_kv_heads, attn_mask, softmax_scale,
                                       alibi_slopes, attn_output, kv_scales, kv_zeros, quant_bits):
        arguments = dict(locals())
        del arguments["recorder"]
        recorder.calls.append(("paged_prefill_attention", arguments))
        return attn_output

    def prefill_attention(query, key, value, key_cache, value_cache, q_start_loc, q_seq_len, kv_seq_len,
                          max_q_seq_len, num_q_heads, num_kv_heads, attn_mask, softmax_scale=None, alibi_slopes=None,
                          attn_output=None):
        recorder.kv_seq_len.append(kv_seq_len)
        return vendor_prefill_attention(query, key, value, q_start_loc, q_seq_len, max_q_seq_len, num_q_heads,
                                        num_kv_heads, attn_mask, softmax_scale, alibi_slopes, attn_output)

    def paged_prefill_attention(query, key, value, key_cache, value_cache, block_table, block_size, q_start_loc,
                                q_seq_len, kv_seq_len, cu_seq_lens_kv, max_q_seq_len, max_kv_seq_len, num_q_heads,
                                num_kv_heads, attn_mask, head_size_v=0, softmax_scale=None, alibi_slopes=None,
                                attn_output=None, kv_scales=None, kv_zeros=None, quant_bits=0):
        return vendor_paged_prefill_attention(query, key, value, key_cache, value_cache, block_table, block_size,
                                              q_start_loc, q_seq_len, kv_seq_len, cu_seq_lens_kv, max_q_seq_len,
                                              max_kv_seq_len, num_q_heads, num_kv_heads, attn_mask, softmax_scale,
                                              alibi_slopes, attn_output, kv_scales, kv_zeros, quant_bits)

    def fill_kv_cache(key, value, key_cache, value_cache, kv_indices, k_scales_zeros=(), v_scales_zeros=(),
                      quant_bits=0):
        return key_cache, value_cache

    recorder.kv_seq_len = []
    recorder.vendor = {"prefill_attention": vendor_prefill_attention,
                       "paged_prefill_attention": vendor_paged_prefill_attention}
    return {"prefill_attention": prefill_attention, "paged_prefill_attention": paged_prefill_attention,
            "fill_kv_cache": fill_kv_cache}


def op_backend(vendor):
    import importlib

    module = importlib.import_module(f"lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend")
    return getattr(module, f"{vendor.capitalize()}OpsBackend")


def activate_cuda_style(vendor):
    """What ``vendor_graph.<vendor>``'s activation adds that these steps need on lmdeploy 0.18: its metadata fix
    (lmdeploy's own Camb/MACA ``update_step_context`` raises without it) and the bridges."""
    from vendor_graph.install import metadata_fix

    def setup(activation):
        activation.add(metadata_fix.metadata_fix_patch(op_backend(vendor)))
        bridges.install(activation)

    return patching.activate(vendor, setup)


def cuda_style_prefills(vendor, device):
    """lmdeploy 0.18 running the test's three prefills on ``vendor`` with its tensors on ``device``: a step without
    cache and one over a cache (lengths Q_LENS / Q_LENS and Q_LENS / KV_LENS), each through lmdeploy's own
    ``update_step_context`` and ``DlinferAttentionImpl.forward``, and a vision tower's flash attention
    (``DlinferFlashAttentionImpl.forward`` given ``cu_seqlens[:-1]`` and its differences, as Qwen2-VL's does).
    Returns ``{case: (inputs, metadata)}``; what reached dlinfer is on the recorder."""
    from types import SimpleNamespace

    from lmdeploy.pytorch.backends.dlinfer.attention import DlinferAttentionImpl
    from lmdeploy.pytorch.backends.dlinfer.flash_attention import DlinferFlashAttentionImpl

    backend = op_backend(vendor)
    generator = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(device)

    seen = {}
    for case, kv_lens in (("prefill", Q_LENS), ("paged_prefill", KV_LENS)):
        backend.total_slots = None  # lmdeploy caches its slot table on the class
        shape = (8, KV_HEADS, BLOCK, DIM) if vendor == "camb" else (8, BLOCK, KV_HEADS, DIM)
        q_seqlens = torch.tensor(Q_LENS, device=device)  # lmdeploy's StepContext: int64, on the device
        history = torch.tensor(kv_lens, device=device) - q_seqlens
        context = SimpleNamespace(
            kv_caches=[(randn(*shape), randn(*shape))], is_decoding=False, q_seqlens=q_seqlens,
            kv_seqlens=q_seqlens + history, q_start_loc=q_seqlens.cumsum(0) - q_seqlens,
            block_offsets=torch.tensor(BLOCKS, device=device), attn_metadata=None)
        meta = backend.update_step_context(context).attn_metadata
        inputs = dict(query=randn(sum(Q_LENS), HEADS, DIM), key=randn(sum(Q_LENS), KV_HEADS, DIM),
                      value=randn(sum(Q_LENS), KV_HEADS, DIM), k_cache=context.kv_caches[0][0],
                      v_cache=context.kv_caches[0][1])
        impl = DlinferAttentionImpl(HEADS, DIM, scale=0.5, num_kv_heads=KV_HEADS, v_head_size=DIM)
        impl.forward(**inputs, attn_metadata=meta)
        seen[case] = inputs, meta
    backend.total_slots = None
    cu_seqlens = torch.tensor(CU_SEQLENS, dtype=torch.int32, device=device)  # a vision tower's
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    inputs = dict(query=randn(sum(Q_LENS), HEADS, DIM), key=randn(sum(Q_LENS), HEADS, DIM),
                  value=randn(sum(Q_LENS), HEADS, DIM), q_start_loc=cu_seqlens[:-1], q_seqlens=lengths)
    DlinferFlashAttentionImpl(HEADS, DIM, scale=0.5).forward(**inputs, kv_start_loc=inputs["q_start_loc"],
                                                             kv_seqlens=lengths, max_q_seqlen=max(Q_LENS))
    seen["flash"] = inputs, None
    return seen


def describe(value):
    """A value dlinfer's vendor function got, as data: a tensor's device type, dtype and values (a float tensor's
    shape instead of its values), a sequence item by item."""
    if isinstance(value, torch.Tensor):
        data = value.cpu().tolist() if not value.is_floating_point() else list(value.shape)
        return {"device": value.device.type, "dtype": str(value.dtype).removeprefix("torch."), "values": data}
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return int(value) if isinstance(value, int) else value


def expected_016(vendor, case, device):
    """What lmdeploy 0.16/0.17 handed dlinfer's ``vendor`` prefill function for the test's step, written out from
    their Camb/MACA ``update_step_context`` and dlinfer kernels (independently of the bridge): every length a
    tensor on the device. ``q_start_loc``: ``cu_seqlens`` (``cat(q_start_loc, total).int()``, batch + 1) from the
    attention metadata, or the flash kernel's own (per-sequence starts); Camb passes StepContext's int64
    ``q_seqlens`` unconverted and builds ``cu_seq_lens_kv``, MACA converts with ``.int()`` and passes None."""

    def tensor(values, dtype):
        return {"device": device, "dtype": dtype, "values": values}

    q_dtype = "int64" if vendor == "camb" else "int32"
    common = dict(num_q_heads=HEADS, num_kv_heads=KV_HEADS, softmax_scale=0.5, alibi_slopes=None)
    if case == "flash":
        return dict(common, num_kv_heads=HEADS, q_start_loc=tensor(CU_SEQLENS[:-1], "int32"),
                    q_seq_len=tensor(Q_LENS, "int32"), max_q_seq_len=max(Q_LENS), attn_mask=[])
    mask = None if vendor == "camb" else []
    if case == "prefill":
        return dict(common, q_start_loc=tensor(CU_SEQLENS, "int32"), q_seq_len=tensor(Q_LENS, q_dtype),
                    max_q_seq_len=max(Q_LENS), attn_mask=mask)
    return dict(common, q_start_loc=tensor(CU_SEQLENS, "int32"), q_seq_len=tensor(Q_LENS, q_dtype),
                kv_seq_len=tensor(KV_LENS, "int32"),
                cu_seq_lens_kv=tensor([0, 7, 16, 20], "int32") if vendor == "camb" else None,
                max_q_seq_len=max(Q_LENS), max_kv_seq_len=max(KV_LENS), block_table=tensor(BLOCKS, "int32"),
                block_size=BLOCK, attn_mask=mask, kv_scales=None, kv_zeros=None, quant_bits=0)


def host_reads(calls):
    """The (op, argument) of each length tensor on the host in a call whose query is on a device: what lmdeploy
    0.16's Camb/MACA backends never passed, and their kernels (``tmo.flash_attention``, ``flash_attn_varlen_func``,
    the context-attention kernel) read on the device."""
    return [(name, arg) for name, got in calls if got["query"]["device"] != "cpu"
            for arg, value in got.items() if isinstance(value, dict) and value["dtype"].startswith("int")
            and value["device"] == "cpu"]


@pytest.fixture
def cuda_style_bridge(dlinfer_ops, monkeypatch):
    """(vendor -> the recorder) activating ``vendor`` as ``activate_cuda_style`` does, with dlinfer's vendor that
    one and its ops the recorders."""

    def activate(vendor):
        recorder = Recorder()
        dlinfer_ops(cuda_style_ops(recorder))
        monkeypatch.setattr(bridges, "dlinfer_vendor", lambda: vendor)
        monkeypatch.setattr(op_backend(vendor), "total_slots", None)
        activate_cuda_style(vendor)
        return recorder

    yield activate
    vendor_graph.uninstall()


@needs_018_prefill
@pytest.mark.parametrize("vendor", CUDA_STYLE)
def test_018_prefills_reach_camb_and_maca_with_what_016_passed(cuda_style_bridge, vendor):
    """lmdeploy 0.18's step through its own Camb/MACA backend and kernels reaches dlinfer's vendor function with
    lmdeploy 0.16's arguments, value by value and dtype by dtype; the tensors 0.18 still passes (lengths, query,
    caches, block table, output) are the same objects."""
    recorder = cuda_style_bridge(vendor)
    seen = cuda_style_prefills(vendor, "cpu")
    assert [name for name, _ in recorder.calls] == ["prefill_attention", "paged_prefill_attention",
                                                    "prefill_attention"]
    for case, (_, got) in zip(("prefill", "paged_prefill", "flash"), recorder.calls, strict=True):
        expected = expected_016(vendor, case, "cpu")
        assert {k: describe(got[k]) for k in expected} == expected, case
        inputs, meta = seen[case]
        assert got["query"] is inputs["query"] and got["key"] is inputs["key"] and got["value"] is inputs["value"]
        if case != "flash":  # the attention layer writes in place (0.16 and 0.18); flash into a new tensor
            assert got["attn_output"].data_ptr() == inputs["query"].data_ptr()
        if case == "prefill":
            assert got["q_seq_len"] is meta.q_seqlens  # the device tensor 0.16 passed, as 0.18 still does
        elif case == "paged_prefill":
            assert got["block_table"] is meta.block_offsets
            assert got["key_cache"] is inputs["k_cache"] and got["value_cache"] is inputs["v_cache"]
        else:
            assert got["q_seq_len"] is inputs["q_seqlens"]
    # prefill_attention's kv_seq_len, which dlinfer does not hand its Camb/MACA function: 0.16's device tensors
    no_cache, flash = recorder.kv_seq_len
    assert no_cache is seen["prefill"][1].kv_seqlens and no_cache.dtype == torch.int32 and no_cache.tolist() == Q_LENS
    assert flash is seen["flash"][0]["q_seqlens"]
    targets = sorted(a.target for a in bridges.applied())
    assert targets == [f"lmdeploy.pytorch.kernels.dlinfer.{m}.ext_ops" for m in ("flash_attention", "pagedattention")]


@needs_018_prefill
def test_unbridged_018_prefill_on_camb_raises(dlinfer_ops, monkeypatch):
    monkeypatch.setenv(ENV, "off")
    dlinfer_ops(cuda_style_ops(Recorder()))
    monkeypatch.setattr(op_backend("camb"), "total_slots", None)
    activate_cuda_style("camb")
    try:
        with pytest.raises(TypeError, match="actual_seq_lengths_cpu"):
            cuda_style_prefills("camb", "cpu")
    finally:
        vendor_graph.uninstall()


def test_the_q_start_loc_forms_name_lmdeploys_calling_functions():
    """The kernel functions :data:`bridges.Q_START_LOC` names are the ones making lmdeploy's prefill_attention
    calls (read from the installed lmdeploy's source), on every release."""
    forms = [f for module in _kernels() for f in bridges.call_forms(module, "prefill_attention", ("ext_ops",))]
    assert sorted(f.function for f in forms) == sorted(bridges.Q_START_LOC)


@needs_018_prefill
def test_a_camb_call_from_a_kernel_function_the_bridge_does_not_know_is_left_alone(
        dlinfer_ops, monkeypatch, caplog, tmp_path):
    """On Camb/MACA the q_start_loc lmdeploy 0.16 passed depends on the calling kernel; for an unknown one the
    bridge does not guess (on Ascend, whose kernels do not read it, it adapts)."""
    from load_by_path import load_by_path

    source = tmp_path / "vg_unknown_kernel.py"
    source.write_text("import dlinfer.ops as ext_ops\n\n\n"
                      "def sliding_window_fwd(q, k, v, out, q_seqlens, ends):\n"
                      "    return ext_ops.prefill_attention(q, k, v, None, None, q_seqlens, q_seqlens, 5, 2, 1, [],\n"
                      "                                     attn_output=out, actual_seq_lengths_cpu=ends)\n")
    module = load_by_path("vg_unknown_kernel", source)
    monkeypatch.delitem(sys.modules, "vg_unknown_kernel")
    dlinfer_ops(cuda_style_ops(Recorder()))
    for vendor, bridged in (("camb", False), ("ascend", True)):
        monkeypatch.setattr(bridges, "dlinfer_vendor", lambda vendor=vendor: vendor)
        activation = patching.activate(vendor, lambda activation: None)
        with caplog.at_level(logging.WARNING, logger="vendor_graph"):
            bridges._check_kernels(activation, module)
        assert (module.ext_ops is not sys.modules["dlinfer.ops"]) is bridged, vendor
        vendor_graph.uninstall()
        assert module.ext_ops is sys.modules["dlinfer.ops"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "from sliding_window_fwd" in warnings[0] and "camb" in warnings[0], warnings


def test_the_recorders_have_dlinfers_parameter_lists(dlinfer_available):
    """The recorders' parameter lists are dlinfer's: ``ops/llm.py``'s ops (without the defaults its decorator
    adds) and the vendor functions of ``vendor/camb/camb_ops.py`` and ``vendor/maca/maca_ops.py``, read from the
    source (their modules import torch_mlu_ops / flash_attn, which are not here)."""
    import ast
    import importlib.util

    origin, root = dlinfer_available
    package = root / "dlinfer" if root is not None else Path(importlib.util.find_spec("dlinfer").origin).parent

    def parameters(path, name):
        tree = ast.parse((package / path).read_text())
        [function] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        return [a.arg for a in function.args.args]

    recorder = Recorder()
    ops = cuda_style_ops(recorder)
    for name in ("prefill_attention", "paged_prefill_attention"):
        assert list(inspect.signature(ops[name]).parameters) == parameters("ops/llm.py", name)
        assert list(inspect.signature(a50184e_ops(recorder)[name]).parameters) == parameters("ops/llm.py", name)
        for vendor in CUDA_STYLE:
            assert list(inspect.signature(recorder.vendor[name]).parameters) == parameters(
                f"vendor/{vendor}/{vendor}_ops.py", name), (vendor, name)


# -- the same prefills with the tensors on a device, in a child process -----------------------------------------

CUDA_STYLE_PROBE = r"""
import json, sys
from pathlib import Path
from vendor_graph_sim import device as sim

sim.install()  # the simulator's device: not the host, as Camb's MLU and MACA's GPU are not
here = Path(sys.argv[1])
sys.path[:0] = [str(here), str(here.parent)]
from load_by_path import load_by_path
tests = load_by_path("_vg_test_bridges", here / "test_bridges.py")
import dlinfer.ops
import vendor_graph
from vendor_graph.install import bridges

out = {}
for vendor, form in (("camb", "camb"), ("maca", "maca"), ("camb", "ascend")):
    recorder = tests.Recorder()
    for name, fn in tests.cuda_style_ops(recorder).items():
        setattr(dlinfer.ops, name, fn)
    bridges.dlinfer_vendor = lambda form=form: form
    tests.activate_cuda_style(vendor)
    tests.cuda_style_prefills(vendor, sim.installed())
    vendor_graph.uninstall()
    out[f"{vendor} as {form}"] = [[name, {k: tests.describe(v) for k, v in got.items()}]
                                  for name, got in recorder.calls]
print(json.dumps({"device": sim.installed(), "runs": out}))
"""


@pytest.fixture(scope="module")
def on_a_device():
    """:func:`cuda_style_prefills` on the simulator's device (its own process: it takes torch's one PrivateUse1
    slot), for Camb and MACA, and for Camb with the bridge in Ascend's form (host lengths)."""
    proc = subprocess.run([sys.executable, "-c", CUDA_STYLE_PROBE, str(Path(__file__).resolve().parent)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def check_016_calls(calls, vendor, device):
    """``calls`` (described) are lmdeploy 0.16's for the test's three prefills on ``vendor``, its lengths on
    ``device``; AssertionError naming the first difference otherwise."""
    assert [name for name, _ in calls] == ["prefill_attention", "paged_prefill_attention", "prefill_attention"]
    assert host_reads(calls) == [], "host lengths where lmdeploy 0.16 gave the device kernel device tensors"
    for case, (_, got) in zip(("prefill", "paged_prefill", "flash"), calls, strict=True):
        expected = expected_016(vendor, case, device)
        assert {k: got[k] for k in expected} == expected, case
        assert got["query"]["device"] == device


@needs_018_prefill
@pytest.mark.parametrize("vendor", CUDA_STYLE)
def test_on_a_device_camb_and_maca_get_016s_device_tensors(on_a_device, vendor):
    """On a device, every length dlinfer's Camb/MACA function gets is a device tensor, as lmdeploy 0.16 gave it
    (the bridge copies 0.18's host lengths over where 0.18 passes no device ones), with 0.16's values."""
    device = on_a_device["device"]
    assert device != "cpu"
    check_016_calls(on_a_device["runs"][f"{vendor} as {vendor}"], vendor, device)


@needs_018_prefill
def test_host_lengths_handed_to_camb_fail_the_device_check(on_a_device):
    """The failure put back: the bridge in Ascend's form on Camb hands its kernels host lengths (what the bridge
    did for every vendor before): the check above refuses them, naming each."""
    calls = on_a_device["runs"]["camb as ascend"]
    assert {("prefill_attention", "q_start_loc"), ("paged_prefill_attention", "q_start_loc"),
            ("paged_prefill_attention", "cu_seq_lens_kv")} <= set(host_reads(calls))
    with pytest.raises(AssertionError, match="host lengths"):
        check_016_calls(calls, "camb", on_a_device["device"])


@needs_018_prefill
@pytest.mark.parametrize("value", ["off", "state-cache"])
def test_the_setting_leaves_the_prefill_bridge_out(dlinfer_ops, activate_bridges, value):
    pagedattention, _ = _kernels()
    ops = dlinfer_ops(a50184e_ops(Recorder()))
    activate_bridges(**{ENV: value})
    assert pagedattention.ext_ops is ops and bridges.applied() == ()
    with pytest.raises(TypeError, match="actual_seq_lengths_cpu"):
        pagedattention.paged_attention_fwd(**_prefill_inputs(paged=False))


@needs_018_prefill
def test_uninstall_gives_the_kernels_dlinfer_ops_back(dlinfer_ops, activate_bridges):
    kernels = _kernels()
    ops = dlinfer_ops(a50184e_ops(Recorder()))
    activate_bridges()
    assert all(k.ext_ops is not ops for k in kernels)
    vendor_graph.uninstall()
    assert all(k.ext_ops is ops for k in kernels) and bridges.applied() == ()


def test_the_prefill_bridge_stands_aside_where_dlinfer_takes_lmdeploys_call(dlinfer_ops, activate_bridges):
    """On every release, ops whose signatures take the installed lmdeploy's calls (dlinfer main's on 0.16/0.17,
    0.18's own form on 0.18) are left alone, and lmdeploy's call reaches them as written."""
    pagedattention, _ = _kernels()
    recorder = Recorder()
    ops = dlinfer_ops((lmdeploy_018_form_ops if PREFILL_BY_CPU_ENDS else a50184e_ops)(recorder))
    activate_bridges()
    assert pagedattention.ext_ops is ops and bridges.applied() == ()
    if PREFILL_BY_CPU_ENDS:
        pagedattention.paged_attention_fwd(**_prefill_inputs(paged=False))
        [(_, got)] = recorder.calls
        assert _equal(got["actual_seq_lengths_cpu"], _i32([3, 8, 10])) and _equal(got["q_seq_len"], _i32(Q_LENS))


def test_a_call_the_bridge_cannot_adapt_is_left_alone_with_a_warning(dlinfer_ops, activate_bridges, caplog):
    """Ops that fit neither lmdeploy's call nor what the bridge adapts to: 0.18-form ops under 0.16/0.17 (whose
    calls are not the form the bridge adapts), or under 0.18 a prefill_attention wanting one more argument."""
    pagedattention, _ = _kernels()
    if PREFILL_BY_CPU_ENDS:
        ops = a50184e_ops(Recorder())

        def prefill_attention(query, key, value, key_cache, value_cache, q_start_loc, q_seq_len, kv_seq_len,
                              max_q_seq_len, num_q_heads, num_kv_heads, attn_mask, softmax_scale=None,
                              alibi_slopes=None, attn_output=None, *, window):
            raise AssertionError("never called")

        ops["prefill_attention"] = prefill_attention
    else:
        ops = lmdeploy_018_form_ops(Recorder())
    installed = dlinfer_ops(ops)
    with caplog.at_level(logging.WARNING, logger="vendor_graph"):
        activate_bridges()
    assert pagedattention.ext_ops is installed or "prefill_attention" not in vars(pagedattention.ext_ops)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("dlinfer.ops.prefill_attention" in w and "cannot adapt them" in w for w in warnings), warnings


# -- the real dlinfer (a50184e) on the simulated NPU, in a child process ----------------------------------------

PROBE = r"""
import json, os, sys, types
import torch
import vendor_graph
from vendor_graph.install import bridges, patching
from vendor_graph_sim import device as sim, realstack

def lengths(t):
    return {"values": t.tolist(), "dtype": str(t.dtype).removeprefix("torch."), "device": t.device.type}

def attempt(fn):
    try:
        fn()
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"

def state_cache_calls(own):
    from lmdeploy.pytorch.config import StateCacheSpec
    from lmdeploy.pytorch.engine import cache_engine
    engine_cls = cache_engine.StateCacheEngine
    shapes = [((4, 8), torch.float16), ((3,), torch.float32)]
    built = {}
    def build(case, specs, states_shapes=shapes):
        config = types.SimpleNamespace(states_shapes=states_shapes, num_state_caches=5)
        engine = engine_cls(config, types.SimpleNamespace(state_cache_specs=specs, num_layers=2))
        built[case] = {"shapes": [list(c.shape) for c in engine.state_caches],
                       "dtypes": [str(c.dtype).removeprefix("torch.") for c in engine.state_caches],
                       "devices": [c.device.type for c in engine.state_caches],
                       "zero": all(bool((c == 0).all()) for c in engine.state_caches),
                       "names": list(engine.named_state_caches)}
    specs = [StateCacheSpec("a", (4, 8), torch.float16), StateCacheSpec("b", (3,), torch.float32)]
    errors = {
        "shapes": attempt(lambda: build("shapes", [])),
        "specs": attempt(lambda: build("specs", specs, states_shapes=[((9,), torch.float16)])),
        "layered": attempt(lambda: build("layered", [StateCacheSpec("w", (4, 8), torch.float16, layer_ids=[0, 1])])),
        "size": attempt(lambda: built.update(size=engine_cls.get_cache_state_size(shapes, state_specs=None,
                                                                                   num_layers=2))),
    }
    pool, _ = own.__func__(num_caches=1, state_shapes=shapes, device="meta", state_specs=None, num_layers=2)
    return {"errors": errors, "built": built, "lmdeploy_size": pool.numel() * pool.element_size()}

def prefill_calls(seen):
    from lmdeploy.pytorch.kernels.dlinfer import flash_attention, pagedattention
    import dlinfer.ops as ops
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block_size = 2, 1, 128, 16
    def randn(*shape):
        return torch.randn(*shape, generator=g).to(torch.float16).to("npu")
    q, k, v = randn(10, heads, dim), randn(10, kv_heads, dim), randn(10, kv_heads, dim)
    kc, vc = randn(8, block_size, kv_heads, dim), randn(8, block_size, kv_heads, dim)
    blocks = torch.tensor([[1, 2], [3, 4], [5, 6]], dtype=torch.int32).to("npu")
    mask = [torch.triu(torch.ones(2048, 2048, dtype=torch.int8), diagonal=1).to("npu")]
    q_dev = torch.tensor([3, 5, 2], dtype=torch.int32).to("npu")
    cu_cpu = torch.tensor([0, 3, 8, 10], dtype=torch.int32)
    kv_cpu = torch.tensor([7, 9, 4], dtype=torch.int32)
    per_seq = torch.tensor([3, 5, 2], dtype=torch.int32)
    starts = torch.tensor([0, 3, 8], dtype=torch.int32).to("npu")
    common = dict(block_size=block_size, num_heads=heads, num_kv_heads=kv_heads, v_head_size=dim, attn_mask=mask,
                  cu_seqlens_q=cu_cpu.to("npu"), cu_seqlens_q_cpu=cu_cpu, softmax_scale=None, is_decoding=False)
    results = {}
    def run(case, lmdeploy_call, reference_call):
        seen.clear()
        got = {}
        error = attempt(lambda: got.update(out=lmdeploy_call().cpu()))
        to_vendor = list(seen)
        seen.clear()
        reference = reference_call().cpu()
        results[case] = {"error": error, "to_vendor": to_vendor, "reference_to_vendor": list(seen),
                         "equal": "out" in got and torch.equal(got["out"], reference),
                         "nonzero": bool(reference.abs().sum() > 0)}
    # each reference is the call lmdeploy 0.16 made to the same dlinfer.ops function, with its Ascend values
    run("prefill", lambda: pagedattention.paged_attention_fwd(
        q, k, v, torch.empty_like(q), kc, vc, blocks, q_seqlens=q_dev, kv_seqlens=q_dev, max_q_seq_len=5,
        max_kv_seq_len=5, kv_seqlens_cpu=per_seq, is_prefill_no_cache=True, **common),
        lambda: ops.prefill_attention(q, k, v, kc, vc, None, per_seq, per_seq, 5, heads, kv_heads, mask,
                                      softmax_scale=None, attn_output=torch.empty_like(q)))
    run("paged_prefill", lambda: pagedattention.paged_attention_fwd(
        q, k, v, torch.empty_like(q), kc, vc, blocks, q_seqlens=q_dev, kv_seqlens=kv_cpu.to("npu"),
        max_q_seq_len=5, max_kv_seq_len=9, kv_seqlens_cpu=kv_cpu, is_prefill_no_cache=False, **common),
        lambda: ops.paged_prefill_attention(q, k, v, kc, vc, blocks, block_size, None, cu_cpu[1:].clone(), kv_cpu,
                                            None, 5, 9, heads, kv_heads, mask, head_size_v=dim, softmax_scale=None,
                                            attn_output=torch.empty_like(q), kv_scales=None, kv_zeros=None,
                                            quant_bits=0))
    run("flash", lambda: flash_attention.flash_attention_fwd(
        q, k, v, torch.empty_like(q), starts, q_dev, starts, q_dev, heads, kv_heads, max_q_seqlen=5),
        lambda: ops.prefill_attention(q, k, v, None, None, starts, q_dev, q_dev, 5, heads, kv_heads, attn_mask=[],
                                      softmax_scale=None, attn_output=torch.empty_like(q)))
    return results

def snapshot(state_cache, prefill, own, seen):
    import dlinfer.ops
    from lmdeploy.pytorch.engine import cache_engine
    from lmdeploy.pytorch.kernels.dlinfer import pagedattention
    allocate = cache_engine.StateCacheEngine.__dict__.get("allocate_caches")
    return {"applied": sorted([a.name, a.target] for a in bridges.applied()),
            "ext_ops_is_dlinfer_ops": pagedattention.ext_ops is dlinfer.ops,
            "allocate_caches": getattr(getattr(allocate, "__func__", allocate), "__qualname__", None),
            "state_cache": state_cache_calls(own) if state_cache else None,
            "prefill": prefill_calls(seen) if prefill else None}

state_cache, prefill = sys.argv[1] == "1", sys.argv[2] == "1"
sim.install()
with sim.use_torch_npu("G1"):
    from lmdeploy.pytorch.engine import cache_engine
    own = cache_engine.StateCacheEngine.__dict__.get("allocate_caches")
    patching.activate("ascend", bridges.install)  # a user's order: vendor_graph first, then dlinfer
    realstack.import_dlinfer()
    from dlinfer.vendor import vendor_ops_registry
    seen = []
    for name, picks in (("prefill_attention", (3, 4)), ("paged_prefill_attention", (7, 8, 9, 10))):
        def record(*args, _real=vendor_ops_registry[name], _picks=picks):
            seen.append({str(i): lengths(args[i]) if isinstance(args[i], torch.Tensor) else None for i in _picks})
            return _real(*args)
        vendor_ops_registry[name] = record
    out = {"bridged": snapshot(state_cache, prefill, own, seen)}
    vendor_graph.uninstall()
    out["uninstalled"] = snapshot(state_cache, prefill, own, seen)
    os.environ["VENDOR_GRAPH_BRIDGES"] = "off"
    patching.activate("ascend", bridges.install)  # dlinfer already imported: the check runs at activation
    out["off"] = snapshot(state_cache, prefill, own, seen)
    vendor_graph.uninstall()
    os.environ["VENDOR_GRAPH_BRIDGES"] = "auto"
    patching.activate("ascend", bridges.install)
    out["after_dlinfer"] = snapshot(state_cache, prefill, own, seen)
    vendor_graph.uninstall()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def real_dlinfer(dlinfer_available):
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != STANDINS]
    proc = subprocess.run([sys.executable, "-c", PROBE, str(int(PASSES_STATE_SPECS)), str(int(PREFILL_BY_CPU_ENDS))],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(paths)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


STATE_TARGET = "lmdeploy.pytorch.engine.cache_engine.StateCacheEngine.allocate_caches"
DLINFERS_ALLOCATE = "patch_state_cache_engine.<locals>._state_cache_engine_allocate_caches"


def test_real_dlinfer_each_bridge_installs_exactly_where_lmdeploys_call_does_not_fit(real_dlinfer):
    expected = []
    if PASSES_STATE_SPECS:
        expected.append(["state-cache", STATE_TARGET])
    if PREFILL_BY_CPU_ENDS:
        expected += [["prefill-attention", f"lmdeploy.pytorch.kernels.dlinfer.{m}.ext_ops"]
                     for m in ("flash_attention", "pagedattention")]
    for phase in ("bridged", "after_dlinfer"):
        snap = real_dlinfer[phase]
        assert snap["applied"] == sorted(expected), phase
        assert snap["ext_ops_is_dlinfer_ops"] is not PREFILL_BY_CPU_ENDS
        # 0.18: dlinfer still replaces allocate_caches, which 0.18's StateCacheEngine never calls: left as it is
        assert (snap["allocate_caches"] == DLINFERS_ALLOCATE) is not PASSES_STATE_SPECS
    for phase in ("uninstalled", "off"):
        snap = real_dlinfer[phase]
        assert snap["applied"] == [] and snap["ext_ops_is_dlinfer_ops"], phase
        assert snap["allocate_caches"] == DLINFERS_ALLOCATE


@needs_state_specs
def test_real_dlinfer_allocates_lmdeploys_state_caches_through_the_bridge(real_dlinfer):
    for phase in ("bridged", "after_dlinfer"):
        calls = real_dlinfer[phase]["state_cache"]
        errors, built = calls["errors"], calls["built"]
        assert errors["shapes"] is None and errors["specs"] is None and errors["size"] is None, errors
        assert built["shapes"] == {"shapes": [[5, 4, 8], [5, 3]], "dtypes": ["float16", "float32"],
                                   "devices": ["npu", "npu"], "zero": True, "names": ["state_0", "state_1"]}
        assert built["specs"] == dict(built["shapes"], names=["a", "b"])
        assert built["size"] == calls["lmdeploy_size"]  # dlinfer's sizing, reached through lmdeploy's own caller
        assert errors["layered"].startswith("StateSpecsNotSupported:") and "w (layer_ids [0, 1]" in errors["layered"]
    for phase in ("uninstalled", "off"):
        errors = real_dlinfer[phase]["state_cache"]["errors"]
        assert set(errors.values()) == {f"TypeError: {DLINFERS_ALLOCATE}() got an unexpected keyword argument "
                                        f"'state_specs'"}, phase


@needs_018_prefill
def test_real_dlinfer_prefills_through_the_bridge_as_lmdeploy_016_did(real_dlinfer):
    """lmdeploy 0.18's kernels, bridged, reach dlinfer's Ascend kernels with the host lengths lmdeploy 0.16
    gave (per sequence without cache; cumulative queries and per-sequence KV with one) and compute what the 0.16
    call computes, on the emulated kernels."""
    def host(values):
        return {"values": values, "dtype": "int32", "device": "cpu"}

    for phase in ("bridged", "after_dlinfer"):
        runs = real_dlinfer[phase]["prefill"]
        for case, run in runs.items():
            assert run["error"] is None and run["equal"] and run["nonzero"], (phase, case, run["error"])
        prefill, paged = runs["prefill"], runs["paged_prefill"]
        assert [c["4"] for c in prefill["to_vendor"]] == [c["4"] for c in prefill["reference_to_vendor"]] == [
            host([3, 5, 2])]
        assert [c["3"] for c in prefill["to_vendor"]] == [host([0, 3, 8])]
        assert [(c["8"], c["9"]) for c in paged["to_vendor"]] == [
            (c["8"], c["9"]) for c in paged["reference_to_vendor"]] == [(host([3, 8, 10]), host([7, 9, 4]))]
        assert [(c["7"], c["10"]) for c in paged["to_vendor"]] == [(host([0, 3, 8]), host([0, 7, 16, 20]))]
        assert [c["4"] for c in runs["flash"]["to_vendor"]] == [host([3, 5, 2])]
    for phase in ("uninstalled", "off"):
        runs = real_dlinfer[phase]["prefill"]
        assert runs["prefill"]["error"] == runs["flash"]["error"] == (
            "TypeError: prefill_attention() got an unexpected keyword argument 'actual_seq_lengths_cpu'"), phase
        assert runs["paged_prefill"]["error"] == ("TypeError: paged_prefill_attention() missing 2 required "
                                                  "positional arguments: 'num_kv_heads' and 'attn_mask'"), phase
