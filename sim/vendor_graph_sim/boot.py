"""The simulator switch: ``VENDOR_GRAPH_SIM=<generation or torch_npu release>`` makes an interpreter see the
simulated Ascend NPU from its start, as an Ascend machine's interpreter sees its torch_npu.

vendor-graph-sim installs ``vendor_graph_sim_boot.pth``, which imports this module at interpreter start only
when the variable is set. Then nothing heavy runs: one finder goes first on ``sys.meta_path``, and the
simulator comes up the first time something imports ``torch_npu`` (lmdeploy's engine does, through dlinfer,
when it checks its environment). From then on, for the rest of the process:

* ``torch_npu`` is the simulated package of that release and ``torch.npu`` its device module;
  ``torch_npu.contrib.transfer_to_npu`` maps ``cuda`` devices to the NPU as the real one does;
* ``dlinfer`` is the source tree of ``VENDOR_GRAPH_DLINFER_SRC`` where that is set (else an installed one),
  laid out as its build lays it out (``dlinfer/vendor/vendor.yaml`` written for Ascend), in a cache folder;
* the modules that no CPU build can provide are labelled stand-ins (:data:`STANDIN_LABEL`), each only where
  the real module cannot work here (:func:`standin_reason`).

``VENDOR_GRAPH_SIM=camb`` and ``VENDOR_GRAPH_SIM=maca`` are the two other vendors' devices
(:mod:`vendor_graph_sim.device._cuda_style` holds their facts): for ``camb``, ``torch_mlu`` is the simulated
package (its GPU migration maps ``cuda`` onto the ``mlu`` device when imported, as dlinfer's camb package does) and
``torch_mlu_ops`` a labelled stand-in; for ``maca`` the simulated device comes up when torch is imported (where
torch came before the switch, with dlinfer's first import): a MACA torch's ``cuda`` is its device, so ``cuda`` is
mapped from then on; ``flash_attn``, ``mcoplib`` and dlinfer's Triton modules are labelled stand-ins where the real
ones are not installed. dlinfer is laid out for the vendor (``vendor.yaml``, without the other vendors' packages, as
``DEVICE=<vendor>`` builds it).

A process started from such an interpreter inherits the variable, so lmdeploy's workers, the server and
whatever ``vendor-graph run`` starts see the same NPU. Unset, this module is never imported. A value that
names no generation or release, or a real torch_npu installed beside it, makes ``import torch_npu`` raise an
ImportError that says so (and the line is printed once at start). This module imports neither torch nor
lmdeploy until ``torch_npu`` is imported.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import types
from pathlib import Path
from typing import Any

ENV = "VENDOR_GRAPH_SIM"
STANDIN_LABEL = "__vendor_graph_test_standin__"
# dlinfer main's torch_npu pins (its requirements/ascend/torch.txt): a generation runs as its newest release
# inside them.
DLINFER_TORCH_NPU_PINS = (">=2.3.1", "<2.10.0")
ASCEND_VENDOR_YAML = "vendor: ascend\ndispatch_key: PrivateUse1\n"
# what dlinfer's setup.py writes for each DEVICE (its vendor_dispatch_key_map)
VENDOR_YAML = {"ascend": ASCEND_VENDOR_YAML, "camb": "vendor: camb\ndispatch_key: PrivateUse1\n",
               "maca": "vendor: maca\ndispatch_key: CUDA\n"}
CUDA_STYLE = ("camb", "maca")  # the switch's values for the vendors on lmdeploy's CUDA graph runner
TRITON_OPS = ("dlinfer.vendor.ascend.triton_ops", "dlinfer.vendor.ascend.triton_ops.reject_sample",
              "dlinfer.vendor.ascend.triton_ops.triton_utils")
VERSION_MODULE = "dlinfer.vendor.ascend.version"
REJECT_SAMPLER = "lmdeploy.pytorch.spec_decode.reject_sampler"


class SimSwitchError(ValueError):
    """``VENDOR_GRAPH_SIM`` cannot be honoured here (the message names the fix)."""


def simulated_vendor(spec: str) -> str:
    """The vendor whose device ``spec`` simulates: ``camb``, ``maca``, or ``ascend`` (a torch_npu generation or
    release); :class:`SimSwitchError` naming the valid values for anything else."""
    from vendor_graph.config import settings

    from .variables import SIM_SWITCH

    try:
        value = SIM_SWITCH.parse(spec)
    except settings.SettingsError as exc:
        raise SimSwitchError(str(exc)) from None
    return value if value in CUDA_STYLE else "ascend"


def _parse(spec: str) -> tuple[str | None, str | None]:
    """(generation, release) named by ``spec``, one of them None; :class:`SimSwitchError` naming the valid values
    for anything else (``camb`` / ``maca`` too: they name no torch_npu). Reads only vendor_graph's settings and
    release table: it runs at interpreter start."""
    from vendor_graph.config import settings
    from vendor_graph.vendors.ascend.releases import GENERATIONS

    from .variables import SIM_SWITCH

    try:
        value = SIM_SWITCH.parse(spec)
    except settings.SettingsError as exc:
        raise SimSwitchError(str(exc)) from None
    if value in CUDA_STYLE:
        raise SimSwitchError(f"{spec!r} simulates the {value} device, which has no torch_npu: name a torch_npu "
                             f"generation such as G5 for the NPU")
    return (value, None) if value in GENERATIONS else (None, value)


def pinned_release(spec: str) -> str:
    """The torch_npu release ``spec`` runs as: a generation's newest release inside
    :data:`DLINFER_TORCH_NPU_PINS`, a release string as the table spells it. :class:`SimSwitchError` for
    anything else, naming the valid values."""
    generation, release = _parse(spec)
    if release is not None:
        return release
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from vendor_graph.vendors.ascend.releases import RELEASES

    pins = SpecifierSet(",".join(DLINFER_TORCH_NPU_PINS))
    inside = [r.version for r in RELEASES if r.generation == generation and Version(r.version) in pins]
    if not inside:
        raise SimSwitchError(f"no torch_npu release of {generation} lies inside dlinfer's pins {pins}: name a "
                             f"release of it instead")
    return max(inside, key=Version)


# -- dlinfer laid out as a build lays it out ------------------------------------------------------------------


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vendor_graph" / "dlinfer-staged"


def _tree_key(package: Path) -> str:
    digest = hashlib.sha256(str(package.resolve()).encode())
    for folder, dirs, files in sorted(os.walk(package)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(f for f in files if not f.endswith(".pyc")):
            info = os.stat(os.path.join(folder, name))
            digest.update(f"{os.path.relpath(os.path.join(folder, name), package)}:{info.st_size}:"
                          f"{info.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:20]


def stage(root: Path, vendor: str = "ascend") -> Path:
    """The folder holding ``root``'s ``dlinfer`` package with ``vendor/vendor.yaml`` for ``vendor``, as dlinfer's
    build writes it (for Camb and MACA without the other vendors' packages, as their builds leave them out): a copy
    in the user's cache, made once per source tree and vendor and shared by every process."""
    package = Path(root) / "dlinfer"
    key = _tree_key(package)
    target = _cache_root() / (key if vendor == "ascend" else f"{key}-{vendor}")
    if (target / "dlinfer" / "vendor" / "vendor.yaml").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    shutil.copytree(package, building / "dlinfer", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if vendor != "ascend":
        for other in VENDOR_YAML:
            if other != vendor:
                shutil.rmtree(building / "dlinfer" / "vendor" / other, ignore_errors=True)
    (building / "dlinfer" / "vendor" / "vendor.yaml").write_text(VENDOR_YAML[vendor])
    try:
        os.rename(building, target)
    except OSError:  # another process staged the same tree first
        shutil.rmtree(building, ignore_errors=True)
    return target


def dlinfer_source() -> Path | None:
    """The dlinfer source tree to stage: ``VENDOR_GRAPH_DLINFER_SRC`` (validated by its declaration)."""
    from .variables import dlinfer_src

    root = dlinfer_src()
    return Path(root) if root is not None else None


# -- stand-ins ------------------------------------------------------------------------------------------------


def _findable_elsewhere(name: str) -> bool:
    """Whether ``name`` is found by the finders after this one (an installed package)."""
    for finder in sys.meta_path:
        if isinstance(finder, _Finder) or not hasattr(finder, "find_spec"):
            continue
        with contextlib.suppress(ImportError, ValueError):
            if finder.find_spec(name, None) is not None:
                return True
    return False


def standin_reason(name: str) -> str | None:
    """Why ``name`` is served as a stand-in in this interpreter, or None when the real module is used."""
    if name in TRITON_OPS and not _findable_elsewhere("triton"):
        return "dlinfer's triton kernels (speculative rejection sampling, linear attention); triton has no CPU build"
    if name == REJECT_SAMPLER and not _findable_elsewhere("triton"):
        lmdeploy = importlib.util.find_spec("lmdeploy")
        folder = Path(lmdeploy.origin).parent if lmdeploy is not None and lmdeploy.origin else None
        source = folder / "pytorch" / "spec_decode" / "reject_sampler.py" if folder else None
        if source is not None and source.is_file() and "\nimport triton" in source.read_text(encoding="utf-8"):
            return "lmdeploy's triton rejection sampler (speculative decoding); triton has no CPU build"
    if name == VERSION_MODULE and "dlinfer.vendor.ascend" in sys.modules:
        parent = sys.modules["dlinfer.vendor.ascend"]
        if importlib.machinery.PathFinder.find_spec(name, list(getattr(parent, "__path__", []))) is None:
            return ("lmdeploy 0.17/0.18's AscendOpsBackend.init() imports it, and this dlinfer has none; its runtime "
                    "check has nothing to check on the simulator")
    return None


def _standin(name: str, reason: str) -> types.ModuleType:
    module = types.ModuleType(name, f"vendor_graph test stand-in for {name}: {reason}")
    setattr(module, STANDIN_LABEL, reason)
    if name == VERSION_MODULE:
        module.ensure_ascend_runtime = lambda *args, **kwargs: None  # type: ignore[attr-defined]
        return module

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{name} is a vendor_graph test stand-in ({reason})")

    if name == REJECT_SAMPLER:
        from torch import nn

        # lmdeploy 0.16 builds one in every engine; only speculative decoding calls it.
        module.RejectionSampler = type("RejectionSampler", (nn.Module,),  # type: ignore[attr-defined]
                                       {"forward": refuse, "__module__": name})
        module.rejection_sample = refuse  # type: ignore[attr-defined]
        return module

    def __getattr__(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return type(attr, (), {"__new__": refuse, "__module__": name})  # annotations naming it still evaluate

    module.__getattr__ = __getattr__  # type: ignore[attr-defined]
    if name == TRITON_OPS[0]:
        module.__path__ = []  # a package: its submodules are stand-ins too
    return module


class _Loader(importlib.abc.Loader):
    def __init__(self, module: types.ModuleType) -> None:
        self.module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self.module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# -- the finder -----------------------------------------------------------------------------------------------


class _SimulatedNpuLoader(importlib.abc.Loader):
    """Brings the simulator up when ``torch_npu`` (``torch_mlu`` for Camb) is imported (not when it is only looked
    up)."""

    def __init__(self, finder: _Finder) -> None:
        self.finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.finder.problem is not None:
            raise ImportError(self.finder.problem, name=spec.name)
        return self.finder.bring_up()

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self.finder.package_spec  # the simulated package's own (its submodules' finder reads it)


class _ThenBringUp(importlib.abc.Loader):
    """A module's own loader, then ``bring_up`` once the module has run."""

    def __init__(self, loader: importlib.abc.Loader, bring_up: Any) -> None:
        self.loader = loader
        self.bring_up = bring_up

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        self.bring_up()

    def __getattr__(self, name: str) -> Any:  # the wrapped loader's resource readers and the like
        return getattr(self.loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``: the simulated vendor package (``torch_npu``, or ``torch_mlu`` for Camb; up at
    its first import; MACA's device with torch's import; nothing for ``spec`` None), dlinfer laid out as a build for
    the vendor lays it out, the stand-ins."""

    def __init__(self, spec: str | None, problem: str | None, vendor: str | None = None) -> None:
        self.spec = spec
        self.problem = problem
        # a vendor without a spec: its dlinfer layout and kernel stand-ins on this machine's real device
        self.on_real_device = spec is None and vendor is not None
        self.vendor = vendor or "ascend"
        if spec is not None:
            with contextlib.suppress(SimSwitchError):
                self.vendor = simulated_vendor(spec)
        self.release: str | None = None
        self.package: types.ModuleType | None = None
        self.package_spec: importlib.machinery.ModuleSpec | None = None
        self.dlinfer_root: Path | None = None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == VENDOR_PACKAGE.get(self.vendor) and self.spec is not None:
            return importlib.machinery.ModuleSpec(fullname, _SimulatedNpuLoader(self), is_package=True)
        if self.vendor == "camb" and self.package is not None and fullname.startswith("torch_mlu."):
            from .device import _cuda_style

            return _cuda_style.find_torch_mlu_spec(self.package, fullname)
        if fullname == "torch" and self.vendor == "maca" and self.spec is not None and self.problem is None:
            return self._torch_then_maca()
        if fullname == "dlinfer" and self.problem is None:
            return self._dlinfer_spec()
        if fullname == "dlinfer" and self.vendor == "maca" and self.spec is not None:
            raise ImportError(self.problem, name=fullname)  # where MACA's simulated device would come up
        if fullname in VENDOR_STANDINS.get(self.vendor, ()) and (self.spec is not None or self.on_real_device):
            return self._vendor_standin(fullname)
        reason = standin_reason(fullname) if fullname in (*TRITON_OPS, VERSION_MODULE, REJECT_SAMPLER) else None
        if reason is not None:
            module = _standin(fullname, reason)
            return importlib.machinery.ModuleSpec(fullname, _Loader(module),
                                                  is_package=hasattr(module, "__path__"))
        return None

    def bring_up(self) -> types.ModuleType:
        from . import device as sim

        if self.vendor == "camb":
            from .device import _cuda_style

            self.package = _cuda_style.torch_mlu_package()
            self.package_spec = importlib.machinery.ModuleSpec("torch_mlu", _Loader(self.package), is_package=True)
            atexit.register(self.package.__sim_redirect__.restore)
            return self.package
        self.release = pinned_release(self.spec)
        sim.install()
        scope = sim.use_torch_npu(self.release)
        package = scope.__enter__()
        self.package_spec = package.__spec__
        # Left at exit, before the interpreter tears torch down (leaving it later crashes the teardown).
        atexit.register(scope.__exit__, None, None, None)
        return package

    def bring_up_maca(self) -> None:
        """The simulated MACA device, once: what a MACA torch has from its import on."""
        if self.vendor != "maca" or self.package is not None or self.spec is None:
            return
        if self.problem is not None:
            raise ImportError(self.problem)
        import torch

        if torch.version.cuda is not None or torch.cuda.is_available():
            self.problem = (f"{ENV}=maca is set, but this torch is a CUDA build ({torch.__version__}): the simulator "
                            f"never runs beside a real device; unset {ENV}")
            raise ImportError(self.problem)
        from .device import _cuda_style

        redirect = _cuda_style.maca_device()
        self.package = sys.modules[f"torch.{_cuda_style.MACA_DEVICE}"]
        atexit.register(redirect.restore)

    def _torch_then_maca(self) -> importlib.machinery.ModuleSpec | None:
        """torch's own spec, whose loading ends by bringing MACA's simulated device up: a MACA torch's ``cuda`` is its
        device from ``import torch`` on (lmdeploy's workers call ``torch.cuda.set_device`` before anything else)."""
        spec = importlib.machinery.PathFinder.find_spec("torch")
        if spec is None or spec.loader is None:
            return None
        spec.loader = _ThenBringUp(spec.loader, self.bring_up_maca)
        return spec

    def _vendor_standin(self, fullname: str) -> importlib.machinery.ModuleSpec | None:
        """A stand-in for a vendor kernel package no CPU build provides (never in front of an installed one)."""
        top = fullname.split(".")[0]
        if top != "dlinfer" and _findable_elsewhere(top):
            return None
        if top == "dlinfer" and _findable_elsewhere("triton"):
            return None  # dlinfer's own Triton kernels run where triton is installed
        if self.vendor == "maca":
            self.bring_up_maca()
            from . import vendor_kernels_maca as kernels
        else:
            from . import vendor_kernels_camb as kernels
        module = kernels.build_module(fullname) if self.vendor == "maca" else kernels.build_module()
        return importlib.machinery.ModuleSpec(fullname, _Loader(module), is_package=hasattr(module, "__path__"))

    def _dlinfer_spec(self) -> importlib.machinery.ModuleSpec | None:
        if self.dlinfer_root is None:
            source = dlinfer_source()
            if source is None:
                return None  # an installed dlinfer, if any
            self.dlinfer_root = stage(source, self.vendor)
        self.bring_up_maca()
        return importlib.machinery.PathFinder.find_spec("dlinfer", [str(self.dlinfer_root)])


# the package whose import brings each vendor's simulated device up (MACA's comes up with torch's)
VENDOR_PACKAGE = {"ascend": "torch_npu", "camb": "torch_mlu"}
# the vendor kernel packages served as labelled stand-ins where no real one is installed
VENDOR_STANDINS = {
    "camb": ("torch_mlu_ops",),
    "maca": ("flash_attn", "mcoplib", "mcoplib.lmdeploy", "mcoplib.op", "mcoplib._C", "mcoplib._moe_C",
             "dlinfer.vendor.maca.context_flashattention", "dlinfer.vendor.maca.fused_moe"),
}


def active() -> _Finder | None:
    """The switch's finder in this interpreter, or None when the switch is off."""
    return next((f for f in sys.meta_path if isinstance(f, _Finder)), None)


def install(spec: str) -> _Finder:
    """Turn the switch on in this interpreter (what the ``.pth`` file does for ``VENDOR_GRAPH_SIM``); idempotent
    for the same value. The problem, if any, is raised at ``import torch_npu`` (``torch_mlu``; MACA: dlinfer's
    import) as :class:`ImportError`."""
    finder = active()
    if finder is not None and finder.spec is None and not {"torch_npu", "torch_mlu"} & set(sys.modules):
        sys.meta_path.remove(finder)  # only dlinfer and the stand-ins so far: the switch takes over
        finder = None
    if finder is not None:
        if finder.spec != spec:
            raise SimSwitchError(f"the simulated device is already {finder.spec!r} in this process, not {spec!r}: "
                                 f"torch renames its device backend once per process")
        return finder
    problem = None
    try:
        vendor = simulated_vendor(spec)
    except SimSwitchError as exc:
        problem, vendor = str(exc), "ascend"
    runtime = {"ascend": "torch_npu", "camb": "torch_mlu", "maca": "mcoplib"}[vendor]
    real = importlib.machinery.PathFinder.find_spec(runtime)
    if problem is None and real is not None:
        problem = (f"{ENV} is set, but a real {runtime} is installed ({real.origin}): the simulator never runs beside "
                   f"it; unset {ENV}")
    if problem is None and vendor == "ascend":
        try:
            _parse(spec)
        except SimSwitchError as exc:
            problem = str(exc)
    finder = _Finder(spec, problem)
    sys.meta_path.insert(0, finder)
    return finder


def serve_vendor(vendor: str) -> _Finder:
    """dlinfer laid out for ``vendor`` (Camb, MACA) and that vendor's kernel stand-ins, on this machine's real device
    (no simulated one): how lmdeploy's Camb and MACA backend code runs on an NVIDIA GPU. Not beside the switch."""
    if vendor not in CUDA_STYLE:
        raise ValueError(f"vendor must be one of {CUDA_STYLE}, got {vendor!r}")
    finder = active()
    if finder is not None:
        raise SimSwitchError(f"the simulator's finder is already in this process (vendor {finder.vendor}): "
                             f"serve_vendor runs on a real device only")
    finder = _Finder(None, None, vendor)
    sys.meta_path.insert(0, finder)
    return finder


def serve_upstream() -> _Finder:
    """dlinfer laid out and the stand-ins served in this interpreter, without the simulator switch (a process that
    installs the simulated torch_npu itself, :func:`vendor_graph_sim.device.use_torch_npu`); idempotent."""
    finder = active()
    if finder is None:
        finder = _Finder(None, None)
        sys.meta_path.insert(0, finder)
    return finder


def _main() -> None:
    spec = os.environ.get(ENV, "").strip()
    if not spec:
        return
    finder = install(spec)
    if finder.problem is not None:
        print(f"vendor_graph_sim: {finder.problem}", file=sys.stderr)


_main()
