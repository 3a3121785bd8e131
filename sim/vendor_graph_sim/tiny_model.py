"""A tiny decoder that plugs into lmdeploy's graph-mode contract, on the emulated vendor kernels.

:class:`TinyDecoder` mixes in lmdeploy's REAL ``CudaGraphMixin``, so a vendor's patches to that mixin
(``make_buffers_cudagraph`` / ``fill_buffers_cudagraph`` / ``update_context_cudagraph`` /
``get_outputs_cudagraph``) apply to it exactly as to a real lmdeploy model, and its decode metadata is what
lmdeploy's own ``<Vendor>OpsBackend.update_step_context`` builds. Vendor quirks it reproduces: Ascend reads host
sequence lengths, frozen into a captured graph unless the vendor's update path changes them; Camb's int
``max_kv_seq_len`` is frozen at capture too (a positive value truncates attention); MACA's ``kv_start_indices``
must be ``(tokens, 1)`` int64, as MACA's backend builds them; their decode kernels read the lengths from device
memory and refuse a host tensor. Camb and MACA decode attention is lmdeploy's own ``DlinferAttentionImpl`` (its
KV fill and ``paged_attention_fwd``, down to ``dlinfer.ops``). Ascend multi-token decode (speculative decoding)
comes from lmdeploy's non-decoding path (``is_decoding=False``, ``is_multi_token_decoding=True``).

Block 0 is reserved for padding, as lmdeploy does. Math accumulates in float64 and rounds to float32, so a row's
result does not depend on its batch (eager batch 3 and a graph padded to 4 agree bitwise).

Needs lmdeploy at import. lmdeploy's dlinfer backends import ``dlinfer``: on a CPU box put the stand-in
(``sim/vendor_graph_sim/data/standins``) on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
from lmdeploy.pytorch.models.utils.cudagraph import CudaGraphMixin
from torch import Tensor, nn

from vendor_graph.vendors.ascend.hook import call_attention

from . import kernels

VENDORS = ("ascend", "camb", "maca")
ASCEND_ATTENTION = ("fia", "fia_v2", "paged_attention", "mla", "paged_attention_mla")
MLA_ATTENTION = ("mla", "paged_attention_mla")
# Attention variants that can take several query tokens per sequence (speculative decoding).
MULTI_TOKEN_ATTENTION = ("fia", "fia_v2")
OP_BACKENDS = {
    "ascend": ("lmdeploy.pytorch.backends.dlinfer.ascend.op_backend", "AscendOpsBackend"),
    "camb": ("lmdeploy.pytorch.backends.dlinfer.camb.op_backend", "CambOpsBackend"),
    "maca": ("lmdeploy.pytorch.backends.dlinfer.maca.op_backend", "MacaOpsBackend"),
}


@dataclass(frozen=True)
class TinyConfig:
    """The pinned tiny-model configuration (change only with the tests that pin outputs)."""

    num_layers: int = 2
    hidden_size: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    intermediate_size: int = 128
    vocab_size: int = 256
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    block_size: int = 16
    num_blocks: int = 128
    max_blocks_per_seq: int = 8
    seed: int = 0
    dtype: torch.dtype = torch.float32
    # MLA variants only: the latent (compressed KV, also the value head) width and the RoPE part of the key.
    kv_lora_rank: int = 32
    qk_rope_head_dim: int = 8

    @property
    def max_seq_len(self) -> int:
        return self.block_size * self.max_blocks_per_seq

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)

    @property
    def mla_key_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def mla_scale(self) -> float:
        return 1.0 / math.sqrt(self.mla_key_dim)


def kv_cache_layout(vendor: str) -> str:
    """``"bshd"`` = ``(blocks, block_size, heads, dim)`` (Ascend, MACA); ``"bhsd"`` (Camb)."""
    _check_vendor(vendor)
    return "bhsd" if vendor == "camb" else "bshd"


def _check_vendor(vendor: str) -> None:
    if vendor not in VENDORS:
        raise ValueError(f"vendor must be one of {VENDORS}, got {vendor!r}")


def allocate_kv_caches(config: TinyConfig, vendor: str, device: torch.device | str = "cpu",
                       num_blocks: int | None = None, fill: float = 0.0, *,
                       mla: bool = False) -> list[tuple[Tensor, Tensor]]:
    """One ``(k_cache, v_cache)`` per layer in the vendor's layout (lmdeploy's ``get_k_block_shape``
    with the block count in front), filled with ``fill`` (``float('nan')`` poisons unused slots).

    ``mla=True`` (Ascend MLA variants): one KV head, the key ``kv_lora_rank + qk_rope_head_dim`` wide
    and the value ``kv_lora_rank`` wide (K and V head dims differ, as in lmdeploy's MLA models)."""
    nb = num_blocks or config.num_blocks
    layout = kv_cache_layout(vendor)
    if mla:
        if layout != "bshd":
            raise ValueError(f"the MLA cache is modelled for Ascend's layout only, not {vendor!r}")
        k_shape = (nb, config.block_size, 1, config.mla_key_dim)
        v_shape = (nb, config.block_size, 1, config.kv_lora_rank)
    elif layout == "bshd":
        k_shape = v_shape = (nb, config.block_size, config.num_kv_heads, config.head_dim)
    else:
        k_shape = v_shape = (nb, config.num_kv_heads, config.block_size, config.head_dim)
    return [(torch.full(k_shape, fill, dtype=config.dtype, device=device),
             torch.full(v_shape, fill, dtype=config.dtype, device=device)) for _ in range(config.num_layers)]


class BlockAllocator:
    """Hands out KV blocks 1..num_blocks-1 in a seeded shuffled order (block 0 stays reserved for
    padding), so block tables are not contiguous."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.free = list(range(1, num_blocks))
        random.Random(seed).shuffle(self.free)

    def ensure(self, table: list[int], length: int) -> list[int]:
        """Grow ``table`` in place until it covers ``length`` tokens; return it."""
        while len(table) * self.block_size < length:
            if not self.free:
                raise RuntimeError("out of KV blocks: allocate the caches with more num_blocks")
            table.append(self.free.pop())
        return table


# --------------------------------------------------------------------------------------------------
# the model


_HALF = (torch.bfloat16, torch.float16)


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    # float32 (the pinned model): float64 accumulation, so a row's result does not depend on its batch.
    # bf16/fp16 weights (benchmark-sized models, ``dtype=torch.bfloat16``): a plain GEMM in that dtype.
    if weight.dtype in _HALF:
        return torch.nn.functional.linear(x, weight)
    return torch.nn.functional.linear(x.to(torch.float64), weight.to(torch.float64)).to(x.dtype)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    acc = torch.float32 if weight.dtype in _HALF else torch.float64
    xd = x.to(acc)
    return (xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * weight.to(acc)).to(x.dtype)


class _Layer(nn.Module):
    def __init__(self, c: TinyConfig, g: torch.Generator):
        super().__init__()

        def w(rows: int, cols: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(rows, cols, generator=g) / math.sqrt(cols), requires_grad=False)

        def norm() -> nn.Parameter:
            return nn.Parameter(1.0 + 0.1 * torch.randn(c.hidden_size, generator=g), requires_grad=False)

        self.input_norm = norm()
        self.q_proj = w(c.num_heads * c.head_dim, c.hidden_size)
        self.k_proj = w(c.num_kv_heads * c.head_dim, c.hidden_size)
        self.v_proj = w(c.num_kv_heads * c.head_dim, c.hidden_size)
        self.o_proj = w(c.hidden_size, c.num_heads * c.head_dim)
        self.post_norm = norm()
        self.gate_proj = w(c.intermediate_size, c.hidden_size)
        self.up_proj = w(c.intermediate_size, c.hidden_size)
        self.down_proj = w(c.hidden_size, c.intermediate_size)


class _MLALayer(nn.Module):
    """A latent-attention layer with the up-projections absorbed (as MLA decode kernels expect):
    the query is projected straight into the latent space (``q_nope``) plus a RoPE part; the key is
    ``[normed latent | RoPE part]`` shared by all heads, the value the latent; ``o_proj`` maps the
    per-head latent outputs back to the hidden size."""

    def __init__(self, c: TinyConfig, g: torch.Generator):
        super().__init__()

        def w(rows: int, cols: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(rows, cols, generator=g) / math.sqrt(cols), requires_grad=False)

        def norm(size: int) -> nn.Parameter:
            return nn.Parameter(1.0 + 0.1 * torch.randn(size, generator=g), requires_grad=False)

        self.input_norm = norm(c.hidden_size)
        self.q_nope_proj = w(c.num_heads * c.kv_lora_rank, c.hidden_size)
        self.q_rope_proj = w(c.num_heads * c.qk_rope_head_dim, c.hidden_size)
        self.kv_a_proj = w(c.kv_lora_rank, c.hidden_size)
        self.kv_norm = norm(c.kv_lora_rank)
        self.k_rope_proj = w(c.qk_rope_head_dim, c.hidden_size)
        self.o_proj = w(c.hidden_size, c.num_heads * c.kv_lora_rank)
        self.post_norm = norm(c.hidden_size)
        self.gate_proj = w(c.intermediate_size, c.hidden_size)
        self.up_proj = w(c.intermediate_size, c.hidden_size)
        self.down_proj = w(c.hidden_size, c.intermediate_size)


Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


class TinyDecoder(nn.Module, CudaGraphMixin):
    """Tiny Llama-style decoder on the emulated ``vendor`` kernels (see the module docstring).

    ``ascend_attention`` picks the Ascend decode kernel: ``"fia"``, ``"fia_v2"``,
    ``"paged_attention"``, or an MLA variant (``"mla"``, ``"paged_attention_mla"``: latent-attention
    layers with their own weights and an MLA-shaped KV cache, see :meth:`kv_cache_dims`). Parameters
    do not require grad; use under ``torch.no_grad()`` or ``torch.inference_mode()`` as lmdeploy does.
    """

    def __init__(self, vendor: str = "ascend", config: TinyConfig | None = None, *,
                 ascend_attention: str = "fia", device: torch.device | str | None = None):
        super().__init__()
        _check_vendor(vendor)
        if ascend_attention not in ASCEND_ATTENTION:
            raise ValueError(f"ascend_attention must be one of {ASCEND_ATTENTION}, got {ascend_attention!r}")
        self.is_mla = ascend_attention in MLA_ATTENTION
        if self.is_mla and vendor != "ascend":
            raise ValueError(f"the MLA variants are Ascend attention kernels, not {vendor!r} ones")
        self.vendor = vendor
        self.ascend_attention = ascend_attention
        self.config = c = config or TinyConfig()
        self.kv_layout = kv_cache_layout(vendor)
        self.scale = c.mla_scale if self.is_mla else c.scale
        g = torch.Generator().manual_seed(c.seed)
        self.embed_tokens = nn.Parameter(torch.randn(c.vocab_size, c.hidden_size, generator=g), requires_grad=False)
        layer_cls = _MLALayer if self.is_mla else _Layer
        self.layers = nn.ModuleList(layer_cls(c, g) for _ in range(c.num_layers))
        self.norm = nn.Parameter(1.0 + 0.1 * torch.randn(c.hidden_size, generator=g), requires_grad=False)
        self.lm_head = nn.Parameter(torch.randn(c.vocab_size, c.hidden_size, generator=g) / math.sqrt(c.hidden_size),
                                    requires_grad=False)
        rope_dim = c.qk_rope_head_dim if self.is_mla else c.head_dim
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # float64, like the other math
        for param in self.parameters():
            param.data = param.data.to(c.dtype)
        if device is not None:
            self.to(device)

    # -- lmdeploy's model interface ----------------------------------------------------------------

    def forward(self, input_ids: Tensor, position_ids: Tensor, past_key_values: Sequence[Sequence[Tensor]],
                attn_metadata, inputs_embeds: Tensor | None = None, **kwargs) -> Tensor:
        """One decode step: hidden states ``(1, T, hidden)`` for ``T`` query tokens (one per sequence,
        or ``query_len`` per sequence in a multi-token decode step)."""
        if not (attn_metadata.is_decoding or getattr(attn_metadata, "is_multi_token_decoding", False)):
            raise NotImplementedError("TinyDecoder.forward runs decode steps; prefill with vendor_graph_sim."
                                      "tiny_model.prefill")

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            return self._decode_attention(q, k, v, past_key_values[i], attn_metadata)

        x = self._embed(input_ids, inputs_embeds)
        return self._run(x, position_ids.reshape(-1), attend).unsqueeze(0)

    def get_logits(self, hidden_states: Tensor) -> Tensor:
        return _linear(hidden_states, self.lm_head)

    def get_input_embeddings(self) -> Tensor:
        return self.embed_tokens

    # -- reference ---------------------------------------------------------------------------------

    @torch.no_grad()
    def reference_hidden(self, token_ids: Sequence[int]) -> Tensor:
        """Dense causal forward over one whole sequence, no cache: final hidden states ``(L, hidden)``."""
        ids = torch.tensor([list(token_ids)], dtype=torch.int64, device=self.embed_tokens.device)
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self._run(self._embed(ids, None), pos, lambda i, q, k, v: causal_attention(q, k, v, self.scale))

    def kv_cache_dims(self) -> tuple[int, int, int]:
        """``(kv_heads, k_head_dim, v_head_dim)`` of this model's KV cache (they differ for MLA)."""
        c = self.config
        if self.is_mla:
            return 1, c.mla_key_dim, c.kv_lora_rank
        return c.num_kv_heads, c.head_dim, c.head_dim

    # -- internals ---------------------------------------------------------------------------------

    def _embed(self, input_ids: Tensor, inputs_embeds: Tensor | None) -> Tensor:
        if inputs_embeds is not None:
            return inputs_embeds.reshape(-1, self.config.hidden_size)
        return torch.nn.functional.embedding(input_ids.reshape(-1), self.embed_tokens)

    def _rope(self, x: Tensor, positions: Tensor) -> Tensor:
        half = x.shape[-1] // 2
        angles = positions.to(torch.float64).unsqueeze(-1) * self.inv_freq.to(torch.float64)  # (T, D/2)
        cos, sin = torch.cos(angles).unsqueeze(1), torch.sin(angles).unsqueeze(1)
        xd = x.to(torch.float64)
        x1, x2 = xd[..., :half], xd[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    def _run(self, x: Tensor, positions: Tensor, attend: Attend) -> Tensor:
        c = self.config
        t = x.shape[0]
        for i, layer in enumerate(self.layers):
            a = _rms_norm(x, layer.input_norm, c.rms_eps)
            q, k, v = self._qkv(layer, a, positions)
            o = attend(i, q, k, v)
            x = x + _linear(o.reshape(t, -1), layer.o_proj)
            m = _rms_norm(x, layer.post_norm, c.rms_eps)
            x = x + _linear(torch.nn.functional.silu(_linear(m, layer.gate_proj)) * _linear(m, layer.up_proj),
                            layer.down_proj)
        return _rms_norm(x, self.norm, c.rms_eps)

    def _qkv(self, layer: nn.Module, a: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Query ``(T, N, Dk)``, key ``(T, KVH, Dk)`` and value ``(T, KVH, Dv)`` of one layer."""
        c = self.config
        t = a.shape[0]
        if not self.is_mla:
            q = self._rope(_linear(a, layer.q_proj).view(t, c.num_heads, c.head_dim), positions)
            k = self._rope(_linear(a, layer.k_proj).view(t, c.num_kv_heads, c.head_dim), positions)
            v = _linear(a, layer.v_proj).view(t, c.num_kv_heads, c.head_dim)
            return q, k, v
        q_nope = _linear(a, layer.q_nope_proj).view(t, c.num_heads, c.kv_lora_rank)
        q_rope = self._rope(_linear(a, layer.q_rope_proj).view(t, c.num_heads, c.qk_rope_head_dim), positions)
        latent = _rms_norm(_linear(a, layer.kv_a_proj), layer.kv_norm, c.rms_eps).view(t, 1, c.kv_lora_rank)
        k_rope = self._rope(_linear(a, layer.k_rope_proj).view(t, 1, c.qk_rope_head_dim), positions)
        return torch.cat((q_nope, q_rope), dim=-1), torch.cat((latent, k_rope), dim=-1), latent

    def _decode_attention(self, q: Tensor, k: Tensor, v: Tensor, kv_cache: Sequence[Tensor], meta) -> Tensor:
        k_cache, v_cache = kv_cache[0], kv_cache[1]
        start = meta.kv_start_indices
        if self.vendor == "maca" and (start.dim() != 2 or start.shape[-1] != 1 or start.dtype != torch.int64):
            raise ValueError(f"MACA's KV fill takes kv_start_indices (tokens, 1) int64, got "
                             f"{tuple(start.shape)} {start.dtype}")
        if self.vendor != "ascend":
            # lmdeploy's own attention layer: its KV fill and paged_attention_fwd, down to dlinfer.ops and the
            # vendor's kernels (the stand-in's reach the emulated ones).
            attention = self._lmdeploy_attention
            with _dlinfer_vendor(self.vendor):
                return attention.forward(q, k, v, k_cache, v_cache, meta)
        self._ascend_fill_kv_cache(k, v, k_cache, v_cache, start)
        return self._ascend_attention(q, k_cache, v_cache, meta)

    def _ascend_fill_kv_cache(self, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slots: Tensor) -> None:
        """The decode step's KV write through the ops dlinfer's Ascend ``fill_kv_cache`` calls, with their
        documented slot rules (docs/ascend_kernel_facts.md): ATB ReshapeAndCache when K and V head sizes agree
        (a negative slot skipped, a repeated one refused), ``npu_scatter_nd_update_`` of the key cache
        flattened to ``[blocks*block_size, 1, D]`` for MLA (an index outside the cache, -1 included, refused)."""
        if self.is_mla:
            torch.ops.npu.npu_scatter_nd_update_(torch.flatten(k_cache, start_dim=0, end_dim=1), slots.view(-1, 1),
                                                 k.contiguous())
            return
        torch.ops.atb._npu_reshape_and_cache(key=k.contiguous(), value=v.contiguous(), key_cache=k_cache,
                                             value_cache=v_cache, slot_indices=slots.to(torch.int32))

    @functools.cached_property
    def _lmdeploy_attention(self):
        from . import standins

        standins.use_standin_dlinfer_if_missing()  # lmdeploy's dlinfer kernels import dlinfer.ops
        from lmdeploy.pytorch.backends.dlinfer.attention import DlinferAttentionImpl

        c = self.config
        return DlinferAttentionImpl(c.num_heads, c.head_dim, scale=c.scale, num_kv_heads=c.num_kv_heads,
                                    v_head_size=c.head_dim)

    def _ascend_attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta) -> Tensor:
        # Through vendor_graph's hook, as a vendor attention must be: under a capture it registers the
        # task so the runner can refresh its host lengths; the .out overloads write given outputs, so a
        # re-issued task (task-update path) writes where the graph's later tasks read.
        c = self.config
        q_ends, kv_host = ascend_host_seqlens(meta)
        multi_token = bool(getattr(meta, "is_multi_token_decoding", False))
        if multi_token and self.ascend_attention not in MULTI_TOKEN_ATTENTION:
            raise NotImplementedError(f"ascend_attention={self.ascend_attention!r} decodes one token per sequence; "
                                      f"multi-token decode runs on {MULTI_TOKEN_ATTENTION}")
        if self.ascend_attention == "paged_attention":
            out = q.new_empty(q.shape)
            call_attention(torch.ops.atb._npu_paged_attention.default, q, k_cache, v_cache, c.num_kv_heads,
                           c.num_heads, c.scale, meta.block_offsets, kv_host, out)
            return out
        if self.is_mla:
            return self._ascend_mla(q, k_cache, meta, kv_host)
        nb, bs = k_cache.shape[:2]
        kc, vc = k_cache.view(nb, bs, -1), v_cache.view(nb, bs, -1)
        out = q.new_empty(q.shape)
        lse = q.new_empty((1,), dtype=torch.float32)
        # Multi-token decode: lmdeploy's fixed causal-mask template and FIA's causal sparse mode 3 (each
        # query row sees the KV up to its own position); single-token decode: no mask.
        mask = meta.attention_mask[0] if multi_token else None
        sparse_mode = 3 if multi_token else 0
        if self.ascend_attention == "fia_v2":
            call_attention(
                torch.ops.npu.npu_fused_infer_attention_score_v2.out,
                q, kc, vc, atten_mask=mask, actual_seq_qlen=q_ends.tolist(), actual_seq_kvlen=kv_host.tolist(),
                block_table=meta.block_offsets, num_query_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
                softmax_scale=c.scale, input_layout="TND", sparse_mode=sparse_mode, block_size=bs,
                attention_out=out, softmax_lse=lse)
            return out
        call_attention(
            torch.ops.npu.npu_fused_infer_attention_score.out,
            q, kc, vc, atten_mask=mask, actual_seq_lengths=q_ends.tolist(), actual_seq_lengths_kv=kv_host.tolist(),
            block_table=meta.block_offsets, num_heads=c.num_heads, scale=c.scale, input_layout="TND",
            num_key_value_heads=c.num_kv_heads, sparse_mode=sparse_mode, block_size=bs, attention_out=out,
            softmax_lse=lse)
        return out

    def _ascend_mla(self, q: Tensor, k_cache: Tensor, meta, kv_host: Tensor) -> Tensor:
        """MLA decode over the key cache ``[latent | rope]`` (the value is its latent part)."""
        c = self.config
        rank = c.kv_lora_rank
        out = q.new_empty((q.shape[0], c.num_heads, rank))
        if self.ascend_attention == "paged_attention_mla":
            # The host tensor as positional context_lens (index 6); NPUGraph.update never reaches this op.
            call_attention(torch.ops.atb._npu_paged_attention_mla.default, q, k_cache, 1, c.num_heads, self.scale,
                           meta.block_offsets, kv_host, rank, out)
            return out
        # ctkv and k_rope: the two parts of the key cache, views into it (cache_mode "krope_ctkv": ND caches);
        # the host list context_lens positional at index 5.
        q_nope, q_rope = q[..., :rank].contiguous(), q[..., rank:].contiguous()
        call_attention(torch.ops.npu.npu_multi_head_latent_attention.out, q_nope, q_rope, k_cache[..., :rank],
                       k_cache[..., rank:], meta.block_offsets, kv_host.tolist(), c.num_heads, self.scale, 1,
                       cache_mode="krope_ctkv", attn_out=out)
        return out


def ascend_host_seqlens(attn_metadata) -> tuple[Tensor, Tensor]:
    """The HOST tensors Ascend decode attention reads: cumulative query ends ``(B,)`` and KV lengths
    ``(B,)``. lmdeploy 0.18: ``cu_seqlens_q_cpu[1:]`` and ``kv_seqlens_cpu``; 0.16/0.17: ``q_seqlens``
    and ``kv_seqlens``, which the Ascend backend sets to host tensors."""
    if hasattr(attn_metadata, "kv_seqlens_cpu"):  # a field from 0.18 on
        if attn_metadata.kv_seqlens_cpu is None or attn_metadata.cu_seqlens_q_cpu is None:
            raise ValueError("attn_metadata.kv_seqlens_cpu / cu_seqlens_q_cpu are not set (lmdeploy 0.18 Ascend "
                             "decode reads them)")
        return attn_metadata.cu_seqlens_q_cpu[1:], attn_metadata.kv_seqlens_cpu
    return attn_metadata.q_seqlens, attn_metadata.kv_seqlens


def causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Plain causal attention over one sequence, per head, in float64: ``q (L, N, D)``,
    ``k``/``v (L, KVH, D)`` -> ``(L, N, D)`` in ``q``'s dtype."""
    length, n = q.shape[:2]
    group = n // k.shape[1]
    future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
    heads = []
    for h in range(n):
        scores = q[:, h].double() @ k[:, h // group].double().T * scale
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        heads.append(probs @ v[:, h // group].double())
    return torch.stack(heads, dim=1).to(q.dtype)


# --------------------------------------------------------------------------------------------------
# prefill and decode steps


def slot_indices(table: Sequence[int], start: int, stop: int, block_size: int) -> list[int]:
    """KV slots of token positions ``start..stop-1`` through a block table."""
    return [table[p // block_size] * block_size + p % block_size for p in range(start, stop)]


@torch.no_grad()
def prefill(model: TinyDecoder, kv_caches: Sequence[Sequence[Tensor]], block_tables: Sequence[Sequence[int]],
            prompts: Sequence[Sequence[int]]) -> Tensor:
    """Run each prompt eagerly (plain causal attention) and write its K/V into the caches through
    ``fill_kv_cache`` at the slots of its block table. Returns each prompt's last hidden state
    ``(num_prompts, hidden)``."""
    c = model.config
    device = model.embed_tokens.device
    last = []
    for table, prompt in zip(block_tables, prompts, strict=True):
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > len(table) * c.block_size:
            raise ValueError(f"block table {list(table)} is too short for a prompt of {len(prompt)} tokens")
        slots = torch.tensor(slot_indices(table, 0, len(prompt), c.block_size), dtype=torch.int64,
                             device=kv_caches[0][0].device)

        def attend(i: int, q: Tensor, k: Tensor, v: Tensor, slots: Tensor = slots) -> Tensor:
            kernels.fill_kv_cache(k, v, kv_caches[i][0], kv_caches[i][1], slots, model.kv_layout)
            return causal_attention(q, k, v, model.scale)

        ids = torch.tensor(list(prompt), dtype=torch.int64, device=device)
        pos = torch.arange(len(prompt), device=device)
        last.append(model._run(model._embed(ids, None), pos, attend)[-1])
    return torch.stack(last)


def _dlinfer_vendor(vendor: str):
    """The block in which ``dlinfer.ops`` reaches ``vendor``'s kernels: the stand-in serves one vendor per
    block (``dlinfer.vendor.selected``); a real dlinfer is one vendor's build."""
    import dlinfer.vendor

    select = getattr(dlinfer.vendor, "selected", None)
    return select(vendor) if select is not None else contextlib.nullcontext()


def backend_class(vendor: str) -> type:
    """lmdeploy's ``<Vendor>OpsBackend`` (the Ascend module imports ``dlinfer``: the stand-in in data/standins)."""
    _check_vendor(vendor)
    module, name = OP_BACKENDS[vendor]
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as exc:
        raise ImportError(f"{module} failed to import ({exc}); on a machine without dlinfer put the stand-in "
                          f"(vendor_graph_sim.standins.STANDIN_ROOT) on sys.path") from exc


def _single_rank_dist_meta():
    from lmdeploy.pytorch.backends.dlinfer.ascend.op_backend import DistMeta

    return DistMeta(dp_size=1, tp_size=1, ep_size=1, tp_rank=0, ep_rank=0, tp_group=None, ep_group=None)


def ensure_step_env(vendor: str) -> None:
    """What ``update_step_context`` needs outside lmdeploy's engine, installed if missing (and left
    installed, since the model's step runs under it): a current ``StepContextManager`` and, for
    Ascend, a single-rank ``AscendOpsBackend.dist_meta``."""
    from lmdeploy.pytorch.model_inputs import StepContextManager, get_step_ctx_manager, set_step_ctx_manager

    if get_step_ctx_manager() is None:
        set_step_ctx_manager(StepContextManager())
    if vendor == "ascend":
        backend = backend_class("ascend")
        if backend.dist_meta is None:
            backend.dist_meta = _single_rank_dist_meta()


@contextlib.contextmanager
def lmdeploy_step_env(vendor: str) -> Iterator[None]:
    """A fresh ``StepContextManager`` (and Ascend ``dist_meta``) for the block, restored afterwards. Camb/MACA on
    lmdeploy 0.18 with that vendor not active: vendor_graph's fix of their metadata, for the block (lmdeploy's own
    ``update_step_context`` raises ``TypeError`` there)."""
    from lmdeploy.pytorch.model_inputs import StepContextManager, get_step_ctx_manager, set_step_ctx_manager

    from vendor_graph.install import metadata_fix
    from vendor_graph.upstream import compat

    backend = backend_class(vendor)
    saved_mgr = get_step_ctx_manager()
    saved_dist = getattr(backend, "dist_meta", None)
    fix = None
    if (vendor != "ascend" and metadata_fix.needs_metadata_fix(compat.lmdeploy_api())
            and not metadata_fix.metadata_fix_installed(backend)):
        fix = metadata_fix.metadata_fix_patch(backend)
        fix.apply()
    set_step_ctx_manager(StepContextManager())
    if vendor == "ascend":
        backend.dist_meta = _single_rank_dist_meta()
    try:
        yield
    finally:
        set_step_ctx_manager(saved_mgr)
        if vendor == "ascend":
            backend.dist_meta = saved_dist
        if fix is not None:
            fix.restore()
        backend.total_slots = None


def _query_tokens(input_ids: Sequence, query_len: int) -> list[list[int]]:
    """Each sequence's query tokens: ``input_ids[b]`` is one int (``query_len`` 1) or ``query_len`` ints."""
    rows = []
    for entry in input_ids:
        row = [int(entry)] if isinstance(entry, int) or (isinstance(entry, Tensor) and entry.dim() == 0) else [
            int(t) for t in entry]
        if len(row) != query_len:
            raise ValueError(f"every sequence feeds query_len={query_len} tokens, got {row}")
        rows.append(row)
    return rows


def build_decode_context(vendor: str, kv_caches: Sequence[Sequence[Tensor]], block_tables: Sequence[Sequence[int]],
                         kv_seqlens: Sequence[int], input_ids: Sequence, *,
                         device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                         table_width: int | None = None, query_len: int = 1) -> SimpleNamespace:
    """A decode step's ``StepContext`` stand-in with ``attn_metadata``, as lmdeploy builds it.

    ``kv_seqlens[b]`` counts the KV of sequence ``b`` including this step's token ``input_ids[b]``
    (position ``kv_seqlens[b] - 1``). ``block_offsets`` is ``(B, table_width)`` (default: the most
    blocks any row needs), padded with block 0. The metadata comes from lmdeploy's real
    ``<Vendor>OpsBackend.update_step_context`` (Camb/MACA on lmdeploy 0.18: with that vendor active or inside
    :func:`lmdeploy_step_env`, where vendor_graph's fix lets it build 0.18's metadata; lmdeploy's own raises
    ``TypeError``). A ``StepContextManager`` is installed if none is current (see :func:`lmdeploy_step_env` for a
    scoped one).

    ``query_len`` > 1 (Ascend only): a multi-token decode step (speculative decoding) in which every
    sequence feeds ``query_len`` tokens, ``input_ids[b]`` being that many ints at positions
    ``kv_seqlens[b] - query_len .. kv_seqlens[b] - 1``. The context is what lmdeploy's engine gives
    the target model then: still a decode step (``is_decoding``), ``q_seqlens`` all ``query_len``,
    ``max_q_seqlen = query_len``, and the step manager's ``build_ctx.num_spec_tokens = query_len - 1``;
    lmdeploy's Ascend backend then builds it on its multi-token branch.
    """
    _check_vendor(vendor)
    if query_len < 1:
        raise ValueError(f"query_len must be >= 1, got {query_len}")
    if query_len > 1 and vendor != "ascend":
        raise ValueError(f"multi-token decode is modelled for Ascend only, not {vendor!r}")
    if not (len(block_tables) == len(kv_seqlens) == len(input_ids)):
        raise ValueError("block_tables, kv_seqlens and input_ids need one entry per sequence")
    tokens = _query_tokens(input_ids, query_len)
    device = torch.device(device) if device is not None else kv_caches[0][0].device
    block_size = kv_caches[0][0].shape[2 if kv_cache_layout(vendor) == "bhsd" else 1]
    need = [max(1, -(-int(n) // block_size)) for n in kv_seqlens]
    for table, n, blocks in zip(block_tables, kv_seqlens, need, strict=True):
        if n < query_len or len(table) < blocks:
            raise ValueError(f"block table {list(table)} does not cover a KV length of {n}")
    width = table_width or max(need)
    rows = [list(t[:width]) + [0] * (width - min(len(t), width)) for t in block_tables]
    kv = torch.tensor([int(n) for n in kv_seqlens], dtype=torch.int64)
    batch = len(kv_seqlens)
    positions = (kv.view(-1, 1) - query_len + torch.arange(query_len).view(1, -1)).view(1, -1)
    ctx = SimpleNamespace(
        kv_caches=[list(pair) for pair in kv_caches], is_decoding=True,
        block_offsets=torch.tensor(rows, dtype=torch.int64).to(device), kv_seqlens=kv.to(device),
        q_seqlens=torch.full((batch,), query_len, dtype=torch.int64).to(device),
        q_start_loc=(torch.arange(batch) * query_len).to(device),
        input_ids=torch.tensor([[t for row in tokens for t in row]], dtype=torch.int64).to(device),
        position_ids=positions.to(device),
        model_config=SimpleNamespace(is_gated_delta=False, states_shapes=[], mla_index_topk=None, dtype=dtype),
        kv_quant_policy=0, dp_meta=None, local_adapter_ids=None, max_q_seqlen=query_len,
        max_kv_seqlen=int(kv.max()), sum_kv_seqlen=int(kv.sum()), moe_metadata=None, attn_metadata=None,
    )
    ctx.global_is_decoding = lambda: True
    from lmdeploy.pytorch.model_inputs import get_step_ctx_manager

    ensure_step_env(vendor)
    mgr = get_step_ctx_manager()
    # Fixed for an engine with speculative decoding (its draft length); lmdeploy's Ascend backend
    # reads it when sizing MoE token capacity for graphs.
    mgr.build_ctx.num_spec_tokens = query_len - 1
    mgr.set_context(ctx)
    backend_class(vendor).update_step_context(ctx)
    return ctx


def forward_kwargs(ctx) -> dict:
    """The model kwargs lmdeploy's runners pass for a step context."""
    return dict(input_ids=ctx.input_ids, position_ids=ctx.position_ids, past_key_values=ctx.kv_caches,
                attn_metadata=ctx.attn_metadata, inputs_embeds=None)


def eager_step(model: TinyDecoder, ctx) -> Tensor:
    """Run a step context eagerly: hidden states ``(1, T, hidden)``."""
    with torch.inference_mode():
        return model(**forward_kwargs(ctx))


StepRunner = Callable[[TinyDecoder, SimpleNamespace], Tensor]


def draft_tokens(sequence: Sequence[int], count: int, vocab_size: int) -> list[int]:
    """The ``count`` draft tokens a multi-token step feeds after ``sequence``'s last token: a fixed
    function of the sequence (a stand-in for a draft model; any deterministic choice serves parity)."""
    last, n = int(sequence[-1]), len(sequence)
    return [(last * 37 + (n + j) * 101) % (vocab_size - 1) + 1 for j in range(count)]


class DecodeSession:
    """Greedy decoding of a few prompts through :class:`TinyDecoder`, one decode step at a time.

    Construction allocates the vendor's KV caches on ``device`` (default: the model's), assigns
    seeded non-contiguous blocks (block 0 reserved), prefills every prompt eagerly and appends its
    first greedy token. :meth:`step` decodes one token for the ``active`` sequences (default all) with
    metadata from :func:`build_decode_context`; ``run(model, ctx)`` replaces the eager forward (e.g.
    a graph runner) and may return rows padded beyond the batch.

    ``query_len`` > 1 (Ascend): speculative decoding with every draft accepted. Each step feeds, per
    active sequence, its last token plus ``query_len - 1`` draft tokens (:func:`draft_tokens`), then
    appends the drafts and the model's greedy token after the last one; the KV cache always holds
    every token but the last, as in single-token decode.
    """

    def __init__(self, model: TinyDecoder, prompts: Sequence[Sequence[int]], *,
                 device: torch.device | str | None = None, cache_fill: float = 0.0, seed: int = 0,
                 query_len: int = 1):
        c = model.config
        if query_len < 1:
            raise ValueError(f"query_len must be >= 1, got {query_len}")
        self.model = model
        self.vendor = model.vendor
        self.query_len = query_len
        self.device = torch.device(device) if device is not None else model.embed_tokens.device
        self.kv_caches = allocate_kv_caches(c, self.vendor, self.device, fill=cache_fill,
                                            mla=getattr(model, "is_mla", False))
        self.allocator = BlockAllocator(c.num_blocks, c.block_size, seed=seed)
        self.block_tables: list[list[int]] = [self.allocator.ensure([], len(p)) for p in prompts]
        self.tokens = [list(p) for p in prompts]
        hidden = prefill(model, self.kv_caches, self.block_tables, self.tokens)
        for seq, tok in zip(self.tokens, model.get_logits(hidden).argmax(-1).tolist(), strict=True):
            seq.append(int(tok))

    def twin(self) -> DecodeSession:
        """An independent session in this one's exact state (KV bytes, block tables, free blocks, tokens):
        the second side of a side-by-side run without prefilling every prompt again."""
        other = object.__new__(DecodeSession)
        other.__dict__.update(self.__dict__)
        other.kv_caches = [tuple(t.clone() for t in layer) for layer in self.kv_caches]
        other.allocator = copy.deepcopy(self.allocator)
        other.block_tables = [list(t) for t in self.block_tables]
        other.tokens = [list(t) for t in self.tokens]
        return other

    def query_tokens(self, seq: int) -> list[int]:
        """What sequence ``seq`` feeds in its next step: its last token, then the drafts."""
        tokens = self.tokens[seq]
        return [tokens[-1], *draft_tokens(tokens, self.query_len - 1, self.model.config.vocab_size)]

    def decode_context(self, active: Sequence[int] | None = None, table_width: int | None = None) -> SimpleNamespace:
        """The step context for feeding each active sequence's last token (plus its drafts)."""
        active = list(range(len(self.tokens))) if active is None else list(active)
        q = self.query_len
        for i in active:
            if len(self.tokens[i]) - 1 + q > self.model.config.max_seq_len:
                raise RuntimeError(f"sequence {i} reached max_seq_len {self.model.config.max_seq_len}")
            self.allocator.ensure(self.block_tables[i], len(self.tokens[i]) - 1 + q)
        ids = [self.query_tokens(i) for i in active] if q > 1 else [self.tokens[i][-1] for i in active]
        return build_decode_context(
            self.vendor, self.kv_caches, [self.block_tables[i] for i in active],
            [len(self.tokens[i]) - 1 + q for i in active], ids,
            device=self.device, dtype=self.model.config.dtype, table_width=table_width, query_len=q)

    def step(self, active: Sequence[int] | None = None, run: StepRunner | None = None) -> list:
        """Decode one greedy token for each active sequence; returns them (also appended to ``tokens``).

        With ``query_len`` > 1: returns each sequence's ``query_len`` greedy predictions (one per fed
        token) and appends the drafts plus the last prediction."""
        active = list(range(len(self.tokens))) if active is None else list(active)
        q = self.query_len
        ctx = self.decode_context(active)
        fed = [self.query_tokens(i) for i in active] if q > 1 else None
        hidden = (run or eager_step)(self.model, ctx)
        logits = self.model.get_logits(hidden.reshape(-1, self.model.config.hidden_size)[: len(active) * q])
        chosen = [int(t) for t in logits.argmax(-1).tolist()]
        if q == 1:
            for i, tok in zip(active, chosen, strict=True):
                self.tokens[i].append(tok)
            return chosen
        per_seq = [chosen[b * q:(b + 1) * q] for b in range(len(active))]
        for i, tokens, predicted in zip(active, fed, per_seq, strict=True):
            self.tokens[i].extend(tokens[1:] + predicted[-1:])
        return per_seq


__all__ = [
    "ASCEND_ATTENTION",
    "MLA_ATTENTION",
    "MULTI_TOKEN_ATTENTION",
    "VENDORS",
    "BlockAllocator",
    "DecodeSession",
    "TinyConfig",
    "TinyDecoder",
    "allocate_kv_caches",
    "ascend_host_seqlens",
    "build_decode_context",
    "causal_attention",
    "draft_tokens",
    "eager_step",
    "ensure_step_env",
    "forward_kwargs",
    "kv_cache_layout",
    "lmdeploy_step_env",
    "prefill",
    "slot_indices",
]
