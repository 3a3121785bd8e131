"""Activation in processes that never import vendor_graph themselves (lmdeploy's workers).

``vendor_graph_autoload.pth`` (installed into site-packages with the package) imports this module at
interpreter start only when ``VENDOR_GRAPH_VENDOR`` is set; importing ``vendor_graph.<vendor>`` sets
it, so the workers lmdeploy spawns inherit it. This module imports neither torch nor lmdeploy: it
waits for lmdeploy's graph module or the vendor's op backend to be imported, and only then activates
the vendor. ``VENDOR_GRAPH_DISABLE_AUTOLOAD=1`` turns it off.
"""

from __future__ import annotations

import importlib
import logging
import os

from . import REFERENCE_VENDORS, VENDORS
from .patching import VENDOR_ENV, when_imported

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
        importlib.import_module(f"vendor_graph.{vendor}")

    for trigger in _REFERENCE_TRIGGERS if vendor in REFERENCE_VENDORS else _TRIGGERS:
        when_imported(trigger.format(vendor=vendor), activate)


def _main() -> None:
    vendor = os.environ.get(VENDOR_ENV, "").strip()
    if not vendor or os.environ.get("VENDOR_GRAPH_DISABLE_AUTOLOAD") == "1":
        return
    if vendor not in VENDORS + REFERENCE_VENDORS:
        logging.getLogger("vendor_graph").error(
            "%s=%s is not a vendor_graph vendor (one of %s); graph mode stays off in this process",
            VENDOR_ENV, vendor, ", ".join(VENDORS + REFERENCE_VENDORS),
        )
        return
    _arm(vendor)


_main()
