"""The simulated Cambricon MLU and MetaX MACA devices: the graph simulator under the torch surface each vendor's
runtime gives lmdeploy and dlinfer, with the cuda-to-device mapping each has.

Facts used, and where they come from (the only place they are written down; on hardware check these first):

======================  ===================================================================================
fact                    source
======================  ===================================================================================
Camb device ``mlu``     torch_mlu registers the MLU as PrivateUse1 renamed ``mlu`` (``torch.mlu``,
                        ``Tensor.mlu()``); dlinfer's camb package allocates with ``device="mlu"``
                        (``vendor/camb/__init__.py``)
``torch_mlu.utils.``    dlinfer's ``vendor/camb/pytorch_patch.py`` imports it for its side effect: from then
``gpu_migration.``      on ``torch.cuda`` calls and ``cuda`` devices run on the MLU, and ``nccl`` means
``migration``           ``cncl`` (torch_mlu's GPU migration tool, as ``transfer_to_npu`` does for Ascend);
                        lmdeploy's engine checks ``torch.tensor(..., device='cuda')`` after dlinfer's import
MLU graph API           ``torch.mlu.MLUGraph`` / ``torch.mlu.graph`` / ``torch.mlu.graph_pool_handle`` with
                        torch.cuda's parameter lists (torch_mlu ports ``torch.cuda.graphs``); the migration
                        points ``torch.cuda.CUDAGraph`` at ``MLUGraph``: what lmdeploy's ``CUDAGraphRunner``
                        calls on Camb
MACA device             MetaX's torch is a CUDA-API build: its device *is* ``cuda`` (dlinfer's maca package:
                        ``device_str = "cuda"``), ``torch.cuda.CUDAGraph`` is native, ``nccl`` is its
                        collective's name. A CPU torch cannot make ``cuda`` tensors, so the simulated device
                        is PrivateUse1 renamed ``maca`` and ``cuda`` is mapped onto it from the start, for the
                        whole process: code that compares ``tensor.device.type == "cuda"`` sees ``maca``
                        here (the one visible difference; ``is_cuda`` is true, as on MACA)
device names            "MLU370-X8" and "MXC500": labels of this simulator, read by nothing in lmdeploy 0.16-0.18
                        or dlinfer for these vendors
device properties       ``get_device_properties(0)``: name, 64 GiB, ``major``/``minor`` None on the MLU (no CUDA
                        compute capability) and 8.0 on MACA (assumed: a CUDA-API build reports some capability).
                        lmdeploy reads ``major`` in ``flash_mla_available`` (MLA models): >= 9 would import
                        flash_mla
======================  ===================================================================================

Memory: ``mem_get_info`` is the simulated NPU's (its free memory), ``get_device_properties`` reports
:data:`TOTAL_BYTES`.
"""

from __future__ import annotations

import importlib.machinery
import types

from ._cuda import build_cuda_api
from ._device import install
from ._npu_surface import CudaRedirect, make_spec
from ._torch_npu import _common_functions

CAMB_DEVICE = "mlu"
MACA_DEVICE = "maca"
DEVICE_NAMES = {"camb": "MLU370-X8", "maca": "MXC500"}
TORCH_MLU_VERSION = "1.24.0-torch2.5.0"  # a label: nothing reads it beyond printing
MIGRATION = "torch_mlu.utils.gpu_migration.migration"
# torch.npu names of the shared device functions that the MLU / MACA device modules do not have
_NPU_ONLY = ("get_soc_version", "get_device_properties", "utilization", "host_empty_cache")
CAPABILITY = {"camb": (None, None), "maca": (8, 0)}
TOTAL_BYTES = 64 << 30


def device_module(vendor: str, name: str, graph_class: str) -> types.ModuleType:
    """The simulated device module of ``vendor`` (``torch.mlu`` or MACA's ``torch.cuda``): devices, streams, events,
    memory, and the CUDA-style graph API with the graph class named ``graph_class``."""
    device = install(CAMB_DEVICE if vendor == "camb" else MACA_DEVICE)
    module = types.ModuleType(name, f"Simulated {name} ({vendor}) of vendor_graph_sim.")
    module.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
    for key, fn in _common_functions(device).items():
        if key not in _NPU_ONLY:
            setattr(module, key, fn)
    for key, value in build_cuda_api().items():
        if key in ("mem_get_info", "get_device_capability"):
            continue  # the device's own (the simulated free memory) and the redirect's answer
        if key == "CUDAGraph":
            key = value.__name__ = value.__qualname__ = graph_class
            value.__module__ = name
        setattr(module, key, value)
    module.get_device_name = lambda device=None: DEVICE_NAMES[vendor]  # type: ignore[attr-defined]
    major, minor = CAPABILITY[vendor]
    properties = types.SimpleNamespace(name=DEVICE_NAMES[vendor], total_memory=TOTAL_BYTES, multi_processor_count=1,
                                       major=major, minor=minor)
    module.get_device_properties = lambda device=None: properties  # type: ignore[attr-defined]
    module.__spec__ = make_spec(module, False)
    return module


def torch_mlu_package() -> types.ModuleType:
    """A fresh simulated ``torch_mlu``: ``__version__``, ``mlu`` (= ``torch.mlu``), and the migration submodule
    whose import maps ``torch.cuda`` and ``cuda`` devices onto the MLU (``nccl`` onto the simulator's collective)."""
    mlu = device_module("camb", "torch.mlu", "MLUGraph")
    _as_torch_attribute(mlu, CAMB_DEVICE)
    package = types.ModuleType("torch_mlu", "Simulated torch_mlu of vendor_graph_sim (the graph simulator's MLU).")
    package.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
    package.__version__ = TORCH_MLU_VERSION  # type: ignore[attr-defined]
    package.__path__ = []  # type: ignore[attr-defined]
    package.mlu = mlu  # type: ignore[attr-defined]
    redirect = CudaRedirect(mlu, device=CAMB_DEVICE, collective="hccl", aliases={"CUDAGraph": "MLUGraph"})
    package.__sim_redirect__ = redirect  # type: ignore[attr-defined]
    modules = {"torch_mlu": package, "torch_mlu.mlu": mlu}
    for fullname in ("torch_mlu.utils", "torch_mlu.utils.gpu_migration", MIGRATION):
        sub = types.ModuleType(fullname, f"Simulated {fullname}.")
        sub.__vendor_graph_sim__ = True  # type: ignore[attr-defined]
        if fullname != MIGRATION:
            sub.__path__ = []  # type: ignore[attr-defined]
        modules[fullname] = sub
    # no submodule is set as its parent's attribute beforehand: `from ...gpu_migration import migration` must import
    # it (its side effect), as it does on torch_mlu
    package.__sim_specs__ = {  # type: ignore[attr-defined]
        fullname: make_spec(module, hasattr(module, "__path__"), on_exec=redirect.apply if fullname == MIGRATION
                            else None)
        for fullname, module in modules.items() if fullname != "torch_mlu"}
    return package


def maca_device() -> CudaRedirect:
    """Install the simulated MACA device and map ``torch.cuda`` and ``cuda`` devices onto it (a MACA torch's
    ``cuda`` is its device); returns the applied mapping."""
    module = device_module("maca", "torch.maca", "CUDAGraph")
    _as_torch_attribute(module, MACA_DEVICE)
    redirect = CudaRedirect(module, device=MACA_DEVICE, collective="hccl", capability=CAPABILITY["maca"])
    redirect.apply()
    return redirect


def _as_torch_attribute(module: types.ModuleType, device: str) -> None:
    """``torch.<device>`` and ``import torch.<device>`` are ``module`` (not :func:`install`'s NPU-shaped one)."""
    import sys

    import torch

    setattr(torch, device, module)
    sys.modules[f"torch.{device}"] = module


def find_torch_mlu_spec(package: types.ModuleType, fullname: str) -> importlib.machinery.ModuleSpec | None:
    """The spec of a simulated ``torch_mlu`` submodule, or None."""
    return package.__sim_specs__.get(fullname)


def _mlu_as_cuda(device: object) -> object:
    if isinstance(device, str) and (device == CAMB_DEVICE or device.startswith(f"{CAMB_DEVICE}:")):
        return "cuda" + device[len(CAMB_DEVICE):]
    return device


def install_torch_mlu_on_cuda() -> list[tuple[object, str, object]]:
    """On an NVIDIA GPU (no MLU, no simulator): a ``torch_mlu`` whose GPU migration is already applied the other way
    round, so that dlinfer's camb package, which allocates with ``device="mlu"``, and lmdeploy's Camb backend, which
    calls ``torch.cuda``, run on the GPU. Returns what it replaced (owner, name, old value)."""
    import sys

    import torch

    from ._npu_surface import _DEVICE_FACTORIES

    def on_cuda(fn):
        def call(*args, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _mlu_as_cuda(kwargs["device"])
            return fn(*args, **kwargs)

        call.__wrapped__ = fn
        return call

    replaced = [(torch, name, getattr(torch, name)) for name in _DEVICE_FACTORIES if hasattr(torch, name)]
    for owner, name, old in replaced:
        setattr(owner, name, on_cuda(old))
    package = types.ModuleType("torch_mlu", "torch_mlu on an NVIDIA GPU (vendor_graph_sim): mlu means cuda.")
    package.__path__ = []  # type: ignore[attr-defined]
    package.__version__ = TORCH_MLU_VERSION  # type: ignore[attr-defined]
    package.mlu = torch.cuda  # type: ignore[attr-defined]
    for fullname in ("torch_mlu", "torch_mlu.utils", "torch_mlu.utils.gpu_migration", MIGRATION):
        module = package if fullname == "torch_mlu" else types.ModuleType(fullname, "applied at install")
        if fullname not in ("torch_mlu", MIGRATION):
            module.__path__ = []  # type: ignore[attr-defined]
        sys.modules[fullname] = module
    return replaced


__all__ = ["CAMB_DEVICE", "DEVICE_NAMES", "MACA_DEVICE", "MIGRATION", "device_module", "find_torch_mlu_spec",
           "install_torch_mlu_on_cuda", "maca_device", "torch_mlu_package"]
