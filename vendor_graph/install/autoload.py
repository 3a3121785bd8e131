"""Activation in processes that never import vendor_graph themselves (lmdeploy's workers).

``vendor_graph_autoload.pth`` (installed into site-packages with the package) imports this module at
interpreter start only when ``VENDOR_GRAPH_VENDOR`` is set; importing ``vendor_graph.<vendor>`` sets
it, so the workers lmdeploy spawns inherit it. This module imports neither torch nor lmdeploy: it
waits for lmdeploy's graph module or the vendor's op backend to be imported, and only then activates
the vendor. ``VENDOR_GRAPH_DISABLE_AUTOLOAD=1`` turns it off. A bad vendor or autoload switch is logged
here and nothing is armed; any other bad setting is raised by the activation, when lmdeploy imports it.
"""

from __future__ import annotations

import importlib
import logging
import os

from .. import REFERENCE_VENDORS
from ..config import settings
from . import workers
from .patching import when_imported

_TRIGGERS = (
    "lmdeploy.pytorch.models.utils.cudagraph",
    "lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend",
)
_REFERENCE_TRIGGERS = (
    "lmdeploy.pytorch.models.utils.cudagraph",
    "lmdeploy.pytorch.backends.cuda.op_backend",
)


def _arm(vendor: str) -> None:
    fired = False

    def activate(_module) -> None:
        nonlocal fired
        if fired:
            return
        fired = True
        importlib.import_module(f"vendor_graph.{vendor}").activate()

    for trigger in _REFERENCE_TRIGGERS if vendor in REFERENCE_VENDORS else _TRIGGERS:
        when_imported(trigger.format(vendor=vendor), activate)
    if os.environ.get(workers.REPORTS_ENV):  # a worker spawned by an executor vendor_graph watches
        workers.arm_worker()


def _main() -> None:
    try:
        config = settings.load()
    except settings.SettingsError as exc:
        if {settings.variable("vendor"), settings.variable("disable_autoload")} & set(exc.names):
            logging.getLogger("vendor_graph").error("%s; graph mode stays off in this process", exc)
            return
        config = exc.partial
    if config.vendor is None or config.disable_autoload:
        return
    _arm(config.vendor)


_main()
