"""AscendGraphRunner: one NPUGraph per GraphKey, with the seq-len refresh Ascend attention needs.

Per replay: fill the graph's buffers (vendor_graph's CudaGraphMixin methods), refresh the host KV
lengths of every registered attention task (``NPUGraph.update`` or the task-group path, chosen per
op), replay, and record a fence. What a step does is :class:`~vendor_graph.runtime.step.StepPolicy`'s call.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import switches
from ...runtime import counters
from ...runtime.key import GraphKey
from ...runtime.step import CaptureFailed, GraphBackend, StepPolicy, StepView
from ...sizing import buckets, capacity
from ...sizing.buckets import ascend_capture_sizes
from . import hook, limits
from .seqlen import GRAPH_UPDATE, TASK_UPDATE, UPDATES, Capabilities, detect
from .spec import HOST_KV_SEQLENS

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
    # The stream NPUGraph.update() re-issues this graph's tasks on (torch_npu's own), when reachable.
    update_stream: Any = None

    @property
    def paths(self) -> set[str]:
        return {t.path for t in self.tasks}


NOT_DECODING = StepView("not a decode step")


class GraphUnsafe(RuntimeError):
    """This key cannot be captured so that its replays are right; it runs eager."""


class AscendGraphRunner(GraphRunner, GraphBackend):
    """lmdeploy GraphRunner for Ascend NPUs (built by ``AscendOpsBackend.build_graph_runner``): NPUGraph
    capture and replay behind :class:`~vendor_graph.runtime.step.StepPolicy`, with the seq-len refresh."""

    label = "vendor_graph.ascend"

    def __init__(self, model, model_config, cache_config, backend_config, device, **kwargs):
        super().__init__(model, model_config, cache_config, backend_config, device)
        self.num_blocks = cache_config.num_gpu_blocks
        self.max_batches = cache_config.max_batches
        self.capture_plan = capacity.resolve_capture_plan(
            "ascend", cache_config.max_batches, ascend_capture_sizes(cache_config.max_batches),
            getattr(cache_config, "cudagraph_capture_batch_sizes", None),
            num_layers=getattr(model_config, "num_layers", 0) or 0, num_blocks=cache_config.num_gpu_blocks,
            reserved_bytes=getattr(cache_config, capacity.RESERVED_ATTR, None))
        self._sizes = list(self.capture_plan.sizes)
        self.enable_graph = _false if backend_config.eager_mode else getattr(model, "support_cuda_graph", _false)
        self._off_reason = "graph mode off for this model or step"
        if switches.disabled():
            switches.announce_disabled("Ascend graph runner")
            self.enable_graph = _false
            self._off_reason = f"{switches.DISABLE_ENV}=1"
        # Each attention task of each graph holds an ExternalEvent: keep the sizes that fit (ACL 207008).
        budget = limits.fit_capture_sizes(getattr(model_config, "num_layers", 0) or 0, self._sizes)
        if budget.message is not None and not backend_config.eager_mode:
            logger.warning("%s", budget.message)
        if budget.kept:
            self._sizes = budget.kept
        elif self.enable_graph is not _false:
            self.enable_graph = _false
            self._off_reason = budget.off_reason
        self._graphs: dict[GraphKey, AscendSingleGraph] = {}
        self._npu: Any = None
        self._caps: Capabilities | None = None
        self._pool: Any = None
        self._update_stream: Any = None
        self._fence: Any = None  # event recorded on the replay stream after each replay (re-recorded)
        self._extra_key = hasattr(model, "get_cudagraph_extra_key")
        self.policy = StepPolicy(self)

    # -- lmdeploy GraphRunner API -----------------------------------------------------------------

    def __call__(self, **kwargs):
        return self.policy.step(kwargs)

    def get_capture_batch_sizes(self) -> list[int]:
        return list(self._sizes)

    def get_graph_key(self, input_ids: torch.Tensor, attn_metadata: Any = None, **kwargs) -> GraphKey:
        rows = attn_metadata.block_offsets.size(0)
        context = self.ctx_mgr.current_context()
        return self._key(self._wanted(rows), rows, bool(context.global_is_decoding()), context, input_ids, kwargs)

    def _key(self, batch: int, rows: int, decoding: bool, context: Any, input_ids: torch.Tensor,
             kwargs: dict[str, Any]) -> GraphKey:
        extra = tuple(self.model.get_cudagraph_extra_key(**kwargs)) if self._extra_key else ()
        return GraphKey(
            padded_batch=buckets.pad_to_bucket(self._sizes, batch),
            decoding=decoding,
            microbatch=bool(getattr(context, "enable_microbatch", False)),
            query_len=max(1, input_ids.size(-1) // rows),
            extra=extra,
        )

    def update_inputs(self, inputs):
        """DP: every rank pads to the same bucket of the global batch (as lmdeploy's CUDA runner)."""
        if self.backend_config.eager_mode:
            return inputs
        dp_meta = getattr(inputs, "dp_meta", None)
        if dp_meta is not None and inputs.global_is_decoding():
            padding = self.get_meta().padding_batch_size
            batch = inputs.seq_length.size(0)
            query_len = max(1, inputs.input_ids.numel() // max(batch, 1))
            if padding is not None and padding <= self._sizes[-1]:
                dp_meta.sync_tp_size(buckets.pad_to_bucket(self._sizes, padding) * query_len)
        return inputs

    def reset(self) -> None:
        """Free every graph, its registered tasks and the pool; a later step captures afresh.

        lmdeploy calls this from ``ModelAgent.reset_graph_runner``: on sleep, on a finished weight
        update and on release (0.16-0.18)."""
        super().reset()
        self.policy.reset()
        self._fence = None

    # -- GraphBackend -----------------------------------------------------------------------------

    def view(self, kwargs: dict[str, Any]) -> StepView:
        context = self.ctx_mgr.current_context()
        if not context.global_is_decoding():
            return NOT_DECODING
        if not self.enable_graph(**kwargs):
            return StepView(self._off_reason)
        rows = kwargs["attn_metadata"].block_offsets.size(0)
        batch = self._wanted(rows)
        if batch > self._sizes[-1]:
            return StepView(None, batch)
        key = self._key(batch, rows, True, context, kwargs["input_ids"], kwargs)
        return StepView(None, batch, key, self._graphs.get(key))

    def forward_skipped(self, reason: str, kwargs: dict[str, Any]) -> Any:
        return self.policy.eager(reason, kwargs)

    def _wanted(self, batch: int) -> int:
        padding = self.get_meta().padding_batch_size  # DP: the global batch every rank pads to
        return batch if padding is None else padding

    def capture_sizes(self) -> list[int]:
        return self._sizes

    def device_memory(self) -> int | None:
        return counters.device_memory(self._runtime()[0])

    def release(self, key: GraphKey | None) -> None:
        """Free graphs (their NPUGraph, registered tasks and buffers), and the pool and cached device
        memory once no graph uses them."""
        for graph in list(self._graphs.values()) if key is None else [self._graphs.get(key)]:
            if graph is not None:
                self._free(self._graphs.pop(graph.key))
        if not self._graphs:
            self._pool = None
            self._fence = None
            if self._npu is not None and hasattr(self._npu, "empty_cache"):
                self._npu.empty_cache()

    @staticmethod
    def _free(graph: AscendSingleGraph) -> None:
        if graph.graph is not None and hasattr(graph.graph, "reset"):
            graph.graph.reset()
        graph.graph = None
        graph.tasks.clear()
        graph.output_buffers.clear()
        graph.meta.input_buffers = {}

    # -- capture and replay -----------------------------------------------------------------------

    def _runtime(self) -> tuple[Any, Capabilities]:
        if self._npu is None:
            self._npu, self._caps = npu_runtime()
        return self._npu, self._caps

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
        meta = CudaGraphMeta(
            max_batchs=key.padded_batch, max_tokens=key.padded_tokens, num_blocks=self.num_blocks,
            is_decoding=key.decoding, device=self.device, input_buffers={}, output_buffers={},
            vocab_size=getattr(cfg, "vocab_size", 1), decode_query_len=key.query_len,
            **{k: v for k, v in optional.items() if k in fields},
        )
        # What the KV-slot padding depends on (spec.kv_slot_padding): MLA caches are filled by scatter.
        meta.kv_is_mla = getattr(cfg, "k_head_dim", None) != getattr(cfg, "v_head_dim", None)
        meta.kv_block_size = int(getattr(self.cache_config, "block_size", 64))
        return meta

    def _bind(self, graph: AscendSingleGraph, kwargs: dict[str, Any]) -> dict[str, Any]:
        padded = self.model.fill_buffers_cudagraph(graph.meta, **kwargs)
        self.model.update_context_cudagraph(graph.meta, self.ctx_mgr.current_context())
        return padded

    def capture(self, key: GraphKey, kwargs: dict[str, Any]) -> Any:
        npu, caps = self._runtime()
        if not caps.facts.get("graph_api"):
            raise CaptureFailed(f"torch_npu {caps.version} ({caps.generation or 'unknown generation'}) has no "
                                f"NPUGraph API; upgrade torch_npu for graph mode", fault=False)
        graph = AscendSingleGraph(key=key, meta=self._make_meta(key))
        try:
            graph.meta.input_buffers = self.model.make_buffers_cudagraph(graph.meta, **kwargs)
            padded = self._bind(graph, kwargs)
            warmup = self.model.make_output_buffers(self.model(**padded))  # outside the graph: first-use work
        except Exception as exc:
            self._release_unregistered(graph)
            raise CaptureFailed(str(exc), hint=limits.explain_capture_error(exc)) from exc
        # Capture executes nothing, so from here on a failure still has the warmup's result for this step.
        outputs = self.model.get_outputs_cudagraph(warmup, **kwargs)
        try:
            self._capture_into(graph, padded, npu, caps, force_task_update=False)
        except (GraphUnsafe, hook.NoSeqLenUpdate) as exc:
            self._release_unregistered(graph)
            raise CaptureFailed(str(exc), outputs=outputs, fault=False) from exc
        except Exception as exc:
            self._release_unregistered(graph)
            raise CaptureFailed(str(exc), outputs=outputs, hint=limits.explain_capture_error(exc)) from exc
        self._graphs[key] = graph
        logger.info("%s: %s: seq-len path %s, %d attention tasks", self.label, key,
                    "/".join(sorted(graph.paths)), len(graph.tasks))
        return outputs

    def _release_unregistered(self, graph: AscendSingleGraph) -> None:
        """Nothing of a graph that was not registered survives it; the pool neither, when unused."""
        self._free(graph)
        self.release(graph.key)

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
            logger.info("%s: %s: %s; recapturing with task groups only", self.label, graph.key, exc)
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
            logger.warning("%s: %s: %s; recapturing with task groups", self.label, graph.key, problem)
            return self._capture_into(graph, padded, npu, caps, force_task_update=True)
        graph.graph = npu_graph
        graph.tasks = list(scope.tasks)
        graph.output_buffers = self.model.make_output_buffers(output)
        if any(t.path == GRAPH_UPDATE for t in graph.tasks):
            graph.update_stream = graph_update_stream(npu_graph)
            if graph.update_stream is None:
                logger.warning("%s: %s: torch_npu's update stream is not reachable on this graph; each step "
                               "waits on the host for the previous replay before NPUGraph.update", self.label,
                               graph.key)

    @staticmethod
    def _check_reach(npu_graph: Any, tasks: list[hook.AttentionTask]) -> str | None:
        """Why the update would miss a registered task, or None when every task is reached."""
        if not tasks:
            return ("no attention op registered through vendor_graph.vendors.ascend.hook.call_attention during "
                    "capture; its host KV lengths would stay frozen at their capture values")
        wanted = sum(1 for t in tasks if t.path == GRAPH_UPDATE)
        if wanted:
            mode = getattr(npu_graph, "graph_dispatch_mode", None)
            records = getattr(mode, "graph_dispatch_records", None)
            if records is None or len(records) != wanted:
                got = "no" if records is None else len(records)
                return f"NPUGraph.update would reach {got} of the {wanted} attention tasks registered for it"
        return None

    def replay(self, view: StepView, kwargs: dict[str, Any]) -> Any:
        npu = self._npu
        graph = view.graph
        self._bind(graph, kwargs)
        lens = graph.meta.input_buffers[HOST_KV_SEQLENS].tolist()  # host buffer: no device sync
        self._refresh_seqlens(graph, lens)
        graph.graph.replay()
        # The fence: the next step's refresh must not rewrite these tasks while this replay runs. One
        # event, re-recorded: a stream wait targets the latest record issued before it.
        if self._fence is None:
            self._fence = npu.Event()
        self._fence.record(npu.current_stream())
        return self.model.get_outputs_cudagraph(graph.output_buffers, **kwargs)

    def _refresh_seqlens(self, graph: AscendSingleGraph, lens: list[int]) -> None:
        npu = self._npu
        fence = self._fence
        by_update = [t for t in graph.tasks if t.path == GRAPH_UPDATE]
        by_task = [t for t in graph.tasks if t.path == TASK_UPDATE]
        if by_update:
            if fence is not None:
                if graph.update_stream is not None:
                    graph.update_stream.wait_event(fence)  # torch_npu updates on this stream: device order
                else:
                    fence.synchronize()
            with UPDATES:
                graph.graph.update(cpu_update_input=[{t.spec.key: t.host_value(lens)} for t in by_update])
        if by_task:
            if self._update_stream is None:
                self._update_stream = npu.Stream()
            stream = self._update_stream
            if fence is not None:
                stream.wait_event(fence)  # device-side: no host stall
            with UPDATES, npu.stream(stream):  # the re-issued op must be issued on the update stream
                for task in by_task:
                    npu.graph_task_update_begin(stream, task.handle)
                    task.call_with(lens)
                    npu.graph_task_update_end(stream)
                    task.event.record(stream)

    # -- introspection ----------------------------------------------------------------------------

    def graphs(self) -> dict[GraphKey, AscendSingleGraph]:
        return dict(self._graphs)


def graph_update_stream(npu_graph: Any) -> Any:
    """The stream ``npu_graph.update()`` issues its task updates on, or None when it cannot be reached.

    torch_npu keeps it on the graph's dispatch mode: one per graph in G2a-G2c (made in the mode's
    ``__init__``), one per class from G3a on (made in its ``__new__``); either way it exists once the
    ``NPUGraph`` does. Ordering that stream after the previous replay keeps the host out of the step.
    """
    stream = getattr(getattr(npu_graph, "graph_dispatch_mode", None), "update_stream", None)
    return stream if callable(getattr(stream, "wait_event", None)) else None


def build_graph_runner(original, model, model_config, cache_config, backend_config, device, *args, **kwargs):
    """``AscendOpsBackend.build_graph_runner`` with vendor_graph's runner, keeping lmdeploy's side effects."""
    from lmdeploy.pytorch.backends.dlinfer.ascend.op_backend import AscendOpsBackend

    AscendOpsBackend.enable_graph = not backend_config.eager_mode
    AscendOpsBackend.max_batches = cache_config.max_batches
    return AscendGraphRunner(model, model_config, cache_config, backend_config, device)
