"""Process-wide switches from the settings (:mod:`vendor_graph.config.settings`), shared by every runner.

* ``VENDOR_GRAPH_DISABLE=1``: graph mode off, every step eager, said once per process. The buffer
  patches stay installed (from lmdeploy 0.17 its own ``CudaGraphMixin`` fill does not work on these
  vendors, and an engine built with graphs may still call it). Runner API: ``disabled()`` where the
  runner decides whether graphs are on (its ``__init__``); ``announce_disabled(where)`` there (logs
  once). vendor_graph's builder wrapper also builds every runner with ``eager_mode=True`` then.
* ``VENDOR_GRAPH_DEBUG=1``: detailed logs (logger ``vendor_graph`` at DEBUG). The logger has its own stderr
  handler for what the root logger's console handlers do not print. Runner API: ``apply_debug()`` once in ``__init__``;
  ``DEBUG`` (a module-level bool) guards per-step debug logging so it costs one attribute read.
"""

from __future__ import annotations

import logging
import sys
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


class _NotShownByRoot(logging.Filter):
    """Passes a record that no console handler of the root logger prints. lmdeploy raises every plain
    ``StreamHandler`` of the root logger to ERROR when it makes its own logger (its ``get_logger``), so in a
    process whose logging was configured (``logging.basicConfig``) vendor_graph's warnings, info and debug
    records would reach no console."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(type(h) is logging.StreamHandler and getattr(h, "stream", None) in (sys.stderr, sys.stdout)
                       and record.levelno >= h.level for h in logging.getLogger().handlers)


def ensure_log_handler() -> None:
    """Give the ``vendor_graph`` logger a stderr handler for the records the root logger's console handlers
    do not print (none when the logger already has a handler of its user's)."""
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_NotShownByRoot())
    logger.addHandler(handler)


def apply_debug() -> bool:
    """Take ``VENDOR_GRAPH_DEBUG`` from the current settings; when on, the ``vendor_graph`` logger emits DEBUG
    records (a line per replayed, captured and eager decode step) on stderr."""
    global DEBUG
    DEBUG = settings.current().debug
    ensure_log_handler()
    if DEBUG:
        logger.setLevel(logging.DEBUG)
    return DEBUG


__all__ = ["DEBUG", "DEBUG_ENV", "DISABLE_ENV", "announce_disabled", "apply_debug", "disabled", "ensure_log_handler"]
