"""Installing vendor_graph into lmdeploy, and keeping it installed.

One vendor per process. Installing:

* sets our buffer methods on lmdeploy's real ``CudaGraphMixin`` and wraps the vendor op backend's
  ``build_graph_runner``; each target is patched when its module has finished importing (now, or
  later through an import hook), so ``import vendor_graph.<vendor>`` may come before lmdeploy;
* re-asserts our methods after any ``dlinfer.framework.lmdeploy_ext`` module finishes importing:
  lmdeploy imports it in every worker (``try_import_deeplink``) and it reassigns the same methods;
  ownership is also checked where the runner is built and before each capture, and what was
  displaced is logged;
* exports ``VENDOR_GRAPH_VENDOR`` so lmdeploy's spawned workers activate the same vendor
  (``vendor_graph/install/autoload.py``).

``uninstall()`` puts back exactly what each target held before, and removes the hooks.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import settings

logger = logging.getLogger("vendor_graph")

VENDOR_ENV = settings.variable("vendor")
_MISSING = object()


class VendorConflict(RuntimeError):
    """A second vendor was activated in a process that already has one."""


# -- post-import hooks --------------------------------------------------------------------------------


def _module_ready(name: str) -> bool:
    """Whether ``name`` has finished executing (a module whose post-import hooks are running has)."""
    module = sys.modules.get(name)
    if module is None:
        return False
    if name in _finder.firing:
        return True
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


class _HookLoader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader, finder: _PostImportFinder):
        self._inner = inner
        self._finder = finder

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        self._finder.fire(module.__name__)

    def __getattr__(self, name):  # get_source, get_code, is_package ... for tools that ask
        return getattr(self._inner, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs callbacks right after watched modules finish executing."""

    def __init__(self) -> None:
        self._exact: dict[str, list[Callable[[Any], None]]] = {}
        self._prefix: dict[str, list[Callable[[Any], None]]] = {}
        # Modules already mid-import when watched: the finder is past them, so they are run at the
        # next hook that fires or the next ownership check, whichever comes first.
        self._pending: dict[str, list[Callable[[Any], None]]] = {}
        self.firing: set[str] = set()
        self._local = threading.local()

    def watch(self, name: str, callback: Callable[[Any], None], *, prefix: bool = False) -> None:
        table = self._prefix if prefix else self._exact
        table.setdefault(name, []).append(callback)

    def defer(self, name: str, callback: Callable[[Any], None]) -> None:
        self._pending.setdefault(name, []).append(callback)

    def run_pending(self) -> None:
        for name in [n for n in self._pending if _module_ready(n)]:
            for callback in self._pending.pop(name):
                callback(sys.modules[name])

    def clear(self) -> None:
        self._exact.clear()
        self._prefix.clear()
        self._pending.clear()

    def _callbacks(self, name: str) -> list[Callable[[Any], None]]:
        found = list(self._exact.get(name, ()))
        for pre, cbs in self._prefix.items():
            if name == pre or name.startswith(pre + "."):
                found.extend(cbs)
        return found

    def find_spec(self, fullname, path, target=None):
        if self._pending:
            self.run_pending()
        if not self._callbacks(fullname) or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is None:
                for finder in sys.meta_path:
                    if finder is self or not hasattr(finder, "find_spec"):
                        continue
                    spec = finder.find_spec(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookLoader(spec.loader, self)
        return spec

    def fire(self, name: str) -> None:
        module = sys.modules.get(name)
        self.firing.add(name)
        try:
            callbacks = self._callbacks(name)
            self._exact.pop(name, None)  # exact watches run once
            for callback in callbacks:
                callback(module)
        finally:
            self.firing.discard(name)
        self.run_pending()


_finder = _PostImportFinder()


def _ensure_finder() -> None:
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def when_imported(name: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` once ``name`` has finished importing: now if it has, else at import."""
    if _module_ready(name):
        callback(sys.modules[name])
        return
    _ensure_finder()
    if name in sys.modules:
        _finder.defer(name, callback)
    else:
        _finder.watch(name, callback)


def after_each_import(prefix: str, callback: Callable[[Any], None]) -> None:
    """Call ``callback(module)`` after every later import of ``prefix`` or a submodule of it, and once
    for each such module that is mid-import now (as soon as the next import or check notices it done)."""
    _ensure_finder()
    _finder.watch(prefix, callback, prefix=True)
    for name in list(sys.modules):
        if (name == prefix or name.startswith(prefix + ".")) and not _module_ready(name):
            _finder.defer(name, callback)


# -- patches ------------------------------------------------------------------------------------------


@dataclass
class Patch:
    """One attribute we own on a class (or module), with what it held before us."""

    owner: Any
    name: str
    ours: Any
    before: Any = _MISSING
    owner_is_module: bool = False

    def apply(self) -> None:
        self.before = self.owner.__dict__.get(self.name, _MISSING)
        setattr(self.owner, self.name, self.ours)

    def owned(self) -> bool:
        return self.owner.__dict__.get(self.name, _MISSING) is self.ours

    def current(self) -> Any:
        return self.owner.__dict__.get(self.name, _MISSING)

    def restore(self) -> None:
        if self.before is _MISSING:
            if self.name in self.owner.__dict__:
                delattr(self.owner, self.name)
        else:
            setattr(self.owner, self.name, self.before)

    @property
    def target(self) -> str:
        if self.owner_is_module:
            return f"{self.owner.__name__}.{self.name}"
        return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"


def describe(value: Any) -> str:
    if value is _MISSING:
        return "(inherited)"
    func = getattr(value, "__func__", value)
    module = getattr(func, "__module__", None) or "?"
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{module}.{name}"


@dataclass
class Activation:
    """The one vendor installed in this process."""

    vendor: str
    patches: list[Patch] = field(default_factory=list)
    # (target, displacer) pairs seen and undone, for the log and `vendor-graph doctor`.
    displaced: list[tuple[str, str]] = field(default_factory=list)
    exported_env: bool = False

    def add(self, patch: Patch) -> None:
        patch.apply()
        self.patches.append(patch)
        logger.debug("vendor_graph.%s: %s <- ours (was %s)", self.vendor, patch.target, describe(patch.before))

    def ensure_owned(self, where: str) -> bool:
        """Re-assert every patch something else replaced; True if all were already ours."""
        intact = True
        for patch in self.patches:
            if patch.owned():
                continue
            intact = False
            intruder = describe(patch.current())
            self.displaced.append((patch.target, intruder))
            logger.warning(
                "vendor_graph.%s: %s had been replaced by %s (noticed %s); vendor_graph's is back in force",
                self.vendor, patch.target, intruder, where,
            )
            setattr(patch.owner, patch.name, patch.ours)
        return intact


_lock = threading.RLock()
_active: Activation | None = None


def active() -> Activation | None:
    return _active


def activate(vendor: str, setup: Callable[[Activation], None]) -> Activation:
    """Install ``vendor`` (idempotent); ``setup`` registers the vendor's patches on the activation.

    Parses the settings (:class:`~vendor_graph.config.settings.SettingsError` when a value is not accepted) and warns,
    once per process, of each ``VENDOR_GRAPH_*`` name it does not know, naming the closest known one."""
    global _active
    requested = settings.load().vendor
    settings.warn_unknown()
    with _lock:
        if _active is not None:
            if _active.vendor == vendor:
                return _active
            raise VendorConflict(
                f"vendor_graph.{_active.vendor} is already active in this process; cannot also activate "
                f"vendor_graph.{vendor}. One process drives one accelerator vendor: import only one, or "
                f"call vendor_graph.uninstall() first"
            )
        if requested is not None and requested != vendor:
            raise VendorConflict(
                f"{VENDOR_ENV}={requested} asks for vendor_graph.{requested}, but vendor_graph.{vendor} "
                f"was imported; unset {VENDOR_ENV} or import vendor_graph.{requested}"
            )
        activation = Activation(vendor=vendor)
        _active = activation
        try:
            setup(activation)
        except BaseException:
            _uninstall_locked()
            raise
        after_each_import(_dlinfer_prefix(), lambda module: _reassert(f"after import of {module.__name__}"))
        if requested is None:
            os.environ[VENDOR_ENV] = vendor
            activation.exported_env = True
        logger.info("vendor_graph.%s active", vendor)
        return activation


def _dlinfer_prefix() -> str:
    from ..upstream.compat import DLINFER_EXT_PREFIX

    return DLINFER_EXT_PREFIX


def _reassert(where: str) -> None:
    activation = _active
    if activation is not None:
        activation.ensure_owned(where)


def ensure_owned(where: str) -> bool:
    """Check (and restore) ownership of every patch; called where runners are built and before capture."""
    _finder.run_pending()
    activation = _active
    return True if activation is None else activation.ensure_owned(where)


def uninstall() -> None:
    """Undo everything ``activate`` did; a no-op when nothing is active."""
    with _lock:
        _uninstall_locked()


def _forget_public_modules() -> None:
    """Drop the public vendor modules from ``sys.modules``, so that the next ``import vendor_graph.<vendor>``
    runs it again and activates (a module object already held keeps working)."""
    from .. import REFERENCE_VENDORS, VENDORS

    for vendor in VENDORS + REFERENCE_VENDORS:
        sys.modules.pop(f"vendor_graph.{vendor}", None)


def _uninstall_locked() -> None:
    global _active
    activation = _active
    _finder.clear()
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    if activation is None:
        return
    for patch in reversed(activation.patches):
        patch.restore()
    if activation.exported_env and os.environ.get(VENDOR_ENV) == activation.vendor:
        del os.environ[VENDOR_ENV]
    _active = None
    _forget_public_modules()
    logger.info("vendor_graph.%s uninstalled", activation.vendor)
