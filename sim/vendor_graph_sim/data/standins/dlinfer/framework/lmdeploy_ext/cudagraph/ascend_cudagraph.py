from lmdeploy.pytorch.backends.graph_runner import GraphRunner

from ._displace import displace

displace("ascend")


class AscendGraphRunner(GraphRunner):
    """Eager-only stand-in for dlinfer's Ascend runner (accepts lmdeploy >= 0.17's is_mla=)."""

    def __init__(self, model, model_config, cache_config, backend_config, device, is_mla=False):
        super().__init__(model, model_config, cache_config, backend_config, device)
        self.is_mla = is_mla


def get_ascend_compatible_size(n: int) -> int:
    from vendor_graph.ascend.buckets import ascend_bucket

    return ascend_bucket(n)
