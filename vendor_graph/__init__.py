"""vendor_graph: graph-mode decoding for lmdeploy's PyTorch engine on Ascend, Cambricon and MetaX.

Use: ``import vendor_graph.ascend`` (or ``.camb`` / ``.maca``) before lmdeploy starts. Importing this
package itself does nothing and imports neither torch nor lmdeploy.
"""

from __future__ import annotations

__version__ = "0.1.0"

VENDORS = ("ascend", "camb", "maca")
# Not a product vendor: runs the package on NVIDIA GPUs inside lmdeploy's engine, as a reference.
REFERENCE_VENDORS = ("cuda",)


def uninstall() -> None:
    """Restore lmdeploy's original methods and remove vendor_graph's import hooks."""
    from .install import patching

    patching.uninstall()


def active_vendor() -> str | None:
    """The vendor active in this process, or None."""
    import sys

    patching = sys.modules.get("vendor_graph.install.patching")
    activation = patching.active() if patching is not None else None
    return activation.vendor if activation is not None else None


__all__ = ["REFERENCE_VENDORS", "VENDORS", "__version__", "active_vendor", "uninstall"]
