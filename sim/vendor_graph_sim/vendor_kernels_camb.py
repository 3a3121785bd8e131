"""A labelled STAND-IN for Cambricon's ``torch_mlu_ops`` (``tmo``), the kernel package dlinfer's camb vendor
module imports (``import torch_mlu_ops as tmo`` in ``dlinfer/vendor/camb/camb_ops.py``). No CPU build of it
exists; :func:`build_module` returns a module named ``torch_mlu_ops`` whose functions carry the real argument
names, order and defaults (so dlinfer's positional and keyword calls bind as on the real package and a wrong
keyword raises ``TypeError``) and call the emulated kernels registered here as ``torch.library`` operators in
namespace ``vendor_graph_sim_camb``: a CPU kernel, the same kernel for ``CUDA`` (real-graph conformance) and a
fake (meta) kernel each. The simulator records each operator as ONE device op at graph capture and replays it.

Kernel rules. The decode-path kernels (activation, RMS norm, rotary, cache write, decode attention, MoE routing
and expert GEMMs) never read device tensor data on the host: lengths, offsets and expert counts held in
tensors are applied with masks, ``searchsorted`` and gathers over capacities known from shapes or host ints.
Host ints passed as arguments (``max_context_len``, ``max_seq_len_q``...) are read on the host, so a graph
freezes them. Prefill attention reads nothing on the host either. Attention accumulates in float64
(:func:`vendor_graph_sim.kernels._attend`), everything else in float32, and rounds once to the output dtype;
rows with nothing to attend to (padding rows of length 0) give zeros; NaN or garbage in cache slots and table
columns past a row's length never reaches the output.

Quantised paths (int8/fp8 caches, smooth quant, the quant arguments of the functions below), ALiBi, attention
bias, sinks and expert-parallel offsets raise ``NotImplementedError`` naming what is not simulated.

Sources: "tmo" is torch_mlu_ops 1.12.1+torch2.11.0 as published in ``miznchimaki/domesticated_torch_mlu_ops``
(``_ops.py``: Python signatures, docstrings with the math; ``abstract.py``: the internal op schemas and output
shapes); "dlinfer" is ``dlinfer/vendor/camb/camb_ops.py`` (the call sites) and
``dlinfer/framework/lmdeploy_ext/cudagraph/camb_cudagraph.py``; "lmdeploy" is
``lmdeploy/pytorch/backends/dlinfer/camb/op_backend.py``. Every fact this module relies on is in this table.

====================================  ==================================================================================
tmo function: what the stand-in       facts and where they come from
does
====================================  ==================================================================================
``active(input, act_mode,``           tmo ``_ops.py``: signature; ``is_gated``: ``act(x[..., :C//2]) * x[..., C//2:]``,
``is_gated, active_coef=1.0,``        output ``(..., C // (1 + is_gated))`` in the input dtype; modes silu, gelu,
``high_precision=False,``             swish (``x * sigmoid(active_coef * x)``), quick_gelu; ``gelu_approximate``
``gelu_approximate='none')``          'none' / 'tanh'. quick_gelu as ``x * sigmoid(1.702 x)``: assumed (the usual
-> op ``active``                      definition). dlinfer calls ``active(x, act_mode="silu", is_gated=True)``.
                                      ``high_precision`` is a precision hint (the stand-in is float32 throughout).
``fused_rms_norm(x, residual,``       tmo ``_ops.py``: signature (rms norm shares ``fused_layer_norm``'s docstring):
``gamma, beta, bias, eps,``           ``x1 = x (+ bias) (+ residual)``, ``out = rmsnorm(x1) * gamma + beta``; returns
``store_output_before_norm,``         ``out``, then ``x1`` if ``store_output_before_norm``, then the quant scale, then
``quant_scale=None, out=None,``       the pre-quant output if ``store_output_after_norm``. dlinfer passes
``dynamic_quant=False,``              ``(x, None|residual, weight, None, None, eps, False|True, None[, None])``.
``store_output_after_norm=False,``    Assumed: ``x1`` rounded to ``x``'s dtype before it is normalised (the order the
``quant_type=torch.int8,``            Hugging Face reference uses); the norm in float32. Quantised output
``scale_type=torch.float,``           (``quant_scale``, ``dynamic_quant``, ``mx_quant``) and a 2-d gamma are refused.
``mx_quant=False)``
-> op ``fused_rms_norm``
``apply_rotary(input, sin_cache,``    tmo ``_ops.py``: signature; in place into ``input`` when ``output`` is None (the
``cos_cache, position_ids,``          function returns ``output``, else ``input``); ``rotary_dim = sin_cache.shape[-1]``
``cu_seqlens, interleaved,``          (only those leading channels rotate; assumed: the rest are copied unchanged);
``discrete, dynamic_ntk,``            fold (``interleaved=False``): ``rot = cat(-x2, x1)`` of the two halves, cross:
``max_seqlen, output=None,``          ``rot[0::2] = -x[1::2], rot[1::2] = x[0::2]``; ``y = rot * sin[pos] +``
``is_inverse=False)``                 ``x * cos[pos]``; ``is_inverse`` negates sin. Input ``(batch, seq, heads, dim)``
-> op ``apply_rotary``                (pad mode) or ``(total, heads, dim)`` with ``cu_seqlens (batch + 1)`` (pack
                                      mode; without ``cu_seqlens`` every sequence is ``max_seqlen`` long);
                                      ``discrete``: ``position_ids`` per token, else per-batch start positions (None:
                                      0) plus the offset in the sequence; ``dynamic_ntk``: caches
                                      ``(batch, rotary_seq, rotary_dim)``. dlinfer passes ``(q.unsqueeze(0), sin, cos,
                                      None, None, False, False, False, total_seq_len)`` with ``sin``/``cos``
                                      ``(total_seq_len, head_dim)`` already gathered per token: token ``t`` uses row
                                      ``t``. Assumed: pack-mode tokens past ``cu_seqlens[-1]`` are left unchanged.
``reshape_paged_cache(k, v,``         tmo ``_ops.py``: signature and math: for ``slot_mapping[i] >= 0``,
``k_cache, v_cache,``                 ``k_cache[slot // block_size, :, slot % block_size, :] = k[i]`` (same for v); a
``slot_mapping, direction=False)``    negative slot writes nothing (graph padding rows carry -1); ``direction=True``
-> ops ``reshape_paged_cache``,       gathers the cache rows into ``k``/``v`` instead; caches
``reshape_from_paged_cache``          ``(block_num, head_num_kv, block_size, head_size)`` (also lmdeploy's Camb
                                      ``get_k_block_shape``: ``(num_heads, block_size, head_size)`` per block);
                                      ``slot_mapping`` int32 ``(num_token,)``. A slot past the cache raises
                                      (torch's own index check). Repeated non-negative slots: unspecified (as on
                                      the device).
``flash_attention(q, k, v, out,``     tmo ``_ops.py``: signature and defaults; ``cu_seq_lens_q``/``_kv`` are the
``cu_seq_lens_q, cu_seq_lens_kv,``    ``(batch + 1)`` cumulative lengths of packed ``(total, heads, dim)`` q / k / v;
``alibi_slope, attn_bias,``           4-d ``(batch, seq, heads, dim)`` is pad mode; ``max_seq_len_q``/``_kv`` are
``max_seq_len_q, max_seq_len_kv,``    the maxima (``-1`` allowed in pad mode); ``block_tables`` given: k / v are
``softmax_scale, is_causal,``         paged caches ``(total_blocks, head_num_kv, block_size, dim)`` read through
``window_size_left=-1,``              ``block_tables (batch, max_block_num)``; ``out`` None: a new tensor is returned
``window_size_right=-1,``             (``out`` cannot alias ``q``: dlinfer's comment "flash_attention doesn't support
``compute_dtype=torch.float,``        in-place"); ``window_size_left/right`` -1 unlimited, else at most ``w + 1``
``return_lse=False,``                 positions on that side; ``return_lse`` gives ``(out, lse)``, lse ``(heads,
``block_tables=None, ...``            total_q)`` packed, ``(batch, heads, seq_q)`` padded. dlinfer's prefill passes
``sink=None)``                        ``cu_seq_lens_kv = cu_seq_lens_q`` (causal; non-causal for the vision trick)
-> op ``flash_attention``             and its paged prefill ``k = key_cache, block_tables=block_table`` with
                                      ``cu_seq_lens_kv``. Assumed (the flash-attention convention): when the KV is
                                      longer than the query, causality is aligned to the end, query ``j`` of a
                                      sequence sees KV positions ``<= kv_len - q_len + j``. Here ``max_seq_len_q/_kv
                                      <= 0`` in pack mode means "bounded by the token count"; a positive value smaller
                                      than a length truncates that sequence (tmo: not guaranteed). Quant scales,
                                      ALiBi, ``attn_bias``, block-sparse arguments and ``sink`` are refused;
                                      ``compute_dtype`` / ``out_dtype`` only matter for quantised inputs.
``single_query_cached_kv_attn(q,``    tmo ``_ops.py``: signature and math; q ``(batch, seq_q, heads, dim)``, caches
``k_cache, v_cache, out,``            ``(total_blocks, head_num_kv, block_size, dim)`` (v_cache None: the value is
``block_tables, context_lens,``       ``k_cache[..., :head_size_v]``), ``block_tables (batch, max_block_num)`` int32,
``k_cache_quant_scale,``              ``context_lens (batch,)`` int32 on the device (lengths including this step's
``v_cache_quant_scale,``              token); ``out`` written in place and returned (``(out, lse)`` with
``alibi_slopes,``                     ``return_lse``, lse ``(batch, heads, seq_q)``). ``max_context_len``: tmo "If
``max_context_len,``                  max_context_len <= 0, indicating an uncertain maximum value of context_lens. If 0
``windows_size_left,``                < max_context_len < max(context_lens), the correctness is not guaranteed."
``windows_size_right,``               (quoted again in dlinfer's ``camb_cudagraph.py``, which sets -1 for graphs).
``softmax_scale, return_lse=``        The stand-in takes each row's length from ``context_lens`` on the device when
``False, kv_cache_quant_bit_size``    ``<= 0``, and when ``> 0`` attends to at most the first ``max_context_len``
``=-1, ..., sink=None)``              positions (the undefined case made deterministic, so that a value frozen at
-> op ``single_query_cached_``        capture that is smaller than a later length gives a visibly wrong answer).
``kv_attn``                           ``windows_size_left`` >= 0: the last ``w + 1`` positions only. dlinfer passes
                                      ``(q.view(b, 1, h, d), k_cache, v_cache, out.view(b, 1, h, d), block_table,
                                      kv_seq_len, None, None, None, max_kv_seq_len, -1, -1, scale)``. Only
                                      ``seq_q == 1`` is simulated (the mask / ``cu_seq_q`` multi-token forms are not
                                      documented enough); quantised caches, ALiBi, ``mask`` and ``sink`` are refused.
``moe_softmax_topk(input, topk,``     tmo ``_ops.py``: signature and math: ``softmax(input.float())`` (times ``mask``),
``normalize=False,``                  optional ``score_bias`` for the choice only, grouped selection when
``num_expert_group=-1,``              ``num_expert_group > 1`` (groups ranked by their max, ``topk_group`` kept, the
``topk_group=0, mask=None,``          rest zeroed), ``topk``; ``normalize`` divides by the top-k sum
``normed_by="topk_logit",``           (``"topk_logit"``) or the softmax sum (``"softmax_logit"``); times
``route_scale=1.0,``                  ``route_scale``; returns ``(reduce_weight float32, expert_id int32)`` of shape
``reduce_weight=None,``               ``(..., topk)``, written into the given tensors if any. dlinfer calls
``expert_id=None,``                   ``moe_softmax_topk(router_logits.float(), topk)``. Ties: ``torch.topk``'s order
``score_bias=None)``                  (the device's order for equal scores is not documented).
-> op ``moe_softmax_topk``
``moe_gen_idx(expert_id,``            tmo ``_ops.py`` / ``abstract.py``: returns ``(expand_idx, combine_idx,
``expert_num,``                       token_count, cusum_token_count[, token2expert_idx])``, int32, shapes ``(T *
``return_token2expert_idx=``          topk,)``, ``(T * topk,)``, ``(expert_num,)``, ``(expert_num + 1,)``. Inferred from
``False)``                            how ``moe_expand_input`` / ``moe_combine_result`` use them: ``expand_idx[r]`` is
-> op ``moe_gen_idx``                 the TOKEN of the r-th (token, k) pair in expert order, ``combine_idx[t * topk +
                                      k]`` the row of pair (t, k) in that order, ``token_count`` the pairs per expert,
                                      ``cusum_token_count`` its exclusive prefix sum from 0. Assumed: pairs of one
                                      expert keep their (t, k) order (a stable sort); token2expert_idx is that sorted
                                      order of flat pair indices ("the sorted indices not divided by topk").
``moe_expand_input(input,``           tmo ``_ops.py``: ``input[gather_idx]``, or with ``cusum_token_count`` the slice
``gather_idx,``                       ``gather_idx[cusum[start_expert_id]:cusum[start_expert_id + expert_size]]``;
``cusum_token_count=None,``           output ``(gather_idx.size(0), hidden)`` (``abstract.py``). Assumed: rows past
``start_expert_id=0,``                the slice are zeros (the device leaves them unspecified).
``expert_size=0, output=None)``
-> op ``moe_expand_input``
``group_gemm(a, b, group_list,``      tmo ``_ops.py``: signature; ``a = a[expand_idx]`` if given, rows split by
``expand_idx, c, alpha, beta,``       ``group_list`` (counts per expert, in expert order), ``d_i = a_i @ b[i]^T *
``max_in_group_list, bias=None,``     alpha[i] + beta[i] * c_i + bias[i]`` (``trans_b=True``: b ``(experts, n,
``d=None, trans_a=False,``            k)``); output ``(total_m, n)`` in ``output_dtype`` or a's dtype.
``trans_b=True, tile_config=``        ``max_in_group_list`` and ``tile_config`` are performance hints. Assumed: rows
``None, idx_offset=None,``            past ``group_list.sum()`` are zeros. The 2-d ``b`` (k-split) form,
``output_dtype=None)``                ``idx_offset`` and ``c`` without ``beta`` are refused.
-> op ``group_gemm``
``moe_active(input, act_mode,``       tmo ``_ops.py``: signature and math: optional per-expert ``bias`` over the rows
``is_gated, output=None,``            ``cusum_token_count`` assigns (from ``start_expert_id``), ``swiglu_limit`` > 0
``bias=None,``                        clamps (gate: max, up: both sides), then the gated activation; returns
``cusum_token_count=None,``           ``output``. dlinfer passes ``output=up_proj`` (the input itself, width C) and
``start_expert_id=0,``                keeps ``[:, :C // 2]``: the result goes to the first ``C // 2`` columns of each
``expert_size=0,``                    output row (the stand-in writes ``output[..., :C // 2]``; inferred from that
``high_precision=False,``             call site). ``weight`` (shape undocumented) is refused.
``gelu_approximate='none',``
``swiglu_limit=0, weight=None)``
-> op ``moe_active``
``moe_combine_result(input,``         tmo ``_ops.py``: signature and math: ``out[t] = sum_k reduce_weight[t, k] *
``reduce_weight, gather_ids,``        input[gather_ids[t * topk + k]] (+ residual[t])``; with ``cusum_token_count``,
``residual, cusum_token_count,``      pairs whose ``gather_ids`` fall outside ``[cusum[start_expert_id],
``start_expert_id, expert_size,``     cusum[start_expert_id + expert_size])`` weigh 0. The docstring offsets the row
``bias=None, output=None)``           by ``cusum[start_expert_id + expert_size]``, which is negative for every row on
-> op ``moe_combine_result``          one card; assumed: rows are offset by ``cusum[start_expert_id]`` (0 for dlinfer's
                                      ``start_expert_id=0``). ``bias``: tmo "Do not support yet, must be None".
``matmul(a, b, bias=None, c=None,``   tmo ``_ops.py``: signature and math: ``alpha * a @ b (b^T when trans_b) + beta
``act_mode='none', alpha=1.0,``       * c + bias``, then the activation (gelu, relu, silu, sigmoid, none;
``beta=0.0, fast_act=True,``          ``approximate`` picks tanh GELU, per ``batch_matmul``'s docstring); 2-d or 3-d;
``approximate=True, dtype=None,``     ``dtype`` the output dtype (default a's). dlinfer: ``matmul(x2d, weight,
``a_scale=None, b_scale=None,``       bias)`` with ``weight (out, in)``. ``a_scale``/``b_scale`` (int8/fp8) refused;
``trans_a=False, trans_b=True,``      ``tile_config``, ``fast_act`` are hints.
``tile_config=None, output=None)``
-> op ``matmul``
``matmul_allreduce(cncl_comm, a,``    dlinfer's call site only (tensor-parallel ``linear``); not in tmo 1.12's
``b, bias=None)``                     ``_ops.py``. Refused: collectives are not simulated here.
``per_token_smooth_quantize(x,``      dlinfer's call site only (``dynamic_quant``, w8a8); not in tmo 1.12. Refused:
``smooth)``                           quantisation is not simulated.
``smooth_quant_matmul(a, a_scale,``   dlinfer's call site only (``linear_w8a8``, positional); names assumed. Refused.
``b, b_scale, dtype, bias=None)``
====================================  ==================================================================================

``__version__``: neither dlinfer nor lmdeploy reads one; the stand-in has a label anyway.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.library import Library

from .boot import STANDIN_LABEL
from .kernels import _attend, _exists, _positions, gather_paged

NAMESPACE = "vendor_graph_sim_camb"
MODULE_NAME = "torch_mlu_ops"
STANDIN_REASON = ("torch_mlu_ops has no CPU build: vendor_graph_sim.vendor_kernels_camb emulates the kernels dlinfer's "
                  "camb ops call (torch.library ops in namespace vendor_graph_sim_camb)")
STANDIN_VERSION = "1.12.1+vendor_graph_sim.standin"

REGISTERED: list[str] = []
_LIBS: dict[str, Library] = {}
_ops = None  # torch.ops.vendor_graph_sim_camb, bound by register()


def _not_simulated(function: str, what: str) -> NotImplementedError:
    return NotImplementedError(f"torch_mlu_ops.{function}: {what} is not simulated by the vendor_graph stand-in "
                               "(vendor_graph_sim.vendor_kernels_camb)")


def _refuse_given(function: str, **given: object) -> None:
    """NotImplementedError for the first argument in ``given`` that is not None (or not False)."""
    for name, value in given.items():
        if value is not None and value is not False:
            raise _not_simulated(function, f"{name}={value!r}" if not isinstance(value, Tensor) else name)


# --------------------------------------------------------------------------------------------------
# activations


_ACT_MODES = {
    "active": ("silu", "gelu", "swish", "quick_gelu"),
    "moe_active": ("silu", "gelu"),
    "matmul": ("gelu", "relu", "silu", "sigmoid", "none"),
}


def _activate(x: Tensor, mode: str, coef: float = 1.0, gelu_tanh: bool = False) -> Tensor:
    if mode == "silu":
        return x * torch.sigmoid(x)
    if mode == "swish":
        return x * torch.sigmoid(coef * x)
    if mode == "gelu":
        return F.gelu(x, approximate="tanh" if gelu_tanh else "none")
    if mode == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    if mode == "relu":
        return torch.relu(x)
    if mode == "sigmoid":
        return torch.sigmoid(x)
    if mode == "none":
        return x
    raise ValueError(f"unknown act_mode {mode!r}")


def _check_mode(function: str, mode: str) -> None:
    if mode not in _ACT_MODES[function]:
        raise ValueError(f"torch_mlu_ops.{function}: act_mode must be one of {_ACT_MODES[function]}, got {mode!r}")


def _gate(x: Tensor, mode: str, is_gated: bool, coef: float, gelu_tanh: bool) -> Tensor:
    """float32 (gated) activation of ``x`` over its last dim."""
    xf = x.to(torch.float32)
    if not is_gated:
        return _activate(xf, mode, coef, gelu_tanh)
    half = x.shape[-1] // 2
    return _activate(xf[..., :half], mode, coef, gelu_tanh) * xf[..., half:2 * half]


def _k_active(input, act_mode, is_gated, active_coef, high_precision, gelu_approximate):
    return _gate(input, act_mode, is_gated, active_coef, gelu_approximate == "tanh").to(input.dtype)


def _f_active(input, act_mode, is_gated, active_coef, high_precision, gelu_approximate):
    return input.new_empty((*input.shape[:-1], input.shape[-1] // (2 if is_gated else 1)))


def _rows_of_experts(cusum: Tensor, start_expert_id: int, expert_size: int, rows: int) -> tuple[Tensor, Tensor]:
    """For local rows ``0..rows-1`` (the first at ``cusum[start_expert_id]``): each row's expert and whether it
    belongs to one of ``expert_size`` experts from ``start_expert_id`` (device-side, no host read)."""
    c = cusum.reshape(-1).to(torch.int64)
    local = c[start_expert_id + 1:start_expert_id + expert_size + 1] - c[start_expert_id]
    r = _positions(rows, c.device)
    which = torch.searchsorted(local, r, right=True)
    valid = which < expert_size
    return which.clamp(max=max(expert_size - 1, 0)) + start_expert_id, valid


def _k_moe_active(input, output, bias, cusum_token_count, act_mode, is_gated, start_expert_id, expert_size,
                  high_precision, gelu_approximate, swiglu_limit):
    x = input.to(torch.float32)
    if bias is not None:
        if cusum_token_count is None:
            raise ValueError("torch_mlu_ops.moe_active: bias needs cusum_token_count")
        expert, valid = _rows_of_experts(cusum_token_count, start_expert_id, expert_size, x.shape[0])
        x = x + torch.where(valid.view(-1, 1), bias.to(torch.float32)[expert], 0.0)
    half = x.shape[-1] // 2
    if swiglu_limit > 0:
        if is_gated:
            x = torch.cat((x[..., :half].clamp(max=swiglu_limit), x[..., half:].clamp(-swiglu_limit, swiglu_limit)),
                          dim=-1)
        else:
            x = x.clamp(max=swiglu_limit)
    y = _gate(x, act_mode, is_gated, 1.0, gelu_approximate == "tanh")
    output[..., :y.shape[-1]].copy_(y.to(output.dtype))


def _no_result(*args, **kwargs) -> None:
    return None


# --------------------------------------------------------------------------------------------------
# RMS norm


def _k_fused_rms_norm(x, residual, gamma, beta, bias, eps, store_output_before_norm):
    if gamma is not None and gamma.dim() != 1:
        raise _not_simulated("fused_rms_norm", "a 2-d gamma")
    x1 = x.to(torch.float32)
    if bias is not None:
        x1 = x1 + bias.to(torch.float32)
    if residual is not None:
        x1 = x1 + residual.to(torch.float32)
    x1 = x1.to(x.dtype)  # what store_output_before_norm returns, and what is normalised
    xf = x1.to(torch.float32)
    y = xf * torch.rsqrt(xf.square().mean(dim=-1, keepdim=True) + eps)
    if gamma is not None:
        y = y * gamma.to(torch.float32)
    if beta is not None:
        y = y + beta.to(torch.float32)
    return y.to(x.dtype), x1.clone()


def _f_fused_rms_norm(x, residual, gamma, beta, bias, eps, store_output_before_norm):
    return x.new_empty(x.shape), x.new_empty(x.shape)


# --------------------------------------------------------------------------------------------------
# rotary embedding


def _rotate(x: Tensor, interleaved: bool) -> Tensor:
    if interleaved:
        return torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _k_apply_rotary(input, output, sin_cache, cos_cache, position_ids, cu_seqlens, interleaved, discrete,
                    dynamic_ntk, max_seqlen, is_inverse):
    if input.dim() not in (3, 4):
        raise ValueError(f"torch_mlu_ops.apply_rotary: input must be 3-d or 4-d, got {tuple(input.shape)}")
    heads, dim = input.shape[-2:]
    tokens = input.shape[0] * (input.shape[1] if input.dim() == 4 else 1)
    t = _positions(tokens, input.device)
    live = None
    if input.dim() == 4:
        seq = input.shape[1]
        batch_of, offset = t // seq, t % seq
    elif cu_seqlens is not None:
        cu = cu_seqlens.reshape(-1).to(torch.int64)
        batches = cu.numel() - 1
        batch_of = torch.searchsorted(cu[1:], t, right=True)
        live = batch_of < batches
        batch_of = batch_of.clamp(max=max(batches - 1, 0))
        offset = t - cu[batch_of]
    else:
        if max_seqlen <= 0:
            raise ValueError("torch_mlu_ops.apply_rotary: pack mode without cu_seqlens needs max_seqlen > 0")
        batch_of, offset = t // max_seqlen, t % max_seqlen
    if discrete:
        if position_ids is None:
            raise ValueError("torch_mlu_ops.apply_rotary: discrete=True needs position_ids")
        pos = position_ids.reshape(-1).to(torch.int64)
    elif position_ids is not None:
        pos = offset + position_ids.reshape(-1).to(torch.int64)[batch_of]
    else:
        pos = offset
    if live is not None:
        pos = torch.where(live, pos, 0)
    if dynamic_ntk:
        sin, cos = sin_cache[batch_of, pos], cos_cache[batch_of, pos]
    else:
        sin, cos = sin_cache[pos], cos_cache[pos]
    sin = sin.to(torch.float32).unsqueeze(1)
    cos = cos.to(torch.float32).unsqueeze(1)
    if is_inverse:
        sin = -sin
    rot_dim = sin.shape[-1]
    xf = input.reshape(tokens, heads, dim).to(torch.float32)
    head = xf[..., :rot_dim]
    rotated = head * cos + _rotate(head, interleaved) * sin
    y = torch.cat((rotated, xf[..., rot_dim:]), dim=-1)
    if live is not None:
        y = torch.where(live.view(-1, 1, 1), y, xf)
    output.copy_(y.to(output.dtype).reshape(output.shape))


# --------------------------------------------------------------------------------------------------
# paged KV cache: (num_blocks, num_kv_heads, block_size, head_dim)


def _slots(slot_mapping: Tensor, block_size: int) -> tuple[Tensor, Tensor, Tensor]:
    s = slot_mapping.reshape(-1).to(torch.int64)
    live = s >= 0
    safe = s.clamp(min=0)
    return live, safe // block_size, safe % block_size


def _scatter_rows(cache: Tensor, rows: Tensor, slot_mapping: Tensor) -> None:
    """``cache[slot // bs, :, slot % bs] = rows[i]`` for ``slot >= 0``; negative slots write nothing.

    Without a host read: every row is written, each padding row to slot 0 with the value slot 0 holds after the
    live writes (its old contents, or the last live row aimed at it), so the duplicates agree and nothing else
    changes.
    """
    if rows.shape[0] == 0:
        return
    live, block, offset = _slots(slot_mapping, cache.shape[2])
    if live.numel() != rows.shape[0]:
        raise ValueError(f"slot_mapping has {live.numel()} slots for {rows.shape[0]} tokens")
    view = cache.permute(0, 2, 1, 3)  # (blocks, block_size, heads, dim), a view of the cache
    rows = rows.to(cache.dtype)
    at_zero = live & (block == 0) & (offset == 0)
    order = _positions(live.numel(), live.device)
    last = torch.where(at_zero, order, 0).amax().reshape(1)
    slot0_after = torch.where(at_zero.any(), rows.index_select(0, last)[0], view[0, 0])
    src = torch.where(live.view(-1, 1, 1), rows, slot0_after.unsqueeze(0))
    view.index_put_((block, offset), src)


def _check_kv(k: Tensor, cache: Tensor, what: str) -> None:
    if cache.dim() != 4:
        raise ValueError(f"torch_mlu_ops.reshape_paged_cache: {what} must be (block_num, head_num_kv, block_size, "
                         f"head_size), got {tuple(cache.shape)}")
    if k.dim() != 3 or tuple(k.shape[1:]) != (cache.shape[1], cache.shape[3]):
        raise ValueError(f"torch_mlu_ops.reshape_paged_cache: {what} rows must be (num_token, {cache.shape[1]}, "
                         f"{cache.shape[3]}), got {tuple(k.shape)}")


def _k_reshape_paged_cache(k, v, k_cache, v_cache, slot_mapping):
    for rows, cache, what in ((k, k_cache, "k_cache"), (v, v_cache, "v_cache")):
        if rows is None or cache is None:
            continue
        _check_kv(rows, cache, what)
        _scatter_rows(cache, rows, slot_mapping)


def _k_reshape_from_paged_cache(k, v, k_cache, v_cache, slot_mapping):
    for rows, cache, what in ((k, k_cache, "k_cache"), (v, v_cache, "v_cache")):
        if rows is None or cache is None:
            continue
        _check_kv(rows, cache, what)
        live, block, offset = _slots(slot_mapping, cache.shape[2])
        got = cache.permute(0, 2, 1, 3)[torch.where(live, block, 0), torch.where(live, offset, 0)]
        rows.copy_(torch.where(live.view(-1, 1, 1), got.to(rows.dtype), rows))


# --------------------------------------------------------------------------------------------------
# attention


def _packed_grid(x: Tensor, cu: Tensor, width: int) -> tuple[Tensor, Tensor]:
    """Packed ``x (total, ...)`` as ``(batch, width, ...)`` by ``cu (batch + 1)``, and each sequence's length."""
    c = cu.reshape(-1).to(torch.int64)
    lens = c[1:] - c[:-1]
    j = _positions(width, x.device)
    index = (c[:-1].unsqueeze(1) + j).clamp(0, max(x.shape[0] - 1, 0))
    return x[index], lens


def _unpack(grid: Tensor, cu: Tensor, tokens: int) -> tuple[Tensor, Tensor, Tensor]:
    """For packed tokens ``0..tokens-1``: (sequence, position, live) into a ``(batch, width, ...)`` grid."""
    c = cu.reshape(-1).to(torch.int64)
    batches, width = grid.shape[0], grid.shape[1]
    t = _positions(tokens, grid.device)
    b = torch.searchsorted(c[1:], t, right=True)
    live = b < batches
    b = b.clamp(max=max(batches - 1, 0))
    j = t - c[b]
    live = live & (j < width)
    return b, j.clamp(0, max(width - 1, 0)), live


def _k_flash_attention(q, k, v, out, cu_seq_lens_q, cu_seq_lens_kv, block_tables, max_seq_len_q, max_seq_len_kv,
                       softmax_scale, is_causal, window_size_left, window_size_right, out_lse):
    packed = q.dim() == 3
    if packed:
        if cu_seq_lens_q is None:
            raise ValueError("torch_mlu_ops.flash_attention: packed q (total, heads, dim) needs cu_seq_lens_q")
        width = max_seq_len_q if max_seq_len_q > 0 else q.shape[0]
        qg, q_lens = _packed_grid(q, cu_seq_lens_q, width)
    elif q.dim() == 4:
        qg = q
        q_lens = torch.full((q.shape[0],), q.shape[1], dtype=torch.int64, device=q.device)
    else:
        raise ValueError(f"torch_mlu_ops.flash_attention: q must be 3-d or 4-d, got {tuple(q.shape)}")
    batches, width = qg.shape[0], qg.shape[1]
    if block_tables is not None:
        if cu_seq_lens_kv is None:
            raise ValueError("torch_mlu_ops.flash_attention: paged k/v (block_tables) need cu_seq_lens_kv")
        longest = max_seq_len_kv if max_seq_len_kv > 0 else None
        kg = gather_paged(k, block_tables, "bhsd", longest)
        vg = gather_paged(v, block_tables, "bhsd", longest)
        c = cu_seq_lens_kv.reshape(-1).to(torch.int64)
        kv_lens = c[1:] - c[:-1]
    elif k.dim() == 3:
        if cu_seq_lens_kv is None:
            raise ValueError("torch_mlu_ops.flash_attention: packed k/v need cu_seq_lens_kv")
        kv_width = max_seq_len_kv if max_seq_len_kv > 0 else k.shape[0]
        kg, kv_lens = _packed_grid(k, cu_seq_lens_kv, kv_width)
        vg, _ = _packed_grid(v, cu_seq_lens_kv, kv_width)
    else:
        kg, vg = k, v
        kv_lens = torch.full((k.shape[0],), k.shape[1], dtype=torch.int64, device=q.device)
    if kg.shape[0] != batches:
        raise ValueError(f"torch_mlu_ops.flash_attention: {batches} query sequences and {kg.shape[0]} KV sequences")
    j = _positions(width, q.device).view(1, -1)
    p = _positions(kg.shape[1], q.device).view(1, 1, -1)
    q_lens, kv_lens = q_lens.view(-1, 1), kv_lens.view(-1, 1)
    at = (kv_lens - q_lens + j).unsqueeze(-1)  # each query's position in its KV sequence (end-aligned)
    allowed = (j < q_lens).unsqueeze(-1) & (p < kv_lens.unsqueeze(-1))
    if is_causal:
        allowed = allowed & (p <= at)
    if window_size_left >= 0:
        allowed = allowed & (p >= at - window_size_left)
    if window_size_right >= 0:
        allowed = allowed & (p <= at + window_size_right)
    og, lse = _attend(qg, kg, vg, allowed, softmax_scale)  # (B, S, N, Dv), (B, N, S)
    if packed:
        b, pos, live = _unpack(og, cu_seq_lens_q, q.shape[0])
        res = torch.where(live.view(-1, 1, 1), og[b, pos], 0.0)
        out.copy_(res.to(out.dtype))
        if out_lse is not None:
            lse_t = torch.where(live.view(1, -1), lse[b, :, pos].transpose(0, 1), float("-inf"))
            out_lse.copy_(lse_t)
    else:
        out.copy_(og.to(out.dtype))
        if out_lse is not None:
            out_lse.copy_(lse)


def _k_single_query(q, k_cache, v_cache, out, block_tables, context_lens, max_context_len, windows_size_left,
                    softmax_scale, head_size_v, out_lse):
    if q.dim() != 4 or q.shape[1] != 1:
        raise _not_simulated("single_query_cached_kv_attn", f"q of shape {tuple(q.shape)} (only (batch, 1, heads, "
                             "dim) is)")
    if v_cache is None:
        v_cache = k_cache[..., :head_size_v]
    lens = context_lens.reshape(-1).to(device=q.device, dtype=torch.int64)
    longest = None
    if max_context_len > 0:
        # At most max_context_len positions per row: a value frozen at capture that is smaller than a later
        # length drops the tail of that sequence.
        lens = lens.clamp(max=max_context_len)
        longest = max_context_len
    k = gather_paged(k_cache, block_tables, "bhsd", longest)
    v = gather_paged(v_cache, block_tables, "bhsd", longest)
    p = _positions(k.shape[1], q.device).view(1, 1, -1)
    lens = lens.view(-1, 1, 1)
    allowed = p < lens
    if windows_size_left >= 0:
        allowed = allowed & (p >= lens - (windows_size_left + 1))
    res, lse = _attend(q, k, v, allowed, softmax_scale)
    out.copy_(res.to(out.dtype))
    if out_lse is not None:
        out_lse.copy_(lse)


# --------------------------------------------------------------------------------------------------
# MoE


def _k_moe_softmax_topk(input, topk, normalize, num_expert_group, topk_group, mask, normed_by, route_scale,
                        score_bias):
    experts = input.shape[-1]
    probs = torch.softmax(input.to(torch.float32), dim=-1)
    if num_expert_group <= 1:
        if mask is not None:
            probs = probs * mask.to(torch.float32)
        choose = probs if score_bias is None else probs + score_bias.to(torch.float32)
    else:
        choose = probs if score_bias is None else probs + score_bias.to(torch.float32)
        groups = choose.reshape(*choose.shape[:-1], num_expert_group, experts // num_expert_group)
        best = torch.topk(groups.amax(dim=-1), k=topk_group, dim=-1).indices
        keep = torch.zeros(groups.shape[:-1], dtype=torch.bool, device=input.device).scatter(-1, best, True)
        choose = groups.masked_fill(~keep.unsqueeze(-1), 0.0).reshape(choose.shape)
    expert_id = torch.topk(choose, k=topk, dim=-1).indices
    weight = probs.gather(-1, expert_id)
    if normalize:
        if normed_by == "topk_logit":
            weight = weight / weight.sum(dim=-1, keepdim=True)
        elif normed_by == "softmax_logit":
            weight = weight / probs.sum(dim=-1, keepdim=True)
        else:
            raise ValueError(f"torch_mlu_ops.moe_softmax_topk: normed_by must be 'topk_logit' or 'softmax_logit', "
                             f"got {normed_by!r}")
    return (weight * route_scale).to(torch.float32), expert_id.to(torch.int32)


def _f_moe_softmax_topk(input, topk, *args):
    shape = (*input.shape[:-1], topk)
    return input.new_empty(shape, dtype=torch.float32), input.new_empty(shape, dtype=torch.int32)


def _k_moe_gen_idx(expert_id, expert_num):
    flat = expert_id.reshape(-1).to(torch.int64)
    topk = expert_id.shape[-1] if expert_id.dim() > 1 else 1
    order = torch.sort(flat, stable=True).indices  # (token, k) pairs in expert order
    expand_idx = torch.div(order, topk, rounding_mode="floor")
    combine_idx = torch.empty_like(order).scatter_(0, order, _positions(order.numel(), order.device))
    count = torch.zeros(expert_num, dtype=torch.int64, device=flat.device)
    count.scatter_add_(0, flat, torch.ones_like(flat))
    cusum = torch.cat((count.new_zeros(1), count.cumsum(0)))
    i32 = torch.int32
    return expand_idx.to(i32), combine_idx.to(i32), count.to(i32), cusum.to(i32), order.to(i32)


def _f_moe_gen_idx(expert_id, expert_num):
    n = expert_id.numel()
    i32 = torch.int32
    return (expert_id.new_empty((n,), dtype=i32), expert_id.new_empty((n,), dtype=i32),
            expert_id.new_empty((expert_num,), dtype=i32), expert_id.new_empty((expert_num + 1,), dtype=i32),
            expert_id.new_empty((n,), dtype=i32))


def _k_moe_expand_input(input, gather_idx, cusum_token_count, start_expert_id, expert_size):
    idx = gather_idx.reshape(-1).to(torch.int64)
    n = idx.numel()
    if cusum_token_count is None:
        return input[idx]
    c = cusum_token_count.reshape(-1).to(torch.int64)
    first, end = c[start_expert_id], c[start_expert_id + expert_size]
    src = first + _positions(n, idx.device)
    live = src < end
    rows = torch.where(live, idx[src.clamp(0, max(n - 1, 0))], 0)
    got = input[rows]
    return torch.where(live.view(-1, *([1] * (input.dim() - 1))), got, got.new_zeros(()))


def _f_moe_expand_input(input, gather_idx, cusum_token_count, start_expert_id, expert_size):
    return input.new_empty((gather_idx.numel(), *input.shape[1:]))


def _k_group_gemm(a, b, group_list, expand_idx, c, alpha, beta, bias, trans_a, trans_b, output_dtype):
    if trans_a:
        a = a.transpose(0, 1)
    if expand_idx is not None:
        a = a[expand_idx.reshape(-1).to(torch.int64)]
    rows, experts = a.shape[0], b.shape[0]
    bounds = group_list.reshape(-1).to(torch.int64).cumsum(0)
    expert = torch.searchsorted(bounds, _positions(rows, a.device), right=True)
    live = expert < experts
    expert = expert.clamp(max=experts - 1)
    af = a.to(torch.float32)
    n = b.shape[1] if trans_b else b.shape[2]
    acc = torch.zeros((rows, n), dtype=torch.float32, device=a.device)
    for i in range(experts):  # host loop over a shape: every expert's GEMM, kept where the row belongs to it
        w = b[i].to(torch.float32)
        acc = torch.where((expert == i).view(-1, 1), af @ (w.transpose(0, 1) if trans_b else w), acc)
    if alpha is not None:
        acc = acc * alpha.to(torch.float32)[expert].view(-1, 1)
    if c is not None:
        acc = acc + beta.to(torch.float32)[expert].view(-1, 1) * c.to(torch.float32)
    if bias is not None:
        acc = acc + bias.to(torch.float32)[expert]
    acc = torch.where(live.view(-1, 1), acc, 0.0)
    return acc.to(output_dtype if output_dtype is not None else a.dtype)


def _f_group_gemm(a, b, group_list, expand_idx, c, alpha, beta, bias, trans_a, trans_b, output_dtype):
    rows = expand_idx.numel() if expand_idx is not None else (a.shape[1] if trans_a else a.shape[0])
    n = b.shape[1] if trans_b else b.shape[2]
    return a.new_empty((rows, n), dtype=output_dtype if output_dtype is not None else a.dtype)


def _k_moe_combine_result(input, reduce_weight, gather_ids, residual, cusum_token_count, start_expert_id,
                          expert_size):
    tokens, topk = reduce_weight.shape[0], reduce_weight.shape[-1]
    g = gather_ids.reshape(tokens, topk).to(torch.int64)
    w = reduce_weight.reshape(tokens, topk).to(torch.float32)
    if cusum_token_count is not None:
        cu = cusum_token_count.reshape(-1).to(torch.int64)
        first, end = cu[start_expert_id], cu[start_expert_id + expert_size]
        live = (g >= first) & (g < end)
        g = torch.where(live, g - first, 0)
    else:
        live = torch.ones_like(g, dtype=torch.bool)
    rows = input[g.reshape(-1)].reshape(tokens, topk, -1).to(torch.float32)
    contrib = torch.where(live.unsqueeze(-1), rows * w.unsqueeze(-1), 0.0)
    out = contrib.sum(dim=1)
    if residual is not None:
        out = out + residual.to(torch.float32)
    return out.to(input.dtype)


def _f_moe_combine_result(input, reduce_weight, gather_ids, residual, cusum_token_count, start_expert_id,
                          expert_size):
    return input.new_empty((reduce_weight.shape[0], input.shape[-1]))


# --------------------------------------------------------------------------------------------------
# matmul


def _matmul_operands(a: Tensor, b: Tensor, trans_a: bool, trans_b: bool) -> tuple[Tensor, Tensor]:
    return (a.transpose(-1, -2) if trans_a else a), (b.transpose(-1, -2) if trans_b else b)


def _k_matmul(a, b, bias, c, act_mode, alpha, beta, fast_act, approximate, dtype, trans_a, trans_b):
    lhs, rhs = _matmul_operands(a, b, trans_a, trans_b)
    y = alpha * (lhs.to(torch.float32) @ rhs.to(torch.float32))
    if c is not None:
        y = y + beta * c.to(torch.float32)
    if bias is not None:
        y = y + bias.to(torch.float32)
    y = _activate(y, act_mode, 1.0, approximate)
    return y.to(dtype if dtype is not None else a.dtype)


def _f_matmul(a, b, bias, c, act_mode, alpha, beta, fast_act, approximate, dtype, trans_a, trans_b):
    lhs, rhs = _matmul_operands(a, b, trans_a, trans_b)
    shape = torch.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2]) + (lhs.shape[-2], rhs.shape[-1])
    return a.new_empty(shape, dtype=dtype if dtype is not None else a.dtype)


# --------------------------------------------------------------------------------------------------
# registration


_SCHEMAS: tuple[tuple[str, Callable, Callable], ...] = (
    ("active(Tensor input, str act_mode, bool is_gated, float active_coef, bool high_precision, "
     "str gelu_approximate) -> Tensor", _k_active, _f_active),
    ("moe_active(Tensor input, Tensor(a!) output, Tensor? bias, Tensor? cusum_token_count, str act_mode, "
     "bool is_gated, int start_expert_id, int expert_size, bool high_precision, str gelu_approximate, "
     "int swiglu_limit) -> ()", _k_moe_active, _no_result),
    ("fused_rms_norm(Tensor x, Tensor? residual, Tensor? gamma, Tensor? beta, Tensor? bias, float eps, "
     "bool store_output_before_norm) -> (Tensor, Tensor)", _k_fused_rms_norm, _f_fused_rms_norm),
    ("apply_rotary(Tensor input, Tensor(a!) output, Tensor sin_cache, Tensor cos_cache, Tensor? position_ids, "
     "Tensor? cu_seqlens, bool interleaved, bool discrete, bool dynamic_ntk, int max_seqlen, bool is_inverse) -> ()",
     _k_apply_rotary, _no_result),
    ("reshape_paged_cache(Tensor k, Tensor? v, Tensor(a!) k_cache, Tensor(b!)? v_cache, Tensor slot_mapping) -> ()",
     _k_reshape_paged_cache, _no_result),
    ("reshape_from_paged_cache(Tensor(a!) k, Tensor(b!)? v, Tensor k_cache, Tensor? v_cache, Tensor slot_mapping)"
     " -> ()", _k_reshape_from_paged_cache, _no_result),
    ("flash_attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, Tensor? cu_seq_lens_q, Tensor? cu_seq_lens_kv, "
     "Tensor? block_tables, int max_seq_len_q, int max_seq_len_kv, float softmax_scale, bool is_causal, "
     "int window_size_left, int window_size_right, Tensor(b!)? out_lse) -> ()", _k_flash_attention, _no_result),
    ("single_query_cached_kv_attn(Tensor q, Tensor k_cache, Tensor? v_cache, Tensor(a!) out, Tensor block_tables, "
     "Tensor context_lens, int max_context_len, int windows_size_left, float softmax_scale, int head_size_v, "
     "Tensor(b!)? out_lse) -> ()", _k_single_query, _no_result),
    ("moe_softmax_topk(Tensor input, int topk, bool normalize, int num_expert_group, int topk_group, Tensor? mask, "
     "str normed_by, float route_scale, Tensor? score_bias) -> (Tensor, Tensor)",
     _k_moe_softmax_topk, _f_moe_softmax_topk),
    ("moe_gen_idx(Tensor expert_id, int expert_num) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
     _k_moe_gen_idx, _f_moe_gen_idx),
    ("moe_expand_input(Tensor input, Tensor gather_idx, Tensor? cusum_token_count, int start_expert_id, "
     "int expert_size) -> Tensor", _k_moe_expand_input, _f_moe_expand_input),
    ("group_gemm(Tensor a, Tensor b, Tensor group_list, Tensor? expand_idx, Tensor? c, Tensor? alpha, Tensor? beta, "
     "Tensor? bias, bool trans_a, bool trans_b, ScalarType? output_dtype) -> Tensor", _k_group_gemm, _f_group_gemm),
    ("moe_combine_result(Tensor input, Tensor reduce_weight, Tensor gather_ids, Tensor? residual, "
     "Tensor? cusum_token_count, int start_expert_id, int expert_size) -> Tensor",
     _k_moe_combine_result, _f_moe_combine_result),
    ("matmul(Tensor a, Tensor b, Tensor? bias, Tensor? c, str act_mode, float alpha, float beta, bool fast_act, "
     "bool approximate, ScalarType? dtype, bool trans_a, bool trans_b) -> Tensor", _k_matmul, _f_matmul),
)


def _register(schema: str, kernel: Callable, fake: Callable) -> None:
    name = schema.split("(", 1)[0]
    if _exists(NAMESPACE, name, "default"):
        return  # an earlier import of this module (or someone else) owns it
    lib = _LIBS.setdefault(NAMESPACE, Library(NAMESPACE, "FRAGMENT"))
    lib.define(schema)
    lib.impl(name, kernel, "CPU")
    lib.impl(name, kernel, "CUDA")  # the same composite math on a GPU (real-graph conformance)
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=lib)
    REGISTERED.append(f"{NAMESPACE}::{name}")


def register() -> list[str]:
    """Register every operator not already defined (done at import). Returns :data:`REGISTERED`."""
    global _ops
    for schema, kernel, fake in _SCHEMAS:
        _register(schema, kernel, fake)
    _ops = getattr(torch.ops, NAMESPACE)
    return REGISTERED


register()


# --------------------------------------------------------------------------------------------------
# the torch_mlu_ops functions (real names, argument order and defaults; see the table above)


def active(input: Tensor, act_mode: str, is_gated: bool, active_coef: float = 1.0, high_precision: bool = False,
           gelu_approximate: str = "none") -> Tensor:
    _check_mode("active", act_mode)
    return _ops.active(input, act_mode, bool(is_gated), float(active_coef), bool(high_precision), gelu_approximate)


def fused_rms_norm(x: Tensor, residual: Tensor | None, gamma: Tensor | None, beta: Tensor | None,
                   bias: Tensor | None, eps: float, store_output_before_norm: bool, quant_scale: Tensor | None = None,
                   out: Tensor | None = None, dynamic_quant: bool = False, store_output_after_norm: bool = False,
                   quant_type: torch.dtype = torch.int8, scale_type: torch.dtype = torch.float,
                   mx_quant: bool = False):
    _refuse_given("fused_rms_norm", quant_scale=quant_scale, dynamic_quant=dynamic_quant, mx_quant=mx_quant)
    normed, before = _ops.fused_rms_norm(x, residual, gamma, beta, bias, float(eps), bool(store_output_before_norm))
    if out is not None:
        out.copy_(normed)
        normed = out
    outputs = [normed]
    if store_output_before_norm:
        outputs.append(before)
    if store_output_after_norm:
        outputs.append(normed.clone())
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


def apply_rotary(input: Tensor, sin_cache: Tensor, cos_cache: Tensor, position_ids: Tensor | None,
                 cu_seqlens: Tensor | None, interleaved: bool, discrete: bool, dynamic_ntk: bool, max_seqlen: int,
                 output: Tensor | None = None, is_inverse: bool = False) -> Tensor:
    if output is None:
        output = input
    _ops.apply_rotary(input, output, sin_cache, cos_cache, position_ids, cu_seqlens, bool(interleaved),
                      bool(discrete), bool(dynamic_ntk), int(max_seqlen), bool(is_inverse))
    return output


def reshape_paged_cache(k: Tensor, v: Tensor | None, k_cache: Tensor, v_cache: Tensor | None, slot_mapping: Tensor,
                        direction: bool = False):
    if direction:
        _ops.reshape_from_paged_cache(k, v, k_cache, v_cache, slot_mapping)
        return (k, v) if v is not None else k
    _ops.reshape_paged_cache(k, v, k_cache, v_cache, slot_mapping)
    return (k_cache, v_cache) if v_cache is not None else k_cache


def flash_attention(q: Tensor, k: Tensor, v: Tensor, out: Tensor | None, cu_seq_lens_q: Tensor | None,
                    cu_seq_lens_kv: Tensor | None, alibi_slope: Tensor | None, attn_bias: Tensor | None,
                    max_seq_len_q: int, max_seq_len_kv: int, softmax_scale: float, is_causal: bool,
                    window_size_left: int = -1, window_size_right: int = -1,
                    compute_dtype: torch.dtype = torch.float, return_lse: bool = False,
                    block_tables: Tensor | None = None, k_quant_scale: Tensor | None = None,
                    v_quant_scale: Tensor | None = None, q_quant_scale: Tensor | None = None,
                    out_quant_scale: Tensor | None = None, out_dtype: torch.dtype = torch.half,
                    q2k_block_idx: Tensor | None = None, q2k_block_num: Tensor | None = None,
                    variable_block_sizes: Tensor | None = None, q_block_size: int = 256, k_block_size: int = 128,
                    sink: Tensor | None = None):
    _refuse_given("flash_attention", alibi_slope=alibi_slope, attn_bias=attn_bias, k_quant_scale=k_quant_scale,
                  v_quant_scale=v_quant_scale, q_quant_scale=q_quant_scale, out_quant_scale=out_quant_scale,
                  q2k_block_idx=q2k_block_idx, q2k_block_num=q2k_block_num,
                  variable_block_sizes=variable_block_sizes, sink=sink)
    if out is None:
        out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=v.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty((*q.shape[:-3], q.shape[-2], q.shape[-3]), dtype=torch.float32, device=q.device)
    _ops.flash_attention(q, k, v, out, cu_seq_lens_q, cu_seq_lens_kv, block_tables, int(max_seq_len_q),
                         int(max_seq_len_kv), float(softmax_scale), bool(is_causal), int(window_size_left),
                         int(window_size_right), lse)
    return (out, lse) if return_lse else out


def single_query_cached_kv_attn(q: Tensor, k_cache: Tensor, v_cache: Tensor | None, out: Tensor | None,
                                block_tables: Tensor, context_lens: Tensor, k_cache_quant_scale: Tensor | None,
                                v_cache_quant_scale: Tensor | None, alibi_slopes: Tensor | None,
                                max_context_len: int, windows_size_left: int, windows_size_right: int,
                                softmax_scale: float, return_lse: bool = False, kv_cache_quant_bit_size=-1,
                                q_quant_scale: Tensor | None = None, out_quant_scale: Tensor | None = None,
                                out_dtype: torch.dtype = torch.half, compute_dtype: torch.dtype = torch.float,
                                head_size_v: int = -1, mask: Tensor | None = None, cu_seq_q: Tensor | None = None,
                                max_seq_q: int = -1, sink: Tensor | None = None):
    _refuse_given("single_query_cached_kv_attn", k_cache_quant_scale=k_cache_quant_scale,
                  v_cache_quant_scale=v_cache_quant_scale, alibi_slopes=alibi_slopes, q_quant_scale=q_quant_scale,
                  out_quant_scale=out_quant_scale, mask=mask, cu_seq_q=cu_seq_q, sink=sink)
    if kv_cache_quant_bit_size != -1:
        raise _not_simulated("single_query_cached_kv_attn", f"kv_cache_quant_bit_size={kv_cache_quant_bit_size}")
    if windows_size_right != -1:
        raise _not_simulated("single_query_cached_kv_attn", f"windows_size_right={windows_size_right} (reserved, -1)")
    if v_cache is not None:
        head_size_v = v_cache.shape[-1]
    elif head_size_v <= 0:
        head_size_v = out.shape[-1] if out is not None else q.shape[-1]
    if out is None:
        out = torch.empty((*q.shape[:-1], head_size_v), dtype=q.dtype, device=q.device)
    lse = None
    if return_lse:
        lse = torch.empty((*q.shape[:-3], q.shape[-2], q.shape[-3]), dtype=torch.float32, device=q.device)
    _ops.single_query_cached_kv_attn(q, k_cache, v_cache, out, block_tables, context_lens, int(max_context_len),
                                     int(windows_size_left), float(softmax_scale), int(head_size_v), lse)
    return (out, lse) if return_lse else out


def moe_softmax_topk(input: Tensor, topk: int, normalize: bool = False, num_expert_group: int = -1,
                     topk_group: int = 0, mask: Tensor | None = None, normed_by: str = "topk_logit",
                     route_scale: float = 1.0, reduce_weight: Tensor | None = None, expert_id: Tensor | None = None,
                     score_bias: Tensor | None = None):
    weight, ids = _ops.moe_softmax_topk(input, int(topk), bool(normalize), int(num_expert_group), int(topk_group),
                                        mask, normed_by, float(route_scale), score_bias)
    if reduce_weight is not None:
        reduce_weight.copy_(weight)
        weight = reduce_weight
    if expert_id is not None:
        expert_id.copy_(ids)
        ids = expert_id
    return weight, ids


def moe_gen_idx(expert_id: Tensor, expert_num: int, return_token2expert_idx: bool = False):
    outputs = _ops.moe_gen_idx(expert_id, int(expert_num))
    return tuple(outputs) if return_token2expert_idx else tuple(outputs[:4])


def moe_expand_input(input: Tensor, gather_idx: Tensor, cusum_token_count: Tensor | None = None,
                     start_expert_id: int = 0, expert_size: int = 0, output: Tensor | None = None) -> Tensor:
    result = _ops.moe_expand_input(input, gather_idx, cusum_token_count, int(start_expert_id), int(expert_size))
    if output is None:
        return result
    output.copy_(result)
    return output


def group_gemm(a: Tensor, b: Tensor, group_list: Tensor, expand_idx: Tensor | None, c: Tensor | None,
               alpha: Tensor | None, beta: Tensor | None, max_in_group_list: int, bias: Tensor | None = None,
               d: Tensor | None = None, trans_a: bool | None = False, trans_b: bool | None = True,
               tile_config: dict[str, int] | None = None, idx_offset: Tensor | None = None,
               output_dtype: torch.dtype | None = None) -> Tensor:
    _refuse_given("group_gemm", idx_offset=idx_offset)
    if b.dim() != 3:
        raise _not_simulated("group_gemm", "a 2-d b (the k-split form)")
    if c is not None and beta is None:
        raise _not_simulated("group_gemm", "c without beta")
    result = _ops.group_gemm(a, b, group_list, expand_idx, c, alpha, beta, bias, bool(trans_a), bool(trans_b),
                             output_dtype if d is None else d.dtype)
    if d is None:
        return result
    d.copy_(result)
    return d


def moe_active(input: Tensor, act_mode: str, is_gated: bool, output: Tensor | None = None, bias: Tensor | None = None,
               cusum_token_count: Tensor | None = None, start_expert_id: int = 0, expert_size: int = 0,
               high_precision: bool = False, gelu_approximate: str = "none", swiglu_limit: int = 0,
               weight: Tensor | None = None) -> Tensor:
    _check_mode("moe_active", act_mode)
    _refuse_given("moe_active", weight=weight)
    if output is None:
        output = input.new_empty((*input.shape[:-1], input.shape[-1] // (2 if is_gated else 1)))
    _ops.moe_active(input, output, bias, cusum_token_count, act_mode, bool(is_gated), int(start_expert_id),
                    int(expert_size), bool(high_precision), gelu_approximate, int(swiglu_limit))
    return output


def moe_combine_result(input: Tensor, reduce_weight: Tensor, gather_ids: Tensor, residual: Tensor | None,
                       cusum_token_count: Tensor | None, start_expert_id: int, expert_size: int,
                       bias: Tensor | None = None, output: Tensor | None = None) -> Tensor:
    _refuse_given("moe_combine_result", bias=bias)
    result = _ops.moe_combine_result(input, reduce_weight, gather_ids, residual, cusum_token_count,
                                     int(start_expert_id), int(expert_size))
    if output is None:
        return result
    output.copy_(result)
    return output


def matmul(a: Tensor, b: Tensor, bias: Tensor | None = None, c: Tensor | None = None, act_mode: str = "none",
           alpha: float = 1.0, beta: float = 0.0, fast_act: bool = True, approximate: bool = True,
           dtype: torch.dtype | None = None, a_scale: Tensor | float | None = None,
           b_scale: Tensor | float | None = None, trans_a: bool = False, trans_b: bool = True,
           tile_config: dict[str, int] | None = None, output: Tensor | None = None) -> Tensor:
    _check_mode("matmul", act_mode)
    _refuse_given("matmul", a_scale=a_scale, b_scale=b_scale)
    result = _ops.matmul(a, b, bias, c, act_mode, float(alpha), float(beta), bool(fast_act), bool(approximate),
                         dtype if output is None else output.dtype, bool(trans_a), bool(trans_b))
    if output is None:
        return result
    output.copy_(result)
    return output


def matmul_allreduce(cncl_comm, a: Tensor, b: Tensor, bias: Tensor | None = None) -> Tensor:
    raise _not_simulated("matmul_allreduce", "a matmul fused with a CNCL all-reduce (tensor parallelism)")


def per_token_smooth_quantize(x: Tensor, smooth: Tensor):
    raise _not_simulated("per_token_smooth_quantize", "int8 smooth quantisation (w8a8)")


def smooth_quant_matmul(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, dtype: torch.dtype,
                        bias: Tensor | None = None) -> Tensor:
    raise _not_simulated("smooth_quant_matmul", "int8 smooth-quant matmul (w8a8)")


TMO_FUNCTIONS: tuple[Callable, ...] = (
    active, apply_rotary, flash_attention, fused_rms_norm, group_gemm, matmul, matmul_allreduce, moe_active,
    moe_combine_result, moe_expand_input, moe_gen_idx, moe_softmax_topk, per_token_smooth_quantize,
    reshape_paged_cache, single_query_cached_kv_attn, smooth_quant_matmul,
)


def build_module() -> types.ModuleType:
    """A fresh stand-in ``torch_mlu_ops`` module (labelled with :data:`~vendor_graph_sim.boot.STANDIN_LABEL`)."""
    module = types.ModuleType(MODULE_NAME, f"vendor_graph test stand-in for torch_mlu_ops: {STANDIN_REASON}")
    for fn in TMO_FUNCTIONS:
        setattr(module, fn.__name__, fn)
    module.__all__ = [fn.__name__ for fn in TMO_FUNCTIONS]  # type: ignore[attr-defined]
    module.__version__ = STANDIN_VERSION  # type: ignore[attr-defined]
    setattr(module, STANDIN_LABEL, STANDIN_REASON)
    return module


__all__ = [
    "MODULE_NAME",
    "NAMESPACE",
    "REGISTERED",
    "STANDIN_REASON",
    "STANDIN_VERSION",
    "TMO_FUNCTIONS",
    "active",
    "apply_rotary",
    "build_module",
    "flash_attention",
    "fused_rms_norm",
    "group_gemm",
    "matmul",
    "matmul_allreduce",
    "moe_active",
    "moe_combine_result",
    "moe_expand_input",
    "moe_gen_idx",
    "moe_softmax_topk",
    "per_token_smooth_quantize",
    "register",
    "reshape_paged_cache",
    "single_query_cached_kv_attn",
    "smooth_quant_matmul",
]
