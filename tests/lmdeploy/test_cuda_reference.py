"""``vendor_graph.cuda``, the reference vendor: its buffers on lmdeploy 0.18's real CUDA metadata (built
by lmdeploy's own ``CudaOpsBackend.update_step_context``), padded as lmdeploy's own graph fill pads."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
import torch

from vendor_graph.upstream import compat

RELEASE = compat.series(compat.installed_lmdeploy_version())
SUPPORTED = RELEASE in compat.SUPPORTED_SERIES["cuda"]
BLOCK = 16


def test_cuda_reference_refuses_releases_it_was_not_built_for():
    if SUPPORTED:
        pytest.skip(f"lmdeploy {RELEASE} is supported")
    import vendor_graph

    vendor_graph.uninstall()
    with pytest.raises(compat.UnsupportedLmdeploy, match="Supported: 0.18.x"):
        importlib.import_module("vendor_graph.cuda").activate()


needs_018 = pytest.mark.skipif(not SUPPORTED, reason=f"vendor_graph.cuda targets lmdeploy 0.18, not {RELEASE}")


def step_context(batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randint(1, 4 * BLOCK + 1, (batch,), generator=g)
    ctx = SimpleNamespace(
        is_decoding=True, block_offsets=torch.randint(1, 64, (batch, 4), generator=g), kv_seqlens=kv,
        q_seqlens=torch.ones(batch, dtype=torch.int64), q_start_loc=torch.arange(batch),
        input_ids=torch.randint(0, 100, (1, batch), generator=g), position_ids=(kv - 1).view(1, -1),
        model_config=SimpleNamespace(is_gated_delta=False, use_flash_mla=False, model_paradigm="ar"),
        kv_quant_policy=0, max_q_seqlen=1, max_kv_seqlen=int(kv.max()), sum_kv_seqlen=int(kv.sum()),
        local_adapter_ids=None,
    )
    return ctx


@pytest.fixture
def cuda_vendor():
    from lmdeploy.pytorch.backends.cuda.op_backend import CudaOpsBackend
    from lmdeploy.pytorch.model_inputs import StepContextManager, get_step_ctx_manager, set_step_ctx_manager
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    import vendor_graph

    vendor_graph.uninstall()
    activation = importlib.import_module("vendor_graph.cuda").activate()
    saved = get_step_ctx_manager()
    set_step_ctx_manager(StepContextManager())

    class Model(CudaGraphMixin):
        pass

    yield SimpleNamespace(backend=CudaOpsBackend, model=Model(), activation=activation)
    set_step_ctx_manager(saved)
    vendor_graph.uninstall()


def graph_meta(batch: int, **overrides):
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

    return CudaGraphMeta(max_batchs=batch, max_tokens=batch, num_blocks=6, is_decoding=True,
                         device=torch.device("cpu"), input_buffers={}, output_buffers={}, vocab_size=100,
                         **overrides)


def lmdeploy_metadata(backend, batch: int, seed: int):
    ctx = step_context(batch, seed)
    backend.update_step_context(ctx)
    return ctx


def kwargs_of(ctx):
    return dict(input_ids=ctx.input_ids, position_ids=ctx.position_ids, past_key_values=[],
                attn_metadata=ctx.attn_metadata, inputs_embeds=None)


@needs_018
def test_the_reference_vendor_owns_the_mixin_and_cuda_builder(cuda_vendor):
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    for name in ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph"):
        assert getattr(CudaGraphMixin, name).__module__ == "vendor_graph.cuda"
    assert cuda_vendor.backend.build_graph_runner.__module__ == "vendor_graph.cuda"


@needs_018
def test_buffers_pad_like_lmdeploys_own_graph_fill(cuda_vendor):
    model, backend = cuda_vendor.model, cuda_vendor.backend
    meta = graph_meta(4)
    first = lmdeploy_metadata(backend, 3, seed=1)
    meta.input_buffers = model.make_buffers_cudagraph(meta, **kwargs_of(first))
    padded = model.fill_buffers_cudagraph(meta, **kwargs_of(first))
    model.update_context_cudagraph(meta, first)
    buf = meta.input_buffers
    attn = first.attn_metadata
    # bound: the attention reads the graph's buffers, at the graph's batch
    for name in ("block_offsets", "kv_seqlens", "q_seqlens", "q_start_loc", "cu_seqlens_q"):
        assert getattr(attn, name) is buf[name], name
    assert padded["input_ids"] is buf["input_ids"] and first.kv_seqlens is buf["kv_seqlens"]
    live_kv = lmdeploy_metadata(backend, 3, seed=1).kv_seqlens
    # lmdeploy's padding (fill_graph_common_inputs): query length 1, KV length 1, block table zeros
    assert buf["kv_seqlens"].tolist() == live_kv.tolist() + [1]
    assert buf["kv_seqlens"].dtype == torch.int32 and buf["block_offsets"].dtype == torch.int32
    assert buf["block_offsets"][3].tolist() == [0] * 6
    assert buf["q_seqlens"].tolist() == [1, 1, 1, 1]
    assert buf["q_start_loc"].tolist() == [0, 1, 2, 3]
    assert buf["cu_seqlens_q"].tolist() == [0, 1, 2, 3, 4]

    # a smaller step resets what the larger one left: row 2 is padding again
    second = lmdeploy_metadata(backend, 2, seed=2)
    model.fill_buffers_cudagraph(meta, **kwargs_of(second))
    assert buf["kv_seqlens"].tolist()[2:] == [1, 1]
    assert buf["block_offsets"][2:].eq(0).all()
    assert buf["input_ids"][0, :2].tolist() == second.input_ids[0].tolist()


@needs_018
@pytest.mark.parametrize("override, needs", [
    ({"use_fa3_decoding": True}, "speculative"),
    ({"decode_query_len": 2}, "speculative"),
    ({"use_flash_mla": True}, "FlashMLA"),
    ({"use_mrope": True}, "mrope"),
])
def test_graphs_the_spec_does_not_cover_are_refused_naming_what_to_use(cuda_vendor, override, needs):
    from vendor_graph.vendors.cuda import UnsupportedGraphConfig

    meta = graph_meta(2, **override)
    ctx = lmdeploy_metadata(cuda_vendor.backend, 2, seed=3)
    with pytest.raises(UnsupportedGraphConfig, match=needs) as info:
        cuda_vendor.model.make_buffers_cudagraph(meta, **kwargs_of(ctx))
    assert "lmdeploy's own graph mode" in str(info.value)
    assert not meta.input_buffers  # refused before anything was allocated


@needs_018
def test_an_attention_metadata_builder_other_than_triton_is_refused(cuda_vendor):
    from lmdeploy.pytorch.backends.cuda.step_metadata import CudaStepMetaPlan

    from vendor_graph.vendors.cuda import UnsupportedGraphConfig

    class FA3AttentionMetaBuilder:  # a builder that owns graph buffers the spec knows nothing of
        pass

    plan = CudaStepMetaPlan(attention_builders=(FA3AttentionMetaBuilder(),), step_updaters=())
    meta = graph_meta(2, step_meta_plan=plan)
    ctx = lmdeploy_metadata(cuda_vendor.backend, 2, seed=4)
    with pytest.raises(UnsupportedGraphConfig, match="FA3AttentionMetaBuilder"):
        cuda_vendor.model.make_buffers_cudagraph(meta, **kwargs_of(ctx))
