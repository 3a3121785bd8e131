"""A CUDA-style graph API (``torch.cuda.CUDAGraph``, ``torch.cuda.graph`` ...) backed by the simulator.

What lmdeploy's ``CUDAGraphRunner`` / ``CUDASingleGraphRunner`` (0.16–0.18) call: ``graph_pool_handle()``,
``CUDAGraph()`` + ``capture_begin/capture_end/replay/reset/pool``, ``graph(g, pool=, stream=,
capture_error_mode=)``, ``current_stream()``, plus the stream/sync basics. The graph classes are
generated with the parameter lists of the installed torch's own ``torch.cuda`` classes, so a keyword
torch does not take fails here too. :func:`cuda_graph_api` patches ``torch.cuda`` for the duration of a
``with`` block and restores every attribute exactly (absent ones are removed again).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from . import _runtime as rt
from ._signatures import generate
from ._torch_npu import _generate_class

_MISSING = object()


def _params_of(fn: Callable[..., Any]) -> list[dict[str, Any]]:
    params = []
    for p in inspect.signature(fn).parameters.values():
        entry: dict[str, Any] = {"name": p.name, "kind": p.kind.name.lower()}
        if p.default is not inspect.Parameter.empty:
            entry["default"] = repr(p.default)
        params.append(entry)
    return params


def _method_spec(cls: type, names: tuple[str, ...]) -> dict[str, Any]:
    methods = {}
    for name in names:
        fn = getattr(cls, name, None)
        if fn is None:
            continue
        try:
            methods[name] = {"params": _params_of(fn), "decorators": []}
        except (TypeError, ValueError):
            continue
    return {"methods": methods}


def _capture_begin(self: Any, pool: Any = None, capture_error_mode: str = "global", **_: Any) -> None:
    stream = rt.current_stream()
    if rt.config.cuda_forbid_default_stream_capture and stream is rt.default_stream():
        raise RuntimeError("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok "
                           "to replay them on the default stream.)")
    self._sim.capture_begin(pool, capture_error_mode)


def build_cuda_api() -> dict[str, Any]:
    """The attributes :func:`cuda_graph_api` puts on ``torch.cuda``."""
    graph_names = ("__new__", "capture_begin", "capture_end", "replay", "reset", "pool", "instantiate", "debug_dump",
                   "enable_debug_mode")

    def new(cls: type, keep_graph: bool = False, **_: Any) -> Any:
        obj = object.__new__(cls)
        obj._sim = rt.SimGraph()
        return obj

    impls = {
        "__new__": new,
        "capture_begin": _capture_begin,
        "capture_end": lambda self: self._sim.capture_end(),
        "replay": lambda self: self._sim.replay(),
        "reset": lambda self: self._sim.reset(),
        "pool": lambda self: self._sim.pool_handle(),
        "instantiate": lambda self: None,
        "debug_dump": lambda self, debug_path: None,
        "enable_debug_mode": lambda self: None,
    }
    cuda_graph = _generate_class("CUDAGraph", _method_spec(torch.cuda.CUDAGraph, graph_names), object, impls,
                                 "torch.cuda", {"sim_graph": property(lambda self: self._sim)})

    def init(self: Any, cuda_graph: Any, pool: Any = None, stream: Any = None, capture_error_mode: str = "global",
             **_: Any) -> None:
        cls = type(self)
        if cls.default_capture_stream is None:
            cls.default_capture_stream = rt.Stream()
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else cls.default_capture_stream
        self.stream_ctx = rt.stream_context(self.capture_stream)
        self.cuda_graph = cuda_graph
        self.capture_error_mode = capture_error_mode

    def enter(self: Any) -> None:
        rt.sync_device("torch.cuda.synchronize()")
        gc.collect()
        self.stream_ctx.__enter__()
        try:
            self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def exit_(self: Any, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        try:
            try:
                self.cuda_graph.capture_end()
            except Exception:
                if exc_type is None:
                    raise
            if exc_type is not None:
                self.cuda_graph._sim._abort(f"{exc_type.__name__} raised inside the captured region")
        finally:
            self.stream_ctx.__exit__(None, None, None)

    graph_ctx = _generate_class("graph", _method_spec(torch.cuda.graph, ("__init__", "__enter__", "__exit__")),
                                object, {"__init__": init, "__enter__": enter, "__exit__": exit_}, "torch.cuda",
                                {"default_capture_stream": None})

    def synchronize(device: Any = None) -> None:
        rt.sync_device("torch.cuda.synchronize()")

    return {
        "CUDAGraph": cuda_graph,
        "graph": graph_ctx,
        "graph_pool_handle": generate("graph_pool_handle", [], lambda: rt.new_pool_handle(), "graph_pool_handle",
                                      "torch.cuda"),
        "is_current_stream_capturing": lambda: rt.current_stream().capture is not None,
        "current_stream": lambda device=None: rt.current_stream(),
        "default_stream": lambda device=None: rt.default_stream(),
        "set_stream": rt.set_stream,
        "stream": rt.stream_context,
        "Stream": rt.Stream,
        "Event": rt.Event,
        "synchronize": synchronize,
        "is_available": lambda: True,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "empty_cache": lambda: None,
        "mem_get_info": lambda device=None: (64 << 30, 64 << 30),
        "get_device_capability": lambda device=None: (9, 0),
    }


@contextlib.contextmanager
def cuda_graph_api() -> Iterator[dict[str, Any]]:
    """Within the block, ``torch.cuda``'s graph/stream API drives the simulator; restored exactly on exit."""
    from ._device import install

    install()
    api = build_cuda_api()
    saved = {name: torch.cuda.__dict__.get(name, _MISSING) for name in api}
    try:
        for name, value in api.items():
            setattr(torch.cuda, name, value)
        yield api
    finally:
        for name, value in saved.items():
            if value is _MISSING:
                torch.cuda.__dict__.pop(name, None)
            else:
                setattr(torch.cuda, name, value)
