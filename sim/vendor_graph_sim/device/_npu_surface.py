"""The simulated torch_npu's surface outside ``torch_npu.npu``, GENERATED from ``data/torch_npu_surface.json``.

The wheel manifests cover the graph and stream API of ``torch_npu.npu``; the real dlinfer and lmdeploy's
Ascend backend also reach for ``torch_npu.contrib.transfer_to_npu``, ``torch_npu.utils._path_manager``,
``torch_npu.profiler``, ``torch_npu._C._NPUTaskGroupHandle``, ``torch_npu.empty_with_format``,
``torch_npu.__file__`` (to load ``lib/libop_plugin_atb.so``) and ``torch.npu.get_soc_version()``. Which
names exist, and their parameter lists, come from that data file (each entry names its sources); what
they do is the simulator's:

- the package's ``__file__`` is ``data/torch_npu/__init__.py`` of this package, and
  :func:`plugin_loads` makes ``torch.ops.load_library`` of a plugin listed there (the ATB plugin)
  register the emulated operators (:func:`vendor_graph_sim.kernels.register`) instead of dlopen-ing it;
  any other path goes to torch's own loader;
- importing ``torch_npu.contrib.transfer_to_npu`` points every public ``torch.cuda`` attribute that the
  simulated ``torch.npu`` also has at the ``torch.npu`` one, and maps a ``cuda`` device given to torch's
  factories, ``Tensor`` and ``Module`` methods to the NPU (:class:`CudaRedirect`), until ``use_torch_npu``
  exits, which restores all of it exactly;
- submodules are imported through a meta-path finder installed for the ``use_torch_npu`` block, so each
  has a real ``ModuleSpec`` and ``importlib.util.find_spec`` works on them.
"""

from __future__ import annotations

import contextlib
import enum
import importlib.abc
import importlib.machinery
import json
import os
import sys
import types
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import torch

from . import _runtime as rt
from ._signatures import generate

DATA = Path(__file__).resolve().parents[1] / "data"
SURFACE_FILE = DATA / "torch_npu_surface.json"
PACKAGE_DIR = DATA / "torch_npu"
_MISSING = object()


@cache
def surface() -> dict[str, Any]:
    """The parsed ``data/torch_npu_surface.json``."""
    return json.loads(SURFACE_FILE.read_text())


def package_file() -> Path:
    """What the simulated ``torch_npu.__file__`` is."""
    return DATA / surface()["package_file"]["__file__"]


def plugin_paths() -> dict[str, Path]:
    """Plugin libraries under the simulated package's directory: relative name -> path."""
    return {name: package_file().parent / name for name in surface()["plugins"]}


def device_name() -> str:
    return surface()["device_module"]["device_name"]


def soc_version() -> int:
    return int(surface()["device_module"]["soc_version"])


def device_properties(device_name: Any = None) -> Any:
    """What ``torch.npu.get_device_properties`` reports: the part's name and memory; ``major`` is None, as on
    the torch_npu releases lmdeploy's MLA config check guards against."""
    import types

    return types.SimpleNamespace(**surface()["device_module"]["properties"])


# --------------------------------------------------------------------------------------------------
# the submodules


class _Loader(importlib.abc.Loader):
    """Hands out a prebuilt submodule; running it applies its side effect (``transfer_to_npu``)."""

    def __init__(self, module: types.ModuleType, on_exec: Callable[[], None] | None = None) -> None:
        self.module = module
        self.on_exec = on_exec

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        if self.on_exec is not None:
            self.on_exec()


def make_spec(module: types.ModuleType, is_package: bool, origin: str | None = None,
              on_exec: Callable[[], None] | None = None) -> importlib.machinery.ModuleSpec:
    spec = importlib.machinery.ModuleSpec(module.__name__, _Loader(module, on_exec), origin=origin,
                                          is_package=is_package)
    if origin is not None:
        spec.has_location = True
    return spec


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the submodules of one simulated torch_npu package (installed for a ``use_torch_npu`` block)."""

    def __init__(self, package: types.ModuleType) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if sys.modules.get("torch_npu") is not self.package:
            return None
        return self.package.__sim_surface__.specs.get(fullname)


# torch factories that take ``device=`` (torch_npu's transfer_to_npu wraps the same family; only those this torch has)
_DEVICE_FACTORIES = (
    "arange", "as_tensor", "bartlett_window", "blackman_window", "empty", "empty_like", "empty_strided", "eye",
    "frombuffer", "full", "full_like", "hamming_window", "hann_window", "kaiser_window", "linspace", "logspace",
    "normal", "ones", "ones_like", "rand", "rand_like", "randint", "randint_like", "randn", "randn_like", "randperm",
    "range", "scalar_tensor", "tensor", "tril_indices", "triu_indices", "zeros", "zeros_like",
)
_TENSOR_DEVICE_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros", "to")
_MODULE_DEVICE_METHODS = ("to", "to_empty")


def npu_device(device: Any, target: str = "npu") -> Any:
    """``device`` with a ``cuda`` device named as ``target`` (``"cuda:0"`` -> ``"npu:0"``); anything else as given."""
    if isinstance(device, str) and (device == "cuda" or device.startswith("cuda:")):
        return target + device[4:]
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device(target, device.index) if device.index is not None else torch.device(target)
    return device


def _on_npu(fn: Callable[..., Any], positional: bool, target: str = "npu") -> Callable[..., Any]:
    """``fn`` with a ``cuda`` ``device=`` (and, for ``positional``, a ``cuda`` positional argument) on ``target``."""

    def on_npu(*args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs:
            kwargs["device"] = npu_device(kwargs["device"], target)
        if positional:
            args = tuple(npu_device(a, target) for a in args)
        return fn(*args, **kwargs)

    on_npu.__name__ = getattr(fn, "__name__", "on_npu")
    on_npu.__qualname__ = getattr(fn, "__qualname__", on_npu.__name__)
    on_npu.__doc__ = getattr(fn, "__doc__", None)
    on_npu.__wrapped__ = fn  # type: ignore[attr-defined]
    return on_npu


def hccl_backend(backend: Any, device: str = "npu", collective: str = "hccl") -> Any:
    """A torch.distributed ``backend`` argument with ``nccl`` named as ``collective`` (``"cpu:gloo,cuda:nccl"``
    too, its ``cuda:`` as ``device``)."""
    if isinstance(backend, str) and "nccl" in backend.lower():
        return backend.lower().replace("cuda:", f"{device}:").replace("nccl", collective)
    return backend


def _nccl_as_hccl(fn: Callable[..., Any], position: int, device: str = "npu",
                  collective: str = "hccl") -> Callable[..., Any]:
    """``fn`` (``init_process_group``, ``new_group``) with its ``backend`` (keyword or at ``position``) on
    ``collective``."""

    def on_hccl(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = hccl_backend(kwargs["backend"], device, collective)
        elif len(args) > position:
            args = (*args[:position], hccl_backend(args[position], device, collective), *args[position + 1:])
        return fn(*args, **kwargs)

    on_hccl.__name__ = getattr(fn, "__name__", "on_hccl")
    on_hccl.__qualname__ = getattr(fn, "__qualname__", on_hccl.__name__)
    on_hccl.__doc__ = getattr(fn, "__doc__", None)
    on_hccl.__wrapped__ = fn  # type: ignore[attr-defined]
    return on_hccl


def _no_cuda_capability(device: Any = None) -> tuple[int, int]:
    """``torch.cuda.get_device_capability`` under transfer_to_npu: (0, 0), as the NPU has no CUDA compute capability
    (its device properties have no major/minor). torch 2.13's ``dist.broadcast`` probes it for every tensor whose
    ``is_cuda`` is true, which transfer_to_npu makes every NPU tensor; torch's own would read ``major`` None."""
    return (0, 0)


# torch.distributed functions taking a backend, and its position: lmdeploy asks the backend of the device context
# it is in, which is 'cuda' (nccl) when its worker joins the default group
_DISTRIBUTED_BACKEND_ARGS = (("init_process_group", 0), ("new_group", 2))


class CudaRedirect:
    """``transfer_to_npu``: torch.cuda's attributes that the simulated torch.npu also has, pointed at it, and a
    ``cuda`` device given to torch's factories, ``Tensor.to`` / ``new_*`` / ``cuda()`` / ``is_cuda`` and
    ``Module.to`` / ``cuda()`` taken as the NPU (what lmdeploy's ``device='cuda'`` startup check needs), and
    torch.distributed's ``nccl`` backend taken as ``hccl`` (:mod:`._hccl`) in ``init_process_group`` and
    ``new_group`` (lmdeploy's tensor-parallel workers ask for nccl when they join the default group).

    The same mapping serves the other simulated devices (:mod:`._cuda_style`): ``device`` names the simulated
    device, ``collective`` the backend ``nccl`` becomes, ``aliases`` torch.cuda names taken from another name of
    the device module (torch_mlu's ``CUDAGraph`` -> ``MLUGraph``), ``capability`` what
    ``get_device_capability`` answers."""

    def __init__(self, npu: types.ModuleType, device: str = "npu", collective: str = "hccl",
                 aliases: dict[str, str] | None = None, capability: tuple[int, int] | None = None) -> None:
        self.npu = npu
        self.device = device
        self.collective = collective
        self.aliases = dict(aliases or {})
        self.capability = capability
        self.saved: dict[tuple[Any, str], Any] | None = None

    def names(self) -> list[str]:
        return sorted(name for name in vars(self.npu) if not name.startswith("_") and hasattr(torch.cuda, name))

    @property
    def applied(self) -> bool:
        return self.saved is not None

    def _replacements(self) -> list[tuple[Any, str, Any]]:
        device = self.device
        out: list[tuple[Any, str, Any]] = [(torch.cuda, name, getattr(self.npu, name)) for name in self.names()]
        out += [(torch.cuda, name, getattr(self.npu, own)) for name, own in self.aliases.items()]
        out += [(torch, name, _on_npu(getattr(torch, name), False, device)) for name in _DEVICE_FACTORIES
                if hasattr(torch, name)]
        out += [(torch.Tensor, name, _on_npu(getattr(torch.Tensor, name), True, device))
                for name in _TENSOR_DEVICE_METHODS]
        out += [(torch.nn.Module, name, _on_npu(getattr(torch.nn.Module, name), True, device))
                for name in _MODULE_DEVICE_METHODS]
        out += [(torch.Tensor, "cuda", getattr(torch.Tensor, device)),
                (torch.Tensor, "is_cuda", getattr(torch.Tensor, f"is_{device}")),
                (torch.nn.Module, "cuda", getattr(torch.nn.Module, device))]
        if self.capability is None:
            out.append((torch.cuda, "get_device_capability", _no_cuda_capability))
        else:
            capability = self.capability
            out.append((torch.cuda, "get_device_capability", lambda device=None: capability))
        if torch.distributed.is_available():
            out += [(torch.distributed, name, _nccl_as_hccl(getattr(torch.distributed, name), position, device,
                                                            self.collective))
                    for name, position in _DISTRIBUTED_BACKEND_ARGS]
        return out

    def apply(self) -> None:
        if self.saved is not None:
            return
        replacements = self._replacements()
        self.saved = {(owner, name): owner.__dict__.get(name, _MISSING) for owner, name, _ in replacements}
        for owner, name, value in replacements:
            setattr(owner, name, value)

    def restore(self) -> None:
        saved, self.saved = self.saved, None
        for (owner, name), value in (saved or {}).items():
            if value is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(owner, name)
            else:
                setattr(owner, name, value)


class Surface:
    """The generated submodules of one simulated package, their specs, and the ``torch.cuda`` redirect."""

    def __init__(self, package: types.ModuleType, manifest: dict[str, Any]) -> None:
        self.package = package
        self.redirect = CudaRedirect(package.npu)
        self.modules: dict[str, types.ModuleType] = {}
        self.specs: dict[str, importlib.machinery.ModuleSpec] = {}
        for fullname, info in surface()["submodules"].items():
            module = types.ModuleType(fullname, f"Simulated {fullname}.")
            module.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
            on_exec = self.redirect.apply if info.get("side_effect") == "redirect_cuda" else None
            builder = _BUILDERS.get(fullname)
            if builder is not None:
                builder(module, info, manifest)
            self.modules[fullname] = module
            self.specs[fullname] = make_spec(module, bool(info.get("package")), on_exec=on_exec)
        #: what ``torch_npu.<name>`` imports on first attribute access (no submodule with a side effect)
        self.lazy = {name.split(".")[1] for name, info in surface()["submodules"].items()
                     if name.count(".") == 1 and not info.get("side_effect")}

    def attribute(self, name: str) -> types.ModuleType | None:
        """``torch_npu.<name>`` for a submodule: imported if this package is the installed one."""
        if name not in self.lazy:
            return None
        fullname = f"torch_npu.{name}"
        if sys.modules.get("torch_npu") is self.package:
            import importlib

            return importlib.import_module(fullname)
        return self.modules[fullname]


# builders: the behaviour behind each submodule's names --------------------------------------------


def _build_c(module: types.ModuleType, info: dict[str, Any], manifest: dict[str, Any]) -> None:
    types_of = {"_NPUTaskGroupHandle": rt.TaskGroupHandle}
    for token in info["from_binary_strings"]:
        if manifest.get("binary_strings", {}).get(token):
            setattr(module, token, types_of[token])


def _check_directory_path_readable(cls: Any, path: Any) -> None:
    where = os.fspath(path)
    if not os.path.exists(where):
        raise RuntimeError(f"The path {where} does not exist (simulated torch_npu PathManager)")
    if not os.access(where, os.R_OK):
        raise RuntimeError(f"The path {where} is not readable (simulated torch_npu PathManager)")


def _build_path_manager(module: types.ModuleType, info: dict[str, Any], manifest: dict[str, Any]) -> None:
    impls = {"check_directory_path_readable": _check_directory_path_readable}
    for cls_name, spec in info["classes"].items():
        namespace: dict[str, Any] = {"__module__": module.__name__}
        for method, method_info in spec["classmethods"].items():
            namespace[method] = classmethod(generate(method, method_info["params"], impls[method],
                                                     f"{cls_name}.{method}", module.__name__))
        setattr(module, cls_name, type(cls_name, (), namespace))


class _Profile(torch.profiler.profile):
    """Simulated ``torch_npu.profiler.profile``: torch's profiler over the host, where the simulated device's
    work runs; ``ProfilerActivity.NPU`` adds nothing beyond CPU."""

    def __init__(self, *args: Any, activities: Any = None, experimental_config: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, activities=[torch.profiler.ProfilerActivity.CPU], **kwargs)


def _build_profiler(module: types.ModuleType, info: dict[str, Any], manifest: dict[str, Any]) -> None:
    activity = enum.Enum("ProfilerActivity", list(info["ProfilerActivity"]), module=module.__name__)
    profile = type("profile", (_Profile,), {"__module__": module.__name__, "__doc__": _Profile.__doc__})
    values = {"profile": profile, "ProfilerActivity": activity, "schedule": torch.profiler.schedule,
              "tensorboard_trace_handler": torch.profiler.tensorboard_trace_handler}
    for name in info["names"]:
        setattr(module, name, values[name])


_BUILDERS: dict[str, Callable[[types.ModuleType, dict[str, Any], dict[str, Any]], None]] = {
    "torch_npu._C": _build_c,
    "torch_npu.utils._path_manager": _build_path_manager,
    "torch_npu.profiler": _build_profiler,
}


def _empty_with_format(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = False,
                       acl_format: Any = 2) -> torch.Tensor:
    from . import _tensor

    return torch.empty(size, dtype=dtype, layout=layout or torch.strided,
                       device=device if device is not None else _tensor._DEVICE)


def _npu_fusion_attention(query: Any, key: Any, value: Any, head_num: Any, input_layout: Any, **kwargs: Any) -> Any:
    try:
        op = torch.ops.npu.npu_fusion_attention
    except (AttributeError, RuntimeError):
        raise NotImplementedError("torch_npu.npu_fusion_attention exists on a real torch_npu but is not emulated by "
                                  "the simulator (no torch.ops.npu.npu_fusion_attention is registered)") from None
    return op(query, key, value, head_num, input_layout, **kwargs)


_PACKAGE_IMPLS = {"empty_with_format": _empty_with_format, "npu_fusion_attention": _npu_fusion_attention}


def package_functions() -> dict[str, Callable[..., Any]]:
    """``torch_npu.<function>`` (``empty_with_format``) with the data file's parameter lists."""
    return {name: generate(name, info["params"], _PACKAGE_IMPLS[name], name, "torch_npu")
            for name, info in surface()["package_functions"].items()}


def device_functions() -> dict[str, Callable[..., Any]]:
    """The device-module functions of the data file (``get_soc_version``)."""
    impls = {"get_soc_version": soc_version, "get_device_properties": device_properties}
    return {name: generate(name, info["params"], impls[name], name, "torch_npu.npu")
            for name, info in surface()["device_module"]["functions"].items()}


# --------------------------------------------------------------------------------------------------
# installing


def _is_plugin(path: Any) -> bool:
    try:
        where = os.path.realpath(os.fspath(path))
    except TypeError:
        return False
    return any(where == os.path.realpath(p) for p in plugin_paths().values())


@contextlib.contextmanager
def plugin_loads() -> Iterator[None]:
    """For the block, ``torch.ops.load_library(<simulated torch_npu>/lib/libop_plugin_atb.so)`` registers the
    emulated operators instead of dlopen; every other path goes to torch's loader. Restored on exit."""
    ops = torch.ops
    saved = ops.__dict__.get("load_library", _MISSING)
    real = ops.load_library

    def load_library(path: Any) -> None:
        if not _is_plugin(path):
            return real(path)
        from vendor_graph_sim import kernels

        kernels.register()
        ops.loaded_libraries.add(os.fspath(path))
        return None

    load_library.__doc__ = real.__doc__
    ops.load_library = load_library
    try:
        yield
    finally:
        if saved is _MISSING:
            ops.__dict__.pop("load_library", None)
        else:
            ops.load_library = saved


@contextlib.contextmanager
def installed(package: types.ModuleType) -> Iterator[None]:
    """The package's finder and plugin loads for the block; on exit, ``torch.cuda`` is restored if
    ``transfer_to_npu`` redirected it."""
    finder = _Finder(package)
    sys.meta_path.insert(0, finder)
    try:
        with plugin_loads():
            yield
    finally:
        package.__sim_surface__.redirect.restore()
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(finder)
