"""vendor_graph's ``fill_buffers_cudagraph`` hands the fill the StepContext the runner binds next, so
context-sourced inputs (Ascend's device KV lengths on lmdeploy 0.16/0.17) ride in the fill's one device
copy and ``update_context_cudagraph`` only binds."""

from types import SimpleNamespace

from packaging.version import Version
from torch.utils._python_dispatch import TorchDispatchMode

from vendor_graph.install.profile import VendorProfile, buffer_methods
from vendor_graph.upstream.compat import LmdeployApi
from vendor_graph.vendors.ascend.spec import ascend_spec

from .test_buffers import decode_step, graph_meta

API_017 = LmdeployApi(Version("0.17.0"), frozenset(), max_q_attr="max_q_seq_len", separate_host_seqlens=False)


class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in ("detach", "lift_fresh"):
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_the_mixin_fill_copies_the_context_inputs_and_the_bind_only_binds():
    profile = VendorProfile("ascend", build_spec=lambda api: ascend_spec(API_017), build_runner=None)
    methods = buffer_methods(profile)
    current = {}
    model = SimpleNamespace(ctx_mgr=SimpleNamespace(current_context=lambda: current["ctx"]))
    meta = graph_meta(8)

    def step(batch, seed, first=False):
        inputs, attn, ctx = decode_step("ascend-0.17", batch, 3, seed)
        current["ctx"] = ctx
        args = (model, meta, inputs["input_ids"], inputs["position_ids"], [], attn)
        if first:
            meta.input_buffers = methods["make_buffers_cudagraph"](*args)
        with Ops() as fill:
            methods["fill_buffers_cudagraph"](*args)
        with Ops() as bind:
            methods["update_context_cudagraph"](model, meta, ctx)
        return fill.ops, bind.ops, ctx

    step(5, 0, first=True)
    for i, batch in enumerate((5, 3, 5, 3, 5), start=1):
        fill, bind, ctx = step(batch, i)
        assert fill == ["_foreach_copy_"] and bind == [], (batch, fill, bind)
        device_lens = meta.input_buffers["kv_seqlens_device"]
        assert ctx.kv_seqlens is device_lens
        assert device_lens[:batch].tolist() == meta.input_buffers["kv_seqlens"][:batch].tolist()
        assert device_lens[batch:].tolist() == [0] * (8 - batch)
