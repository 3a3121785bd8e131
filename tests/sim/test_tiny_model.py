"""The tiny decoder: lmdeploy's real mixin and metadata, decode equal to a dense reference, determinism."""

import dataclasses

import pytest
import torch

pytest.importorskip("lmdeploy", reason="the tiny model mixes in lmdeploy's CudaGraphMixin")

from vendor_graph_sim import kernels  # noqa: E402
from vendor_graph_sim import tiny_model as tm  # noqa: E402

PROMPTS = [[1, 2, 3, 4, 5], [7] * 20, list(range(30, 63)), [200]]
VARIANTS = [("ascend", "fia"), ("ascend", "fia_v2"), ("ascend", "paged_attention"), ("camb", "fia"), ("maca", "fia")]
IDS = ["ascend-fia", "ascend-fia_v2", "ascend-pa", "camb", "maca"]


@pytest.fixture(params=VARIANTS, ids=IDS)
def variant(request):
    return request.param


@pytest.fixture
def session(variant):
    """A session over PROMPTS, inside a scoped lmdeploy step environment."""
    vendor, attention = variant

    def make(prompts=PROMPTS, **kwargs):
        return tm.DecodeSession(tm.TinyDecoder(vendor, ascend_attention=attention), prompts, **kwargs)

    with tm.lmdeploy_step_env(vendor):
        yield make


def recording_runner(store):
    def run(model, ctx):
        hidden = tm.eager_step(model, ctx)
        store.append((ctx, hidden))
        return hidden

    return run


def test_pinned_configuration_and_cache_layouts():
    c = tm.TinyConfig()
    assert (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim) == (2, 64, 4, 2, 16)
    assert (c.vocab_size, c.block_size, c.num_blocks, c.max_blocks_per_seq, c.dtype) == (256, 16, 128, 8, torch.float32)
    assert tm.allocate_kv_caches(c, "ascend")[0][0].shape == (128, 16, 2, 16)
    assert tm.allocate_kv_caches(c, "maca")[1][1].shape == (128, 16, 2, 16)
    assert tm.allocate_kv_caches(c, "camb")[0][1].shape == (128, 2, 16, 16)
    assert len(tm.allocate_kv_caches(c, "camb")) == c.num_layers
    a, b = tm.TinyDecoder("camb"), tm.TinyDecoder("ascend")
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True)), "weights from seed"
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in a.parameters())
    alloc = tm.BlockAllocator(c.num_blocks, c.block_size)
    tables = [alloc.ensure([], 128) for _ in range(15)]
    assert 0 not in {blk for t in tables for blk in t}, "block 0 is reserved for padding"
    with pytest.raises(RuntimeError, match="out of KV blocks"):
        alloc.ensure([], 128)


def test_model_uses_lmdeploys_real_mixin_and_sees_patches_to_it(monkeypatch):
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    model = tm.TinyDecoder("ascend")
    assert isinstance(model, CudaGraphMixin) and isinstance(model, torch.nn.Module)
    marker = object()
    monkeypatch.setattr(CudaGraphMixin, "fill_buffers_cudagraph", lambda self, graph_meta, **kw: marker)
    assert model.fill_buffers_cudagraph(None) is marker


def test_decode_steps_equal_a_dense_reference_forward(session):
    s = session()
    seen = []
    for _ in range(4):
        s.step(run=recording_runner(seen))
    s.step(active=[3, 1], run=recording_runner(seen))
    assert len(seen) == 5
    ctx, hidden = seen[-1]
    for row, seq in enumerate([3, 1]):
        ref = s.model.reference_hidden(s.tokens[seq][:-1])[-1]
        torch.testing.assert_close(hidden[0, row], ref, rtol=0, atol=2e-5)
    for seq in range(len(PROMPTS)):  # every greedy token is the dense model's greedy token
        for n in range(len(PROMPTS[seq]) + 1, len(s.tokens[seq])):
            ref_logits = s.model.get_logits(s.model.reference_hidden(s.tokens[seq][:n])[-1])
            assert int(ref_logits.argmax()) == s.tokens[seq][n]


def test_greedy_decoding_is_deterministic_and_batch_invariant(session, variant):
    first, second, alone = session(), session(), session(prompts=[PROMPTS[2]])
    a, b, c = [], [], []
    for _ in range(6):
        first.step(run=recording_runner(a))
        second.step(run=recording_runner(b))
        alone.step(run=recording_runner(c))
    assert first.tokens == second.tokens
    assert all(torch.equal(x[1], y[1]) for x, y in zip(a, b, strict=True)), "bitwise identical hidden states"
    for (ka, va), (kb, vb) in zip(first.kv_caches, second.kv_caches, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb)
    # the same sequence decoded alone gives the same bits as inside the batch of four
    assert alone.tokens[0] == first.tokens[2]
    assert all(torch.equal(x[1][0, 2], z[1][0, 0]) for x, z in zip(a, c, strict=True))


def test_same_tokens_on_every_vendor():
    tokens = {}
    for vendor, attention in VARIANTS:
        with tm.lmdeploy_step_env(vendor):
            s = tm.DecodeSession(tm.TinyDecoder(vendor, ascend_attention=attention), PROMPTS)
            for _ in range(5):
                s.step()
        tokens[vendor, attention] = s.tokens
    assert len({str(t) for t in tokens.values()}) == 1, tokens


def test_metadata_comes_from_lmdeploys_update_step_context(variant):
    from lmdeploy.pytorch.backends.dlinfer.attention import DlinferAttentionMetadata

    vendor, _ = variant
    fields = {f.name for f in dataclasses.fields(DlinferAttentionMetadata)}
    with tm.lmdeploy_step_env(vendor):
        caches = tm.allocate_kv_caches(tm.TinyConfig(), vendor)
        ctx = tm.build_decode_context(vendor, caches, [[5, 9], [3]], [17, 2], [11, 12])
    meta = ctx.attn_metadata
    assert type(meta) is DlinferAttentionMetadata and meta.is_decoding
    assert meta.kv_start_indices.view(-1).tolist() == [9 * 16 + 0, 3 * 16 + 1]
    assert ctx.position_ids.tolist() == [[16, 1]] and meta.block_offsets.tolist() == [[5, 9], [3, 0]]
    if vendor == "ascend":
        q_ends, kv_host = tm.ascend_host_seqlens(meta)
        assert kv_host.device.type == "cpu" and kv_host.tolist() == [17, 2] and q_ends.tolist() == [1, 2]
        assert ("kv_seqlens_cpu" in fields) == (kv_host is getattr(meta, "kv_seqlens_cpu", None))
    elif vendor == "maca":
        assert meta.kv_start_indices.shape == (2, 1) and meta.kv_start_indices.dtype == torch.int64
        assert meta.max_kv_seq_len == -1
    else:
        assert meta.kv_start_indices.dtype == torch.int32 and meta.max_kv_seq_len == 17
    if vendor != "ascend" and "max_q_seq_len" not in fields:
        # lmdeploy 0.18: its own builder raises without vendor_graph's fix (lmdeploy_step_env applies it for
        # the block, as activating the vendor does)
        assert "cu_seqlens_q_cpu" in fields and meta.kv_seqlens_cpu is meta.kv_seqlens
        assert meta.cu_seqlens_q.tolist() == [0, 1, 2] and meta.cu_seqlens_q_cpu is meta.cu_seqlens_q
        ctx.attn_metadata = None
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            tm.backend_class(vendor).update_step_context(ctx)


def test_ascend_reads_its_host_lengths_not_the_device_ones():
    """On every release the FIA lengths come from the host tensors; a stale device copy changes nothing,
    a stale host copy changes the result (what a graph without the seq-len update would do)."""
    with tm.lmdeploy_step_env("ascend"):
        s = tm.DecodeSession(tm.TinyDecoder("ascend"), PROMPTS)
        ctx = s.decode_context()
        good = tm.eager_step(s.model, ctx)
        meta = ctx.attn_metadata
        q_ends, kv_host = tm.ascend_host_seqlens(meta)
        if kv_host is not meta.kv_seqlens:
            meta.kv_seqlens = torch.ones_like(meta.kv_seqlens)
            assert torch.equal(tm.eager_step(s.model, ctx), good)
        kv_host.copy_(kv_host - 3)
        assert not torch.allclose(tm.eager_step(s.model, ctx), good, atol=1e-3)


def test_camb_frozen_max_kv_seq_len_gives_wrong_hidden_states():
    with tm.lmdeploy_step_env("camb"):
        s = tm.DecodeSession(tm.TinyDecoder("camb"), PROMPTS)
        ctx = s.decode_context()
        good = tm.eager_step(s.model, ctx)
        assert ctx.attn_metadata.max_kv_seq_len == max(len(t) for t in s.tokens)
        ctx.attn_metadata.max_kv_seq_len = -1
        assert torch.equal(tm.eager_step(s.model, ctx), good)
        ctx.attn_metadata.max_kv_seq_len = 6  # frozen at a capture with shorter sequences
        frozen = tm.eager_step(s.model, ctx)
        assert torch.equal(frozen[0, 3], good[0, 3]), "the 2-token sequence is within the frozen max"
        assert not torch.allclose(frozen[0, :3], good[0, :3], atol=1e-3)


def pad_metadata(vendor, ctx, batch):
    """What a graph fill does to the step: pad to ``batch`` rows, padding inert (slot -1, length 0)."""
    meta = ctx.attn_metadata
    extra = batch - ctx.input_ids.shape[1]

    def pad(t, value):
        return torch.cat((t, torch.full((extra, *t.shape[1:]), value, dtype=t.dtype, device=t.device)))

    host = tm.ascend_host_seqlens(meta) if vendor == "ascend" else None
    meta.kv_start_indices = pad(meta.kv_start_indices, -1)
    meta.block_offsets = pad(meta.block_offsets, 0)
    meta.kv_seqlens = pad(meta.kv_seqlens, 0)  # on 0.16/0.17 Ascend this is the host tensor, set again below
    if vendor == "ascend":
        q_ends, kv_host = host
        n = q_ends.numel()
        ends = torch.cat((q_ends, torch.arange(n + 1, batch + 1, dtype=q_ends.dtype)))
        if hasattr(meta, "kv_seqlens_cpu"):
            meta.kv_seqlens_cpu = pad(kv_host, 0)
            meta.cu_seqlens_q_cpu = torch.cat((meta.cu_seqlens_q_cpu[:1], ends))
        else:
            meta.kv_seqlens, meta.q_seqlens = pad(kv_host, 0), ends
    elif hasattr(meta, "kv_seqlens_cpu"):  # Camb/MACA on 0.18: the decode kernel reads these names
        meta.kv_seqlens_cpu = meta.kv_seqlens
        meta.cu_seqlens_q = meta.cu_seqlens_q_cpu = torch.arange(batch + 1, dtype=torch.int32)
    ids = torch.cat((ctx.input_ids, torch.zeros(1, extra, dtype=torch.int64)), dim=1)
    pos = torch.cat((ctx.position_ids, torch.zeros(1, extra, dtype=torch.int64)), dim=1)
    return dict(input_ids=ids, position_ids=pos, past_key_values=ctx.kv_caches, attn_metadata=meta)


def test_padding_rows_are_inert(session, variant):
    vendor, _ = variant
    plain, padded = session(), session()
    ctx_plain, ctx_padded = plain.decode_context(), padded.decode_context()
    expect = tm.eager_step(plain.model, ctx_plain)
    with torch.inference_mode():
        got = padded.model(**pad_metadata(vendor, ctx_padded, 8))
    assert got.shape == (1, 8, 64)
    assert torch.equal(got[:, :4], expect)
    for (ka, va), (kb, vb) in zip(plain.kv_caches, padded.kv_caches, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb), "padding wrote a KV slot"


def test_unused_cache_slots_are_never_read(session):
    poisoned, clean = session(cache_fill=float("nan")), session()
    for _ in range(3):
        assert poisoned.step() == clean.step()


def test_maca_insists_on_its_kv_start_indices_layout():
    with tm.lmdeploy_step_env("maca"):
        s = tm.DecodeSession(tm.TinyDecoder("maca"), PROMPTS[:2])
        ctx = s.decode_context()
        ctx.attn_metadata.kv_start_indices = ctx.attn_metadata.kv_start_indices.view(-1)
        with pytest.raises(ValueError, match=r"\(tokens, 1\) int64"):
            tm.eager_step(s.model, ctx)


def test_forward_refuses_prefill_metadata():
    model = tm.TinyDecoder("maca")
    with tm.lmdeploy_step_env("maca"):
        ctx = tm.DecodeSession(model, PROMPTS[:1]).decode_context()
    ctx.attn_metadata.is_decoding = False
    with pytest.raises(NotImplementedError, match="prefill"):
        tm.eager_step(model, ctx)


def test_kernels_are_the_registered_operators():
    assert {"npu::npu_fused_infer_attention_score", "npu::npu_fused_infer_attention_score_v2",
            "atb::_npu_paged_attention", "vendor_graph_sim::maca_paged_decode_attention"} <= set(kernels.REGISTERED)


def supported_vendors():
    from vendor_graph.upstream import compat

    version = compat.installed_lmdeploy_version()
    return compat.vendors_supporting(version) if version is not None else []


@pytest.mark.parametrize("vendor", supported_vendors())
def test_the_active_vendors_buffer_methods_feed_the_model(vendor):
    """The package's patched CudaGraphMixin methods, reached through the model, pad a step so that
    the model's live rows are unchanged and padding writes no KV (eager run on the graph buffers)."""
    import importlib

    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

    importlib.import_module(f"vendor_graph.{vendor}").activate()
    c = tm.TinyConfig()
    with tm.lmdeploy_step_env(vendor):
        plain, graphed = (tm.DecodeSession(tm.TinyDecoder(vendor), PROMPTS) for _ in range(2))
        expect = tm.eager_step(plain.model, plain.decode_context())
        ctx = graphed.decode_context()
        meta = CudaGraphMeta(max_batchs=8, max_tokens=8, num_blocks=c.max_blocks_per_seq, is_decoding=True,
                             device=torch.device("cpu"), input_buffers={}, output_buffers={},
                             vocab_size=c.vocab_size, block_size=c.block_size)
        kwargs = tm.forward_kwargs(ctx)
        meta.input_buffers = graphed.model.make_buffers_cudagraph(meta, **kwargs)
        padded = graphed.model.fill_buffers_cudagraph(meta, **kwargs)
        graphed.model.update_context_cudagraph(meta, ctx)
        with torch.inference_mode():
            got = graphed.model(**padded)
    assert got.shape == (1, 8, c.hidden_size)
    assert torch.equal(got[:, :len(PROMPTS)], expect)
    for (ka, va), (kb, vb) in zip(plain.kv_caches, graphed.kv_caches, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb), "padding rows wrote a KV slot"


# -------------------------------------------------------------------------------------------------
# multi-token decode (speculative decoding) and MLA


@pytest.mark.parametrize("attention", tm.MULTI_TOKEN_ATTENTION)
@pytest.mark.parametrize("query_len", [2, 3])
def test_multi_token_decode_equals_a_dense_reference_forward(attention, query_len):
    """Every query token of a multi-token step sees the KV up to its own position (causal inside the
    block), and the drafts plus the last greedy token are appended."""
    with tm.lmdeploy_step_env("ascend"):
        s = tm.DecodeSession(tm.TinyDecoder("ascend", ascend_attention=attention), PROMPTS, query_len=query_len)
        seen = []
        for _ in range(3):
            s.step(run=recording_runner(seen))
        before = [len(t) for t in s.tokens]
        fed = [s.query_tokens(i) for i in (3, 1)]
        predicted = s.step(active=[3, 1], run=recording_runner(seen))
    ctx, hidden = seen[-1]
    assert hidden.shape == (1, 2 * query_len, 64)
    for b, seq in enumerate([3, 1]):
        n = before[seq]
        assert s.tokens[seq][n - 1:n - 1 + query_len] == fed[b]
        assert s.tokens[seq][-1] == predicted[b][-1] and len(s.tokens[seq]) == n + query_len
        ref = s.model.reference_hidden(s.tokens[seq][:n - 1 + query_len])[-query_len:]
        torch.testing.assert_close(hidden[0, b * query_len:(b + 1) * query_len], ref, rtol=0, atol=2e-5)
        ref_tokens = s.model.get_logits(ref).argmax(-1).tolist()
        assert predicted[b] == ref_tokens


def test_multi_token_metadata_comes_from_lmdeploys_multi_token_branch():
    from lmdeploy.pytorch.model_inputs import get_step_ctx_manager

    with tm.lmdeploy_step_env("ascend"):
        caches = tm.allocate_kv_caches(tm.TinyConfig(), "ascend")
        ctx = tm.build_decode_context("ascend", caches, [[5, 9], [3]], [17, 3], [[11, 12], [13, 14]], query_len=2)
        assert get_step_ctx_manager().build_ctx.num_spec_tokens == 1
    meta = ctx.attn_metadata
    assert ctx.is_decoding and ctx.max_q_seqlen == 2 and ctx.q_seqlens.tolist() == [2, 2]
    assert not meta.is_decoding and meta.is_multi_token_decoding
    assert ctx.input_ids.tolist() == [[11, 12, 13, 14]] and ctx.position_ids.tolist() == [[15, 16, 1, 2]]
    assert meta.kv_start_indices.view(-1).tolist() == [5 * 16 + 15, 9 * 16 + 0, 3 * 16 + 1, 3 * 16 + 2]
    q_ends, kv_host = tm.ascend_host_seqlens(meta)
    assert q_ends.device.type == kv_host.device.type == "cpu"
    assert q_ends.tolist() == [2, 4] and kv_host.tolist() == [17, 3]
    (mask,) = meta.attention_mask  # lmdeploy's fixed causal-mask template
    assert mask.shape == (2048, 2048) and bool(mask[0, 1]) and not bool(mask[1, 0])


def test_multi_token_decode_is_refused_where_it_is_not_modelled():
    with tm.lmdeploy_step_env("ascend"):
        s = tm.DecodeSession(tm.TinyDecoder("ascend", ascend_attention="paged_attention"), PROMPTS[:2], query_len=2)
        with pytest.raises(NotImplementedError, match="one token per sequence"):
            s.step()
    caches = tm.allocate_kv_caches(tm.TinyConfig(), "maca")
    with pytest.raises(ValueError, match="Ascend only"):
        tm.build_decode_context("maca", caches, [[5]], [3], [[1, 2]], query_len=2)
    with pytest.raises(ValueError, match="query_len=2 tokens"):
        tm.build_decode_context("ascend", caches, [[5]], [3], [1], query_len=2)


@pytest.mark.parametrize("query_len", [1, 2])
def test_the_ascend_buffer_methods_pad_multi_token_steps(query_len):
    """vendor_graph's Ascend fill, on a graph of 8 sequences x query_len tokens: live rows unchanged,
    padding tokens write no KV (eager run on the graph buffers)."""
    import importlib

    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

    importlib.import_module("vendor_graph.ascend").activate()
    c = tm.TinyConfig()
    with tm.lmdeploy_step_env("ascend"):
        plain, graphed = (tm.DecodeSession(tm.TinyDecoder("ascend"), PROMPTS, query_len=query_len) for _ in range(2))
        expect = tm.eager_step(plain.model, plain.decode_context())
        ctx = graphed.decode_context()
        meta = CudaGraphMeta(max_batchs=8, max_tokens=8 * query_len, num_blocks=c.max_blocks_per_seq,
                             is_decoding=True, device=torch.device("cpu"), input_buffers={}, output_buffers={},
                             vocab_size=c.vocab_size, block_size=c.block_size, decode_query_len=query_len)
        kwargs = tm.forward_kwargs(ctx)
        meta.input_buffers = graphed.model.make_buffers_cudagraph(meta, **kwargs)
        padded = graphed.model.fill_buffers_cudagraph(meta, **kwargs)
        graphed.model.update_context_cudagraph(meta, ctx)
        with torch.inference_mode():
            got = graphed.model(**padded)
    live = len(PROMPTS) * query_len
    assert got.shape == (1, 8 * query_len, c.hidden_size)
    assert torch.equal(got[:, :live], expect)
    assert (meta.input_buffers["kv_start_indices"][live:] == -1).all()
    for (ka, va), (kb, vb) in zip(plain.kv_caches, graphed.kv_caches, strict=True):
        assert torch.equal(ka, kb) and torch.equal(va, vb), "padding tokens wrote a KV slot"


def test_mla_variants_equal_a_dense_reference_and_each_other():
    tokens, caches = {}, {}
    for attention in tm.MLA_ATTENTION:
        with tm.lmdeploy_step_env("ascend"):
            model = tm.TinyDecoder("ascend", ascend_attention=attention)
            s = tm.DecodeSession(model, PROMPTS)
            seen = []
            for _ in range(4):
                s.step(run=recording_runner(seen))
            s.step(active=[2, 0], run=recording_runner(seen))
        _, hidden = seen[-1]
        for row, seq in enumerate([2, 0]):
            ref = model.reference_hidden(s.tokens[seq][:-1])[-1]
            torch.testing.assert_close(hidden[0, row], ref, rtol=0, atol=2e-5)
        tokens[attention], caches[attention] = s.tokens, s.kv_caches
    assert tokens["mla"] == tokens["paged_attention_mla"]
    c = tm.TinyConfig()
    k_cache, v_cache = caches["mla"][0]
    assert k_cache.shape == (c.num_blocks, c.block_size, 1, c.kv_lora_rank + c.qk_rope_head_dim)
    assert v_cache.shape == (c.num_blocks, c.block_size, 1, c.kv_lora_rank)
    assert tm.TinyDecoder("ascend", ascend_attention="mla").kv_cache_dims() == (1, 40, 32)
    with pytest.raises(ValueError, match="Ascend attention kernels"):
        tm.TinyDecoder("camb", ascend_attention="mla")
