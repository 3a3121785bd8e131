"""A self-check of a vendor's buffer methods as installed in lmdeploy, on synthetic decode steps.

Steps are generated from the spec's own declarations (one random tensor per sourced field, sized for
the live batch), pushed through lmdeploy's ``CudaGraphMixin`` (so the methods actually in force are
the ones exercised), and after every fill the graph's buffers must equal those of a fresh graph filled
with the same step: no row or column of an earlier, larger step may survive.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch

from ..buffers import BATCH, BATCH_PLUS_ONE, BLOCKS, SOURCE, TOKENS, BufferSpec, Ref


def _put(root: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        nxt = root.get(part) if isinstance(root, dict) else getattr(root, part, None)
        if nxt is None:
            nxt = SimpleNamespace()
            Ref("kwarg" if isinstance(root, dict) else "attn", part).set(root, nxt)
        root = nxt
    Ref("kwarg" if isinstance(root, dict) else "attn", last).set(root, value)


def synthetic_step(spec: BufferSpec, batch: int, blocks: int, query_len: int = 1, seed: int = 0):
    """(model inputs, attn_metadata, StepContext) for one decode step, with every source the spec reads."""
    g = torch.Generator().manual_seed(seed)
    sizes = {BATCH: batch, TOKENS: batch * query_len, BATCH_PLUS_ONE: batch + 1, BLOCKS: blocks, SOURCE: 4}
    roots = {"kwarg": {}, "attn": SimpleNamespace(block_size=16, attention_mask=[]), "context": SimpleNamespace()}
    for f in spec.fields:
        if f.source is None:
            continue
        shape = [sizes.get(d, d) for d in f.shape]
        dtype = f.dtype or torch.int64
        if dtype == torch.bool:
            value = torch.rand(shape, generator=g) < 0.5
        elif dtype.is_floating_point:
            value = torch.rand(shape, generator=g).to(dtype)
        else:
            value = torch.randint(1, 50, shape, generator=g, dtype=dtype)
        _put(roots[f.source.kind], f.source.path, value)
    return roots["kwarg"], roots["attn"], roots["context"]


@dataclass
class SelfCheckReport:
    graph_batch: int
    batches: list[int]
    copies_per_step: int
    stale: list[str]

    @property
    def ok(self) -> bool:
        return not self.stale


def run(spec: BufferSpec, graph_batch: int, num_blocks: int = 8) -> SelfCheckReport:
    """Fill one graph of ``graph_batch`` rows with shrinking live batches through lmdeploy's mixin."""
    for name, value in (("graph_batch", graph_batch), ("num_blocks", num_blocks)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"self-check {name} must be a positive int, got {value!r}")
    from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMeta, CudaGraphMixin

    class Model(CudaGraphMixin):
        pass

    model = Model()

    def meta() -> Any:
        return CudaGraphMeta(max_batchs=graph_batch, max_tokens=graph_batch, num_blocks=num_blocks,
                             is_decoding=True, device=torch.device("cpu"), input_buffers={}, output_buffers={})

    def step(graph_meta, batch, blocks, seed, capture):
        inputs, attn, ctx = synthetic_step(spec, batch, blocks, seed=seed)
        kwargs = dict(inputs, past_key_values=[], attn_metadata=attn)
        kwargs.setdefault("inputs_embeds", None)
        if capture:
            graph_meta.input_buffers = model.make_buffers_cudagraph(graph_meta, **kwargs)
        model.fill_buffers_cudagraph(graph_meta, **kwargs)
        model.update_context_cudagraph(graph_meta, ctx)

    batches = sorted({graph_batch, max(1, graph_batch // 2 + 1), 1}, reverse=True)
    shrinking_blocks = [num_blocks, max(1, num_blocks // 2), 1]
    graph = meta()
    stale: list[str] = []
    for i, (batch, blocks) in enumerate(zip(batches, shrinking_blocks, strict=False)):
        step(graph, batch, blocks, seed=i, capture=(i == 0))
        fresh = meta()
        step(fresh, batch, blocks, seed=i, capture=True)
        for name, tensor in fresh.input_buffers.items():
            if not torch.equal(graph.input_buffers[name], tensor):
                stale.append(f"{name} after batch {batch}")
    copies = sum(1 for f in spec.fields if not f.is_static and f.name in graph.input_buffers)
    return SelfCheckReport(graph_batch=graph_batch, batches=batches, copies_per_step=copies, stale=stale)
