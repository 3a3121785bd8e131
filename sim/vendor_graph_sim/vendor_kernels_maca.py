"""Labelled stand-ins for the modules dlinfer's MACA vendor package imports that no CPU build (and no H200 image)
provides: ``flash_attn``, MetaX's ``mcoplib`` (its ``lmdeploy``, ``op``, ``_C`` and ``_moe_C`` extensions) and
dlinfer's own Triton kernels (``context_flashattention``, ``fused_moe``), so that the real
``dlinfer/vendor/maca/maca_ops.py`` runs on the simulated MACA device (CPU) and on a CUDA GPU.

Every kernel is ONE ``torch.library`` operator (a ``CPU`` kernel, the same kernel for ``CUDA``, and a fake kernel for
shape inference), so that the simulator records it as one device op at capture and replays it later. The operators
that mcoplib registers keep their real namespaces and schemas (``_C``, ``_C_cache_ops``, ``_moe_C``); the others live
in :data:`NAMESPACE`. Nothing is registered when this file is imported: :func:`build_module` registers the operators
of the module it builds, each only if no operator of that name exists yet (a real mcoplib or vLLM owns those
namespaces where it is installed); :data:`REGISTERED` lists what this file registered.

Kernel rules. The decode-path kernels (``flash_attn_with_kvcache``, ``reshape_and_cache_flash``, the norms,
``silu_and_mul``, rotary embedding, ``topk_softmax``, ``moe_align_block_size``, ``moe_sum``, ``fused_experts``) never
read device tensor data on the host (no ``.item()``/``.tolist()``, no data-dependent shape): device lengths are
applied as masks over the whole capacity of the block table, so they can be captured in a real CUDA graph. The
prefill kernels (``flash_attn_varlen_func``, ``context_attention_fwd``) are never captured and read their lengths
on the host. Attention accumulates in float64 (``kernels._attend``) and rounds once; rows with nothing to attend to
are zeros; garbage (NaN included) in cache slots and block-table entries that no length addresses never reaches an
output. The norms, activations, rotary embedding and MoE compute in float32 and round once, where the real kernels
round some intermediates to the input dtype (differences at the input dtype's rounding level).

Facts, and where each comes from ("mcoplib" = MetaX-MACA/mcoplib at f722323, "flash-attention" =
Dao-AILab/flash-attention ``flash_attn/flash_attn_interface.py``, "dlinfer" = dlinfer's ``vendor/maca/*``):

=================================================  ===================================================================
stand-in (operator)                                what it does; sources
=================================================  ===================================================================
``flash_attn.flash_attn_varlen_func``              packed variable-length attention: q ``(total_q, N, D)``, k/v
(``vendor_graph_sim_maca::                         ``(total_k, KVH, D)``, ``cu_seqlens_q/k (B+1,)`` int32,
flash_attn_varlen_func``)                          ``max_seqlen_q/k`` host ints; returns ``(total_q, N, Dv)``.
                                                   Signature, defaults (``dropout_p=0.0, softmax_scale=None -> D**-0.5,
                                                   causal=False, window_size=(-1, -1), softcap=0.0, ...,
                                                   block_table=None``), GQA head grouping (q head h reads KV head
                                                   ``h // (N // KVH)``), causal mask aligned at the bottom right
                                                   (query i of Lq sees key j <= i + Lk - Lq), window bounds, an
                                                   all-masked row gives 0: flash-attention. Keywords used:
                                                   dlinfer's call site. Here a sequence longer than its
                                                   ``max_seqlen`` raises (the real kernel silently skips the excess).
                                                   Not supported (NotImplementedError): dropout, softcap, alibi,
                                                   ``block_table``, ``return_attn_probs``.
``flash_attn.flash_attn_with_kvcache``             attention of q ``(B, S, N, D)`` over a KV cache: paged
(``vendor_graph_sim_maca::                         ``(num_blocks, page_block_size, KVH, D)`` with ``block_table (B,
flash_attn_with_kvcache``)                         max_blocks)`` int32, or ``(B_cache, seqlen_cache, KVH, D)`` without;
                                                   ``cache_seqlens`` an int or ``(B,)`` int32 (None: the whole
                                                   cache); returns ``(B, S, N, Dv)`` (and the LSE ``(B, N, S)`` with
                                                   ``return_softmax_lse``): flash-attention. dlinfer calls it with
                                                   ``q=query.unsqueeze(1)``, the MACA caches, device ``cache_seqlens``
                                                   and ``causal=True, softcap=0`` (dlinfer's call site). Upstream's
                                                   "page_block_size must be a multiple of 256" is not enforced
                                                   (assumed relaxed in MetaX's flash_attn build, whose source is not
                                                   public; its signature is assumed to be upstream's). Not supported:
                                                   new ``k``/``v``, rotary, ``cache_batch_idx``, ``cache_leftpad``,
                                                   alibi, softcap.
``mcoplib.lmdeploy.lmdeploy_rotary_embedding``     in-place rotary embedding of query ``(..., N*head_size)`` and key
(``vendor_graph_sim_maca::                         ``(..., KVH*head_size)``: ``e = cos.size(-1) // 2``, per token
lmdeploy_rotary_embedding``)                       ``c, s = cos[pos, :e], sin[pos, :e]``; neox pairs ``(i, e + i)``,
                                                   GPT-J pairs ``(2i, 2i + 1)``; ``x' = x c - y s, y' = y c + x s``;
                                                   dims past ``2e`` of each head untouched; positions int64, indexing
                                                   cos/sin rows: mcoplib ``op/lmdeploy/ops/pos_encoding_kernels.cu``.
                                                   Name and schema text ``(Tensor positions, Tensor! query, Tensor!
                                                   key, int head_size, Tensor cos, Tensor sin, bool is_neox) -> ()``:
                                                   mcoplib ``op/lmdeploy/ops/pybind.cpp``, a pybind function without
                                                   ``py::arg`` (so positional-only here).
``mcoplib.op.rms_norm``                            ``out = x * rsqrt(mean(x^2) + eps) * weight`` (``rms_div``: ``x /
(``vendor_graph_sim_maca::rms_norm``)              rsqrt(...) * weight``); with ``residual``, ``x = input + residual``
                                                   is also written to ``after_res`` (required then): mcoplib
                                                   ``include/fused_rms_norm_dq.h``, ``op/fused_rms_norm_dq.cu``;
                                                   positional-only (``op/pybind.cpp``: ``m.def`` without ``py::arg``).
``torch.ops._C.fused_add_rms_norm``                ``residual <- input + residual`` (rounded to the input dtype),
                                                   ``input <- rms_norm(residual) * weight``; input, residual and
                                                   weight share a dtype: mcoplib ``op/vllm/torch_bindings.cpp``
                                                   (schema), ``op/vllm/layernorm_kernels.cu``.
``torch.ops._C.silu_and_mul``                      ``result = silu(x[..., :d]) * x[..., d:]``, ``d = x.size(-1) // 2``:
                                                   mcoplib ``op/vllm/torch_bindings.cpp``, ``op/vllm/
                                                   activation_kernels.cu`` (act first).
``torch.ops._C_cache_ops.reshape_and_cache_flash`` ``key/value (T, KVH, D)`` row t to slot ``slot_mapping[t]`` (``block
                                                   * block_size + offset``) of caches ``(num_blocks, block_size, KVH,
                                                   D)``; a negative slot writes nothing; ``slot_mapping.size(0)`` is
                                                   the token count (key may be longer); ``k_scale``/``v_scale`` are
                                                   Tensors, read only for fp8 caches: mcoplib ``op/vllm/
                                                   torch_bindings.cpp``, ``op/vllm/cache_kernels.cu``. dlinfer passes
                                                   ``"auto"`` and host ``torch.tensor(1.0)`` scales (its call site);
                                                   other ``kv_cache_dtype`` values are not supported here.
``torch.ops._moe_C.topk_softmax``                  float32 softmax over experts, the k largest (k = ``topk_weights
                                                   .size(-1)``) in descending order into ``topk_weights`` /
                                                   ``topk_indices``, ``token_expert_indices[i, j] = j * N + i``;
                                                   ``renormalize`` divides by their sum when it is > 0: mcoplib
                                                   ``op/vllm/moe/topk_softmax_kernels.cu``. mcoplib's schema ends in
                                                   a required ``bool renormalize``; dlinfer passes only the first four
                                                   (its call site, matching older vLLM), so it defaults to False here
                                                   (assumed). Ties: the lower expert index first (assumed).
``torch.ops._moe_C.moe_align_block_size``          per expert, the flat indices of its (token, k) entries padded to a
                                                   multiple of ``block_size`` with ``topk_ids.numel()``; the expert of
                                                   each block (-1 past the used blocks); the padded total: mcoplib
                                                   ``op/vllm/moe/torch_bindings.cpp``, ``moe_align_sum_kernels.cu``.
                                                   ``maybe_expert_map`` is required in mcoplib's schema, defaults to
                                                   None here (dlinfer's ``fused_moe.py`` passes six arguments).
                                                   Order inside an expert: ascending (assumed; the real kernel uses
                                                   atomics).
``torch.ops._moe_C.moe_sum``                       ``output = input.sum(1)`` for ``input (M, topk, H)``: mcoplib
                                                   ``moe_align_sum_kernels.cu``.
``dlinfer.vendor.maca.context_flashattention.``    prefix-cached prefill attention; ``o`` written in place, rows past
``context_attention_fwd``                          a sequence's query length untouched. Signature and defaults, the
(``vendor_graph_sim_maca::                         docstring's shapes, caches seen as ``(num_blocks, KVH, head_dim,
context_attention_fwd``)                           block_size)`` (dlinfer passes MACA's caches permuted (0, 2, 3, 1)),
                                                   ``block_size = v_cache.shape[3]``, query len = ``b_seq_len -
                                                   b_ctx_len``, query i sees the ``b_ctx_len`` cached positions (via
                                                   ``b_loc``) and new tokens j <= i, ``sm_scale = q.shape[-1] **
                                                   -0.5`` (no softmax_scale argument), fp8 caches scaled by
                                                   ``k_scale``/``v_scale``: dlinfer ``context_flashattention.py``.
                                                   Alibi (a separate kernel there) is not supported.
``dlinfer.vendor.maca.fused_moe.fused_experts``    ``sum_k topk_weights[t, k] * w2[e] @ silu_and_mul(w1[e] @ x[t])``,
(``vendor_graph_sim_maca::fused_experts``,         ``e = topk_ids[t, k]``, w1 ``(E, N, K)``, w2 ``(E, H, N // 2)``;
``fused_experts_`` for ``inplace=True``)           ids outside ``[0, E)`` contribute nothing. Signature, defaults,
                                                   the shape/dtype/contiguity asserts: dlinfer ``fused_moe.py``.
                                                   Quantised variants are not supported.
=================================================  ===================================================================

The KV cache layout of MACA in lmdeploy is ``(num_blocks, block_size, num_kv_heads, head_dim)`` (as the brief and
``kernels.py`` state). Modules served (:data:`NAMES`) are exactly what ``maca_ops.py`` imports, directly or through
its package.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.library import Library

from .boot import STANDIN_LABEL

NAMESPACE = "vendor_graph_sim_maca"
CONTEXT_ATTENTION = "dlinfer.vendor.maca.context_flashattention"
FUSED_MOE = "dlinfer.vendor.maca.fused_moe"
NAMES = ("flash_attn", "mcoplib", "mcoplib.lmdeploy", "mcoplib.op", "mcoplib._C", "mcoplib._moe_C",
         CONTEXT_ATTENTION, FUSED_MOE)
PACKAGES = ("flash_attn", "mcoplib")

REGISTERED: list[str] = []
_LIBS: dict[str, Library] = {}


def _k():
    """vendor_graph_sim.kernels (its shared attention math), imported when a kernel first runs, not at import."""
    from . import kernels

    return kernels


# --------------------------------------------------------------------------------------------------
# flash_attn


def _window(pos: Tensor, diag: Tensor, causal: bool, left: int, right: int) -> Tensor | None:
    """flash-attn's mask around the bottom-right diagonal ``diag`` (causal: right bound 0); None: no bound."""
    mask = None
    right = 0 if causal else right
    if right >= 0:
        mask = pos <= diag + right
    if left >= 0:
        lower = pos >= diag - left
        mask = lower if mask is None else mask & lower
    return mask


def _cumulative(cu: Tensor, rows: int, longest: int, what: str) -> list[int]:
    """Host read of a prefill's cumulative lengths, checked against the packed rows and the host maximum."""
    ends = [int(x) for x in cu.reshape(-1).tolist()]
    lengths = [b - a for a, b in zip(ends[:-1], ends[1:], strict=True)]
    if len(ends) < 1 or ends[0] < 0 or ends[-1] > rows or any(n < 0 for n in lengths):
        raise ValueError(f"{what} must be non-decreasing cumulative lengths within the {rows} packed rows, got {ends}")
    if any(n > longest for n in lengths):
        raise ValueError(f"{what}: a sequence is longer than its max_seqlen {longest} ({ends})")
    return ends


def _fa_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
               window_left, window_right):
    qe = _cumulative(cu_seqlens_q, q.shape[0], max_seqlen_q, "cu_seqlens_q")
    ke = _cumulative(cu_seqlens_k, k.shape[0], max_seqlen_k, "cu_seqlens_k")
    if len(qe) != len(ke):
        raise ValueError(f"cu_seqlens_q has {len(qe) - 1} sequences and cu_seqlens_k {len(ke) - 1}")
    n = q.shape[1]
    out = q.new_zeros((q.shape[0], n, v.shape[-1]))
    lse = torch.full((n, q.shape[0]), float("-inf"), dtype=torch.float32, device=q.device)
    attend = _k()._attend
    for b in range(len(qe) - 1):
        lq, lk = qe[b + 1] - qe[b], ke[b + 1] - ke[b]
        if lq == 0 or lk == 0:
            continue
        pos = torch.arange(lk, device=q.device).view(1, 1, lk)
        diag = torch.arange(lq, device=q.device).view(1, lq, 1) + (lk - lq)
        allowed = _window(pos, diag, causal, window_left, window_right)
        if allowed is None:
            allowed = torch.ones((1, lq, lk), dtype=torch.bool, device=q.device)
        o, s = attend(q[qe[b]:qe[b + 1]].unsqueeze(0), k[ke[b]:ke[b + 1]].unsqueeze(0),
                      v[ke[b]:ke[b + 1]].unsqueeze(0), allowed.expand(1, lq, lk), softmax_scale)
        out[qe[b]:qe[b + 1]] = o[0]
        lse[:, qe[b]:qe[b + 1]] = s[0]
    return out, lse


def _fa_varlen_fake(q, k, v, *args):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _fa_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, softmax_scale, causal, window_left, window_right):
    K = _k()
    b, s = q.shape[:2]
    if block_table is not None:  # the whole table: the lengths are on the device
        k = K.gather_paged(k_cache, block_table, "bshd")
        v = K.gather_paged(v_cache, block_table, "bshd")
    else:
        if k_cache.shape[0] < b:
            raise ValueError(f"a cache of {k_cache.shape[0]} sequences for a batch of {b}")
        k, v = k_cache[:b], v_cache[:b]
    capacity = k.shape[1]
    pos = torch.arange(capacity, device=q.device).view(1, 1, capacity)
    if cache_seqlens is None:
        lens = torch.full((b, 1, 1), capacity, dtype=torch.int64, device=q.device)
    else:
        lens = cache_seqlens.reshape(b, 1, 1).to(device=q.device, dtype=torch.int64)
    allowed = pos < lens
    band = _window(pos, torch.arange(s, device=q.device).view(1, s, 1) + lens - s, causal, window_left, window_right)
    if band is not None:
        allowed = allowed & band
    return K._attend(q, k, v, allowed.expand(b, s, capacity), softmax_scale)


def _fa_kvcache_fake(q, k_cache, v_cache, *args):
    b, s, n = q.shape[:3]
    return q.new_empty((b, s, n, v_cache.shape[-1])), q.new_empty((b, n, s), dtype=torch.float32)


def _unsupported(what: str, **given: Any) -> None:
    bad = [name for name, value in given.items() if value]
    if bad:
        raise NotImplementedError(f"vendor_graph stand-in {what}: {', '.join(bad)} not supported")


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """flash_attn's varlen attention (stand-in): q ``(total_q, N, D)``, k/v ``(total_k, KVH, D)``; returns
    ``(total_q, N, Dv)``. ``deterministic`` is accepted (the forward pass is deterministic anyway)."""
    _unsupported("flash_attn_varlen_func", dropout_p=dropout_p != 0, softcap=softcap != 0,
                 alibi_slopes=alibi_slopes is not None, return_attn_probs=return_attn_probs,
                 block_table=block_table is not None)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    out, _ = torch.ops.vendor_graph_sim_maca.flash_attn_varlen_func(
        q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale, bool(causal),
        int(window_size[0]), int(window_size[1]))
    return out


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """flash_attn's KV-cache attention (stand-in): q ``(B, S, N, D)``; returns ``(B, S, N, Dv)`` (and the LSE
    ``(B, N, S)`` float32 with ``return_softmax_lse``). ``num_splits`` and ``rotary_interleaved`` change nothing."""
    _unsupported("flash_attn_with_kvcache", k=k is not None, v=v is not None, rotary_cos=rotary_cos is not None,
                 rotary_sin=rotary_sin is not None, cache_batch_idx=cache_batch_idx is not None,
                 cache_leftpad=cache_leftpad is not None, alibi_slopes=alibi_slopes is not None, softcap=softcap != 0)
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise AssertionError("k_cache and v_cache must have contiguous last dimension")
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=k_cache.device)
    out, lse = torch.ops.vendor_graph_sim_maca.flash_attn_with_kvcache(
        q, k_cache, v_cache, cache_seqlens, block_table, scale, bool(causal), int(window_size[0]),
        int(window_size[1]))
    return (out, lse) if return_softmax_lse else out


# --------------------------------------------------------------------------------------------------
# mcoplib.lmdeploy / mcoplib.op (pybind functions: positional only)


def _rotary(positions, query, key, head_size, cos, sin, is_neox):
    e = cos.shape[-1] // 2
    pos = positions.reshape(-1).to(torch.int64)
    c = cos.index_select(0, pos)[:, :e].float()
    s = sin.index_select(0, pos)[:, :e].float()
    for t in (query, key):
        if t.numel() // t.shape[-1] != pos.numel():
            raise ValueError(f"{pos.numel()} positions for a tensor of {t.numel() // t.shape[-1]} tokens")
        heads = t.unflatten(-1, (-1, head_size))  # a view: written in place
        cc, ss = c.reshape(*t.shape[:-1], 1, e), s.reshape(*t.shape[:-1], 1, e)
        if is_neox:
            xs, ys = heads[..., :e], heads[..., e:2 * e]
        else:
            xs, ys = heads[..., 0:2 * e:2], heads[..., 1:2 * e:2]
        x, y = xs.float(), ys.float()
        nx, ny = x * cc - y * ss, y * cc + x * ss
        xs.copy_(nx.to(t.dtype))
        ys.copy_(ny.to(t.dtype))


def _nothing(*args, **kwargs) -> None:
    return None


def lmdeploy_rotary_embedding(positions, query, key, head_size, cos, sin, is_neox, /):
    """mcoplib.lmdeploy's rotary embedding (stand-in), in place on query and key."""
    torch.ops.vendor_graph_sim_maca.lmdeploy_rotary_embedding(positions, query, key, int(head_size), cos, sin,
                                                              bool(is_neox))


def _mcop_rms_norm(out, input, weight, var_epsilon, after_res, residual, rms_div):
    x = input.float()
    if residual is not None:
        if after_res is None:
            raise RuntimeError("mcoplib rms_norm: a residual needs after_res (the kernel writes input + residual)")
        x = x + residual.float()
        after_res.copy_(x.to(after_res.dtype))
    rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + var_epsilon)
    y = x / rstd if rms_div else x * rstd
    out.copy_((y * weight.float()).to(out.dtype))


def rms_norm(out, input, weight, var_epsilon, after_res, residual, rms_div, /):
    """mcoplib.op's RMS norm (stand-in): writes ``out``."""
    torch.ops.vendor_graph_sim_maca.rms_norm(out, input, weight, float(var_epsilon), after_res, residual,
                                             bool(rms_div))


# --------------------------------------------------------------------------------------------------
# mcoplib._C (namespaces _C and _C_cache_ops) and mcoplib._moe_C (namespace _moe_C)


def _fused_add_rms_norm(input, residual, weight, epsilon):
    if not input.dtype == residual.dtype == weight.dtype:
        raise RuntimeError(f"fused_add_rms_norm: input {input.dtype}, residual {residual.dtype} and weight "
                           f"{weight.dtype} must share a dtype")
    z = (input.float() + residual.float()).to(residual.dtype)
    residual.copy_(z)
    x = z.float()
    rstd = torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + epsilon)
    input.copy_((x * rstd * weight.float()).to(input.dtype))


def _silu_and_mul(result, input):
    d = input.shape[-1] // 2
    if tuple(result.shape) != (*input.shape[:-1], d):
        raise RuntimeError(f"silu_and_mul: result {tuple(result.shape)} for input {tuple(input.shape)}")
    x = input.float()
    result.copy_((torch.nn.functional.silu(x[..., :d]) * x[..., d:]).to(result.dtype))


def _reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    if kv_cache_dtype != "auto":
        raise NotImplementedError(f"vendor_graph stand-in reshape_and_cache_flash: kv_cache_dtype "
                                  f"{kv_cache_dtype!r} (only 'auto')")
    tokens = slot_mapping.shape[0]  # key may be longer (padding): mcoplib's cache_kernels.cu
    index = slot_mapping.reshape(-1).to(torch.int64)
    write = _k()._masked_slot_write
    for src, cache in ((key, key_cache), (value, value_cache)):
        if src.dtype != cache.dtype:
            raise RuntimeError(f"reshape_and_cache_flash: 'auto' caches hold the input dtype, got {src.dtype} "
                               f"into {cache.dtype}")
        nb, bs, h, d = cache.shape
        rows = src[:tokens].reshape(tokens, h, d)
        try:
            flat = cache.view(nb * bs, h, d)
        except RuntimeError:  # a strided cache: write a copy back
            flat = cache.reshape(nb * bs, h, d).clone()
            write(flat, rows, index)
            cache.copy_(flat.view(nb, bs, h, d))
            continue
        write(flat, rows, index)


def _topk_softmax(topk_weights, topk_indices, token_expert_indices, gating_output, renormalize=False):
    n, k = topk_weights.shape[0], topk_weights.shape[-1]
    probs = torch.softmax(gating_output.float(), dim=-1)
    values, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # ties: lower expert first
    values, order = values[:, :k], order[:, :k]
    if renormalize:
        total = values.sum(dim=-1, keepdim=True)
        values = values / torch.where(total > 0, total, 1.0)
    topk_weights.copy_(values)
    topk_indices.copy_(order.to(topk_indices.dtype))
    rows = torch.arange(n, device=probs.device).view(n, 1)
    slots = torch.arange(k, device=probs.device).view(1, k)
    token_expert_indices.copy_((slots * n + rows).to(token_expert_indices.dtype))


def _moe_align_block_size(topk_ids, num_experts, block_size, sorted_token_ids, experts_ids, num_tokens_post_pad,
                          maybe_expert_map=None):
    flat = topk_ids.reshape(-1).to(torch.int64)
    numel, dev = flat.numel(), flat.device
    if maybe_expert_map is not None:  # global -> local expert ids, -1: not on this rank
        size = maybe_expert_map.numel()
        mapped = maybe_expert_map.reshape(-1).to(torch.int64).index_select(0, flat.clamp(0, max(size - 1, 0)))
        flat = torch.where((flat >= 0) & (flat < size), mapped, -1)
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)  # num_experts: skipped
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=dev).scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = padded.cumsum(0)
    starts = torch.cat((ends - padded, ends.new_zeros(1)))
    raw_starts = torch.cat((counts.cumsum(0) - counts, counts.sum().view(1)))
    order = torch.argsort(key, stable=True)
    sorted_key = key.index_select(0, order)
    dest = starts.index_select(0, sorted_key) + torch.arange(numel, device=dev) - raw_starts.index_select(0, sorted_key)
    length = sorted_token_ids.numel()
    dest = torch.where((sorted_key < num_experts) & (dest < length), dest, length)  # length: a discarded slot
    buffer = torch.full((length + 1,), numel, dtype=sorted_token_ids.dtype, device=dev)
    buffer.scatter_(0, dest, order.to(sorted_token_ids.dtype))
    sorted_token_ids.copy_(buffer[:length].view(sorted_token_ids.shape))
    total = ends[-1:] if num_experts > 0 else ends.new_zeros(1)
    block_starts = torch.arange(experts_ids.numel(), device=dev, dtype=torch.int64) * block_size
    expert_of_block = torch.searchsorted(ends.contiguous(), block_starts, right=True)
    experts_ids.copy_(torch.where(block_starts < total, expert_of_block, -1).to(experts_ids.dtype)
                      .view(experts_ids.shape))
    num_tokens_post_pad.copy_(total.to(num_tokens_post_pad.dtype).view(num_tokens_post_pad.shape))


def _moe_sum(input, output):
    output.copy_(input.float().sum(dim=1).to(output.dtype).view(output.shape))


# --------------------------------------------------------------------------------------------------
# dlinfer.vendor.maca.context_flashattention / fused_moe


def _is_fp8(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point and dtype.itemsize == 1


def _context_attention(q, k, v, o, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, b_ctx_len, max_input_len,
                       k_scale, v_scale):
    attend = _k()._attend
    starts = [int(x) for x in b_start_loc.reshape(-1).tolist()]
    seqs = [int(x) for x in b_seq_len.reshape(-1).tolist()]
    ctxs = [int(x) for x in b_ctx_len.reshape(-1).tolist()]
    block_size = v_cache.shape[3]
    scale = q.shape[-1] ** -0.5
    dev = q.device
    if len(starts) < len(seqs) or len(ctxs) != len(seqs):
        raise ValueError(f"context_attention_fwd: {len(seqs)} sequences (b_seq_len), {len(starts)} start offsets and "
                         f"{len(ctxs)} context lengths")
    # the kernel's batch is b_seq_len's length; lmdeploy's MACA backend passes the cumulative starts with the total
    # appended (batch + 1), whose last entry no program reads
    for b, (start, seq, ctx) in enumerate(zip(starts[:len(seqs)], seqs, ctxs, strict=True)):
        length = seq - ctx
        if length <= 0:
            continue
        if length > max_input_len:
            raise ValueError(f"context_attention_fwd: sequence {b} has {length} new tokens, max_input_len is "
                             f"{max_input_len} (the real kernel would skip the excess rows)")
        p = torch.arange(ctx, device=dev)
        blocks = b_loc[b].to(torch.int64).index_select(0, p // block_size)
        offsets = p % block_size
        kc = k_cache[blocks, :, :, offsets].to(torch.float64)  # (ctx, KVH, Dk)
        vc = v_cache[blocks, :, :, offsets].to(torch.float64)
        if _is_fp8(k_cache.dtype):
            kc = kc * k_scale
        if _is_fp8(v_cache.dtype):
            vc = vc * v_scale
        keys = torch.cat((kc, k[start:start + length].to(torch.float64)))
        values = torch.cat((vc, v[start:start + length].to(torch.float64)))
        pos = torch.arange(ctx + length, device=dev).view(1, 1, -1)
        row = torch.arange(length, device=dev).view(1, length, 1)
        allowed = (pos < ctx) | (pos - ctx <= row)
        out, _ = attend(q[start:start + length].unsqueeze(0), keys.unsqueeze(0), values.unsqueeze(0), allowed,
                        scale)
        o[start:start + length] = out[0].to(o.dtype)


def context_attention_fwd(q, k, v, o, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, b_ctx_len, max_input_len,
                          k_scale: float = 1.0, v_scale: float = 1.0, alibi_slopes=None):
    """dlinfer's MACA prefix-cached prefill attention (stand-in): writes ``o``; caches ``(num_blocks, KVH, head_dim,
    block_size)`` (views); scale ``q.shape[-1] ** -0.5``."""
    _unsupported("context_attention_fwd", alibi_slopes=alibi_slopes is not None)
    with torch.inference_mode():
        torch.ops.vendor_graph_sim_maca.context_attention_fwd(
            q, k, v, o, k_cache, v_cache, b_loc, b_start_loc, b_seq_len, b_ctx_len, int(max_input_len),
            float(k_scale), float(v_scale))


def _fused_experts(hidden_states, w1, w2, topk_weights, topk_ids):
    x = hidden_states.float()
    ids = topk_ids.to(torch.int64)
    weights = topk_weights.float()
    half = w1.shape[1] // 2
    out = torch.zeros((x.shape[0], w2.shape[1]), dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):  # every expert over every token (masked): no host read of the routing
        coef = torch.where(ids == e, weights, 0.0).sum(dim=-1, keepdim=True)
        h = x @ w1[e].float().t()
        act = torch.nn.functional.silu(h[:, :half]) * h[:, half:]
        out += torch.where(coef != 0, coef * (act @ w2[e].float().t()), 0.0)
    return out.to(hidden_states.dtype)


def _fused_experts_fake(hidden_states, w1, w2, topk_weights, topk_ids):
    return hidden_states.new_empty((hidden_states.shape[0], w2.shape[1]))


def _fused_experts_inplace(hidden_states, w1, w2, topk_weights, topk_ids):
    hidden_states.copy_(_fused_experts(hidden_states, w1, w2, topk_weights, topk_ids))


def fused_experts(hidden_states, w1, w2, topk_weights, topk_ids, inplace=False, use_fp8_w8a8=False,
                  use_int8_w8a16=False, w1_scale=None, w2_scale=None, a1_scale=None, a2_scale=None, block_shape=None):
    """dlinfer's MACA fused MoE (stand-in): ``(M, K)`` tokens through their top-k experts, weighted and summed."""
    _unsupported("fused_experts", use_fp8_w8a8=use_fp8_w8a8, use_int8_w8a16=use_int8_w8a16,
                 w1_scale=w1_scale is not None, w2_scale=w2_scale is not None, a1_scale=a1_scale is not None,
                 a2_scale=a2_scale is not None, block_shape=block_shape is not None)
    for ok, message in ((hidden_states.shape[1] == w1.shape[2], "Hidden size mismatch"),
                        (topk_weights.shape == topk_ids.shape, "topk shape mismatch"),
                        (hidden_states.is_contiguous(), "Hidden_states must be contiguous"),
                        (w1.is_contiguous(), "Expert weights1 must be contiguous"),
                        (w2.is_contiguous(), "Expert weights2 must be contiguous"),
                        (hidden_states.dtype in (torch.float32, torch.float16, torch.bfloat16),
                         f"hidden_states dtype {hidden_states.dtype}")):
        if not ok:
            raise AssertionError(message)
    if inplace:
        torch.ops.vendor_graph_sim_maca.fused_experts_(hidden_states, w1, w2, topk_weights, topk_ids)
        return hidden_states
    return torch.ops.vendor_graph_sim_maca.fused_experts(hidden_states, w1, w2, topk_weights, topk_ids)


# --------------------------------------------------------------------------------------------------
# registration (at build_module, never at import)

_Op = tuple[str, str, Callable, Callable]  # namespace, schema, kernel, fake

OPERATORS: dict[str, tuple[_Op, ...]] = {
    "flash_attn": (
        (NAMESPACE, "flash_attn_varlen_func(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
         "int max_seqlen_q, int max_seqlen_k, float softmax_scale, bool causal, int window_left, int window_right) "
         "-> (Tensor, Tensor)", _fa_varlen, _fa_varlen_fake),
        (NAMESPACE, "flash_attn_with_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? cache_seqlens, "
         "Tensor? block_table, float softmax_scale, bool causal, int window_left, int window_right) "
         "-> (Tensor, Tensor)", _fa_kvcache, _fa_kvcache_fake),
    ),
    "mcoplib": (),
    "mcoplib.lmdeploy": (
        (NAMESPACE, "lmdeploy_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
         "Tensor cos, Tensor sin, bool is_neox) -> ()", _rotary, _nothing),
    ),
    "mcoplib.op": (
        (NAMESPACE, "rms_norm(Tensor(a!) out, Tensor input, Tensor weight, float var_epsilon, Tensor(b!)? after_res, "
         "Tensor? residual, bool rms_div) -> ()", _mcop_rms_norm, _nothing),
    ),
    "mcoplib._C": (
        ("_C", "fused_add_rms_norm(Tensor! input, Tensor! residual, Tensor weight, float epsilon) -> ()",
         _fused_add_rms_norm, _nothing),
        ("_C", "silu_and_mul(Tensor! result, Tensor input) -> ()", _silu_and_mul, _nothing),
        ("_C_cache_ops", "reshape_and_cache_flash(Tensor key, Tensor value, Tensor! key_cache, Tensor! value_cache, "
         "Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()",
         _reshape_and_cache_flash, _nothing),
    ),
    "mcoplib._moe_C": (
        ("_moe_C", "topk_softmax(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
         "Tensor gating_output, bool renormalize=False) -> ()", _topk_softmax, _nothing),
        ("_moe_C", "moe_align_block_size(Tensor topk_ids, int num_experts, int block_size, Tensor! sorted_token_ids, "
         "Tensor! experts_ids, Tensor! num_tokens_post_pad, Tensor? maybe_expert_map=None) -> ()",
         _moe_align_block_size, _nothing),
        ("_moe_C", "moe_sum(Tensor input, Tensor! output) -> ()", _moe_sum, _nothing),
    ),
    CONTEXT_ATTENTION: (
        (NAMESPACE, "context_attention_fwd(Tensor q, Tensor k, Tensor v, Tensor(a!) o, Tensor k_cache, "
         "Tensor v_cache, Tensor b_loc, Tensor b_start_loc, Tensor b_seq_len, Tensor b_ctx_len, int max_input_len, "
         "float k_scale, float v_scale) -> ()", _context_attention, _nothing),
    ),
    FUSED_MOE: (
        (NAMESPACE, "fused_experts(Tensor hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
         "Tensor topk_ids) -> Tensor", _fused_experts, _fused_experts_fake),
        (NAMESPACE, "fused_experts_(Tensor(a!) hidden_states, Tensor w1, Tensor w2, Tensor topk_weights, "
         "Tensor topk_ids) -> ()", _fused_experts_inplace, _nothing),
    ),
}

# qualified name -> the kernel that runs on CPU and CUDA (tests run them directly)
KERNELS: dict[str, Callable] = {f"{ns}::{schema.split('(', 1)[0]}": kernel
                                for ops in OPERATORS.values() for ns, schema, kernel, _ in ops}


def _exists(namespace: str, name: str) -> bool:
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return "default" in packet.overloads()


def _register(namespace: str, schema: str, kernel: Callable, fake: Callable) -> None:
    """As ``kernels._register``: define ``schema`` in ``namespace`` with ``kernel`` for CPU and CUDA and ``fake``,
    unless an operator of that name exists (a real mcoplib/vLLM, or an earlier build)."""
    name = schema.split("(", 1)[0]
    if _exists(namespace, name):
        return
    if namespace not in _LIBS:
        _LIBS[namespace] = Library(namespace, "FRAGMENT")
    lib = _LIBS[namespace]
    lib.define(schema)
    lib.impl(name, kernel, "CPU")
    lib.impl(name, kernel, "CUDA")  # the same composite math on a GPU (real-graph conformance on the H200)
    torch.library.register_fake(f"{namespace}::{name}", fake, lib=lib)
    REGISTERED.append(f"{namespace}::{name}")


def register(name: str) -> list[str]:
    """Register the operators the stand-in ``name`` provides (idempotent). Returns :data:`REGISTERED`."""
    for op in OPERATORS[name]:
        _register(*op)
    return REGISTERED


# --------------------------------------------------------------------------------------------------
# the stand-in modules

_REASONS = {
    "flash_attn": "flash-attn has no CPU build (and none on the H200 image): dlinfer's MACA attention calls it",
    "mcoplib": "MetaX's mcoplib is built for MACA GPUs only: dlinfer's MACA ops call its kernels",
    "mcoplib.lmdeploy": "MetaX's mcoplib is built for MACA GPUs only: lmdeploy_rotary_embedding",
    "mcoplib.op": "MetaX's mcoplib is built for MACA GPUs only: rms_norm",
    "mcoplib._C": "MetaX's mcoplib is built for MACA GPUs only: torch.ops._C / _C_cache_ops kernels",
    "mcoplib._moe_C": "MetaX's mcoplib is built for MACA GPUs only: torch.ops._moe_C kernels",
    CONTEXT_ATTENTION: "dlinfer's MACA Triton prefill attention; triton has no CPU build",
    FUSED_MOE: "dlinfer's MACA Triton fused MoE; triton has no CPU build",
}

_FUNCTIONS: dict[str, tuple[Callable, ...]] = {
    "flash_attn": (flash_attn_varlen_func, flash_attn_with_kvcache),
    "mcoplib.lmdeploy": (lmdeploy_rotary_embedding,),
    "mcoplib.op": (rms_norm,),
    CONTEXT_ATTENTION: (context_attention_fwd,),
    FUSED_MOE: (fused_experts,),
}


def build_module(name: str) -> types.ModuleType:
    """A fresh labelled stand-in module for ``name`` (one of :data:`NAMES`); registers the operators it provides."""
    if name not in NAMES:
        raise KeyError(f"no MACA stand-in for {name!r}; these are served: {', '.join(NAMES)}")
    reason = _REASONS[name]
    register(name)
    module = types.ModuleType(name, f"vendor_graph test stand-in for {name}: {reason}")
    setattr(module, STANDIN_LABEL, reason)
    for fn in _FUNCTIONS.get(name, ()):
        setattr(module, fn.__name__, fn)
    if name in PACKAGES:
        module.__path__ = []  # type: ignore[attr-defined]  # a package: its submodules are stand-ins too
    return module


__all__ = [
    "KERNELS",
    "NAMES",
    "NAMESPACE",
    "OPERATORS",
    "REGISTERED",
    "build_module",
    "context_attention_fwd",
    "flash_attn_varlen_func",
    "flash_attn_with_kvcache",
    "fused_experts",
    "lmdeploy_rotary_embedding",
    "register",
    "rms_norm",
]
