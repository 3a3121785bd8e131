"""Process-wide switches from the settings (:mod:`vendor_graph.settings`), shared by every runner.

* ``VENDOR_GRAPH_DISABLE=1``: graph mode off, every step eager, said once per process. The buffer
  patches stay installed (from lmdeploy 0.17 its own ``CudaGraphMixin`` fill does not work on these
  vendors, and an engine built with graphs may still call it). Runner API: ``disabled()`` where the
  runner decides whether graphs are on (its ``__init__``); ``announce_disabled(where)`` there (logs
  once). vendor_graph's builder wrapper also builds every runner with ``eager_mode=True`` then.
* ``VENDOR_GRAPH_DEBUG=1``: detailed logs (logger ``vendor_graph`` at DEBUG, with a stderr handler
  when logging is not configured). Runner API: ``apply_debug()`` once in ``__init__``;
  ``DEBUG`` (a module-level bool) guards per-step debug logging so it costs one attribute read.
"""

from __future__ import annotations

import logging
import threading

from . import settings

DISABLE_ENV = settings.variable("disable")
DEBUG_ENV = settings.variable("debug")

logger = logging.getLogger("vendor_graph")
_LOCK = threading.Lock()
_ANNOUNCED = False


def disabled() -> bool:
    """Whether ``VENDOR_GRAPH_DISABLE`` turns graph mode off (in the current settings)."""
    return settings.current().disable


def announce_disabled(where: str = "") -> None:
    """Log once per process that graph mode is off and why."""
    global _ANNOUNCED
    with _LOCK:
        if _ANNOUNCED:
            return
        _ANNOUNCED = True
    logger.warning("vendor_graph: %s=1: graph mode is off, every step runs eager%s (vendor buffer patches stay "
                   "installed); unset it to capture graphs again", DISABLE_ENV, f" ({where})" if where else "")


DEBUG = False


def apply_debug() -> bool:
    """Take ``VENDOR_GRAPH_DEBUG`` from the current settings; when on, make the ``vendor_graph`` logger emit
    DEBUG records."""
    global DEBUG
    DEBUG = settings.current().debug
    if DEBUG:
        logger.setLevel(logging.DEBUG)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)
    return DEBUG


__all__ = ["DEBUG", "DEBUG_ENV", "DISABLE_ENV", "announce_disabled", "apply_debug", "disabled"]
