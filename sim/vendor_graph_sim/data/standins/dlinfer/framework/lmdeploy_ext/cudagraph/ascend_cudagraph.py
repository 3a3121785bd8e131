"""Stand-in for ``dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph`` (our own code).

Where the real module keeps them (dlinfer main a50184e), so the stand-in keeps them here too:

* importing it reassigns lmdeploy's ``CudaGraphMixin`` methods: the three buffer methods and
  ``support_cuda_graph`` (here: markers that raise, see ``_displace``);
* ``AscendGraphRunner.capturing``: dlinfer's process-global capture flag, a class attribute that its own
  single-graph runner sets around a capture and that ``dlinfer.vendor.ascend.attention`` reads;
* ``get_graph_params()``: dlinfer's capture bookkeeping (per capture size: events, workspaces, task-group
  handles, attention arguments; ``is_mla``), ``None`` until ``set_graph_params`` sizes it, which in dlinfer
  only its own runner does;
* ``aclgraph_use_torch_npu_update()``: whether torch_npu >= 2.8.0.post1 (then dlinfer's decode attention
  leaves length updates to torch_npu); computed once per process, as dlinfer's ``lru_cache`` does;
* ``get_ascend_compatible_size``: what lmdeploy's Ascend MoE padding imports.

Differences, on purpose: the real module imports ``torch_npu`` at import; the stand-in imports it only in
``aclgraph_use_torch_npu_update`` and answers False where there is none (CPU test machines). The runner is
eager-only and accepts lmdeploy >= 0.18's ``is_mla=`` (dlinfer's does not).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from lmdeploy.pytorch.backends.graph_runner import GraphRunner

from ._displace import displace

displace("ascend")

TORCH_NPU_UPDATE_FROM = "2.8.0.post1"


@functools.lru_cache
def aclgraph_use_torch_npu_update() -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        import torch_npu
    except ImportError:
        return False
    try:
        return Version(torch_npu.__version__) >= Version(TORCH_NPU_UPDATE_FROM)
    except (InvalidVersion, TypeError, AttributeError):
        return False


class AscendGraphRunner(GraphRunner):
    """Eager-only stand-in for dlinfer's Ascend runner; ``capturing`` is dlinfer's global capture flag."""

    capturing = False

    def __init__(self, model, model_config, cache_config, backend_config, device, is_mla=False):
        super().__init__(model, model_config, cache_config, backend_config, device)
        self.is_mla = is_mla


@dataclass
class GraphParams:
    events: dict[int, list[Any]]  # torch.npu.ExternalEvent per captured attention call
    workspaces: dict[int, Any]
    handles: dict[int, list[Any]]  # task-group handles (torch_npu._C._NPUTaskGroupHandle)
    attn_params: dict[int, list[tuple]]  # the arguments of each captured attention call
    is_mla: bool | None


_graph_params: GraphParams | None = None


def set_graph_params(capture_sizes) -> None:
    global _graph_params
    if _graph_params is not None:
        raise ValueError("graph params are already set")
    sizes = set(capture_sizes)
    _graph_params = GraphParams(events={n: [] for n in sizes}, workspaces={n: None for n in sizes},
                                handles={n: [] for n in sizes}, attn_params={n: [] for n in sizes}, is_mla=False)


def get_graph_params() -> GraphParams | None:
    return _graph_params


def clear_graph_params() -> None:
    global _graph_params
    _graph_params = None


def get_ascend_compatible_size(n: int) -> int:
    # dlinfer's rule equals vendor_graph's Ascend bucket for 1..2048 (checked against dlinfer main).
    from vendor_graph.sizing.buckets import ascend_bucket

    return ascend_bucket(n)
