"""A CPU simulator of accelerator graph mode: a fake ``npu`` device, graph capture/replay, streams, events, and
simulated ``torch_npu`` modules for every graph-API generation (G0 … G5), generated from the wheel manifests and
:data:`vendor_graph.vendors.ascend.releases.GENERATION_FACTS`. Use it in its own process: torch allows one PrivateUse1
backend name per process. Beyond ``torch_npu.npu``, the simulated package has what the real dlinfer and lmdeploy's
Ascend backend reach for (``contrib.transfer_to_npu``, ``utils._path_manager``, ``profiler``,
``_C._NPUTaskGroupHandle``, ``empty_with_format``, ``__file__``/``__spec__``, the ATB plugin load, an Ascend910B1
device name and SoC version), generated from ``data/torch_npu_surface.json`` (:mod:`._npu_surface`).

Reproduced: capture executes nothing (outputs hold poison until the first replay); replay re-runs the recorded
work on current contents, allocating from a shareable pool whose address reuse lets one graph's replay clobber
another's freed output; host values are frozen at capture except through the vendor's update API; a
device-to-host sync during capture raises :class:`SimCaptureError`; ``config.eager_drain = False`` defers all
stream work to sync points, exposing host/device races.

Suspected, unconfirmed on hardware (switches in :data:`config`, defaults = the suspicion): an
``auto_dispatch_capture`` task waits on its ExternalEvent at every replay, so a replay without a matching
``NPUGraph.update()`` deadlocks (:class:`SimDeadlockError`); on G2a (2.1.0.post13, 2.5.1.post1, 2.6.0) an FIA
``.default`` call is not intercepted, so ``update()`` is a silent no-op (on hardware check
``len(graph.graph_dispatch_mode.graph_dispatch_records)``); ``Event`` waits follow CUDA semantics. Not
simulated: pinned memory (``pin_memory()`` fails once installed), RNG in graphs, ``make_graphed_callables``,
the G3b+ op-handler hooks. Threads: each has its own current stream; a task update opened while another thread
has one open fails, as on the device.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from typing import Any

from . import _runtime
from ._cuda import cuda_graph_api
from ._device import install, installed
from ._runtime import (
    Counters,
    Event,
    ExternalEvent,
    Pool,
    SimCaptureError,
    SimConfig,
    SimDeadlockError,
    SimGraph,
    Stream,
    config,
    counters,
    current_stream,
    default_stream,
    discard_queued_work,
    pending_work,
)
from ._tensor import SimTensor, is_device_tensor
from ._torch_npu import load_manifest, resolve, torch_npu_module

_MISSING = object()


def synchronize() -> None:
    """Run all queued device work (``torch.npu.synchronize()``)."""
    _runtime.sync_device("synchronize()")


def pool_of(handle: Any) -> Pool:
    """The simulator's :class:`Pool` behind a graph pool handle (bytes allocated, segments, reuse)."""
    return _runtime.pool_of(handle)


def reset_counters() -> None:
    """Zero :data:`counters`."""
    counters.reset()


@contextlib.contextmanager
def count_ops() -> Iterator[Counters]:
    """``with count_ops() as c:`` — :class:`Counters` of the device work issued inside the block only."""
    saved = counters.snapshot()
    counters.reset()
    inner = Counters()
    try:
        yield inner
    finally:
        for name in Counters.__slots__:
            value = getattr(counters, name)
            # a copy: the global Counter gets the outer block's counts added back just below
            setattr(inner, name, collections.Counter(value) if name == "by_op" else value)
        for name, value in saved.items():
            current = getattr(counters, name)
            if name == "by_op":
                current.update(value)
            else:
                setattr(counters, name, current + value)


@contextlib.contextmanager
def configured(**switches: Any) -> Iterator[SimConfig]:
    """Set :data:`config` fields for the block (e.g. ``configured(eager_drain=False)``); restored after."""
    saved = {name: getattr(config, name) for name in switches}
    for name, value in switches.items():
        if not hasattr(config, name):
            raise AttributeError(f"SimConfig has no switch {name!r}")
        setattr(config, name, value)
    try:
        yield config
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


@contextlib.contextmanager
def use_torch_npu(generation_or_version: str | None = None) -> Iterator[Any]:
    """Make a simulated ``torch_npu`` importable (and ``torch.npu`` its device module) for the block.

    ``generation_or_version`` is a generation (``"G2b"``, its newest release) or a torch_npu version
    (``"2.8.0.post2"``); None means the newest generation. Inside the block its submodules import
    (``torch_npu.contrib.transfer_to_npu``, ``torch_npu.profiler``, ...; each with a ``ModuleSpec``), and
    ``torch.ops.load_library`` of its ``lib/libop_plugin_atb.so`` registers the emulated ``atb`` operators.
    On exit ``sys.modules`` (every ``torch_npu*`` entry), ``torch.npu``, ``torch.ops.load_library`` and,
    if ``transfer_to_npu`` redirected it, ``torch.cuda`` are restored exactly.
    """
    import sys

    import torch

    from . import _npu_surface

    device = install()
    package = torch_npu_module(generation_or_version)
    entries = {"torch_npu": package, "torch_npu.npu": package.npu, "torch_npu.version": package.version,
               f"torch.{installed()}": package.npu}
    saved = {name: value for name, value in sys.modules.items() if name == "torch_npu"
             or name.startswith("torch_npu.")}
    saved_device_entry = sys.modules.get(f"torch.{installed()}", _MISSING)
    saved_attr = getattr(torch, installed(), device)
    try:
        for name in saved:
            sys.modules.pop(name, None)
        sys.modules.update(entries)
        setattr(torch, installed(), package.npu)
        with _npu_surface.installed(package):
            yield package
    finally:
        setattr(torch, installed(), saved_attr)
        for name in [n for n in sys.modules if n == "torch_npu" or n.startswith("torch_npu.")]:
            sys.modules.pop(name, None)
        sys.modules.update(saved)
        if saved_device_entry is _MISSING:
            sys.modules.pop(f"torch.{installed()}", None)
        else:
            sys.modules[f"torch.{installed()}"] = saved_device_entry


__all__ = [
    "Counters", "Event", "ExternalEvent", "Pool", "SimCaptureError", "SimConfig", "SimDeadlockError", "SimGraph",
    "SimTensor", "Stream", "config", "configured", "count_ops", "counters", "cuda_graph_api", "current_stream",
    "default_stream", "discard_queued_work", "install", "installed", "is_device_tensor", "load_manifest",
    "pending_work", "pool_of", "reset_counters", "resolve", "synchronize", "torch_npu_module", "use_torch_npu",
]
