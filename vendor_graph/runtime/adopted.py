"""lmdeploy's own ``CUDAGraphRunner``, adopted by vendor_graph (Camb, MACA and the CUDA reference vendor).

Those vendors expose a CUDA-style graph API, so they reuse lmdeploy's runner: the vendor op backend's
builder builds it as usual (0.18's also registers its warm-up metadata) and :func:`adopt` makes that
object an instance of a thin subclass whose steps :class:`~vendor_graph.runtime.step.StepPolicy` decides.
Keys and capture stay lmdeploy's (buffers through the patched mixin, its pool); a replay fills, binds and
replays lmdeploy's captured graph directly.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from ..sizing import capacity
from ..upstream import compat
from . import counters
from .key import GraphKey
from .step import GraphBackend, StepPolicy, StepView

NOT_DECODING = StepView("not a decode step")
GRAPH_MODE_OFF = StepView("graph mode off for this model or step")


class AdoptedRunner(GraphBackend):
    """The methods vendor_graph puts in front of lmdeploy's ``CUDAGraphRunner`` (see :func:`adopt`)."""

    def _vendor_graph_init(self, vendor: str) -> None:
        self.vendor = vendor
        self.label = f"vendor_graph.{vendor}"
        cache_config = self.cache_config
        explicit = getattr(cache_config, capacity.LMDEPLOY_SIZES, None)
        lmdeploys = compat.cuda_graph_runner_class().get_capture_batch_sizes
        self.capture_plan = capacity.resolve_capture_plan(
            vendor, cache_config.max_batches, [] if explicit is not None else lmdeploys(self), explicit,
            num_layers=getattr(self.model_config, "num_layers", 0) or 0, num_blocks=cache_config.num_gpu_blocks,
            reserved_bytes=getattr(cache_config, capacity.RESERVED_ATTR, None))
        self._capture_sizes = list(self.capture_plan.sizes)
        self._keys: dict[tuple, GraphKey] = {}  # lmdeploy's key tuple -> ours, made once per key
        self.policy = StepPolicy(self)

    def get_capture_batch_sizes(self) -> list[int]:
        """The capture plan's sizes: lmdeploy's warmup captures them and its keys pad to them."""
        return self._capture_sizes

    def __call__(self, **kwargs):
        return self.policy.step(kwargs)

    def reset(self) -> None:
        super().reset()
        self.policy.reset()

    # -- GraphBackend over lmdeploy's runner -----------------------------------------------------------

    def view(self, kwargs: dict[str, Any]) -> StepView:
        attn_metadata = kwargs.get("attn_metadata")
        if attn_metadata is None or not self.ctx_mgr.current_context().global_is_decoding():
            return NOT_DECODING
        if not self.enable_graph(**kwargs):
            return GRAPH_MODE_OFF
        padding = self.get_meta().padding_batch_size  # DP: the global batch every rank pads to
        batch = attn_metadata.q_seqlens.size(0) if padding is None else padding
        if batch > self._capture_sizes[-1]:
            return StepView(None, batch)
        self._prepare_inputs(**kwargs)  # lmdeploy's own (block offsets to int32, in place)
        lmdeploy_key = self.get_graph_key(**kwargs)
        key = self._keys.get(lmdeploy_key)
        if key is None:
            key = self._keys[lmdeploy_key] = GraphKey.from_lmdeploy_tuple(lmdeploy_key)
        return StepView(None, batch, key, compat.cuda_runner_graphs(self).get(lmdeploy_key))

    def forward_skipped(self, reason: str, kwargs: dict[str, Any]) -> Any:
        self.policy.stats.eager(reason)  # counted as the Ascend runner counts it: the stats read the same per vendor
        return super().__call__(**kwargs)  # lmdeploy's eager (0.18: or piecewise) path

    def capture_sizes(self) -> list[int]:
        return self._capture_sizes

    def capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        return super().__call__(**kwargs)  # lmdeploy captures a key it has no graph for

    def replay(self, view: StepView, kwargs: dict[str, Any]) -> Any:
        """The key's graph: fill, bind, replay and output slicing as lmdeploy's ``CUDASingleGraphRunner.forward``
        does them, without what ``__call__`` would only redo (input preparation, graph-mode check, key, lookup)
        and ``forward``'s per-step ``record_function``. With DeepEP on, ``__call__`` also sets the process's
        dispatch mode first, so then the step goes through it; a graph whose layout is unknown goes through
        ``forward``."""
        single = view.graph
        if compat.deepep_enabled():
            return super().__call__(**kwargs)
        cuda_graph = compat.captured_cuda_graph(single)
        if cuda_graph is None:
            return single.forward(**kwargs)
        model, meta = single.model, single.meta
        model.fill_buffers_cudagraph(meta, **kwargs)
        model.update_context_cudagraph(meta, self.ctx_mgr.current_context())
        cuda_graph.replay()
        return model.get_outputs_cudagraph(meta.output_buffers, **kwargs)

    def release(self, key: GraphKey | None) -> None:
        graphs = compat.cuda_runner_graphs(self)
        if key is None:
            graphs.clear()
        else:
            graphs.pop(key.as_lmdeploy_tuple(), None)

    def device_memory(self) -> int | None:
        """What the CUDA allocator holds now; None off a real, initialised CUDA device (the simulator)."""
        if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
            return None
        return counters.device_memory(torch.cuda)

    # -- introspection -------------------------------------------------------------------------------

    def graphs(self) -> dict[GraphKey, Any]:
        """GraphKey -> lmdeploy's ``CUDASingleGraphRunner``."""
        return {GraphKey.from_lmdeploy_tuple(k): g for k, g in compat.cuda_runner_graphs(self).items()}


@functools.cache
def adopted_class(runner_cls: type) -> type:
    """The vendor_graph subclass of ``runner_cls`` (lmdeploy's ``CUDAGraphRunner`` of this release)."""
    return type(f"VendorGraph{runner_cls.__name__}", (AdoptedRunner, runner_cls), {"__module__": __name__})


def adopt(runner: Any, vendor: str) -> Any:
    """Make lmdeploy's freshly built ``runner`` an instance of :func:`adopted_class` of its class."""
    if not isinstance(runner, AdoptedRunner):
        runner.__class__ = adopted_class(type(runner))
        runner._vendor_graph_init(vendor)
    return runner


def build_adopted_runner(original, model, model_config, cache_config, backend_config, device, *args,
                         vendor: str, **kwargs):
    """A ``VendorProfile.build_runner``: lmdeploy's own builder, then :func:`adopt`."""
    runner = original(model, model_config, cache_config, backend_config, device, *args, **kwargs)
    cuda_runner = compat.cuda_graph_runner_class()
    if not isinstance(runner, cuda_runner):
        raise TypeError(f"vendor_graph.{vendor}: lmdeploy's builder returned {type(runner).__qualname__}, not "
                        f"its CUDAGraphRunner; this lmdeploy release changed the {vendor} backend")
    return adopt(runner, vendor)


__all__ = ["AdoptedRunner", "adopt", "adopted_class", "build_adopted_runner"]
