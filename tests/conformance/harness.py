"""Drive the tiny decoder through eager and graph runners side by side, step by step."""

from __future__ import annotations

import contextlib
import random
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vendor_graph.testing import tiny_model as tm


def schedule(num_seqs: int, steps: int, seed: int, change_every: int = 3) -> list[list[int]]:
    """Active sequence sets: a new random batch size every few steps, sweeping across buckets."""
    rng = random.Random(seed)
    plan, active = [], list(range(num_seqs))
    for step in range(steps):
        if step % change_every == 0:
            size = rng.randint(1, num_seqs)
            active = sorted(rng.sample(range(num_seqs), size))
        plan.append(active)
    return plan


def prompts(num_seqs: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(rng.randint(3, 30))] for _ in range(num_seqs)]


@dataclass
class Configs:
    model_config: SimpleNamespace
    cache_config: SimpleNamespace
    backend_config: SimpleNamespace


def lmdeploy_configs(vendor: str, model: tm.TinyDecoder, max_batches: int, capture_sizes=None) -> Configs:
    c = model.config
    model_config = SimpleNamespace(
        vocab_size=c.vocab_size, model_paradigm="ar", use_flash_mla=False, use_mla_fp8_cache=False,
        mla_index_topk=None, states_shapes=[], use_mrope=False, block_size=c.block_size,
        k_head_dim=c.head_dim, v_head_dim=c.head_dim, dtype=c.dtype)
    cache_config = SimpleNamespace(max_batches=max_batches, num_gpu_blocks=c.max_blocks_per_seq,
                                   cudagraph_capture_batch_sizes=capture_sizes, block_size=c.block_size,
                                   max_prefill_token_num=4096)
    backend_config = SimpleNamespace(eager_mode=False, device_type=vendor, piecewise_cudagraph_max_tokens=None)
    return Configs(model_config, cache_config, backend_config)


@dataclass
class SideBySide:
    """Two sessions over the same model and prompts: one eager, one through ``runner``."""

    model: tm.TinyDecoder
    runner: object
    eager: tm.DecodeSession
    graph: tm.DecodeSession
    steps: int = 0
    mismatches: list[str] = field(default_factory=list)

    def graph_step(self, model, ctx):
        ctx.enable_microbatch = False
        out = self.runner(**tm.forward_kwargs(ctx))
        return out["hidden_states"]

    def step(self, active: list[int]) -> None:
        hidden = {}

        def keep(name, run):
            def wrapped(model, ctx):
                hidden[name] = run(model, ctx)
                return hidden[name]
            return wrapped

        eager_tokens = self.eager.step(active, run=keep("eager", tm.eager_step))
        graph_tokens = self.graph.step(active, run=keep("graph", self.graph_step))
        n = len(active)
        e = hidden["eager"].reshape(-1, hidden["eager"].shape[-1])[:n].cpu()
        g = hidden["graph"].reshape(-1, hidden["graph"].shape[-1])[:n].cpu()
        if not torch.equal(e, g):
            self.mismatches.append(f"step {self.steps} batch {n}: hidden states differ "
                                   f"(max abs {float((e - g).abs().max()):.3g})")
        if eager_tokens != graph_tokens:
            self.mismatches.append(f"step {self.steps}: tokens {graph_tokens} != eager {eager_tokens}")
        for layer, (pair_e, pair_g) in enumerate(zip(self.eager.kv_caches, self.graph.kv_caches, strict=True)):
            for which, te, tg in zip("kv", pair_e, pair_g, strict=True):
                if not torch.equal(te.cpu(), tg.cpu()):
                    diff = (te.cpu() != tg.cpu()).reshape(te.shape[0], -1).any(-1).nonzero().view(-1).tolist()
                    self.mismatches.append(f"step {self.steps}: layer {layer} {which}-cache differs in blocks {diff}")
        self.steps += 1


def side_by_side(vendor: str, runner_factory, *, num_seqs: int, seed: int, ascend_attention: str = "fia",
                 device="npu") -> SideBySide:
    model = tm.TinyDecoder(vendor, ascend_attention=ascend_attention, device=device)
    texts = prompts(num_seqs, seed)
    eager = tm.DecodeSession(model, texts, device=device, seed=seed)
    graph = tm.DecodeSession(model, texts, device=device, seed=seed)
    runner = runner_factory(model)
    return SideBySide(model=model, runner=runner, eager=eager, graph=graph)


@contextlib.contextmanager
def step_manager(vendor: str, model_config):
    """lmdeploy's StepContextManager as the engine sets it up (AR strategy), for the block."""
    from lmdeploy.pytorch.model_inputs import get_step_ctx_manager
    from lmdeploy.pytorch.strategies.ar import ARStrategyFactory

    with tm.lmdeploy_step_env(vendor):
        mgr = get_step_ctx_manager()
        mgr.build_ctx.strategy_factory = ARStrategyFactory(model_config)
        yield mgr
