"""lmdeploy's own ``CUDAGraphRunner``, adopted by vendor_graph (Camb, MACA and the CUDA reference vendor).

Those vendors expose a CUDA-style graph API, so they reuse lmdeploy's runner rather than a rewrite:
the vendor op backend's builder builds lmdeploy's runner as usual (0.18's also registers its warm-up
metadata) and :func:`adopt` turns that object into an instance of a thin subclass. Around lmdeploy's
own decode path the subclass adds, per step:

* the ownership check (our buffer methods still on ``CudaGraphMixin``);
* per-bucket stats (captures, replays, real and padded tokens, capture time and memory);
* a batch beyond the largest capture size runs eager with one warning (lmdeploy asserts there);
* a capture that raises leaves nothing behind: no graph is registered for its key, the step's
  ``attn_metadata`` and ``StepContext`` get back what the failed fill re-bound, that key runs eager
  with the reason logged, and serving continues;
* a step whose inputs the graph cannot serve (:class:`~vendor_graph.buffers.GraphInputsChanged`, raised
  by the fill before any replay) runs eager, with the step's metadata restored and the reason logged
  once;
* the stale-graph guard (:mod:`vendor_graph.guard`): a graph whose KV caches or weights moved since
  capture is dropped and captured afresh, with the reason logged;
* the shadow check (:mod:`vendor_graph.shadow`, ``VENDOR_GRAPH_SHADOW=N``): every Nth replayed step also
  runs eager on the step's own inputs and is compared; a divergence is logged and can turn that key
  eager;
* a progress bar while the up-front captures run, and profiler ranges carrying the real and padded
  batch (:mod:`vendor_graph.stats`).

Everything else (keys, buffers through the patched mixin, capture, replay, pool) is lmdeploy's.
"""

from __future__ import annotations

import functools
import logging
import time
import weakref
from typing import Any

import torch

from . import compat, faults, patching, stats, switches
from .buffers import GraphInputsChanged
from .guard import StaleGraphGuard
from .shadow import ShadowCheck
from .stats import GraphStats

logger = logging.getLogger("vendor_graph")

_LIVE: weakref.WeakSet = weakref.WeakSet()


def live_runners() -> list[Any]:
    """The adopted runners alive in this process (their ``.stats`` say what graph mode did)."""
    return list(_LIVE)


def _device_memory() -> int | None:
    """What the CUDA allocator holds now; None off a real, initialised CUDA device (the simulator)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return None
    return stats.device_memory(torch.cuda)


class AdoptedRunner:
    """The methods vendor_graph puts in front of lmdeploy's ``CUDAGraphRunner`` (see :func:`adopt`)."""

    _vendor_graph_guarded = True  # vendor.guard_runner: the ownership check is already in __call__

    def _vendor_graph_init(self, vendor: str) -> None:
        self.vendor = vendor
        self.label = f"vendor_graph.{vendor}"
        self.stats = GraphStats()
        self.guard = StaleGraphGuard(self.model)
        self.shadow = ShadowCheck()
        self._eager_keys: dict[tuple, str] = {}
        self._warned_oversize = False
        self._progress: stats.CaptureProgress | None = None
        stats.register(self, f"{vendor} graph runner {id(self):#x}")
        switches.apply_debug()
        _LIVE.add(self)

    # -- the step ------------------------------------------------------------------------------------

    def __call__(self, **kwargs):
        patching.ensure_owned("before a graph step")
        attn_metadata = kwargs.get("attn_metadata")
        context = self.ctx_mgr.current_context()
        if attn_metadata is None or not context.global_is_decoding() or not self.enable_graph(**kwargs):
            return super().__call__(**kwargs)  # lmdeploy's eager (0.18: or piecewise) path
        sizes = self.get_capture_batch_sizes()
        padding = self.get_meta().padding_batch_size  # DP: the global batch every rank pads to
        wanted = attn_metadata.q_seqlens.size(0) if padding is None else padding
        if wanted > sizes[-1]:
            if not self._warned_oversize:
                self._warned_oversize = True
                logger.warning("vendor_graph.%s: a batch of %d is above the largest capture size %d and ran "
                               "eager; raise max_batch_size (or cudagraph_capture_batch_sizes) to capture it",
                               self.vendor, wanted, sizes[-1])
            return self._forward_eager_because("batch above the largest capture size", kwargs)
        kwargs = self._prepare_inputs(**kwargs)
        key = self.get_graph_key(**kwargs)
        reason = self._eager_keys.get(key)
        if reason is not None:
            return self._forward_eager_because(reason, kwargs)
        graphs = compat.cuda_runner_graphs(self)
        if key in graphs:
            stale = self.guard.check(key, kwargs)
            if stale is None:
                return self._replay(key, kwargs)
            logger.warning("%s: graph for batch %d is stale and is captured afresh: %s", self.label, key[0],
                           stale.reason)
            self.stats.stale(key[0])
            if stale.all_graphs:
                graphs.clear()
                self.guard.clear()
            else:
                graphs.pop(key, None)
                self.guard.forget(key)
        return self._capture(key, graphs, kwargs)

    def _replay(self, key: tuple, kwargs: dict[str, Any]):
        attn_metadata = kwargs["attn_metadata"]
        context = self.ctx_mgr.current_context()
        padded_batch, query_len = key[0], key[3]
        tokens = kwargs["input_ids"].size(-1)
        real_batch = attn_metadata.q_seqlens.size(0)
        if self._progress is not None:  # the up-front captures are over
            self._progress.done()
            self._progress = None
        own = faults.StepMetadata(attn_metadata, context)
        try:
            with stats.profile_range(f"{self.label}.replay", real_batch, padded_batch):
                output = super().__call__(**kwargs)
        except GraphInputsChanged as exc:  # raised by the fill, before the replay: run this step eager
            own.restore()
            reason = f"inputs differ from the capture: {exc}"
            if reason not in self.stats.eager_steps:
                logger.warning("%s: a batch-%d step ran eager: %s", self.label, padded_batch, exc)
            return self._forward_eager_because(reason, kwargs)
        self.stats.replayed(padded_batch, tokens, padded_batch * query_len)
        if self.shadow.due():
            # The eager rerun writes the same K/V values into the same live slots the replay wrote.
            own.restore()
            with stats.profile_range(f"{self.label}.shadow", real_batch, padded_batch):
                eager = self.model.make_output_buffers(self.model(**kwargs))
            problem = self.shadow.compare(output, {"hidden_states": eager["hidden_states"][..., :tokens, :]})
            self.stats.shadowed(padded_batch, problem is not None)
            if problem is not None and self.shadow.diverged(self.label, key, real_batch, padded_batch, problem):
                compat.cuda_runner_graphs(self).pop(key, None)
                self.guard.forget(key)
                self._eager_keys[key] = f"shadow check diverged: {problem}"
                return eager
        return output

    def _capture(self, key: tuple, graphs: dict, kwargs: dict[str, Any]):
        attn_metadata = kwargs["attn_metadata"]
        context = self.ctx_mgr.current_context()
        if self._progress is None and self.stats.replays == 0:  # the up-front captures (lmdeploy's warmup)
            self._progress = self.stats.progress(len(self.get_capture_batch_sizes()))
        own = faults.StepMetadata(attn_metadata, context)
        before = _device_memory()
        start = time.perf_counter()
        try:
            output = super().__call__(**kwargs)
        except Exception as exc:  # noqa: BLE001 - any capture failure: this key runs eager, serving goes on
            graphs.pop(key, None)
            own.restore()
            reason = faults.capture_failure_reason(exc)
            self._eager_keys[key] = reason
            self.stats.capture_failed(key[0])
            if self._progress is not None:
                self._progress.captured(key[0])
            logger.warning("%s: graph for batch %d not captured, it runs eager from now on: %s",
                           self.label, key[0], reason, exc_info=True)
            return self._forward_eager_because(reason, kwargs)
        seconds = time.perf_counter() - start
        after = _device_memory()
        self.stats.captured(key[0], seconds, None if before is None or after is None else max(0, after - before))
        self.guard.record(key, kwargs)
        if self._progress is not None:
            self._progress.captured(key[0])
        return output

    def _forward_eager_because(self, reason: str, kwargs: dict[str, Any]):
        self.stats.eager(reason)
        output = self.model(**kwargs)
        return self.model.make_output_buffers(output)

    # -- introspection -------------------------------------------------------------------------------

    def graphs(self) -> dict:
        """graph key tuple -> lmdeploy's ``CUDASingleGraphRunner``."""
        return dict(compat.cuda_runner_graphs(self))

    def eager_reasons(self) -> dict[tuple, str]:
        return dict(self._eager_keys)

    def reset(self) -> None:
        super().reset()
        self._eager_keys.clear()
        self.guard.clear()
        self.stats = GraphStats()
        if self._progress is not None:
            self._progress.done()
        self._progress = None


@functools.cache
def adopted_class(runner_cls: type) -> type:
    """The vendor_graph subclass of ``runner_cls`` (lmdeploy's ``CUDAGraphRunner`` of this release)."""
    return type(f"VendorGraph{runner_cls.__name__}", (AdoptedRunner, runner_cls), {"__module__": __name__})


def vendor_cuda_graph_runner_class() -> type:
    """The subclass for the installed lmdeploy's ``CUDAGraphRunner`` (a module up to 0.17, a package in 0.18)."""
    return adopted_class(compat.cuda_graph_runner_class())


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


__all__ = ["AdoptedRunner", "adopt", "adopted_class", "build_adopted_runner", "live_runners",
           "vendor_cuda_graph_runner_class"]
