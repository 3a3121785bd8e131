"""The CUDA-style graph API on the simulator, and lmdeploy's real CUDA graph runners driven through it."""

import inspect
from types import SimpleNamespace

import pytest
import torch
from vendor_graph_sim import device as sim

from vendor_graph.upstream import compat

NAMES = ("CUDAGraph", "graph", "graph_pool_handle", "current_stream", "Stream", "stream", "synchronize",
         "is_available")


def test_cuda_api_is_patched_inside_and_restored_exactly_on_exit():
    before = {name: torch.cuda.__dict__.get(name) for name in NAMES}
    with sim.cuda_graph_api():
        assert torch.cuda.is_available()
        assert list(inspect.signature(torch.cuda.graph.__init__).parameters) == \
            list(inspect.signature(before["graph"].__init__).parameters)
        x = torch.ones(2, device="npu")
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle(), stream=torch.cuda.current_stream(),
                                  capture_error_mode="thread_local"):
                y = x * 3
        g.replay()
        assert y.tolist() == [3.0, 3.0]
        with pytest.raises(TypeError):
            torch.cuda.graph(g, auto_dispatch_capture=True)  # an NPU-only keyword
        with pytest.raises(RuntimeError, match="non-default stream"):
            torch.cuda.CUDAGraph().capture_begin()
    assert {name: torch.cuda.__dict__.get(name) for name in NAMES} == before


lmdeploy = pytest.importorskip("lmdeploy")


@pytest.fixture
def tiny_model():
    """A one-layer model on the sim device with simple buffer methods (0.18's default fill needs Triton)."""
    from lmdeploy.pytorch.model_inputs import StepContextManager, get_step_ctx_manager, set_step_ctx_manager
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
    from lmdeploy.pytorch.strategies.ar import ARStrategyFactory

    class Tiny(torch.nn.Module, CudaGraphMixin):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(32, 4)
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, input_ids, position_ids, past_key_values, attn_metadata, inputs_embeds=None, **kwargs):
            return self.proj(self.embed(input_ids)) + position_ids.unsqueeze(-1)

        def make_buffers_cudagraph(self, graph_meta, input_ids, position_ids, **kwargs):
            n = graph_meta.max_tokens
            return dict(input_ids=torch.zeros(1, n, dtype=torch.int64, device="npu"),
                        position_ids=torch.zeros(1, n, dtype=torch.int64, device="npu"))

        def fill_buffers_cudagraph(self, graph_meta, input_ids, position_ids, past_key_values, attn_metadata,
                                   inputs_embeds=None, **kwargs):
            buffers = graph_meta.input_buffers
            n = input_ids.size(-1)
            for name, value in (("input_ids", input_ids), ("position_ids", position_ids)):
                buffers[name][:, :n].copy_(value)
                buffers[name][:, n:].zero_()
            return dict(input_ids=buffers["input_ids"], position_ids=buffers["position_ids"],
                        past_key_values=past_key_values, attn_metadata=attn_metadata, inputs_embeds=None)

        def update_context_cudagraph(self, graph_meta, context):
            pass

    torch.manual_seed(0)
    model = Tiny().to("npu")
    saved = get_step_ctx_manager()
    mgr = StepContextManager()
    mgr.build_ctx.strategy_factory = ARStrategyFactory(model_config=SimpleNamespace())
    model.ctx_mgr = mgr
    set_step_ctx_manager(mgr)
    context = SimpleNamespace(global_is_decoding=lambda: True, enable_microbatch=False, dp_meta=None)
    mgr.set_context(context)
    yield model
    set_step_ctx_manager(saved)


def _step(batch, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 32, (1, batch), generator=g)
    pos = torch.randint(0, 8, (1, batch), generator=g)
    meta = SimpleNamespace(q_seqlens=torch.ones(batch, dtype=torch.int64, device="npu"),
                           block_offsets=torch.zeros(batch, 2, dtype=torch.int32, device="npu"))
    return dict(input_ids=ids.to("npu"), position_ids=pos.to("npu"), past_key_values=[], attn_metadata=meta,
                inputs_embeds=None)


def test_lmdeploys_cuda_graph_runners_capture_and_replay_on_the_sim(tiny_model):
    from lmdeploy.pytorch.backends.cuda.graph_runner import CUDAGraphRunner

    model_config = SimpleNamespace(vocab_size=32, use_mla_fp8_cache=False, use_flash_mla=False, mla_index_topk=None,
                                   model_paradigm="ar", states_shapes=[], use_mrope=False, block_size=16)
    cache_config = SimpleNamespace(num_gpu_blocks=4, max_batches=8, cudagraph_capture_batch_sizes=None,
                                   max_prefill_token_num=64)
    backend_config = SimpleNamespace(eager_mode=False, device_type="camb", piecewise_cudagraph_max_tokens=None)
    with sim.cuda_graph_api(), torch.cuda.stream(torch.cuda.Stream()), torch.inference_mode():
        runner = CUDAGraphRunner(tiny_model, model_config, cache_config, backend_config, torch.device("npu"))
        for batch, seed in [(3, 1), (3, 2), (2, 3), (5, 4), (3, 5)]:
            inputs = _step(batch, seed)
            expected = tiny_model(**inputs)
            got = runner(**inputs)["hidden_states"]
            torch.testing.assert_close(got.cpu(), expected.cpu())
        single_runners = compat.cuda_runner_graphs(runner)
        keys = sorted(key[0] for key in single_runners)
        assert keys == [2, 4, 8]
        graphs = [r._graph.sim_graph for r in single_runners.values()]
        assert all(g.status == "captured" for g in graphs)
        assert len({g.pool.handle for g in graphs}) == 1  # one pool shared by every bucket
