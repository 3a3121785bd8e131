"""Simulated ``torch_npu`` modules, one per graph-API generation, GENERATED from the wheel facts.

Nothing here is written per generation. The public surface of ``torch_npu.npu`` (which names exist,
each function's and method's parameters, the class attributes, what ``graph.__enter__`` calls) comes
from the per-release manifests in ``sim/vendor_graph_sim/data/torch_npu_manifests/`` (read from the real wheels by
``tools/torch_npu_manifest.py``); which ops ``NPUGraph.update()`` intercepts and how it patches them
comes from :data:`vendor_graph.vendors.ascend.releases.GENERATION_FACTS`. Every generated function is real Python
with the real parameter list, so a keyword a generation lacks raises ``TypeError`` as it would there.

The behaviour behind the names is the simulator's: capture/replay in :mod:`._runtime`, the update
mechanism below (torch_npu_api.md §4.1): with ``auto_dispatch_capture=True`` each intercepted op is
captured as ExternalEvent wait + reset, then the op (swapped to its ``.out`` overload where the facts
say so) inside a task group, and a record; ``update(cpu_update_input)`` patches each record's
kwargs/args by the generation's rules and re-issues the op inside ``graph_task_update_begin/end`` on the
update stream, then records the event.
"""

from __future__ import annotations

import copy
import gc
import itertools
import os
import types
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vendor_graph.vendors.ascend.releases import GENERATION_FACTS, GENERATIONS, RELEASES, release_of

from . import _npu_surface, _tensor
from . import _runtime as rt
from ._signatures import generate

_MANIFEST_ENV = "VENDOR_GRAPH_TORCH_NPU_MANIFESTS"
MANIFESTS = Path(__file__).resolve().parents[1] / "data" / "torch_npu_manifests"
_NO_UPDATE_MESSAGE = ("The current graph configuration does not support update,Try to capture by setting "
                      "auto_dispatch_capture=True during capture")


def manifest_dir() -> Path:
    """Where the torch_npu manifests are: ``$VENDOR_GRAPH_TORCH_NPU_MANIFESTS`` or this package's data."""
    env = os.environ.get(_MANIFEST_ENV, "").strip()
    if env:
        return Path(env)
    return MANIFESTS


@cache
def load_manifest(version: str) -> dict[str, Any]:
    path = manifest_dir() / f"torch_npu-{version}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no torch_npu manifest {path}: the simulated torch_npu is generated from the "
                                f"manifests in {MANIFESTS} (or set {_MANIFEST_ENV}); reinstall vendor-graph-sim")
    from vendor_graph.config.userfiles import UserFileError, read_json

    fix = f"point {_MANIFEST_ENV} at a folder of manifests written by tools/torch_npu_manifest.py, or unset it"
    try:
        manifest = read_json(path, fix=fix, what="torch_npu manifest")
    except UserFileError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: holds a JSON {type(manifest).__name__}, not an object; {fix}")
    return manifest


def resolve(spec: str | None) -> tuple[str, str]:
    """(version, generation) for a generation name (its newest release) or a torch_npu version string."""
    if spec is None:
        spec = GENERATIONS[-1]
    if spec in GENERATION_FACTS:
        versions = [r.version for r in RELEASES if r.generation == spec]
        return versions[-1], spec
    release = release_of(spec)
    return release.version, release.generation


def _not_simulated(qualname: str) -> Callable[..., Any]:
    def impl(**_: Any) -> Any:
        raise NotImplementedError(f"{qualname} exists in this torch_npu generation but is not simulated")

    return impl


def _noop(**_: Any) -> None:
    return None


# --------------------------------------------------------------------------------------------------
# behaviour shared by every generation (not part of the manifests: the device-module basics)


def _synchronize(device: Any = None) -> None:
    rt.sync_device("torch.npu.synchronize()")


def _current_stream(device: Any = None) -> rt.Stream:
    return rt.current_stream()


def _default_stream(device: Any = None) -> rt.Stream:
    return rt.default_stream()


def _memory_stat(device: Any = None) -> int:
    # What a device without allocator statistics answers: callers that report memory report none.
    raise RuntimeError("the simulated NPU keeps no allocator statistics")


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    return (64 << 30, 64 << 30)


#: Cards of the simulated machine a process may select: lmdeploy's tensor-parallel worker k calls set_device(k). Each
#: process simulates only the card it uses, as its single device (index 0: ``npu:0``, ``current_device() == 0``).
MACHINE_CARDS = 8


def _set_device(device: Any) -> None:
    index = device.index if isinstance(device, torch.device) else device
    if isinstance(index, str) and ":" in index:
        index = index.rsplit(":", 1)[1]
    try:
        card = None if index is None else int(index)
    except (TypeError, ValueError):
        card = -1
    if card is not None and not 0 <= card < MACHINE_CARDS:
        raise RuntimeError(f"the simulated machine has {MACHINE_CARDS} cards (0-{MACHINE_CARDS - 1}), got {device!r}; "
                           "each process simulates the one it selects as its single device")


def _common_functions(device_type: str) -> dict[str, Any]:
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": lambda: None,
        "_lazy_init": lambda: None,
        "_is_in_bad_fork": lambda: False,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": _set_device,
        # an Ascend 910B part (data/torch_npu_surface.json): consumers gate on the name and the SoC version
        "get_device_name": lambda device=None: _npu_surface.device_name(),
        **_npu_surface.device_functions(),
        "manual_seed": lambda seed: None,
        "manual_seed_all": lambda seed: None,
        "seed": lambda: None,
        "seed_all": lambda: None,
        "synchronize": _synchronize,
        "current_stream": _current_stream,
        "default_stream": _default_stream,
        "set_stream": rt.set_stream,
        "stream": rt.stream_context,
        "empty_cache": lambda: None,
        "memory_allocated": _memory_stat,
        "max_memory_allocated": _memory_stat,
        "memory_reserved": _memory_stat,
        "max_memory_reserved": _memory_stat,
        "reset_peak_memory_stats": lambda device=None: None,
        "mem_get_info": _mem_get_info,
    }


# --------------------------------------------------------------------------------------------------
# class implementations (private helpers; the public methods are generated)


class _SimClassMeta(type):
    """Generated Stream/Event classes also accept the runtime's own instances in isinstance()."""

    def __instancecheck__(cls, instance: Any) -> bool:
        base = cls.__dict__.get("_sim_base")
        if base is not None and isinstance(instance, base):
            return True
        return super().__instancecheck__(instance)


def _new(cls: type, **_: Any) -> Any:
    return object.__new__(cls)


def _stream_methods() -> dict[str, Callable[..., Any]]:
    return {
        "__new__": lambda cls, **_: object.__new__(cls),
        "query": lambda self: rt.Stream.query(self),
        "synchronize": lambda self: rt.Stream.synchronize(self),
        "wait_event": lambda self, event: rt.Stream.wait_event(self, event),
        "wait_stream": lambda self, stream: rt.Stream.wait_stream(self, stream),
        "record_event": lambda self, event=None: rt.Stream.record_event(self, event),
        "__eq__": lambda self, other: rt.Stream.__eq__(self, other),
        "__hash__": lambda self: rt.Stream.__hash__(self),
        "__repr__": lambda self: rt.Stream.__repr__(self),
        "set_data_preprocess_stream": _noop,
    }


def _event_methods() -> dict[str, Callable[..., Any]]:
    return {
        "__new__": lambda cls, **_: object.__new__(cls),
        "record": lambda self, stream=None: rt.Event.record(self, stream),
        "wait": lambda self, stream=None: rt.Event.wait(self, stream),
        "query": lambda self: rt.Event.query(self),
        "synchronize": lambda self: rt.Event.synchronize(self),
        "elapsed_time": lambda self, end_event: rt.Event.elapsed_time(self, end_event),
        "recorded_time": lambda self: 0.0,
        "__repr__": lambda self: rt.Event.__repr__(self),
    }


def _external_event_methods() -> dict[str, Callable[..., Any]]:
    return {
        "__new__": lambda cls, **_: object.__new__(cls),
        "record": lambda self, stream=None: rt.ExternalEvent.record(self, stream),
        "wait": lambda self, stream=None: rt.ExternalEvent.wait(self, stream),
        "reset": lambda self, stream=None: rt.ExternalEvent.reset(self, stream),
        "__repr__": lambda self: rt.ExternalEvent.__repr__(self),
    }


_PROPERTY_METHODS = frozenset({"_as_parameter_"})


def _generate_class(name: str, spec: dict[str, Any], base: type, impls: dict[str, Callable[..., Any]],
                    module: str, extra: dict[str, Any] | None = None, accepts_runtime: bool = False) -> type:
    namespace: dict[str, Any] = {"__module__": module, "_sim_base": base if accepts_runtime else None}
    for method, info in spec["methods"].items():
        impl = impls.get(method)
        if impl is None:
            impl = _noop if method in ("__repr__",) else _not_simulated(f"{name}.{method}")
        fn = generate(method, info["params"], impl, f"{name}.{method}", module)
        if "classmethod" in info.get("decorators", []):
            fn = classmethod(fn)
        elif "staticmethod" in info.get("decorators", []):
            fn = staticmethod(fn)
        elif "property" in info.get("decorators", []) or method in _PROPERTY_METHODS:
            fn = property(lambda self: id(self))
        namespace[method] = fn
    if "__new__" in namespace and not isinstance(namespace["__new__"], staticmethod):
        namespace["__new__"] = staticmethod(namespace["__new__"])
    namespace.update(extra or {})
    return _SimClassMeta(name, (base,), namespace)


# --------------------------------------------------------------------------------------------------
# the generation


class _Generation:
    """Everything generated for one torch_npu release; builds the ``torch_npu`` and ``torch_npu.npu`` modules."""

    def __init__(self, version: str, generation: str, module_name: str) -> None:
        self.version, self.generation = version, generation
        self.facts = GENERATION_FACTS[generation]
        self.manifest = load_manifest(version)
        self.module_name = module_name
        self.exports = set(self.manifest["npu_exports"])
        self.module = types.ModuleType(module_name, f"Simulated torch_npu.npu of torch_npu {version} ({generation}).")
        self.module.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
        self.module.__sim_generation__ = generation  # type: ignore[attr-defined]
        self.module.__sim_version__ = version  # type: ignore[attr-defined]
        self.handlers: dict[str, type] = {}
        for key, fn in _common_functions(_tensor._DEVICE_TYPE).items():
            setattr(self.module, key, fn)
        self._streams()
        if self.facts["graph_api"]:
            self._graph_api()
        enter = [c["call"] for c in self.manifest["graph_api"].get("graph_enter_calls", [])]
        if "torch_npu.npu.host_empty_cache" in enter:
            self.module.host_empty_cache = lambda: None  # type: ignore[attr-defined]

    # streams and events ---------------------------------------------------------------------------
    def _streams(self) -> None:
        classes = self.manifest["streams"]["classes"]
        mod = self.module_name
        made: dict[str, type] = {}
        for name in ("Stream", "SyncLaunchStream"):
            if name in classes and name in self.exports:
                made[name] = _generate_class(name, classes[name], rt.Stream, _stream_methods(), mod,
                                             accepts_runtime=name == "Stream")
        if "Event" in classes and "Event" in self.exports:
            made["Event"] = _generate_class("Event", classes["Event"], rt.Event, _event_methods(), mod,
                                            accepts_runtime=True)
        if "ExternalEvent" in classes and "ExternalEvent" in self.exports:
            made["ExternalEvent"] = _generate_class("ExternalEvent", classes["ExternalEvent"], rt.ExternalEvent,
                                                    _external_event_methods(), mod, accepts_runtime=True)
        if "ExternalStream" in classes and "ExternalStream" in self.exports:
            base = made.get("Stream", rt.Stream)

            def external_init(self: Any, stream_ptr: Any, device: Any = None, **kwargs: Any) -> None:
                rt.Stream.__init__(self)
                self.stream_ptr = stream_ptr

            made["ExternalStream"] = _generate_class("ExternalStream", classes["ExternalStream"], base,
                                                     {"__new__": _new}, mod, {"__init__": external_init})
        for name, cls in made.items():
            setattr(self.module, name, cls)

    # graph API -------------------------------------------------------------------------------------
    def _graph_api(self) -> None:
        gen = self
        mod = self.module_name
        api = self.manifest["graph_api"]
        npu = self.module

        def stream_of(stream: Any) -> rt.Stream:
            return rt.current_stream() if stream is None else stream

        function_impls: dict[str, Callable[..., Any]] = {
            "is_current_stream_capturing": lambda: rt.current_stream().capture is not None,
            "graph_pool_handle": lambda: rt.new_pool_handle(),
            "graph_task_group_begin": lambda stream: rt.task_group_begin(stream_of(stream)),
            "graph_task_group_end": lambda stream: rt.task_group_end(stream_of(stream)),
            "graph_task_update_begin": lambda stream, handle: rt.task_update_begin(stream_of(stream), handle),
            "graph_task_update_end": lambda stream: rt.task_update_end(stream_of(stream)),
            "super_kernel_scope_begin": _noop,
            "super_kernel_scope_end": _noop,
        }
        for name, info in api["functions"].items():
            if name in self.exports:
                impl = function_impls.get(name) or _not_simulated(f"torch.npu.{name}")
                setattr(npu, name, generate(name, info["params"], impl, name, mod))

        classes = api["classes"]
        if "_GraphDispatchMode" in classes:
            npu._GraphDispatchMode = self._dispatch_mode_class(classes)  # type: ignore[attr-defined]
            fields = classes["_GraphDispatchRecord"]["class_attributes"] or ["event", "handle", "args", "kwargs"]
            npu._GraphDispatchRecord = type("_GraphDispatchRecord", (_RecordBase,), {  # type: ignore[attr-defined]
                "__slots__": tuple(fields), "__module__": mod, "_fields": tuple(fields)})

        graph_methods = classes["NPUGraph"]["methods"]
        has_init = "__init__" in graph_methods

        def npugraph_new(cls: type, **_: Any) -> Any:
            obj = object.__new__(cls)
            obj._sim = rt.SimGraph()
            if not has_init:
                obj._sim_auto = False
            return obj

        def npugraph_init(self: Any) -> None:
            self.graph_dispatch_mode = npu._GraphDispatchMode()
            self.auto_dispatch_capture = False

        def npugraph_update(self: Any, cpu_update_input: Any) -> None:
            if not getattr(self, "auto_dispatch_capture", False):
                raise RuntimeError(_NO_UPDATE_MESSAGE)
            self.graph_dispatch_mode.update_capture_record(cpu_update_input)

        def debug_dump(self: Any, debug_path: Any) -> None:
            Path(debug_path).write_text("\n".join(self._sim.describe()) + "\n")

        npugraph_impls = {
            "__new__": npugraph_new,
            "__init__": npugraph_init,
            "capture_begin": lambda self, pool=None, capture_error_mode="global": self._sim.capture_begin(
                pool, capture_error_mode),
            "capture_end": lambda self: self._sim.capture_end(),
            "replay": lambda self: self._sim.replay(),
            "reset": lambda self: self._sim.reset(),
            "pool": lambda self: self._sim.pool_handle(),
            "update": npugraph_update,
            "debug_dump": debug_dump,
            "super_kernel_optimize": _noop,
            "_validate_options": _noop,
        }
        npu.NPUGraph = _generate_class("NPUGraph", classes["NPUGraph"], object, npugraph_impls, mod,
                                       {"sim_graph": property(lambda self: self._sim)})
        npu.graph = self._graph_context_class(classes["graph"], api.get("graph_enter_calls", []))
        if "NpuGraphOpHandler" in self.exports:
            npu.NpuGraphOpHandler = type("NpuGraphOpHandler", (), {"__module__": mod})

            def register_npu_graph_handler(op_names: Any) -> Callable[[type], type]:
                def decorator(cls: type) -> type:
                    for op_name in [op_names] if isinstance(op_names, str) else op_names:
                        gen.handlers[op_name] = cls
                    return cls

                return decorator

            npu.register_npu_graph_handler = register_npu_graph_handler

    def _graph_context_class(self, spec: dict[str, Any], enter_calls: list[dict[str, Any]]) -> type:
        npu = self.module
        calls = [(c["call"], c["when"]) for c in enter_calls]

        def init(self: Any, npu_graph: Any, pool: Any = None, stream: Any = None, auto_dispatch_capture: bool = False,
                 capture_error_mode: str = "global") -> None:
            cls = type(self)
            if cls.default_capture_stream is None:
                cls.default_capture_stream = npu.Stream()
            self.pool = () if pool is None else (pool,)
            self.capture_stream = stream if stream is not None else cls.default_capture_stream
            self.stream_ctx = npu.stream(self.capture_stream)
            self.npu_graph = npu_graph
            self.capture_error_mode = capture_error_mode
            if hasattr(npu_graph, "graph_dispatch_mode"):
                npu_graph.auto_dispatch_capture = auto_dispatch_capture

        def enter(self: Any) -> None:
            for call, when in calls:
                if when == "self.npu_graph.auto_dispatch_capture" and not self.npu_graph.auto_dispatch_capture:
                    continue
                if call == "torch.npu.synchronize":
                    npu.synchronize()
                elif call == "gc.collect":
                    if when is None or os.environ.get("TORCH_NPUGRAPH_GC", "0") not in ("0", "", "false", "False"):
                        gc.collect()
                elif call == "torch.npu.empty_cache":
                    npu.empty_cache()
                elif call == "torch_npu.npu.host_empty_cache":
                    npu.host_empty_cache()
                elif call == "self.stream_ctx.__enter__":
                    self.stream_ctx.__enter__()
                elif call == "self.npu_graph.graph_dispatch_mode.__enter__":
                    self.npu_graph.graph_dispatch_mode.__enter__()
                elif call == "self.npu_graph.capture_begin":
                    self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode)

        def exit_(self: Any, exc_type: Any, exc_value: Any, traceback: Any) -> None:
            try:
                try:
                    self.npu_graph.capture_end()
                except Exception:
                    if exc_type is None:
                        raise
                if exc_type is not None:  # no half-captured graph stays usable
                    self.npu_graph._sim._abort(f"{exc_type.__name__} raised inside the captured region")
            finally:
                if getattr(self.npu_graph, "auto_dispatch_capture", False):
                    self.npu_graph.graph_dispatch_mode.__exit__(None, None, None)
                self.stream_ctx.__exit__(None, None, None)

        return _generate_class("graph", spec, object, {"__init__": init, "__enter__": enter, "__exit__": exit_},
                               self.module_name, {"default_capture_stream": None})

    # update() -------------------------------------------------------------------------------------
    def _dispatch_mode_class(self, classes: dict[str, Any]) -> type:
        gen = self
        npu = self.module
        facts = self.facts
        update_info = self.manifest["update"]
        per_instance = update_info.get("update_stream") == "per_instance"
        ops: dict[str, dict[str, Any]] = facts["update_ops"]

        def op_spec(name: str) -> dict[str, Any] | None:
            spec = ops.get(name)
            if spec is None and gen.generation == "G2a" and rt.config.g2a_plain_name_matches_default \
                    and name.endswith(".default"):
                spec = ops.get(name[: -len(".default")])
            if spec is None and name in gen.handlers:
                spec = {"recorded_as": name, "kwargs": "existing_keys_only", "args": (), "should_handle": False}
            return spec

        class _GraphDispatchMode(TorchDispatchMode):
            update_stream: Any = None
            tensor_schema_name: dict[str, Any] = {}

            def __init__(self) -> None:
                super().__init__()
                self.graph_dispatch_records: list[Any] = []
                if per_instance:  # G2: the mode's __init__ makes one per graph
                    self.update_stream = npu.Stream()
                elif type(self).update_stream is None:  # G3a on: __new__ makes the class's one
                    type(self).update_stream = npu.Stream()

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                kwargs = kwargs or {}
                spec = op_spec(func.__name__)
                if spec is None or (spec["should_handle"] and not _fa3_should_handle(kwargs)):
                    return func(*args, **kwargs)
                return _intercept(self, npu, func, spec, args, kwargs)

            def update_capture_record(self, cpu_update_input: Any) -> None:
                _update_records(self, npu, facts, update_info, cpu_update_input)

        _GraphDispatchMode.__module__ = self.module_name
        _GraphDispatchMode._sim_op_spec = staticmethod(op_spec)  # type: ignore[attr-defined]
        _GraphDispatchMode._sim_handlers = self.handlers  # type: ignore[attr-defined]
        self._generated_dispatch_methods(_GraphDispatchMode, classes["_GraphDispatchMode"])
        return _GraphDispatchMode

    def _generated_dispatch_methods(self, cls: type, spec: dict[str, Any]) -> None:
        """The manifest's other ``_GraphDispatchMode`` methods, with its parameter lists (``update_schema``'s
        second parameter is ``schame`` in the releases that spell it so)."""
        npu = self.module

        def append_record(self: Any, event: Any, handle: Any, args: Any, kwargs: Any, func: Any,
                          handler_cls: Any = None) -> None:
            _append_record(self, npu, event, handle, args, kwargs, func)

        def update_schema(cls: type, name: Any, **schema: Any) -> None:
            # the simulator's reading of the class attribute: schemas by op name
            cls.tensor_schema_name[name] = next(iter(schema.values()))  # type: ignore[attr-defined]

        impls: dict[str, Callable[..., Any]] = {
            "__new__": lambda cls: object.__new__(cls),
            "_append_dispatch_record": append_record,
            "update_schema": update_schema,
            # unverified: torch_npu overrides it (the manifests list it); the simulator answers True, a
            # graph-capture mode being infrastructure rather than a user mode
            "is_infra_mode": lambda cls: True,
        }
        for method, info in spec["methods"].items():
            if method in cls.__dict__ and method not in impls:
                continue  # written above: __init__, __torch_dispatch__, update_capture_record
            impl = impls.get(method) or _not_simulated(f"_GraphDispatchMode.{method}")
            fn: Any = generate(method, info["params"], impl, f"_GraphDispatchMode.{method}", self.module_name)
            if method == "__new__":
                fn = staticmethod(fn)
            elif "classmethod" in info.get("decorators", []):
                fn = classmethod(fn)
            elif "staticmethod" in info.get("decorators", []):
                fn = staticmethod(fn)
            setattr(cls, method, fn)
        cls._sim_takes_handler = "handler_cls" in [  # type: ignore[attr-defined]
            p["name"] for p in spec["methods"].get("_append_dispatch_record", {}).get("params", [])]


class _RecordBase:
    """A captured op record (``graph_dispatch_mode.graph_dispatch_records``); sim fields start with _sim."""

    __slots__ = ("_sim_spec", "_sim_outs", "op")
    _fields: tuple[str, ...] = ()

    def __repr__(self) -> str:
        op = getattr(self, "op", None)
        return f"<_GraphDispatchRecord {getattr(op, '__name__', op)}>"


def _fa3_should_handle(kwargs: dict[str, Any]) -> bool:
    return tuple(rt.config.cann_version) >= (9, 1, 0) and kwargs.get("input_layout") != "BNSD"


def _freeze(value: Any) -> Any:
    """What a record keeps: device tensors by (non-owning) reference, everything else deep-copied."""
    if isinstance(value, _tensor.SimTensor):
        return _tensor.wrap(value._inner)
    if isinstance(value, (list, tuple)):
        return type(value)(_freeze(v) for v in value)
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    if isinstance(value, torch.Tensor):
        return value.clone()
    return copy.deepcopy(value)


def _out_overload(func: Any, recorded_as: str) -> Any:
    overload = recorded_as.rsplit(".", 1)[1] if "." in recorded_as else "default"
    if overload == func._overloadname:
        return None
    return getattr(func.overloadpacket, overload, None)


def _intercept(mode: Any, npu: types.ModuleType, func: Any, spec: dict[str, Any], args: Any, kwargs: dict[str, Any]
               ) -> Any:
    stream = rt.current_stream()
    event = npu.ExternalEvent()
    event.wait(stream)
    event.reset(stream)
    op, call_kwargs, outs_for_result = func, dict(kwargs), None
    out_op = _out_overload(func, spec["recorded_as"])
    if out_op is not None:
        shapes = _tensor._result_shapes(func, args, kwargs)
        shapes = shapes if isinstance(shapes, (tuple, list)) else (shapes,)
        out_names = [a.name for a in out_op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        outs = [torch.empty_strided(m.size(), m.stride(), dtype=m.dtype, device=_tensor._DEVICE) for m in shapes]
        call_kwargs.update(zip(out_names, outs, strict=False))
        op, outs_for_result = out_op, outs
    rt.task_group_begin(stream)
    try:
        result = op(*args, **call_kwargs)
    finally:
        handle = rt.task_group_end(stream)
    extra = {"handler_cls": mode._sim_handlers.get(func.__name__)} if mode._sim_takes_handler else {}
    mode._sim_pending = (spec, out_op is not None)
    try:  # through the method, as torch_npu's __torch_dispatch__ records
        mode._append_dispatch_record(event=event, handle=handle, args=args, kwargs=call_kwargs, func=op, **extra)
    finally:
        mode._sim_pending = None
    if outs_for_result is not None:
        return outs_for_result[0] if len(outs_for_result) == 1 else tuple(outs_for_result)
    return result


def _append_record(mode: Any, npu: types.ModuleType, event: Any, handle: Any, args: Any, kwargs: Any, func: Any
                   ) -> None:
    """``_GraphDispatchMode._append_dispatch_record``: a record of ``func`` captured as ``handle``.

    From the simulator's own interception the update rule and whether the op was swapped to its ``.out``
    overload come along; a direct call takes the rule the facts give ``func`` (none: existing keys only).
    """
    pending = getattr(mode, "_sim_pending", None)
    if pending is not None:
        spec, swapped = pending
    else:
        swapped = False
        spec = type(mode)._sim_op_spec(getattr(func, "__name__", str(func))) or {
            "recorded_as": getattr(func, "__name__", str(func)), "kwargs": "existing_keys_only", "args": (),
            "should_handle": False}
    record = npu._GraphDispatchRecord()
    values = {"event": event, "handle": handle, "args": _freeze(list(args)), "kwargs": _freeze(dict(kwargs)),
              "op_cache_entry": func}
    for field in record._fields:
        setattr(record, field, values.get(field))
    record.op = func
    record._sim_spec = spec
    record._sim_outs = None
    if not swapped and isinstance(handle, rt.TaskGroupHandle) and handle.group.nodes:
        record._sim_outs = getattr(handle.group.nodes[-1], "outs", None)
    mode.graph_dispatch_records.append(record)


def _update_records(mode: Any, npu: types.ModuleType, facts: dict[str, Any], update_info: dict[str, Any],
                    cpu_update_input: Any) -> None:
    records = mode.graph_dispatch_records
    inputs = list(cpu_update_input)
    if update_info.get("broadcasts_single_input", True) and len(inputs) == 1:
        inputs = inputs * len(records)
    if facts["update_length_check"] == "raises_on_mismatch" and len(inputs) != len(records):
        raise RuntimeError(f"The length of cpu_update_input ({len(inputs)}) does not match the number of captured "
                           f"records ({len(records)})")
    stream = mode.update_stream
    guarded = bool(facts.get("positional_key_guarded"))
    rt.counters.by_op["NPUGraph.update"] += 1
    with rt.stream_context(stream):
        for record, update_input in zip(records, inputs, strict=False):  # truncates, as G2/G3a do
            spec = record._sim_spec
            args = record.args if isinstance(record.args, list) else list(record.args)
            kwargs = record.kwargs
            rule = spec["kwargs"]
            if rule == "any_key" or (rule == "any_key if len(args) < 2" and len(args) < 2):
                kwargs.update(update_input)
            elif rule == "existing_keys_only":
                for key, value in update_input.items():
                    if key in kwargs:
                        kwargs[key] = value
            for index, key in spec["args"]:
                in_bounds = index < len(args) if index >= 0 else len(args) >= -index
                if not in_bounds or (guarded and key not in update_input):
                    continue
                args[index] = update_input[key]
            record.args = args
            rt.task_update_begin(stream, record.handle)
            if record._sim_outs is not None:
                stream.update.outs = record._sim_outs
            try:
                record.op(*args, **kwargs)
            except BaseException:
                stream.update = None
                raise
            rt.task_update_end(stream)
            record.event.record(stream)


# --------------------------------------------------------------------------------------------------
# modules


def build_device_module(spec: str | None, name: str = "torch_npu.npu") -> types.ModuleType:
    """The simulated ``torch_npu.npu`` (= ``torch.npu``) of a generation or version (None: the newest)."""
    version, generation = resolve(spec)
    return _Generation(version, generation, name).module


_module_ids = itertools.count()


def torch_npu_module(spec: str | None = None) -> types.ModuleType:
    """A fresh simulated ``torch_npu`` package for a generation (``"G3a"``) or a version (``"2.8.0.post2"``).

    It has ``npu`` (the device module), ``__version__``, ``version`` (``__version__``, ``git_version``),
    ``__file__``/``__spec__``, the submodules and functions of ``data/torch_npu_surface.json`` (see
    :mod:`._npu_surface`) and resolves ``torch_npu.<op>`` to ``torch.ops.npu.<op>`` / ``torch.ops.atb.<op>``.
    Installing it is :func:`vendor_graph_sim.device.use_torch_npu`'s job.
    """
    version, generation = resolve(spec)
    manifest = load_manifest(version)
    package = types.ModuleType("torch_npu", f"Simulated torch_npu {version} (graph API {generation}).")
    package.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
    package.__version__ = version  # type: ignore[attr-defined]
    package.__path__ = []  # type: ignore[attr-defined]
    package.npu = build_device_module(version, "torch_npu.npu")  # type: ignore[attr-defined]
    version_module = types.ModuleType("torch_npu.version")
    version_module.__version__ = manifest["version_py"]["__version__"]  # type: ignore[attr-defined]
    version_module.git_version = manifest["version_py"].get("git_version")  # type: ignore[attr-defined]
    package.version = version_module  # type: ignore[attr-defined]
    package.__sim_generation__ = generation  # type: ignore[attr-defined]
    # where consumers look for files next to torch_npu (lib/libop_plugin_atb.so), and a real spec
    package.__file__ = str(_npu_surface.package_file())  # type: ignore[attr-defined]
    package.__spec__ = _npu_surface.make_spec(package, True, origin=package.__file__)
    package.__loader__ = package.__spec__.loader
    package.npu.__spec__ = _npu_surface.make_spec(package.npu, False)
    version_module.__spec__ = _npu_surface.make_spec(version_module, False)
    for name, fn in _npu_surface.package_functions().items():
        setattr(package, name, fn)
    package.__sim_surface__ = _npu_surface.Surface(package, manifest)  # type: ignore[attr-defined]

    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(f"simulated torch_npu has no attribute {name!r}")
        submodule = package.__sim_surface__.attribute(name)
        if submodule is not None:
            return submodule
        for namespace in ("npu", "atb"):
            try:
                return getattr(getattr(torch.ops, namespace), name)
            except (AttributeError, RuntimeError):
                continue
        raise AttributeError(f"simulated torch_npu has no attribute {name!r}")

    package.__getattr__ = __getattr__  # type: ignore[attr-defined]
    return package
