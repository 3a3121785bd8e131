"""A vendor as a small parameterisation of shared parts: its buffer spec and its runner builder.

:func:`install` turns a :class:`VendorProfile` into patches on lmdeploy: the four ``CudaGraphMixin``
methods dlinfer replaces (the three buffer methods, derived from the vendor's
:class:`~vendor_graph.buffers.BufferSpec`, and ``support_cuda_graph``), and a wrapper around the vendor op
backend's ``build_graph_runner`` that checks ownership where the runner is built.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..buffers import BufferSpec
from ..config import settings, switches
from ..ops import reports
from ..sizing import buckets
from ..upstream import compat
from ..upstream.compat import LmdeployApi
from . import bridges, graph_memory, lifecycle, patching, workers

logger = logging.getLogger("vendor_graph")


@dataclass(frozen=True)
class VendorProfile:
    name: str
    build_spec: Callable[[LmdeployApi], BufferSpec]
    # Builds the graph runner (a vendor_graph runner: its steps check ownership); receives lmdeploy's
    # original builder and its arguments.
    build_runner: Callable[..., Any]
    # Vendor-specific patches beyond the mixin and the builder.
    extra_setup: Callable[[patching.Activation], None] | None = None
    # (module, class) of the op backend whose builder we wrap; default: lmdeploy's dlinfer backend.
    op_backend: tuple[str, str] | None = None
    # Called after the spec's make (graph_meta, input_buffers, attn_metadata) and fill (graph_meta,
    # attn_metadata): buffers lmdeploy's backend owns beside ours (0.18 CUDA step metadata).
    after_make: Callable[[Any, dict, Any], None] | None = None
    after_fill: Callable[[Any, Any], None] | None = None
    # The default capture sizes for a max_batches (lmdeploy's CUDA runner rule unless the vendor has its own).
    capture_rule: Callable[[int], list[int]] = buckets.cuda_capture_sizes

    def capture_sizes(self, max_batches: int, explicit: Any = None) -> list[int]:
        """What this vendor captures for lmdeploy's ``max_batches`` and ``cudagraph_capture_batch_sizes``."""
        return buckets.capture_sizes(self.capture_rule, max_batches, explicit)

    @functools.cached_property
    def spec(self) -> BufferSpec:
        return self.build_spec(compat.lmdeploy_api())

    @property
    def op_backend_module(self) -> str:
        """lmdeploy's op backend module for this vendor, whose builder we wrap."""
        if self.op_backend is not None:
            return self.op_backend[0]
        return f"lmdeploy.pytorch.backends.dlinfer.{self.name}.op_backend"

    @property
    def op_backend_class(self) -> str:
        if self.op_backend is not None:
            return self.op_backend[1]
        return f"{self.name.capitalize()}OpsBackend"


def _model_inputs(input_ids, position_ids, inputs_embeds, kwargs) -> dict[str, Any]:
    inputs = dict(kwargs)
    inputs["input_ids"] = input_ids
    inputs["position_ids"] = position_ids
    if inputs_embeds is not None:
        inputs["inputs_embeds"] = inputs_embeds
    return inputs


def support_cuda_graph(self, input_ids, position_ids, past_key_values, attn_metadata=None, inputs_embeds=None,
                       **kwargs) -> bool:
    """lmdeploy's own rule (0.16-0.18): a graph for every step that is decoding on all DP ranks.

    dlinfer's Ascend module replaces it with a rule that refuses multi-token decode below torch_npu
    2.8.0.post1 and caches its first answer for the whole process. Which multi-token keys a graph can
    serve is the runner's business (its seq-len path is chosen per op and per runner), not a
    process-wide version gate.
    """
    global _step_ctx_manager
    if _step_ctx_manager is None:
        from lmdeploy.pytorch.model_inputs import get_step_ctx_manager

        _step_ctx_manager = get_step_ctx_manager
    return _step_ctx_manager().current_context().global_is_decoding()


_step_ctx_manager: Callable[[], Any] | None = None  # lmdeploy's get_step_ctx_manager, imported at the first call


MIXIN_METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph",
                 "support_cuda_graph")


def buffer_methods(profile: VendorProfile) -> dict[str, Callable]:
    """The ``CudaGraphMixin`` methods for ``profile``: the three buffer methods, all reading the same
    spec, and lmdeploy's ``support_cuda_graph`` rule (:data:`MIXIN_METHODS`)."""

    def make_buffers_cudagraph(self, graph_meta, input_ids, position_ids, past_key_values, attn_metadata,
                               inputs_embeds=None, **kwargs):
        inputs = _model_inputs(input_ids, position_ids, inputs_embeds, kwargs)
        input_buffers = profile.spec.make(graph_meta, inputs, attn_metadata)
        if profile.after_make is not None:
            profile.after_make(graph_meta, input_buffers, attn_metadata)
        return input_buffers

    def fill_buffers_cudagraph(self, graph_meta, input_ids, position_ids, past_key_values, attn_metadata,
                               inputs_embeds=None, **kwargs):
        inputs = _model_inputs(input_ids, position_ids, inputs_embeds, kwargs)
        # The StepContext the runner binds next: its sources go into this fill's one device copy.
        ctx_mgr = getattr(self, "ctx_mgr", None)
        context = ctx_mgr.current_context() if ctx_mgr is not None else None
        new_inputs = profile.spec.fill(graph_meta, inputs, attn_metadata, context)
        if profile.after_fill is not None:
            profile.after_fill(graph_meta, attn_metadata)
        new_inputs["past_key_values"] = past_key_values
        new_inputs["attn_metadata"] = attn_metadata
        return new_inputs

    def update_context_cudagraph(self, graph_meta, context):
        profile.spec.bind_context(graph_meta, context)

    methods = {
        "make_buffers_cudagraph": make_buffers_cudagraph,
        "fill_buffers_cudagraph": fill_buffers_cudagraph,
        "update_context_cudagraph": update_context_cudagraph,
    }
    for name, fn in methods.items():
        fn.__qualname__ = name
        fn.__module__ = f"vendor_graph.{profile.name}"
        fn.__doc__ = f"vendor_graph.{profile.name}: {name.replace('_cudagraph', '')} from the vendor's BufferSpec."
    @functools.wraps(support_cuda_graph)
    def support_cuda_graph_of_vendor(self, *args, **kwargs) -> bool:
        return support_cuda_graph(self, *args, **kwargs)

    support_cuda_graph_of_vendor.__module__ = f"vendor_graph.{profile.name}"
    methods["support_cuda_graph"] = support_cuda_graph_of_vendor
    return methods


def _wrap_builder(profile: VendorProfile, original: Callable) -> Callable:
    @functools.wraps(original)
    def build_graph_runner(model, model_config, cache_config, backend_config, device, *args, **kwargs):
        settings.load()  # what the runner reads; a value not accepted fails the build, not a later capture
        reports.start_writer()  # a stats file named since activation, or its directory gone, counts from here
        patching.ensure_owned("before building the graph runner")
        if switches.disabled():  # VENDOR_GRAPH_DISABLE=1: every runner eager; the buffer patches stay
            switches.announce_disabled(f"{profile.name} graph runner")
            backend_config = copy.copy(backend_config)
            backend_config.eager_mode = True
        runner = profile.build_runner(original, model, model_config, cache_config, backend_config, device,
                                      *args, **kwargs)
        # Building may import dlinfer's runner module, which reassigns the mixin methods.
        patching.ensure_owned("after building the graph runner")
        return runner

    build_graph_runner.__module__ = f"vendor_graph.{profile.name}"
    build_graph_runner.__qualname__ = "build_graph_runner"
    return build_graph_runner


def install(profile: VendorProfile) -> patching.Activation:
    """Activate ``profile`` in this process (idempotent; another vendor already active is an error, and so
    is a ``VENDOR_GRAPH_*`` value not accepted: :class:`~vendor_graph.config.settings.SettingsError`)."""
    settings.load()
    switches.ensure_log_handler()
    reports.start_writer()  # the stats file, every VENDOR_GRAPH_STATS_EVERY minutes; reports arms the exit write
    version = compat.check_lmdeploy_supported(profile.name)
    if compat.series(version) not in compat.SUPPORTED_SERIES[profile.name]:
        logger.warning(
            "vendor_graph.%s on unsupported lmdeploy %s (%s=1): expect breakage",
            profile.name, version, compat.ALLOW_UNSUPPORTED_ENV,
        )

    def setup(activation: patching.Activation) -> None:
        def patch_mixin(module) -> None:
            for name, fn in buffer_methods(profile).items():
                activation.add(patching.Patch(module.CudaGraphMixin, name, fn))

        def patch_builder(module) -> None:
            backend = getattr(module, profile.op_backend_class)
            original = backend.build_graph_runner  # the plain function behind the staticmethod
            wrapped = _wrap_builder(profile, original)
            activation.add(patching.Patch(backend, "build_graph_runner", staticmethod(wrapped)))

        patching.when_imported(compat.CUDAGRAPH_MODULE, patch_mixin)
        patching.when_imported(profile.op_backend_module, patch_builder)
        lifecycle.install(activation)  # a finished weight update drops the graphs (lmdeploy does not)
        graph_memory.install(activation, profile)  # graph memory kept out of the KV cache lmdeploy sizes
        bridges.install(activation)  # lmdeploy calls the installed dlinfer cannot take, where its signatures say so
        workers.install(activation)  # a spawned worker that dies stops the engine instead of hanging it
        if profile.extra_setup is not None:
            profile.extra_setup(activation)

    return patching.activate(profile.name, setup)


def activation_on_import(profile: VendorProfile) -> Callable[[], patching.Activation]:
    """A public vendor module's ``activate`` (idempotent), run now: importing ``vendor_graph.<vendor>``
    activates the vendor. Only the public modules call this; nothing in the package imports them."""
    activate = functools.partial(install, profile)
    activate()
    return activate

