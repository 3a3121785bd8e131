"""Stand-in for the capture state dlinfer's Ascend attention reads.

The real ``dlinfer.vendor.ascend.attention`` imports ``AscendGraphRunner`` (whose class attribute
``capturing`` is a process-global flag) and ``get_graph_params`` from
``dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph``. Importing that stand-in reassigns
lmdeploy's ``CudaGraphMixin`` methods, so the attention stand-in takes the same two names from here.
``bookkeeping`` is what dlinfer's own capture branch records (one entry per captured attention call).
"""


class AscendGraphRunner:
    capturing = False


class GraphParams:
    def __init__(self) -> None:
        self.records: list[tuple[str, dict]] = []


_params = GraphParams()


def get_graph_params() -> GraphParams:
    return _params


def aclgraph_use_torch_npu_update() -> bool:
    """dlinfer's version rule (torch_npu >= 2.8.0.post1); the stand-in answers False (task-group path)."""
    return False
