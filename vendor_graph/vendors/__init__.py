"""The vendors' rooms: each vendor's buffer spec, runner and facts, importable without activating anything.

Activation is the job of the public modules at the top (``import vendor_graph.ascend`` ...), which nothing in
the package imports: code that needs a vendor's facts imports its room (``vendor_graph.vendors.ascend.releases``)
or asks :func:`profile`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..install.patching import Activation
    from ..install.profile import VendorProfile


# vendor -> (its room under vendors/, the name of its profile there); Camb and MACA share one room.
PROFILES = {"ascend": ("ascend", "PROFILE"), "camb": ("cuda_style", "CAMB"), "maca": ("cuda_style", "MACA"),
            "cuda": ("cuda", "PROFILE")}


def profile(vendor: str) -> VendorProfile:
    """The :class:`~vendor_graph.install.profile.VendorProfile` of ``vendor`` (ascend, camb, maca, cuda)."""
    from .. import REFERENCE_VENDORS, VENDORS

    if vendor not in VENDORS + REFERENCE_VENDORS:
        raise ValueError(f"unknown vendor {vendor!r}: expected one of {', '.join(VENDORS + REFERENCE_VENDORS)}")
    room, name = PROFILES[vendor]
    return getattr(importlib.import_module(f"{__name__}.{room}"), name)


def activate(vendor: str) -> Activation:
    """Activate ``vendor`` in this process, as ``import vendor_graph.<vendor>`` does (idempotent)."""
    return importlib.import_module(f"vendor_graph.{vendor}").activate()


__all__ = ["activate", "profile"]
