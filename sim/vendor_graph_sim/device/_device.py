"""Install the simulated device: a renamed PrivateUse1 backend with Python kernels and a device module.

torch allows one PrivateUse1 backend name per process, once, so :func:`install` is process-global and
idempotent, and refuses to run next to a real ``torch_npu``.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch

from . import _runtime as rt
from . import _tensor

_INSTALLED: dict[str, Any] = {}
_SKIP_FACTORIES = frozenset({
    "_sparse_coo_tensor_with_dims", "sparse_coo_tensor", "_sparse_compressed_tensor_with_dims", "_efficientzerotensor",
    "_make_dep_token", "_cudnn_init_dropout_state", "_empty_affine_quantized", "from_file",
})
_ALLOCATION_ONLY = frozenset({"empty", "empty_strided", "empty_permuted"})


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id: int) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self) -> Any:
        return torch._C._autograd.DeviceType.PrivateUse1


def installed() -> str | None:
    """The simulated device's name if :func:`install` ran in this process, else None."""
    return _INSTALLED.get("device")


def install(device: str = "npu") -> types.ModuleType:
    """Install the simulated device ``device`` (default ``"npu"``) in this process; return ``torch.<device>``.

    Idempotent. After it, ``torch.zeros(3, device="npu")`` is a :class:`SimTensor` on ``npu:0`` and
    ``torch.npu`` is the simulated device module (the newest torch_npu generation's API; see
    :func:`use_torch_npu` for a specific one); torch.distributed has the ``hccl`` backend for it
    (:mod:`._hccl`). Refused when a real torch_npu is loaded, or when another PrivateUse1 backend name is
    already in use.
    """
    if _INSTALLED:
        if _INSTALLED["device"] != device:
            raise RuntimeError(f"the simulator is installed as {_INSTALLED['device']!r} in this process; torch "
                               f"cannot rename its PrivateUse1 backend again (asked for {device!r})")
        return _INSTALLED["module"]
    real = sys.modules.get("torch_npu")
    if real is not None and not getattr(real, "__vendor_graph_sim__", False):
        raise RuntimeError("a real torch_npu is imported in this process: the simulator cannot be installed next "
                           "to it (run simulator tests in their own process)")
    current = torch._C._get_privateuse1_backend_name()
    if current not in ("privateuseone", device):
        raise RuntimeError(f"the PrivateUse1 backend is already named {current!r}; the simulator needs {device!r}")
    if hasattr(torch, device) and not getattr(getattr(torch, device), "__vendor_graph_sim__", False):
        raise RuntimeError(f"torch.{device} already exists and is not the simulator's")

    from . import _torch_npu

    torch.utils.rename_privateuse1_backend(device)
    _tensor.set_device_type(device)
    rt.state().device_type = device
    torch.utils.generate_methods_for_privateuse1_backend()
    module = _torch_npu.build_device_module(None, name=f"torch.{device}")
    torch._register_device_module(device, module)
    torch._C._acc.register_python_privateuseone_hook(_Hooks())
    torch._C._acc.register_python_privateuseone_device_guard(_Guard())
    lib = torch.library.Library("aten", "IMPL")
    for name, overload in _factory_ops():
        op = getattr(getattr(torch.ops.aten, name), overload or "default")
        qualified = f"{name}.{overload}" if overload else name
        lib.impl(qualified, _factory_kernel(op, name in _ALLOCATION_ONLY, qualified), "PrivateUse1")
    lib.impl("_copy_from", _tensor._h_copy_from_kernel, "PrivateUse1")
    _INSTALLED.update(device=device, module=module, lib=lib)
    from . import _hccl

    _hccl.register()  # torch.distributed's "hccl" (lmdeploy's device groups on Ascend), over gloo
    return module


def _factory_ops() -> list[tuple[str, str]]:
    """aten factories: a keyword-only ``device``, no tensor argument, a tensor result, not composite."""
    found = []
    for schema in torch._C._jit_get_all_schemas():
        if not schema.name.startswith("aten::"):
            continue
        name = schema.name[6:]
        if name in _SKIP_FACTORIES:
            continue
        args = schema.arguments
        if not any(a.name == "device" and a.kwarg_only for a in args):
            continue
        if any("Tensor" in str(a.type) for a in args):
            continue
        if not schema.returns or str(schema.returns[0].type) != "Tensor":
            continue
        qualified = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
        try:
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "CompositeImplicitAutograd"):
                continue
        except RuntimeError:
            continue
        found.append((name, schema.overload_name))
    return found


def _factory_kernel(op: Any, allocation_only: bool, name: str) -> Any:
    cpu = torch.device("cpu")

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs["device"] = cpu
        kwargs.pop("pin_memory", None)
        return _tensor.adopt_factory(op(*args, **kwargs), allocation_only, name)

    return kernel
