"""Ascend NPU graph mechanism: the seq-len update paths, the attention capture hook and the runner.

Importing this package activates nothing (``import vendor_graph.ascend`` does), so vendor attention
code can use :func:`vendor_graph.npu.hook.call_attention` freely.
"""
