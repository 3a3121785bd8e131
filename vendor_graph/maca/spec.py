"""MACA's buffer spec: :func:`vendor_graph.cuda_style.cuda_style_spec` with its ``kv_start_indices`` layout."""

from __future__ import annotations

import torch

from ..buffers import BATCH, BufferSpec
from ..compat import LmdeployApi
from ..cuda_style import cuda_style_spec


def maca_spec(api: LmdeployApi) -> BufferSpec:
    """MACA: ``kv_start_indices`` int64 shaped ``(max_batches, 1)``."""
    return cuda_style_spec("maca", api, kv_start_shape=(BATCH, 1), kv_start_dtype=torch.int64)
