"""The vendor buffer methods on lmdeploy's real classes, fed by lmdeploy's own update_step_context."""

import importlib
from types import SimpleNamespace

import pytest
import torch

from vendor_graph.upstream import compat

VERSION = compat.installed_lmdeploy_version()
RELEASE = compat.series(VERSION)
BLOCK = 16
NUM_BLOCKS = 8
OP_BACKENDS = {
    "ascend": ("lmdeploy.pytorch.backends.dlinfer.ascend.op_backend", "AscendOpsBackend"),
    "camb": ("lmdeploy.pytorch.backends.dlinfer.camb.op_backend", "CambOpsBackend"),
    "maca": ("lmdeploy.pytorch.backends.dlinfer.maca.op_backend", "MacaOpsBackend"),
}


def backend_class(vendor):
    module, name = OP_BACKENDS[vendor]
    return getattr(importlib.import_module(module), name)


def kv_cache(vendor):
    if vendor == "camb":  # (blocks, heads, block_size, dim)
        k = torch.zeros(64, 2, BLOCK, 4)
    else:  # ascend, maca: (blocks, block_size, heads, dim)
        k = torch.zeros(64, BLOCK, 2, 4)
    return [[k, k.clone()]]


def step_context(vendor, batch, seed):
    """A decode StepContext stand-in carrying what the vendor backends read."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randint(1, NUM_BLOCKS * BLOCK + 1, (batch,), generator=g)
    table = torch.randint(1, 64, (batch, NUM_BLOCKS), generator=g)
    ctx = SimpleNamespace(
        kv_caches=kv_cache(vendor), is_decoding=True, block_offsets=table, kv_seqlens=kv,
        q_seqlens=torch.ones(batch, dtype=torch.int64), q_start_loc=torch.arange(batch),
        input_ids=torch.randint(0, 100, (1, batch), generator=g), position_ids=(kv - 1).view(1, -1),
        model_config=SimpleNamespace(is_gated_delta=False, states_shapes=[], mla_index_topk=None,
                                     dtype=torch.float16),
        kv_quant_policy=0, dp_meta=None, local_adapter_ids=None, max_q_seqlen=1, max_kv_seqlen=int(kv.max()),
        sum_kv_seqlen=int(kv.sum()), moe_metadata=None,
    )
    ctx.global_is_decoding = lambda: True
    return ctx


@pytest.fixture
def lmdeploy_step(vendor):
    """Build a step's attn_metadata with lmdeploy's own ``<Vendor>OpsBackend.update_step_context``."""
    from lmdeploy.pytorch.model_inputs import StepContextManager, get_step_ctx_manager, set_step_ctx_manager

    backend = backend_class(vendor)
    saved_mgr = get_step_ctx_manager()
    mgr = StepContextManager()
    set_step_ctx_manager(mgr)
    if vendor == "ascend":
        from lmdeploy.pytorch.backends.dlinfer.ascend.op_backend import DistMeta

        saved_dist = backend.dist_meta
        backend.dist_meta = DistMeta(dp_size=1, tp_size=1, ep_size=1, tp_rank=0, ep_rank=0, tp_group=None,
                                     ep_group=None)

    def build(batch, seed):
        ctx = step_context(vendor, batch, seed)
        mgr.set_context(ctx)
        backend.update_step_context(ctx)
        return ctx

    yield build
    set_step_ctx_manager(saved_mgr)
    if vendor == "ascend":
        backend.dist_meta = saved_dist
    backend.total_slots = None


@pytest.fixture
def model(vendor, activate):
    activate(vendor)
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    class TinyModel(CudaGraphMixin):
        pass

    return TinyModel()


def graph_meta(batch):
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

    return CudaGraphMeta(max_batchs=batch, max_tokens=batch, num_blocks=NUM_BLOCKS, is_decoding=True,
                         device=torch.device("cpu"), input_buffers=dict(), output_buffers=dict(), vocab_size=100)


def forward_kwargs(ctx):
    return dict(input_ids=ctx.input_ids, position_ids=ctx.position_ids, past_key_values=ctx.kv_caches,
                attn_metadata=ctx.attn_metadata, inputs_embeds=None)


def run_step(model, meta, ctx, capture=False):
    """What lmdeploy's graph runners do each step: (make at capture) fill, then bind the context."""
    kwargs = forward_kwargs(ctx)
    if capture:
        meta.input_buffers = model.make_buffers_cudagraph(meta, **kwargs)
    padded = model.fill_buffers_cudagraph(meta, **kwargs)
    model.update_context_cudagraph(meta, ctx)
    return padded


def test_metadata_from_lmdeploys_update_step_context_is_padded_and_bound(vendor, model, lmdeploy_step):
    ctx = lmdeploy_step(batch=5, seed=1)
    live = {name: getattr(ctx.attn_metadata, name) for name in ("kv_start_indices", "block_offsets")}
    live_kv = ctx.kv_seqlens.clone()
    meta = graph_meta(8)
    padded = run_step(model, meta, ctx, capture=True)
    attn = padded["attn_metadata"]
    assert attn is ctx.attn_metadata
    assert padded["input_ids"].shape == (1, 8)
    assert attn.kv_start_indices.shape[0] == 8
    assert attn.kv_start_indices.view(-1)[:5].tolist() == live["kv_start_indices"].view(-1).tolist()
    assert (attn.kv_start_indices.view(-1)[5:] == -1).all()
    assert torch.equal(attn.block_offsets[:5], live["block_offsets"].int())
    assert ctx.kv_seqlens.tolist() == live_kv.tolist() + [0, 0, 0]
    if vendor == "ascend":
        host = attn.kv_seqlens_cpu if "kv_seqlens_cpu" in compat.lmdeploy_api().attn_fields else attn.kv_seqlens
        assert host.device.type == "cpu" and host.tolist() == live_kv.tolist() + [0, 0, 0]
    else:
        assert attn.max_kv_seq_len == -1 and getattr(attn, compat.lmdeploy_api().max_q_attr) == -1


def test_batch_3_after_7_leaves_no_stale_row_in_what_attention_reads(vendor, model, lmdeploy_step):
    meta = graph_meta(8)
    run_step(model, meta, lmdeploy_step(batch=7, seed=1), capture=True)
    run_step(model, meta, lmdeploy_step(batch=7, seed=2))
    ctx3 = lmdeploy_step(batch=3, seed=3)
    padded = run_step(model, meta, ctx3)

    fresh = graph_meta(8)
    run_step(model, fresh, lmdeploy_step(batch=3, seed=3), capture=True)
    assert meta.input_buffers.keys() == fresh.input_buffers.keys()
    for key, tensor in fresh.input_buffers.items():
        assert torch.equal(meta.input_buffers[key], tensor), f"{vendor}: {key} keeps rows of the batch of 7"
    attn = padded["attn_metadata"]
    read = [f for f in vars(attn).values() if isinstance(f, torch.Tensor) and f.dim() >= 1 and f.shape[0] == 8]
    assert read, "attention metadata holds no padded tensors"
    assert (attn.kv_start_indices.view(-1)[3:] == -1).all()


def test_default_lmdeploy_methods_are_not_used(vendor, model, lmdeploy_step, monkeypatch):
    """lmdeploy 0.17+'s own fill launches a Triton kernel that cannot run on these vendors; ours must be
    the method the runner reaches, also through a model subclass calling super()."""
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

    class SpecDecodeLike(type(model)):
        def fill_buffers_cudagraph(self, graph_meta, *args, **kwargs):
            return super().fill_buffers_cudagraph(graph_meta, *args, **kwargs)

    assert CudaGraphMixin.fill_buffers_cudagraph.__module__ == f"vendor_graph.{vendor}"
    ctx = lmdeploy_step(batch=2, seed=4)
    meta = graph_meta(4)
    m = SpecDecodeLike()
    run_step(m, meta, ctx, capture=True)
    assert ctx.attn_metadata.kv_start_indices.view(-1).tolist()[2:] == [-1, -1]


@pytest.mark.skipif(RELEASE != "0.18", reason="documents lmdeploy 0.18's Camb/MACA breakage")
@pytest.mark.parametrize("broken", ["camb", "maca"])
def test_lmdeploy_018_camb_maca_metadata_raises_before_any_graph(broken):
    from lmdeploy.pytorch.model_inputs import StepContextManager, set_step_ctx_manager

    set_step_ctx_manager(StepContextManager())
    with pytest.raises(TypeError, match="max_q_seq_len|cu_seq_lens_kv"):
        backend_class(broken).update_step_context(step_context(broken, 2, 0))
