"""Camb's buffer spec: :func:`vendor_graph.cuda_style.cuda_style_spec` with its ``kv_start_indices`` layout."""

from __future__ import annotations

import torch

from ..buffers import BATCH, BufferSpec
from ..compat import LmdeployApi
from ..cuda_style import cuda_style_spec


def camb_spec(api: LmdeployApi) -> BufferSpec:
    """Camb: ``kv_start_indices`` int32 over the batch."""
    return cuda_style_spec("camb", api, kv_start_shape=(BATCH,), kv_start_dtype=torch.int32)
