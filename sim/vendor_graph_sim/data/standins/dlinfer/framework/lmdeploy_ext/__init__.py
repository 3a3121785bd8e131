"""Like the real package: importing it patches lmdeploy's CudaGraphMixin for the configured vendor."""

from . import cudagraph  # noqa: F401
