"""BufferSpec behaviour on synthetic decode steps shaped like each vendor's lmdeploy metadata."""

from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from packaging.version import Version
from torch.utils._python_dispatch import TorchDispatchMode

from vendor_graph.buffers import BATCH, BufferField, BufferSpec, GraphInputsChanged, Placement, Ref
from vendor_graph.upstream.compat import LmdeployApi
from vendor_graph.vendors.ascend.spec import ascend_spec
from vendor_graph.vendors.cuda_style import camb_spec, maca_spec

API_017 = LmdeployApi(Version("0.17.0"), frozenset(), max_q_attr="max_q_seq_len", separate_host_seqlens=False)
API_018 = LmdeployApi(Version("0.18.0"), frozenset(), max_q_attr="max_q_seqlen", separate_host_seqlens=True)
BLOCK = 16
NUM_BLOCKS = 6

SPECS = {
    "ascend-0.17": ascend_spec(API_017),
    "ascend-0.18": ascend_spec(API_018),
    "camb-0.17": camb_spec(API_017),
    "maca-0.17": maca_spec(API_017),
}


def graph_meta(batch, query_len=1):
    return SimpleNamespace(max_batchs=batch, max_tokens=batch * query_len, num_blocks=NUM_BLOCKS, device="cpu",
                           decode_query_len=query_len, input_buffers=None, is_ssm=False, use_mrope=False,
                           mla_index_topk=None)


def decode_step(name, batch, blocks, seed=0):
    """One decode step's (model inputs, attn_metadata, context) as lmdeploy hands them to a vendor."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randint(1, blocks * BLOCK + 1, (batch,), generator=g, dtype=torch.int32)
    table = torch.randint(1, 50, (batch, blocks), generator=g, dtype=torch.int32)
    slots = (table[torch.arange(batch), ((kv - 1) // BLOCK).long()] * BLOCK + (kv - 1) % BLOCK).to(torch.int32)
    inputs = {"input_ids": torch.randint(0, 1000, (1, batch), generator=g),
              "position_ids": (kv - 1).long().view(1, -1)}
    context = SimpleNamespace(kv_seqlens=kv.clone(), q_seqlens=torch.ones(batch, dtype=torch.int32),
                              q_start_loc=torch.arange(batch, dtype=torch.int64), block_offsets=table,
                              local_adapter_ids=None, moe_metadata=None)
    attn = SimpleNamespace(block_offsets=table, kv_start_indices=slots, block_size=BLOCK, attention_mask=[],
                           cache_seqlens=None, q_start_loc=None, max_kv_seq_len=None)
    vendor, release = name.split("-")
    if vendor == "ascend" and release == "0.18":
        cu = torch.arange(batch + 1, dtype=torch.int32)
        attn.__dict__.update(kv_seqlens=kv, kv_seqlens_cpu=kv.clone(), q_seqlens=torch.ones(batch, dtype=torch.int64),
                             cu_seqlens_q=cu, cu_seqlens_q_cpu=cu.clone(), q_start_loc=cu[:-1], max_q_seqlen=1,
                             max_kv_seq_len=int(kv.max()))
    elif vendor == "ascend":
        attn.__dict__.update(kv_seqlens=kv.clone(), q_seqlens=torch.arange(1, batch + 1, dtype=torch.int32),
                             max_q_seq_len=1)
    else:
        attn.__dict__.update(kv_seqlens=kv, q_seqlens=torch.ones(batch, dtype=torch.int64),
                             q_start_loc=torch.arange(batch + 1, dtype=torch.int32),
                             max_q_seq_len=1, max_kv_seq_len=int(kv.max()))
        if vendor == "maca":
            attn.kv_start_indices = slots.long().view(-1, 1)
    return inputs, attn, context


def capture(spec, name, graph_batch, batch, blocks=3, seed=0):
    meta = graph_meta(graph_batch)
    inputs, attn, ctx = decode_step(name, batch, blocks, seed)
    meta.input_buffers = spec.make(meta, inputs, attn)
    new_inputs = spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    return meta, new_inputs, attn, ctx


def step(spec, meta, name, batch, blocks=3, seed=0):
    inputs, attn, ctx = decode_step(name, batch, blocks, seed)
    new_inputs = spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    return new_inputs, attn, ctx


def snapshot(meta):
    return {k: v.clone() for k, v in meta.input_buffers.items()}


@pytest.mark.parametrize("name", SPECS)
def test_batch_3_after_7_leaves_no_stale_row(name):
    spec = SPECS[name]
    meta, *_ = capture(spec, name, graph_batch=8, batch=7, blocks=5, seed=1)
    step(spec, meta, name, batch=7, blocks=5, seed=2)
    _, attn, ctx = step(spec, meta, name, batch=3, blocks=2, seed=3)

    fresh, *_ = capture(spec, name, graph_batch=8, batch=3, blocks=2, seed=3)
    after = snapshot(meta)
    for key, tensor in snapshot(fresh).items():
        assert torch.equal(after[key], tensor), f"{name}: {key} differs from a fresh fill of batch 3"

    # And spelled out for what attention reads: padding rows write no KV slot and read block 0 only.
    assert (attn.kv_start_indices[3:] == -1).all()
    assert attn.kv_start_indices.shape[0] == 8
    assert (attn.block_offsets[3:] == 0).all() and (attn.block_offsets[:3, 2:] == 0).all()
    assert attn.block_offsets is ctx.block_offsets


@pytest.mark.parametrize("name", SPECS)
def test_everything_bound_is_padded_to_the_graph_batch(name):
    spec = SPECS[name]
    meta, new_inputs, attn, ctx = capture(spec, name, graph_batch=16, batch=5)
    assert new_inputs["input_ids"].shape == (1, 16) and new_inputs["position_ids"].shape == (1, 16)
    for f in spec.fields:
        tensor = meta.input_buffers.get(f.name)
        if tensor is None:
            continue
        rows = tensor.shape[f.row_dim]
        assert rows in (16, 17), f"{f.name} has {rows} rows"
        for ref in f.bind:
            root = {"attn": attn, "context": ctx, "kwarg": new_inputs}[ref.kind]
            assert ref.get(root) is tensor, f"{ref} is not bound to buffer {f.name}"


def test_ascend_host_seqlens_stay_on_the_host_and_match_live_values():
    for name in ("ascend-0.17", "ascend-0.18"):
        spec = SPECS[name]
        meta, _, attn, _ = capture(spec, name, graph_batch=8, batch=5)
        inputs, live_attn, _ = decode_step(name, 6, 3, seed=9)
        live = (live_attn.kv_seqlens_cpu if name.endswith("0.18") else live_attn.kv_seqlens).tolist()
        spec.fill(meta, inputs, live_attn)
        host = meta.input_buffers["kv_seqlens"]
        assert spec.by_name("kv_seqlens").placement is Placement.HOST and host.device.type == "cpu"
        assert host.tolist() == live + [0, 0]
    _, _, attn, _ = capture(SPECS["ascend-0.17"], "ascend-0.17", graph_batch=8, batch=5)
    assert attn.max_kv_seq_len is None  # 0.17 decode: no frozen max
    meta, _, attn, _ = capture(SPECS["ascend-0.18"], "ascend-0.18", graph_batch=8, batch=5)
    assert attn.max_kv_seq_len == NUM_BLOCKS * BLOCK  # the cap, right for every replay
    assert attn.cu_seqlens_q_cpu.tolist() == list(range(9)) and attn.cu_seqlens_q_cpu.device.type == "cpu"


@pytest.mark.parametrize("name", ["camb-0.17", "maca-0.17"])
def test_camb_maca_max_lengths_are_derived_not_frozen(name):
    _, _, attn, _ = capture(SPECS[name], name, graph_batch=8, batch=5)
    assert attn.max_kv_seq_len == -1 and attn.max_q_seq_len == -1


def test_maca_kv_start_indices_layout():
    meta, _, attn, _ = capture(SPECS["maca-0.17"], "maca-0.17", graph_batch=8, batch=5)
    assert attn.kv_start_indices.shape == (8, 1) and attn.kv_start_indices.dtype == torch.int64
    camb_meta, _, camb_attn, _ = capture(SPECS["camb-0.17"], "camb-0.17", graph_batch=8, batch=5)
    assert camb_attn.kv_start_indices.shape == (8,) and camb_attn.kv_start_indices.dtype == torch.int32


def test_index_dtypes_are_converted_into_the_buffer():
    spec = SPECS["camb-0.17"]
    meta, *_ = capture(spec, "camb-0.17", graph_batch=8, batch=5)
    inputs, attn, ctx = decode_step("camb-0.17", 4, 3, seed=4)
    attn.kv_start_indices = attn.kv_start_indices.long()
    attn.block_offsets = attn.block_offsets.long()
    spec.fill(meta, inputs, attn)
    assert attn.kv_start_indices.dtype == torch.int32 and attn.block_offsets.dtype == torch.int32


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in ("detach", "lift_fresh"):
            self.ops.append(name)
        return func(*args, **(kwargs or {}))


def counted_step(spec, meta, name, batch, blocks=3, seed=0, context_to_fill=True):
    """One fill + bind_context with the ops of each call recorded (the inputs are made outside); the
    fill is given the step's context as vendor_graph's CudaGraphMixin methods give it."""
    inputs, attn, ctx = decode_step(name, batch, blocks, seed)
    with OpCounter() as fill:
        spec.fill(meta, inputs, attn, ctx if context_to_fill else None)
    with OpCounter() as bind:
        spec.bind_context(meta, ctx)
    return fill.ops, bind.ops


STEPS = ((7, 4, 5), (3, 4, 6), (2, 1, 7), (8, 6, 8), (1, 2, 9), (3, 4, 6), (2, 1, 7), (3, 4, 6))


@pytest.mark.parametrize("name", SPECS)
def test_fill_and_bind_write_everything_with_one_foreach_copy(name):
    """Live copies and padding resets of a step, context-sourced ones included, go out as one
    ``_foreach_copy_`` from the fill, and the bind only binds: never a ``copy_`` or ``fill_`` per field
    (everything is on the CPU here, so host and device buffers share it). Steps repeat, so both the
    checked fill and the fast one that repeats what it learnt are counted."""
    spec = SPECS[name]
    meta, *_ = capture(spec, name, graph_batch=8, batch=7, blocks=4)
    for batch, blocks, seed in STEPS:
        fill, bind = counted_step(spec, meta, name, batch, blocks, seed)
        assert fill == ["_foreach_copy_"], (batch, fill)
        assert bind == [], (batch, bind)


@pytest.mark.parametrize("name", SPECS)
def test_without_the_context_the_bind_writes_the_context_sources_itself(name):
    spec = SPECS[name]
    meta, *_ = capture(spec, name, graph_batch=8, batch=7, blocks=4)
    context_made = any(f.source is not None and f.source.kind == "context" and not f.is_static
                       and f.name in meta.input_buffers for f in spec.fields)
    for batch, blocks, seed in STEPS:
        inputs, attn, ctx = decode_step(name, batch, blocks, seed)
        fill, bind = counted_step(spec, meta, name, batch, blocks, seed, context_to_fill=False)
        assert fill == ["_foreach_copy_"], (batch, fill)
        assert len(bind) == (1 if context_made else 0), (batch, bind)
        assert torch.equal(ctx.kv_seqlens, meta.input_buffers[
            "kv_seqlens_device" if "kv_seqlens_device" in meta.input_buffers else "kv_seqlens"][:batch]) \
            or not context_made


def test_padding_resets_ride_in_the_same_foreach_as_the_live_copies():
    name, spec = "camb-0.17", SPECS["camb-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=7, blocks=4)
    pairs = []

    class Lists(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ == "_foreach_copy_":
                pairs.append(len(args[0]))
            return func(*args, **(kwargs or {}))

    inputs, attn, _ = decode_step(name, 7, 4, seed=1)
    with Lists():
        spec.fill(meta, inputs, attn)
    steady = pairs.pop()
    inputs, attn, _ = decode_step(name, 3, 2, seed=2)
    with Lists():
        spec.fill(meta, inputs, attn)
    # block_offsets shrank in both dims (2 boxes), every other sourced field in its rows (1 box each)
    sourced = [f for f in spec.fields
               if not f.is_static and f.source.kind != "context" and f.name in meta.input_buffers]
    assert pairs == [steady + len(sourced) + 1]


def test_extents_seen_before_reuse_their_views_and_still_reset_exactly():
    name, spec = "maca-0.17", SPECS["maca-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=6, blocks=5, seed=1)
    for batch, blocks, seed in [(6, 5, 2), (2, 1, 3), (6, 5, 4), (2, 1, 5), (4, 3, 6)] * 3:
        step(spec, meta, name, batch, blocks, seed)
        fresh, *_ = capture(spec, name, graph_batch=8, batch=batch, blocks=blocks, seed=seed)
        for key, tensor in snapshot(fresh).items():
            assert torch.equal(meta.input_buffers[key], tensor), (batch, key)


def test_a_refused_step_writes_nothing():
    name, spec = "camb-0.17", SPECS["camb-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=5)
    before = snapshot(meta)
    inputs, attn, _ = decode_step(name, 5, 3, seed=3)
    attn.kv_start_indices = None
    with pytest.raises(GraphInputsChanged, match="captured with attn_metadata.kv_start_indices"):
        spec.fill(meta, inputs, attn)
    for key, tensor in before.items():
        assert torch.equal(meta.input_buffers[key], tensor), key


def test_list_and_host_sources_convert_into_device_dtype():
    name, spec = "camb-0.17", SPECS["camb-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=5)
    inputs, attn, _ = decode_step(name, 3, 3, seed=3)
    attn.kv_seqlens = [5, 6, 7]  # a list: as_tensor gives int64, the buffer is int32
    spec.fill(meta, inputs, attn)
    assert attn.kv_seqlens.dtype == torch.int32 and attn.kv_seqlens.tolist() == [5, 6, 7, 0, 0, 0, 0, 0]


def test_inputs_that_appear_or_vanish_after_capture_are_refused():
    name, spec = "ascend-0.17", SPECS["ascend-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=5)
    inputs, attn, ctx = decode_step(name, 5, 3)
    inputs["inputs_embeds"] = torch.zeros(1, 5, 4)
    with pytest.raises(GraphInputsChanged, match="captured without kwarg.inputs_embeds"):
        spec.fill(meta, inputs, attn)
    inputs, attn, ctx = decode_step(name, 5, 3)
    ctx.moe_metadata = SimpleNamespace(x_active_mask=torch.ones(5, dtype=torch.bool))
    spec.fill(meta, inputs, attn)
    with pytest.raises(GraphInputsChanged, match="captured without context.moe_metadata.x_active_mask"):
        spec.bind_context(meta, ctx)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_adapter_ids_present_at_capture_and_absent_later_mean_no_adapter(name):
    """lmdeploy's warm-up captures with adapter ids; serving steps without LoRA pass None. The graph
    must then read adapter 0 (no adapter) in every row, not the warm-up's ids (found on the H200:
    refusing the step stopped lmdeploy's engine)."""
    spec = SPECS[name]
    meta = graph_meta(8)
    inputs, attn, ctx = decode_step(name, 5, 3)
    ctx.local_adapter_ids = torch.tensor([3, 1, 2, 3, 1])
    meta.input_buffers = spec.make(meta, inputs, attn)
    spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    assert meta.input_buffers["local_adapter_ids"].tolist() == [3, 1, 2, 3, 1, 0, 0, 0]
    inputs, attn, ctx = decode_step(name, 6, 3, seed=1)  # ctx.local_adapter_ids is None
    spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    assert meta.input_buffers["local_adapter_ids"].tolist() == [0] * 8
    assert ctx.local_adapter_ids is meta.input_buffers["local_adapter_ids"]


def test_a_batch_routed_to_a_smaller_graph_is_refused():
    name, spec = "camb-0.17", SPECS["camb-0.17"]
    meta, *_ = capture(spec, name, graph_batch=4, batch=4)
    inputs, attn, _ = decode_step(name, 5, 3)
    with pytest.raises(GraphInputsChanged, match="looked up by padded batch"):
        spec.fill(meta, inputs, attn)


def test_optional_inputs_present_at_capture_are_made_and_padded():
    name, spec = "ascend-0.17", SPECS["ascend-0.17"]
    meta = graph_meta(8)
    inputs, attn, ctx = decode_step(name, 5, 3)
    inputs["inputs_embeds"] = torch.ones(1, 5, 4, dtype=torch.bfloat16)
    ctx.moe_metadata = SimpleNamespace(x_active_mask=torch.ones(5, dtype=torch.bool))
    ctx.local_adapter_ids = torch.full((5,), 3)
    meta.input_buffers = spec.make(meta, inputs, attn)
    new_inputs = spec.fill(meta, inputs, attn)
    spec.bind_context(meta, ctx)
    assert new_inputs["inputs_embeds"].shape == (1, 8, 4) and new_inputs["inputs_embeds"].dtype == torch.bfloat16
    assert ctx.moe_metadata.x_active_mask.tolist() == [True] * 5 + [False] * 3
    assert ctx.local_adapter_ids.tolist() == [3] * 5 + [0] * 3
    assert "x_active_mask" in meta.input_buffers


def test_ssm_and_mrope_inputs_are_required_when_the_model_has_them():
    name, spec = "camb-0.17", SPECS["camb-0.17"]
    meta = graph_meta(8)
    meta.is_ssm = True
    inputs, attn, _ = decode_step(name, 5, 3)
    with pytest.raises(ValueError, match=r"kwarg.state_ids is required \(the model has SSM state"):
        spec.make(meta, inputs, attn)
    inputs["state_ids"] = torch.arange(5) + 1
    meta.input_buffers = spec.make(meta, inputs, attn)
    new_inputs = spec.fill(meta, inputs, attn)
    assert new_inputs["state_ids"].tolist() == [1, 2, 3, 4, 5, 0, 0, 0]


def test_held_attention_mask_is_the_capture_time_tensor():
    name, spec = "ascend-0.17", SPECS["ascend-0.17"]
    mask = torch.ones(4, 4, dtype=torch.int8)
    meta = graph_meta(8)
    inputs, attn, ctx = decode_step(name, 5, 3)
    attn.attention_mask = [mask]
    meta.input_buffers = spec.make(meta, inputs, attn)
    spec.fill(meta, inputs, attn)
    inputs, attn, ctx = decode_step(name, 5, 3)
    attn.attention_mask = [mask.clone()]  # lmdeploy 0.16 builds a new mask every step
    spec.fill(meta, inputs, attn)
    assert attn.attention_mask[0] is mask


def test_sparse_attention_graphs_are_refused_with_the_fix():
    meta = graph_meta(8)
    meta.mla_index_topk = 2048
    inputs, attn, _ = decode_step("ascend-0.18", 5, 3)
    with pytest.raises(NotImplementedError, match="--eager-mode"):
        SPECS["ascend-0.18"].make(meta, inputs, attn)


def test_spec_declarations_are_checked():
    f = BufferField("a", (BATCH,), torch.int32, 0, bind=(Ref.attn("a"),), source=Ref.attn("a"))
    with pytest.raises(ValueError, match="declared twice"):
        BufferSpec("x", (f, f))
    g = BufferField("b", (BATCH,), torch.int32, 0, bind=(Ref.attn("a"),), source=Ref.attn("b"))
    with pytest.raises(ValueError, match="same place"):
        BufferSpec("x", (f, g))
    with pytest.raises(ValueError, match="bound nowhere"):
        BufferField("c", (BATCH,), torch.int32, 0, bind=(), source=Ref.attn("c"))
    with pytest.raises(ValueError, match="exactly one of"):
        BufferField("d", (3,), torch.int32, 0, bind=(Ref.attn("d"),), source=Ref.attn("d"))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(SPECS)), graph_batch=st.sampled_from([4, 8, 16]), data=st.data())
def test_any_fill_history_equals_a_fresh_fill(name, graph_batch, data):
    """Property: whatever batches and block-table widths came before, the buffers after a fill are
    exactly those of a fresh graph filled with the same step (no stale row, no stale column)."""
    spec = SPECS[name]
    history = data.draw(st.lists(st.tuples(st.integers(1, graph_batch), st.integers(1, NUM_BLOCKS)),
                                 min_size=1, max_size=6))
    meta, *_ = capture(spec, name, graph_batch, *history[0], seed=0)
    for i, (batch, blocks) in enumerate(history[1:], start=1):
        step(spec, meta, name, batch, blocks, seed=i)
    last = len(history) - 1
    fresh, *_ = capture(spec, name, graph_batch, *history[-1], seed=last)
    after = snapshot(meta)
    for key, tensor in snapshot(fresh).items():
        assert torch.equal(after[key], tensor), f"{name} {history}: {key}"


@pytest.mark.parametrize("name", SPECS)
def test_multi_token_decode_pads_per_token_fields_over_the_graphs_tokens(name):
    """Speculative decode graphs (query length 2): token-indexed buffers span batch * 2 rows."""
    from vendor_graph.ops.selfcheck import synthetic_step

    spec = SPECS[name]

    def fill(meta, batch, seed, capture):
        inputs, attn, ctx = synthetic_step(spec, batch, blocks=3, query_len=2, seed=seed)
        if capture:
            meta.input_buffers = spec.make(meta, inputs, attn)
        spec.fill(meta, inputs, attn)
        spec.bind_context(meta, ctx)
        return attn, ctx

    meta = graph_meta(8, query_len=2)
    fill(meta, 7, seed=1, capture=True)
    attn, ctx = fill(meta, 3, seed=2, capture=False)
    fresh = graph_meta(8, query_len=2)
    fill(fresh, 3, seed=2, capture=True)
    for key, tensor in fresh.input_buffers.items():
        assert torch.equal(meta.input_buffers[key], tensor), key
    starts = attn.kv_start_indices.view(-1)
    if name.startswith("ascend"):  # one KV slot per token; Camb/MACA decode writes one per sequence
        assert starts.shape[0] == 16 and (starts[6:] == -1).all()
    assert ctx.q_seqlens.tolist() == [2] * 8 and ctx.q_start_loc.tolist() == list(range(0, 16, 2))


def test_a_torch_without_foreach_copy_falls_back_to_per_buffer_copies(monkeypatch, caplog):
    from vendor_graph.buffers import copies

    def missing(*args, **kwargs):
        raise NotImplementedError("Could not run 'aten::_foreach_copy_' with arguments from the 'X' backend")

    monkeypatch.setattr(torch, "_foreach_copy_", missing)
    monkeypatch.setattr(copies, "_NO_FOREACH", set())
    name, spec = "maca-0.17", SPECS["maca-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=6, blocks=5, seed=1)
    step(spec, meta, name, batch=2, blocks=1, seed=2)
    fresh, *_ = capture(spec, name, graph_batch=8, batch=2, blocks=1, seed=2)
    for key, tensor in snapshot(fresh).items():
        assert torch.equal(meta.input_buffers[key], tensor), key
    assert "fall back to one copy per buffer" in caplog.text


def _step_with_context(spec, meta, name, batch, blocks, seed):
    inputs, attn, ctx = decode_step(name, batch, blocks, seed)
    new_inputs = spec.fill(meta, inputs, attn, ctx)
    spec.bind_context(meta, ctx)
    return new_inputs, attn, ctx


@settings(max_examples=60, deadline=None, derandomize=True)
@given(name=st.sampled_from(sorted(SPECS)), with_context=st.booleans(), data=st.data())
def test_a_steady_state_fill_equals_a_fresh_fill(name, with_context, data):
    """Property: with few distinct shapes (so the fast fill repeats writes it learnt), every step's
    buffers and bindings are exactly those of a fresh graph filled with that step."""
    spec = SPECS[name]
    history = data.draw(st.lists(st.tuples(st.sampled_from([1, 3, 8]), st.sampled_from([1, 2])),
                                 min_size=2, max_size=14))
    meta, *_ = capture(spec, name, 8, *history[0], seed=0)
    run = _step_with_context if with_context else step
    for i, (batch, blocks) in enumerate(history[1:], start=1):
        new_inputs, attn, ctx = run(spec, meta, name, batch, blocks, seed=i)
        fresh, fresh_inputs, fresh_attn, fresh_ctx = capture(spec, name, 8, batch, blocks, seed=i)
        for key, tensor in snapshot(fresh).items():
            assert torch.equal(meta.input_buffers[key], tensor), f"{name} {history[:i + 1]}: {key}"
        for key, value in vars(fresh_attn).items():
            mine = getattr(attn, key)
            assert (mine is meta.input_buffers.get(_buffer_name(fresh, value), mine) if torch.is_tensor(value)
                    else mine == value), (key, history[:i + 1])
        assert set(new_inputs) == set(fresh_inputs)


def _buffer_name(meta, tensor):
    return next((k for k, v in meta.input_buffers.items() if v is tensor), None)


def test_the_steady_state_skips_the_checked_fill(monkeypatch):
    """Repeated shapes are served by the fast fill: the checked fill runs only while it learns."""
    name, spec = "ascend-0.17", SPECS["ascend-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=5)
    checked = []
    original = BufferSpec._fill_checked
    monkeypatch.setattr(BufferSpec, "_fill_checked",
                        lambda self, *a: checked.append(1) or original(self, *a))
    schedule = [(5, 3), (3, 3), (5, 3), (3, 3), (5, 3), (3, 3), (5, 3)]
    for i, (batch, blocks) in enumerate(schedule):
        _step_with_context(spec, meta, name, batch, blocks, seed=i)
    assert len(checked) <= 3, checked  # (5 after 5), (3 after 5), (5 after 3): then all learnt


@pytest.mark.parametrize("with_context", [False, True])
def test_inputs_that_appear_or_vanish_in_the_steady_state_are_refused(with_context):
    name, spec = "ascend-0.17", SPECS["ascend-0.17"]
    meta, *_ = capture(spec, name, graph_batch=8, batch=5)
    for i in range(4):  # learnt
        inputs, attn, ctx = decode_step(name, 5, 3, seed=i)
        spec.fill(meta, inputs, attn, ctx if with_context else None)
        spec.bind_context(meta, ctx)
    inputs, attn, ctx = decode_step(name, 5, 3)
    inputs["inputs_embeds"] = torch.zeros(1, 5, 4)
    with pytest.raises(GraphInputsChanged, match="captured without kwarg.inputs_embeds"):
        spec.fill(meta, inputs, attn, ctx if with_context else None)
    inputs, attn, ctx = decode_step(name, 5, 3)
    attn.kv_start_indices = None
    with pytest.raises(GraphInputsChanged, match="captured with attn_metadata.kv_start_indices"):
        spec.fill(meta, inputs, attn, ctx if with_context else None)
    inputs, attn, ctx = decode_step(name, 5, 3)
    ctx.moe_metadata = SimpleNamespace(x_active_mask=torch.ones(5, dtype=torch.bool))
    with pytest.raises(GraphInputsChanged, match="captured without context.moe_metadata.x_active_mask"):
        spec.fill(meta, inputs, attn, ctx if with_context else None)
        spec.bind_context(meta, ctx)
    inputs, attn, ctx = decode_step(name, 9, 3)
    with pytest.raises(GraphInputsChanged, match="looked up by padded batch"):
        spec.fill(meta, inputs, attn, ctx if with_context else None)


def test_on_cuda_the_fast_fill_copies_every_dense_pair_in_one_call_over_bytes():
    """torch's CUDA ``_foreach_copy_`` makes one kernel of a call only when every pair is dense with equal
    strides and the call has one source and one destination dtype: the program puts every dense pair without
    a conversion (int64 and int32 alike) in one call over byte views, makes expanded pad values dense so they
    join it, and gives a converting pair and a 2-D slice of a wider block table a call each. Run as the fill
    runs them, the calls write exactly what per-pair copies write."""
    from vendor_graph.buffers.fast import _AS_BYTES, _device_calls

    def buffers():
        return (torch.zeros(1, 8, dtype=torch.int64), torch.zeros(8, 6, dtype=torch.int32),
                torch.zeros(8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32))

    sources = (torch.arange(1, 6, dtype=torch.int64).view(1, 5), torch.arange(15, dtype=torch.int32).view(5, 3) + 7,
               torch.arange(5, dtype=torch.int32) + 100, torch.arange(5, dtype=torch.int64) + 1000)
    pad = torch.full((1,), -1, dtype=torch.int32)

    def triples(ids, table, slots, lens):
        return [(ids[:, :5], sources[0], 0), (table[:5, :3], sources[1], 1), (slots[:5], sources[2], 2),
                (lens[:5], sources[3], 3), (slots[5:7], pad.expand(2), None)]

    fused = buffers()
    calls = _device_calls(triples(*fused), by_dtype=True)
    shapes = [([tuple(d.shape) for d in dsts], [d.dtype for d in dsts], as_bytes) for dsts, _, _, as_bytes in calls]
    assert shapes == [([(1, 40), (20,), (8,)], [torch.uint8] * 3, True),
                      ([(5, 3)], [torch.int32], False),  # a 2-D slice of a wider table: not dense
                      ([(5,)], [torch.int32], False)]  # int64 lengths into an int32 buffer: a conversion
    for dsts, live, pads, as_bytes in calls:
        torch._foreach_copy_(dsts, [*map(_AS_BYTES, live(sources)), *pads] if as_bytes else [*live(sources), *pads])
    expected = buffers()
    for dst, src, _slot in triples(*expected):
        dst.copy_(src)
    assert all(torch.equal(a, b) for a, b in zip(fused, expected, strict=True))
    (everything,) = _device_calls(triples(*buffers()), by_dtype=False)
    assert len(everything[0]) == 5 and everything[1](("a", "b", "c", "d")) == ("a", "b", "c", "d")
