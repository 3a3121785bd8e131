"""What every real ``<vendor>_cudagraph`` module does at import: reassign the mixin's buffer methods (and, on
Ascend, ``support_cuda_graph`` too, as dlinfer main's ``ascend_cudagraph`` does)."""

from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin

METHODS = ("make_buffers_cudagraph", "fill_buffers_cudagraph", "update_context_cudagraph")


def displace(vendor: str) -> None:
    for name in METHODS + (("support_cuda_graph",) if vendor == "ascend" else ()):
        def marker(self, *args, _name=name, **kwargs):
            raise RuntimeError(f"dlinfer stand-in {vendor} {_name} ran: vendor_graph was displaced")

        marker.__qualname__ = f"{vendor}_{name}"
        marker.__module__ = f"dlinfer.framework.lmdeploy_ext.cudagraph.{vendor}_cudagraph"
        setattr(CudaGraphMixin, name, marker)
