"""Camb and MACA on lmdeploy 0.18: their own ``update_step_context`` builds 0.18's attention metadata once the
vendor is active (lmdeploy's raises ``TypeError``), and 0.18's dlinfer attention path reads what it needs."""

from types import SimpleNamespace

import pytest
import torch

import vendor_graph
from vendor_graph.install import metadata_fix
from vendor_graph.upstream import compat

CUDA_STYLE = [v for v in ("camb", "maca") if v in compat.vendors_supporting(compat.installed_lmdeploy_version())]
RELEASE_018 = compat.lmdeploy_api().separate_host_seqlens
BLOCK_SIZE = 16


def backend(vendor):
    import importlib

    module = importlib.import_module(f"lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend")
    return getattr(module, f"{vendor.capitalize()}OpsBackend")


def step_context(vendor, decoding, q_lens, kv_lens):
    """What lmdeploy's StepContext hands a backend's update_step_context (CPU tensors stand in for device ones)."""
    shape = (4, 2, BLOCK_SIZE, 8) if vendor == "camb" else (4, BLOCK_SIZE, 2, 8)
    caches = [(torch.zeros(shape), torch.zeros(shape))]
    q = torch.tensor(q_lens)
    return SimpleNamespace(
        kv_caches=caches, is_decoding=decoding, q_seqlens=q, kv_seqlens=torch.tensor(kv_lens),
        q_start_loc=torch.cumsum(q, 0) - q, block_offsets=torch.tensor([[1, 2], [3, 0]]), attn_metadata=None)


@pytest.fixture(params=CUDA_STYLE)
def cuda_style_vendor(request):
    backend(request.param).total_slots = None
    yield request.param
    backend(request.param).total_slots = None


@pytest.mark.skipif(not RELEASE_018, reason="lmdeploy 0.16/0.17: their own builders fit (checked below)")
def test_lmdeploys_own_builder_fails_on_018_and_builds_once_the_vendor_is_active(cuda_style_vendor, activate):
    vendor = cuda_style_vendor
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        backend(vendor).update_step_context(step_context(vendor, True, [1, 1], [17, 3]))
    activate(vendor)
    ctx = backend(vendor).update_step_context(step_context(vendor, True, [1, 1], [17, 3]))
    meta = ctx.attn_metadata
    assert type(meta).__name__ == "DlinferAttentionMetadata" and meta.is_decoding
    assert meta.cu_seqlens_q.tolist() == [0, 1, 2]
    # decode: the lengths the 0.18 kernel hands dlinfer's device kernels are the device tensors themselves
    assert meta.kv_seqlens_cpu is meta.kv_seqlens and meta.cu_seqlens_q_cpu is meta.cu_seqlens_q
    assert meta.kv_seqlens.tolist() == [17, 3]
    expected_slots = [2 * BLOCK_SIZE + 0, 3 * BLOCK_SIZE + 2]
    assert meta.kv_start_indices.view(-1).tolist() == expected_slots
    if vendor == "camb":
        assert meta.max_q_seqlen == 1 and meta.max_kv_seq_len == 17
    else:
        assert meta.max_q_seqlen == -1 and meta.max_kv_seq_len == -1


@pytest.mark.skipif(not RELEASE_018, reason="lmdeploy 0.18's dlinfer kernels")
def test_018_prefill_reaches_dlinfer_with_host_lengths(cuda_style_vendor, activate, monkeypatch):
    """Prefill (never captured): host copies under the _cpu names, so lmdeploy 0.18's prefill kernel gets past
    ``cu_seqlens_q_cpu[1:]`` (a ``TypeError`` on None without the fix) and calls dlinfer with host lengths."""
    vendor = cuda_style_vendor
    activate(vendor)
    ctx = backend(vendor).update_step_context(step_context(vendor, False, [3, 2], [3, 4]))
    meta = ctx.attn_metadata
    assert not meta.is_decoding and meta.cu_seqlens_q.tolist() == [0, 3, 5]
    assert meta.cu_seqlens_q_cpu.tolist() == [0, 3, 5] and meta.kv_seqlens_cpu.tolist() == [3, 4]
    assert meta.cu_seqlens_q_cpu.device.type == "cpu" and meta.kv_seqlens_cpu.device.type == "cpu"
    assert meta.max_q_seqlen == 3
    if vendor == "camb":  # a prefill with history: camb passed cu_seq_lens_kv, 0.18's name is cu_seqlens_k
        assert meta.cu_seqlens_k.tolist() == [0, 3, 7] and not meta.is_prefill_no_cache

    from lmdeploy.pytorch.kernels.dlinfer import pagedattention

    seen = {}

    def paged_prefill_attention(*args, **kwargs):
        seen["args"] = args
        return args[0]

    monkeypatch.setattr(pagedattention.ext_ops, "paged_prefill_attention", paged_prefill_attention, raising=False)
    q = torch.zeros(5, 2, 8)
    pagedattention.paged_attention_fwd(
        q, q, q, q, ctx.kv_caches[0][0], ctx.kv_caches[0][1], meta.block_offsets, q_seqlens=meta.q_seqlens,
        kv_seqlens=meta.kv_seqlens, max_q_seq_len=meta.max_q_seqlen, max_kv_seq_len=meta.max_kv_seq_len,
        is_decoding=False, block_size=BLOCK_SIZE, num_heads=2, num_kv_heads=2, v_head_size=8,
        cu_seqlens_q=meta.cu_seqlens_q, cu_seqlens_q_cpu=meta.cu_seqlens_q_cpu, kv_seqlens_cpu=meta.kv_seqlens_cpu,
        is_prefill_no_cache=meta.is_prefill_no_cache)
    query_ends, kv_lens = seen["args"][7], seen["args"][8]
    assert query_ends.tolist() == [3, 5] and kv_lens.tolist() == [3, 4]
    assert query_ends.device.type == "cpu" and kv_lens.device.type == "cpu"


def test_the_fix_is_installed_only_where_the_release_needs_it(cuda_style_vendor, activate):
    vendor = cuda_style_vendor
    from lmdeploy.pytorch.backends.dlinfer.attention import DlinferAttentionMetadata

    activate(vendor)
    assert metadata_fix.metadata_fix_installed(backend(vendor)) == RELEASE_018
    patched = [p for p in vendor_graph.install.patching.active().patches if p.name == "get_attention_metadata_cls"]
    assert len(patched) == RELEASE_018
    vendor_graph.uninstall()
    assert backend(vendor).get_attention_metadata_cls() is DlinferAttentionMetadata
    assert "get_attention_metadata_cls" not in backend(vendor).__dict__
    if not RELEASE_018:  # 0.16/0.17: lmdeploy's own builder fits its release
        backend(vendor).update_step_context(step_context(vendor, True, [1, 1], [17, 3]))
