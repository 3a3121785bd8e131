"""AscendGraphRunner: one NPUGraph per GraphKey, with the seq-len refresh Ascend attention needs.

Per decode step on the replay path: fill the graph's buffers (vendor_graph's CudaGraphMixin methods),
wait for the previous replay to finish with the captured tasks, refresh the host KV lengths of every
registered attention task (``NPUGraph.update`` or the task-group path, chosen per op), replay, and
record a fence. Keys, sizes and padding come from :mod:`vendor_graph.buckets`; a key that cannot be
captured safely runs eager, with its reason logged once.

Operator components (each runner-agnostic, wired here as their module docstrings describe):
:mod:`vendor_graph.stats` (per-bucket counters, summary at exit and on demand, capture progress bar,
profiler ranges), :mod:`vendor_graph.guard` (stale-graph guard: KV caches and weights moved since
capture -> recapture), :mod:`vendor_graph.shadow` (``VENDOR_GRAPH_SHADOW=N``: eager comparison every
Nth replay), :mod:`vendor_graph.faults` (a failed capture leaves nothing behind; the key runs eager),
:mod:`vendor_graph.switches` (``VENDOR_GRAPH_DISABLE``, ``VENDOR_GRAPH_DEBUG``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import buckets, faults, lifecycle, patching, stats, switches
from ..buffers import GraphInputsChanged
from ..guard import StaleGraphGuard
from ..key import GraphKey
from ..shadow import ShadowCheck
from ..stats import GraphStats
from . import hook, limits
from .seqlen import GRAPH_UPDATE, TASK_UPDATE, Capabilities, detect

logger = logging.getLogger("vendor_graph")

try:  # lmdeploy is a runtime requirement of the runner, not of the package
    from lmdeploy.pytorch.backends.graph_runner import GraphRunner
except ImportError:  # pragma: no cover - only without lmdeploy
    GraphRunner = object  # type: ignore[misc,assignment]


def _false(*args, **kwargs) -> bool:
    return False


def npu_runtime() -> tuple[Any, Capabilities]:
    """``torch.npu`` and what it offers (importing torch_npu registers it)."""
    import torch_npu  # noqa: F401  (registers torch.npu)

    npu = torch.npu
    return npu, detect(npu, getattr(torch_npu, "__version__", None))


@dataclass
class AscendSingleGraph:
    """One captured decode graph, its buffers and its registered attention tasks."""

    key: GraphKey
    meta: Any  # lmdeploy CudaGraphMeta
    graph: Any = None
    output_buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    tasks: list[hook.AttentionTask] = field(default_factory=list)
    capture_seconds: float = 0.0

    @property
    def paths(self) -> set[str]:
        return {t.path for t in self.tasks}


class GraphUnsafe(RuntimeError):
    """This key cannot be captured so that its replays are right; it runs eager."""


class AscendGraphRunner(GraphRunner):
    """lmdeploy GraphRunner for Ascend NPUs (built by ``AscendOpsBackend.build_graph_runner``)."""

    def __init__(self, model, model_config, cache_config, backend_config, device, is_mla: bool = False, **kwargs):
        super().__init__(model, model_config, cache_config, backend_config, device)
        self.is_mla = is_mla
        self.num_blocks = cache_config.num_gpu_blocks
        self.max_batches = cache_config.max_batches
        self.capture_sizes = buckets.capture_sizes(
            "ascend", cache_config.max_batches, getattr(cache_config, "cudagraph_capture_batch_sizes", None))
        self.enable_graph = _false if backend_config.eager_mode else getattr(model, "support_cuda_graph", _false)
        switches.apply_debug()
        self._off_reason = "graph mode off for this model or step"
        if switches.disabled():
            switches.announce_disabled("Ascend graph runner")
            self.enable_graph = _false
            self._off_reason = f"{switches.DISABLE_ENV}=1"
        # Each attention task of each graph holds an ExternalEvent: keep the sizes that fit (ACL 207008).
        budget = limits.fit_capture_sizes(getattr(model_config, "num_layers", 0) or 0, self.capture_sizes)
        if budget.message is not None and not backend_config.eager_mode:
            logger.warning("%s", budget.message)
        if budget.kept:
            self.capture_sizes = budget.kept
        else:
            self.enable_graph = _false
        self._graphs: dict[GraphKey, AscendSingleGraph] = {}
        self._eager_reasons: dict[GraphKey, str] = {}
        self._npu: Any = None
        self._caps: Capabilities | None = None
        self._pool: Any = None
        self._update_stream: Any = None
        self._fence: Any = None  # event recorded on the replay stream after the latest replay
        self._warned_oversize = False
        self.stats = GraphStats()
        self.guard = StaleGraphGuard(model)
        self.shadow = ShadowCheck()
        self._progress: stats.CaptureProgress | None = None
        stats.register(self, f"ascend graph runner {id(self):#x}")

    # -- lmdeploy GraphRunner API -----------------------------------------------------------------

    def get_capture_batch_sizes(self) -> list[int]:
        return list(self.capture_sizes)

    def get_graph_key(self, input_ids: torch.Tensor, attn_metadata: Any = None, **kwargs) -> GraphKey | None:
        """The key of this step's graph, or None when the batch is beyond the largest captured size."""
        context = self.ctx_mgr.current_context()
        batch = attn_metadata.block_offsets.size(0)
        query_len = max(1, input_ids.size(-1) // batch)
        padding = self.get_meta().padding_batch_size  # DP: the global batch every rank pads to
        wanted = batch if padding is None else padding
        if wanted > self.capture_sizes[-1]:
            return None
        extra = tuple(self.model.get_cudagraph_extra_key(**kwargs)) if hasattr(
            self.model, "get_cudagraph_extra_key") else ()
        return GraphKey(
            padded_batch=buckets.pad_to_bucket(self.capture_sizes, wanted),
            decoding=bool(context.global_is_decoding()),
            microbatch=bool(getattr(context, "enable_microbatch", False)),
            query_len=query_len,
            extra=extra,
        )

    def __call__(self, **kwargs):
        context = self.ctx_mgr.current_context()
        if not context.global_is_decoding():
            return self._forward_eager("not a decode step", **kwargs)
        if not self.enable_graph(**kwargs):
            return self._forward_eager(self._off_reason, **kwargs)
        key = self.get_graph_key(**kwargs)
        if key is None:
            if not self._warned_oversize:
                self._warned_oversize = True
                logger.warning("vendor_graph.ascend: a batch of %d is above the largest captured size %d and ran "
                               "eager (every such step does); raise max_batch_size or add the size to "
                               "cudagraph_capture_batch_sizes to capture it",
                               kwargs["attn_metadata"].block_offsets.size(0), self.capture_sizes[-1])
            return self._forward_eager("batch above the largest captured size", **kwargs)
        if key in self._eager_reasons:
            return self._forward_eager(self._eager_reasons[key], **kwargs)
        graph = self._graphs.get(key)
        if graph is None:
            return self._capture(key, kwargs)
        stale = self.guard.check(key, kwargs)
        if stale is not None:
            logger.warning("vendor_graph.ascend: %s: recapturing %s: %s", key,
                           "every graph" if stale.all_graphs else "its graph", stale.reason)
            self.stats.stale(key.padded_batch)
            if stale.all_graphs:
                for other in list(self._graphs):
                    self._drop(other)
            else:
                self._drop(key)
            return self._capture(key, kwargs)
        own = faults.StepMetadata(kwargs.get("attn_metadata"), self.ctx_mgr.current_context())
        try:
            return self._replay(graph, kwargs)
        except GraphInputsChanged as exc:  # raised by the fill, before the replay: this step runs eager
            own.restore()
            reason = f"inputs differ from the capture: {exc}"
            if reason not in self.stats.eager_steps:
                logger.warning("vendor_graph.ascend: a step for %s ran eager: %s", key, exc)
            return self._forward_eager(reason, **kwargs)

    def update_inputs(self, inputs):
        """DP: every rank pads to the same bucket of the global batch (as lmdeploy's CUDA runner)."""
        if self.backend_config.eager_mode:
            return inputs
        dp_meta = getattr(inputs, "dp_meta", None)
        if dp_meta is not None and inputs.global_is_decoding():
            padding = self.get_meta().padding_batch_size
            batch = inputs.seq_length.size(0)
            query_len = max(1, inputs.input_ids.numel() // max(batch, 1))
            if padding is not None and padding <= self.capture_sizes[-1]:
                dp_meta.sync_tp_size(buckets.pad_to_bucket(self.capture_sizes, padding) * query_len)
        return inputs

    def reset(self) -> None:
        """Free every graph, its registered tasks and the pool; a later step captures afresh.

        lmdeploy calls this from ``ModelAgent.reset_graph_runner``: on sleep, on a finished weight
        update and on release (0.16-0.18), so the stale-graph guard is cleared with the graphs."""
        super().reset()
        for key in list(self._graphs):
            self._drop(key)
        self._eager_reasons.clear()
        self.guard.clear()
        if self._progress is not None:
            self._progress.done()
        self._progress = None
        if not self.stats.empty():
            logger.debug("vendor_graph.ascend: graph stats before reset:\n%s", self.stats.summary())
        self.stats = GraphStats()
        self._pool = None
        self._fence = None
        if self._npu is not None and hasattr(self._npu, "empty_cache"):
            self._npu.empty_cache()

    # -- capture and replay -----------------------------------------------------------------------

    def _runtime(self) -> tuple[Any, Capabilities]:
        if self._npu is None:
            self._npu, self._caps = npu_runtime()
        return self._npu, self._caps

    def _drop(self, key: GraphKey) -> None:
        """Free one graph: its NPUGraph (memory back to the pool), registered tasks, buffers, guard record."""
        graph = self._graphs.pop(key, None)
        self.guard.forget(key)
        if graph is None:
            return
        if graph.graph is not None and hasattr(graph.graph, "reset"):
            graph.graph.reset()
        graph.graph = None
        graph.tasks.clear()
        graph.output_buffers.clear()
        if not self._graphs:  # the pool lives as long as a graph uses it; the next capture takes a new one
            self._pool = None

    def _forward_eager(self, reason: str, **kwargs):
        self.stats.eager(reason)
        if switches.DEBUG:
            logger.debug("vendor_graph.ascend: eager step (%s)", reason)
        output = self.model(**kwargs)
        return self.model.make_output_buffers(output)

    def _make_meta(self, key: GraphKey):
        from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta

        cfg = self.model_config
        optional = {
            "is_ssm": bool(getattr(cfg, "states_shapes", None)),
            "use_mrope": bool(getattr(cfg, "use_mrope", False)),
            "mla_index_topk": getattr(cfg, "mla_index_topk", None),
            "block_size": getattr(self.cache_config, "block_size", 64),
        }
        fields = getattr(CudaGraphMeta, "__dataclass_fields__", {})
        return CudaGraphMeta(
            max_batchs=key.padded_batch, max_tokens=key.padded_tokens, num_blocks=self.num_blocks,
            is_decoding=key.decoding, device=self.device, input_buffers={}, output_buffers={},
            vocab_size=getattr(cfg, "vocab_size", 1), decode_query_len=key.query_len,
            **{k: v for k, v in optional.items() if k in fields},
        )

    def _bind(self, graph: AscendSingleGraph, kwargs: dict[str, Any]) -> dict[str, Any]:
        padded = self.model.fill_buffers_cudagraph(graph.meta, **kwargs)
        self.model.update_context_cudagraph(graph.meta, self.ctx_mgr.current_context())
        return padded

    def _capture(self, key: GraphKey, kwargs: dict[str, Any]):
        patching.ensure_owned("before capture")
        npu, caps = self._runtime()
        if not caps.facts.get("graph_api"):
            reason = (f"torch_npu {caps.version} ({caps.generation or 'unknown generation'}) has no NPUGraph API; "
                      f"upgrade torch_npu for graph mode")
            self._eager_reasons[key] = reason
            logger.warning("vendor_graph.ascend: %s runs eager: %s", key, reason)
            return self._forward_eager(reason, **kwargs)
        if self._progress is None and self.stats.replays == 0:
            self._progress = self.stats.progress(len(self.capture_sizes))  # the up-front captures (warmup)
        # The fill rebinds attn_metadata's fields to the graph's buffers: keep the step's own for an
        # eager fallback should the warmup forward fail.
        own = faults.StepMetadata(kwargs.get("attn_metadata"), self.ctx_mgr.current_context())
        graph = AscendSingleGraph(key=key, meta=self._make_meta(key))
        memory_before = stats.device_memory(npu)
        start = time.perf_counter()
        try:
            graph.meta.input_buffers = self.model.make_buffers_cudagraph(graph.meta, **kwargs)
            padded = self._bind(graph, kwargs)
            warmup = self.model.make_output_buffers(self.model(**padded))  # outside the graph: first-use work
        except Exception as exc:
            self._capture_failed(key, graph, exc, "its warmup forward")
            own.restore()
            return self._forward_eager(self._eager_reasons[key], **kwargs)
        try:
            self._capture_into(graph, padded, npu, caps, force_task_update=False)
        except (GraphUnsafe, hook.NoSeqLenUpdate) as exc:
            self._eager_reasons[key] = str(exc)
            self._release(graph)
            logger.warning("vendor_graph.ascend: %s runs eager: %s", key, exc)
            return self.model.get_outputs_cudagraph(warmup, **kwargs)
        except Exception as exc:
            # Capture executes nothing, so this step's result is the warmup's; the key stays eager.
            self._capture_failed(key, graph, exc, "capture")
            return self.model.get_outputs_cudagraph(warmup, **kwargs)
        graph.capture_seconds = time.perf_counter() - start
        memory_after = stats.device_memory(npu)
        nbytes = None if memory_before is None or memory_after is None else memory_after - memory_before
        self.stats.captured(key.padded_batch, graph.capture_seconds, nbytes)
        self._graphs[key] = graph
        self.guard.record(key, kwargs)
        if self._progress is not None:
            self._progress.captured(key.padded_batch)
        logger.info("vendor_graph.ascend: captured %s in %.3fs (seq-len path %s, %d attention tasks)",
                    key, graph.capture_seconds, "/".join(sorted(graph.paths)), len(graph.tasks))
        return self.model.get_outputs_cudagraph(warmup, **kwargs)

    def _release(self, graph: AscendSingleGraph) -> None:
        """Nothing of a graph that was not registered survives it: its NPUGraph, tasks, buffers; the pool
        too when no registered graph uses it."""
        if graph.graph is not None and hasattr(graph.graph, "reset"):
            graph.graph.reset()
        graph.graph = None
        graph.tasks.clear()
        graph.output_buffers.clear()
        graph.meta.input_buffers = {}
        if not self._graphs:
            self._pool = None
            if self._npu is not None and hasattr(self._npu, "empty_cache"):
                self._npu.empty_cache()

    def _capture_failed(self, key: GraphKey, graph: AscendSingleGraph, exc: BaseException, stage: str) -> None:
        self._release(graph)
        self._eager_reasons[key] = faults.capture_failure_reason(exc, limits.explain_capture_error(exc))
        self.stats.capture_failed(key.padded_batch)
        if self._progress is not None:
            self._progress.captured(key.padded_batch)
        logger.error("vendor_graph.ascend: capturing %s failed in %s; it runs eager from now on (serving "
                     "continues): %s", key, stage, self._eager_reasons[key], exc_info=exc)

    def _capture_into(self, graph: AscendSingleGraph, padded, npu, caps: Capabilities, force_task_update: bool):
        if self._pool is None:
            self._pool = npu.graph_pool_handle()
        stream = npu.current_stream()
        npu_graph = npu.NPUGraph()
        graph_kwargs: dict[str, Any] = {"pool": self._pool, "stream": stream}
        if caps.facts.get("auto_dispatch_capture") and not force_task_update:
            graph_kwargs["auto_dispatch_capture"] = True
        scope = hook.CaptureScope(npu=npu, capabilities=caps, stream=stream, force_task_update=force_task_update,
                                  auto_dispatch="auto_dispatch_capture" in graph_kwargs)
        try:
            with scope, npu.graph(npu_graph, **graph_kwargs):
                output = self.model(**padded)
        except hook.NeedsTaskGroupCapture as exc:
            if hasattr(npu_graph, "reset"):
                npu_graph.reset()
            if force_task_update:
                raise GraphUnsafe(str(exc)) from exc
            logger.info("vendor_graph.ascend: %s: %s; recapturing with task groups only", graph.key, exc)
            return self._capture_into(graph, padded, npu, caps, force_task_update=True)
        except BaseException:
            if hasattr(npu_graph, "reset"):
                npu_graph.reset()
            raise
        problem = self._check_reach(npu_graph, scope.tasks)
        if problem is not None:
            if hasattr(npu_graph, "reset"):
                npu_graph.reset()
            if force_task_update or not caps.facts.get("task_group_api"):
                raise GraphUnsafe(problem)
            logger.warning("vendor_graph.ascend: %s: %s; recapturing with task groups", graph.key, problem)
            return self._capture_into(graph, padded, npu, caps, force_task_update=True)
        graph.graph = npu_graph
        graph.tasks = list(scope.tasks)
        graph.output_buffers = self.model.make_output_buffers(output)

    @staticmethod
    def _check_reach(npu_graph: Any, tasks: list[hook.AttentionTask]) -> str | None:
        """Why the update would miss a registered task, or None when every task is reached."""
        if not tasks:
            return ("no attention op registered through vendor_graph.npu.hook.call_attention during capture; "
                    "its host KV lengths would stay frozen at their capture values")
        wanted = sum(1 for t in tasks if t.path == GRAPH_UPDATE)
        if wanted:
            mode = getattr(npu_graph, "graph_dispatch_mode", None)
            records = getattr(mode, "graph_dispatch_records", None)
            if records is None or len(records) != wanted:
                got = "no" if records is None else len(records)
                return f"NPUGraph.update would reach {got} of the {wanted} attention tasks registered for it"
        return None

    def _replay(self, graph: AscendSingleGraph, kwargs: dict[str, Any]):
        npu = self._npu
        key = graph.key
        if self._progress is not None:  # the up-front captures are over
            self._progress.done()
            self._progress = None
        real_batch = kwargs["attn_metadata"].block_offsets.size(0)
        with stats.profile_range("vendor_graph.ascend.replay", real_batch, key.padded_batch):
            padded = self._bind(graph, kwargs)
            lens = graph.meta.input_buffers["kv_seqlens"].tolist()  # host buffer: no device sync
            self._refresh_seqlens(graph, lens)
            graph.graph.replay()
            # The fence: the next step's refresh must not rewrite these tasks while this replay runs.
            self._fence = npu.Event()
            self._fence.record(npu.current_stream())
        self.stats.replayed(key.padded_batch, kwargs["input_ids"].size(-1), key.padded_tokens)
        if switches.DEBUG:
            logger.debug("vendor_graph.ascend: replayed %s for a batch of %d", key, real_batch)
        outputs = self.model.get_outputs_cudagraph(graph.output_buffers, **kwargs)
        if self.shadow.due():
            return self._shadow(graph, padded, kwargs, outputs, real_batch)
        return outputs

    def _shadow(self, graph: AscendSingleGraph, padded: dict[str, Any], kwargs: dict[str, Any], outputs,
                real_batch: int):
        """Run the step eagerly on the graph's own filled inputs and compare (vendor_graph.shadow)."""
        with stats.profile_range("vendor_graph.ascend.shadow", real_batch, graph.key.padded_batch):
            eager = self.model.get_outputs_cudagraph(self.model.make_output_buffers(self.model(**padded)), **kwargs)
        problem = self.shadow.compare(outputs, eager)
        self.stats.shadowed(graph.key.padded_batch, problem is not None)
        if problem is None:
            return outputs
        if self.shadow.diverged("vendor_graph.ascend", graph.key, real_batch, graph.key.padded_batch, problem):
            self._drop(graph.key)
            self._eager_reasons[graph.key] = f"shadow check: graph differed from eager ({problem})"
            return eager
        return outputs

    def _refresh_seqlens(self, graph: AscendSingleGraph, lens: list[int]) -> None:
        npu = self._npu
        by_update = [t for t in graph.tasks if t.path == GRAPH_UPDATE]
        by_task = [t for t in graph.tasks if t.path == TASK_UPDATE]
        if by_update:
            # torch_npu updates on its own stream, which we cannot order on the device: wait on the host.
            if self._fence is not None:
                self._fence.synchronize()
            graph.graph.update(cpu_update_input=[{t.spec.key: t.host_value(lens)} for t in by_update])
        if by_task:
            if self._update_stream is None:
                self._update_stream = npu.Stream()
            stream = self._update_stream
            if self._fence is not None:
                stream.wait_event(self._fence)  # device-side: no host stall
            with npu.stream(stream):  # the re-issued op must be issued on the update stream
                for task in by_task:
                    npu.graph_task_update_begin(stream, task.handle)
                    task.call_with(lens)
                    npu.graph_task_update_end(stream)
                    task.event.record(stream)

    # -- introspection ----------------------------------------------------------------------------

    def graphs(self) -> dict[GraphKey, AscendSingleGraph]:
        return dict(self._graphs)

    def eager_reasons(self) -> dict[GraphKey, str]:
        return dict(self._eager_reasons)


def build_graph_runner(original, model, model_config, cache_config, backend_config, device, *args, **kwargs):
    """``AscendOpsBackend.build_graph_runner`` with vendor_graph's runner, keeping lmdeploy's side effects."""
    from lmdeploy.pytorch.backends.dlinfer.ascend.op_backend import AscendOpsBackend

    lifecycle.install()  # a finished update_params also drops the graphs (lmdeploy 0.16-0.18 do not)
    AscendOpsBackend.enable_graph = not backend_config.eager_mode
    AscendOpsBackend.max_batches = cache_config.max_batches
    is_mla = kwargs.pop("is_mla", None)
    if is_mla is None:
        is_mla = getattr(model_config, "k_head_dim", None) != getattr(model_config, "v_head_dim", None)
    return AscendGraphRunner(model, model_config, cache_config, backend_config, device, is_mla=is_mla)
