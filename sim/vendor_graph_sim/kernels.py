"""Emulated vendor attention kernels, registered as ``torch.library`` operators.

The simulator (``vendor_graph_sim.device``) records device work at capture and replays it later. For
that to reproduce what a vendor graph does, the attention and KV-cache kernels must be single
operators that reach the dispatcher with the vendor's argument semantics: which arguments are device
tensors (read at replay), which are host values (frozen at capture, changed only through the vendor's
update API), and what the kernel does with padding. Each operator here has

- a ``CPU`` kernel (plain tensors; the simulator's wrapper tensors unwrap to these), and
- a fake/meta kernel for shape inference during capture.

No kernel reads a DEVICE tensor on the host (no ``.item()``/``.tolist()``, no data-dependent shape):
lengths held in device tensors are applied with masks over the whole capacity of the block table. The
one exception is a range check of index data (a KV slot past the cache, a scatter index outside the
target), which stands for the device's own assert: on CPU data it is read when the op runs (at replay,
for a captured graph), on other devices it is an asynchronous assert.
HOST sequence lengths (``SymInt[]`` lists, or the host tensors Ascend's ATB ops take) are read on the
host, as the real kernels do; that is what freezes them into a captured graph.

Operators and where their name and schema come from ("research": torch_npu's source and notes, no wheel):

==============================================  =====================================================
operator                                        source
==============================================  =====================================================
``npu::npu_fused_infer_attention_score``        real name; research quotes the head of the schema:
  (``.default`` and ``.out``)                   ``query, key, value`` positional, then keyword-only
                                                ``pse_shift, atten_mask, actual_seq_lengths,
                                                actual_seq_lengths_kv`` (indices 3..6). The keyword
                                                arguments after those are a subset of torch_npu's
                                                public ones, named as torch_npu documents them but
                                                not checked against a wheel; the many quantisation /
                                                shared-prefix arguments are left out. ``.out`` adds
                                                ``workspace, attention_out, softmax_lse``.
``npu::npu_fused_infer_attention_score_v2``     real name; research: ``actual_seq_qlen`` /
  (``.default`` and ``.out``)                   ``actual_seq_kvlen`` at indices 7 / 8 (after
                                                ``query_rope, key_rope, pse_shift, atten_mask``).
                                                Tail: same caveat as v1.
``npu::npu_multi_head_latent_attention``        real name; research quotes ``(q_nope, q_rope, ctkv,
  (``.default`` and ``.out``)                   k_rope, block_tables, SymInt[] context_lens, ...``
                                                (``context_lens`` positional at index 5). The tail
                                                ``q_headnum, qk_scale, kv_headnum, *, mask, qseqlen,
                                                ..., cache_mode`` and the ``.out`` argument
                                                ``attn_out`` are best known, not verified.
``atb::_npu_paged_attention``                   real name; research: ``context_lens`` positional at
                                                index 7 and second to last (``args[-2]``), capture
                                                returns None. The other argument names follow the
                                                public call sites (``query, key_cache, value_cache,
                                                num_kv_heads, num_heads, scale_value, block_table,
                                                context_lens, out``).
``atb::_npu_paged_attention_mla``               real name (research: not updatable by
                                                ``NPUGraph.update``); arguments follow the public call
                                                sites (``query, key_cache, num_kv_heads, num_heads,
                                                scale_value, block_table, context_lens,
                                                mla_vheadsize, out``), not verified.
``npu::npu_rms_norm``,                          real names and schemas (op-plugin
``npu::npu_add_rms_norm``,                      ``op_plugin_functions.yaml``); semantics in
``npu::npu_swiglu``,                            ``docs/ascend_kernel_facts.md``.
``npu::npu_scatter_nd_update_``
``npu::npu_apply_rotary_pos_emb``               real name, argument names and defaults; the real schema
                                                has no alias annotation although the kernel updates
                                                query and key in place and returns them: here
                                                ``Tensor(a!) query, Tensor(b!) key -> (Tensor(a!),
                                                Tensor(b!))``. A2/A3 constraints: rotary_mode "half",
                                                layouts BSND/TND, head dim 64 or 128.
``atb::_npu_reshape_and_cache``                 real name and schema (op-plugin
                                                ``ReshapeAndCachAtb.cpp``): negative slot skipped, empty
                                                input, a slot outside (-N, N) and a non-negative slot
                                                two tokens share raise (ATB's documented slotMapping
                                                rules), int32 slots only.
``atb::_npu_flash_attention`` (``_unpad``)      real names and schemas (op-plugin
                                                ``SelfAttentionAtb.cpp``, ``SelfAttentionUnpadAtb.cpp``):
                                                packed-token prefill with a host ``seq_len``; non-zero
                                                mask entries are masked; ``_unpad`` has no mask
                                                (bidirectional within a sequence).
``vendor_graph_sim::fill_kv_cache``             INVENTED (the vendors' reshape-and-cache kernels are
                                                not in the research): dlinfer's ``fill_kv_cache``
                                                semantics, one slot per token, negative slot skipped.
``vendor_graph_sim::camb_paged_decode_attention``  INVENTED name: Camb's decode attention with
                                                ``max_kv_seq_len`` (``<= 0``: derive from the device
                                                ``kv_seqlens``; ``> 0``: attend to at most that many
                                                positions).
``vendor_graph_sim::maca_paged_decode_attention``  INVENTED name: MACA's decode attention (lengths
                                                from the device ``kv_seqlens`` only).
==============================================  =====================================================

If an operator of the same name already exists (a real torch_npu is loaded), it is left alone and
the emulated one is not registered; :data:`REGISTERED` lists what this module registered.

KV cache layouts (lmdeploy's ``<Vendor>OpsBackend.get_k_block_shape``): Ascend and MACA
``(num_blocks, block_size, num_kv_heads, head_dim)`` (``layout="bshd"``), Camb
``(num_blocks, num_kv_heads, block_size, head_dim)`` (``layout="bhsd"``). A slot index is
``block_id * block_size + offset``.

Numerics: every paged attention kernel gathers the block-table columns its HOST lengths address,
``ceil(longest length / block_size)`` of them (at least one, at most the table's width), so that the
thousands of columns of an engine's graph table cost nothing; where the lengths are on the device only
(Camb with ``max_kv_seq_len <= 0``, MACA) it gathers the whole table. It masks positions outside a row's
length, accumulates in float64 and rounds once to the query dtype. Rows with nothing to attend
to (padding rows with length 0) return zeros. Garbage (even NaN, or a block id out of range) in unused
cache slots and table columns never reaches the output. Results are deterministic, the same whatever the
table holds past the addressed columns, and, because of the float64 accumulation, practically
independent of the batch size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.library import Library

SIM_NAMESPACE = "vendor_graph_sim"
LAYOUTS = ("bshd", "bhsd")
_INT_MAX = 2147483647

REGISTERED: list[str] = []
_LIBS: dict[str, Library] = {}


# --------------------------------------------------------------------------------------------------
# shared math


def _lib(namespace: str) -> Library:
    if namespace not in _LIBS:
        _LIBS[namespace] = Library(namespace, "FRAGMENT")
    return _LIBS[namespace]


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"cache layout must be one of {LAYOUTS}, got {layout!r}")


def gather_paged(cache: Tensor, block_table: Tensor, layout: str = "bshd", longest: int | None = None) -> Tensor:
    """The positions a block table addresses, per row: ``(B, blocks * block_size, heads, dim)``.

    ``longest`` (a host int: the longest KV length the caller attends to) limits the gather to the
    columns covering it, at least one and at most all of them; ``None`` gathers every column.
    Block ids are clamped into range (a padding row's table may hold anything); positions beyond a
    row's length are masked by the caller, never read on the host.
    """
    _check_layout(layout)
    if longest is not None:
        block_size = cache.shape[1] if layout == "bshd" else cache.shape[2]
        block_table = block_table[:, :max(1, -(-longest // block_size))]
    ids = block_table.long().clamp(0, cache.shape[0] - 1)
    blocks = cache[ids]  # (B, MB, BS, H, D) or (B, MB, H, BS, D)
    if layout == "bhsd":
        blocks = blocks.transpose(2, 3)
    b, mb, bs, h, d = blocks.shape
    return blocks.reshape(b, mb * bs, h, d)


def _host_length_values(lengths: Sequence[int] | Tensor, batch: int, what: str) -> list[int]:
    """A host length list (or host tensor) as ``batch`` Python ints (one value stands for every row)."""
    values = lengths.tolist() if isinstance(lengths, Tensor) else list(lengths)
    if len(values) == 1 and batch != 1:
        values = values * batch
    if len(values) != batch:
        raise ValueError(f"{what} has {len(values)} entries for a batch of {batch}")
    return [int(v) for v in values]


def _host_lengths(lengths: Sequence[int] | Tensor | None, batch: int, default: int, what: str) -> Tensor:
    """A host length list (or host tensor) as an int64 CPU tensor of ``batch`` entries."""
    if lengths is None:
        return torch.full((batch,), default, dtype=torch.int64)
    return torch.tensor(_host_length_values(lengths, batch, what), dtype=torch.int64)


def _attend(query: Tensor, key: Tensor, value: Tensor, allowed: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    """Masked grouped-query attention.

    ``query (B, S, N, Dk)``, ``key (B, P, KVH, Dk)``, ``value (B, P, KVH, Dv)``, ``allowed (B, S, P)``
    bool. Returns the output ``(B, S, N, Dv)`` in the query's dtype and the log-sum-exp
    ``(B, N, S)`` in float32 (``-inf`` for rows with nothing allowed, whose output is 0).
    """
    b, s, n, dk = query.shape
    kvh = key.shape[2]
    if n % kvh:
        raise ValueError(f"{n} query heads are not a multiple of {kvh} KV heads")
    g = n // kvh
    q = query.to(torch.float64).reshape(b, s, kvh, g, dk)
    k = key.to(torch.float64)
    mask = allowed.reshape(b, 1, 1, s, -1)
    # Unused slots may hold anything, NaN included: keep them out of both products.
    anywhere = allowed.any(dim=1).reshape(b, -1, 1, 1)
    k = torch.where(anywhere, k, 0.0)
    v = torch.where(anywhere, value.to(torch.float64), 0.0)
    scores = torch.einsum("bskgd,bpkd->bkgsp", q, k) * scale
    scores = torch.where(mask, scores, float("-inf"))
    peak = scores.amax(dim=-1, keepdim=True)
    peak = torch.where(torch.isfinite(peak), peak, 0.0)
    weights = torch.where(mask, torch.exp(scores - peak), 0.0)
    total = weights.sum(dim=-1, keepdim=True)
    probs = weights / torch.where(total > 0, total, 1.0)
    out = torch.einsum("bkgsp,bpkd->bskgd", probs, v).reshape(b, s, n, -1)
    lse = (peak + torch.log(total)).reshape(b, n, s)
    return out.to(query.dtype), lse.to(torch.float32)


def _positions(capacity: int, device: torch.device) -> Tensor:
    return torch.arange(capacity, dtype=torch.int64, device=device)


# --------------------------------------------------------------------------------------------------
# KV cache fill (invented name; dlinfer fill_kv_cache semantics)


def _fill_kv_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                   kv_start_indices: Tensor, layout: str = "bshd") -> None:
    _check_layout(layout)
    tokens = key.shape[0]
    index = kv_start_indices.reshape(-1).to(torch.int64)
    if index.numel() != tokens:
        raise ValueError(f"kv_start_indices has {index.numel()} slots for {tokens} tokens")
    for src, cache in ((key, key_cache), (value, value_cache)):
        if cache.dim() != 4:
            raise ValueError(f"KV cache must be 4-d ({layout}), got shape {tuple(cache.shape)}")
        if layout == "bshd":
            nb, bs, h, d = cache.shape
            flat = cache.view(nb * bs, h, d)
        else:
            nb, h, bs, d = cache.shape
            flat = cache.transpose(1, 2).reshape(nb * bs, h, d)
        rows = src.reshape(tokens, h, d).to(cache.dtype)
        _masked_slot_write(flat, rows, index)
        if layout == "bhsd":  # flat is a copy for this layout: write it back
            cache.copy_(flat.view(nb, bs, h, d).transpose(1, 2))


def _masked_slot_write(flat: Tensor, rows: Tensor, index: Tensor) -> None:
    """``flat[index[t]] = rows[t]`` for ``index[t] >= 0``; negative slots write nothing.

    Without a host sync: every row is written, padding rows to slot 0 with the value slot 0 has after
    the live writes (its old contents, or the last live row aimed at slot 0), so duplicates agree and
    the result does not depend on the order of the writes.
    """
    if index.numel() == 0:
        return
    live = index >= 0
    safe = index.clamp(min=0)
    to_zero = live & (index == 0)
    order = torch.arange(index.numel(), dtype=torch.int64, device=index.device)
    last = torch.where(to_zero, order, 0).amax().reshape(1)
    slot0_after = torch.where(to_zero.any(), rows.index_select(0, last)[0], flat[0])
    shape = (-1,) + (1,) * (rows.dim() - 1)
    src = torch.where(live.view(shape), rows, slot0_after.unsqueeze(0))
    flat.index_copy_(0, safe, src)


# --------------------------------------------------------------------------------------------------
# Ascend: FIA v1 / v2


def _packed_rows(starts: Sequence[int], lens: Sequence[int], width: int, device: torch.device
                 ) -> tuple[list[tuple[int, int]], Tensor]:
    """Packed tokens as a (sequence, position) grid ``width`` wide: the live (i, j) cells, and for every cell
    the packed row it reads (row 0 for cells past a sequence's end)."""
    valid = [(i, j) for i in range(len(lens)) for j in range(lens[i])]
    pick = torch.zeros(len(lens) * width, dtype=torch.int64)
    for i, j in valid:
        pick[i * width + j] = starts[i] + j
    return valid, pick.to(device)


def _tnd_rows(q_lens: Sequence[int] | Tensor | None, tokens: int) -> tuple[list[int], list[int]]:
    """TND: ``actual_seq_lengths`` are cumulative query ends (a host list or host tensor); per batch row, its
    starts and lengths. The ends must not decrease and must stay within the ``tokens`` rows of the query."""
    if q_lens is None:
        raise ValueError("input_layout TND needs actual_seq_lengths (cumulative query ends, host)")
    ends = [int(v) for v in (q_lens.reshape(-1).tolist() if isinstance(q_lens, Tensor) else q_lens)]
    starts = [0, *ends[:-1]]
    if any(e < s for s, e in zip(starts, ends, strict=True)) or (ends and ends[-1] > tokens):
        raise ValueError(f"TND actual_seq_lengths must be cumulative query ends (non-decreasing, at most the "
                         f"{tokens} query rows), got {ends}")
    return starts, [e - s for s, e in zip(starts, ends, strict=True)]


_FIA_MASK_SIDE = 2048  # sparse_mode 2/3/4 take the optimised (compressed) 2048 x 2048 lower-triangular mask


def _check_compressed_mask(atten_mask: Tensor | None, sparse_mode: int) -> None:
    """FIA doc: sparse_mode 2/3/4 need ``atten_mask`` of shape (2048, 2048), (1, 2048, 2048) or
    (1, 1, 2048, 2048), bool/int8/uint8 (the caller guarantees it is the lower-triangular template)."""
    if atten_mask is None:
        raise ValueError(f"FIA sparse_mode={sparse_mode} needs the optimised {_FIA_MASK_SIDE}x{_FIA_MASK_SIDE} "
                         "atten_mask (True/1 above the diagonal)")
    shape = tuple(atten_mask.shape)
    if atten_mask.dim() not in (2, 3, 4) or shape[-2:] != (_FIA_MASK_SIDE, _FIA_MASK_SIDE) \
            or any(d != 1 for d in shape[:-2]):
        raise ValueError(f"FIA sparse_mode={sparse_mode}: atten_mask must be ({_FIA_MASK_SIDE}, {_FIA_MASK_SIDE}), "
                         f"(1, {_FIA_MASK_SIDE}, {_FIA_MASK_SIDE}) or (1, 1, {_FIA_MASK_SIDE}, {_FIA_MASK_SIDE}), "
                         f"got {shape}")
    if atten_mask.dtype not in (torch.bool, torch.int8, torch.uint8):
        raise TypeError(f"FIA atten_mask must be bool, int8 or uint8, got {atten_mask.dtype}")


def _fia_core(query: Tensor, key: Tensor, value: Tensor, *, query_rope: Tensor | None, key_rope: Tensor | None,
              atten_mask: Tensor | None, q_lens: Sequence[int] | None, kv_lens: Sequence[int] | None,
              block_table: Tensor | None, num_heads: int, num_kv_heads: int, scale: float, layout: str,
              sparse_mode: int, block_size: int, pre_tokens: int, next_tokens: int) -> tuple[Tensor, Tensor]:
    """FIA semantics shared by v1 and v2.

    Layouts: ``BSH`` query ``(B, S, N*D)``, ``BSND`` ``(B, S, N, D)`` (``q_lens``: per-row query
    lengths, default S) and ``TND`` ``(T, N, D)`` (``q_lens``: cumulative query ends, required; not
    paged, key/value are packed ``(T, KVH, D)`` too and ``kv_lens`` their cumulative ends, as post-#350
    dlinfer's FIA prefill passes them), and ``BNSD`` / ``BNSD_NBSD`` ``(B, N, S, D)`` (as BSND; paged caches
    ``(blocks, KVH, block_size, D)``; ``BNSD_NBSD`` returns ``(N, B, S, Dv)``: post-#350 dlinfer's MLA decode).
    Paged (``block_table`` given): key/value are the caches, ``(blocks, block_size, KVH*D)`` or
    ``(blocks, block_size, KVH, D)``. ``kv_lens``: per-row KV lengths
    (default: all positions).
    ``sparse_mode`` 0: ``atten_mask`` (True = masked) and the ``pre_tokens``/``next_tokens`` band
    apply; 3: causal aligned at the bottom right (query row ``i`` of a sequence sees KV positions
    ``j <= i + kv_len - q_len``), ``atten_mask`` being the compressed 2048 x 2048 template (its shape and
    dtype are checked; its contents are not read).
    Returns the output in the query's layout and the LSE ``(B, N, S, 1)`` (``(T, N, 1)`` for TND).
    """
    if layout not in ("BSH", "BSND", "TND", "BNSD", "BNSD_NBSD"):
        raise NotImplementedError(f"emulated FIA supports input_layout BSH, BSND, TND, BNSD and BNSD_NBSD, "
                                  f"not {layout!r}")
    bnsd = layout.startswith("BNSD")
    if bnsd:  # (B, N, S, D) in, as BSND; paged caches (blocks, KVH, block_size, D), as (blocks, block_size, KVH, D)
        query = query.transpose(1, 2)
        query_rope = None if query_rope is None else query_rope.transpose(1, 2)
        key, value = key.transpose(1, 2), value.transpose(1, 2)
        key_rope = None if key_rope is None else key_rope.transpose(1, 2)
    if sparse_mode not in (0, 3):
        raise NotImplementedError(f"emulated FIA supports sparse_mode 0 and 3, not {sparse_mode}")
    if sparse_mode == 3:
        _check_compressed_mask(atten_mask, sparse_mode)
    num_kv_heads = num_kv_heads or num_heads
    device = query.device
    if layout == "TND":
        starts, per_row = _tnd_rows(q_lens, query.shape[0])
        b, s = len(per_row), max(per_row, default=0) or 1
        valid, pick = _packed_rows(starts, per_row, s, device)

        def batched(x: Tensor) -> Tensor:
            return x.reshape(x.shape[0], num_heads, -1).index_select(0, pick).reshape(b, s, num_heads, -1)

        q = batched(query)
        if query_rope is not None:
            q = torch.cat((q, batched(query_rope).to(q.dtype)), dim=-1)
        ql = torch.tensor(per_row, dtype=torch.int64, device=device)
    else:
        b, s = query.shape[:2]
        q = query.reshape(b, s, num_heads, -1)
        if query_rope is not None:
            q = torch.cat((q, query_rope.reshape(b, s, num_heads, -1).to(q.dtype)), dim=-1)
        ql = _host_lengths(q_lens, b, s, "actual_seq_lengths").to(device).clamp(max=s)

    kv_values = None if kv_lens is None else _host_length_values(kv_lens, b, "actual_seq_lengths_kv")
    if layout == "TND" and block_table is None:  # packed keys too: actual_seq_lengths_kv are cumulative ends
        kv_starts, kv_values = _tnd_rows(kv_lens, key.shape[0])
        if len(kv_values) != b:
            raise ValueError(f"TND actual_seq_lengths_kv has {len(kv_values)} entries for {b} query sequences")
        width = max(kv_values, default=0) or 1
        _, kv_pick = _packed_rows(kv_starts, kv_values, width, device)

        def packed(x: Tensor) -> Tensor:
            return x.reshape(x.shape[0], num_kv_heads, -1).index_select(0, kv_pick).reshape(b, width, num_kv_heads, -1)

        k, v = packed(key), packed(value)
        if key_rope is not None:
            k = torch.cat((k, packed(key_rope).to(k.dtype)), dim=-1)
    elif block_table is not None:
        if block_size <= 0:
            raise ValueError("paged FIA (block_table given) needs block_size > 0")
        longest = None if kv_values is None else max(kv_values, default=0)

        def blocks(x: Tensor) -> Tensor:
            return x if x.dim() == 4 else x.reshape(x.shape[0], block_size, num_kv_heads, -1)

        k = gather_paged(blocks(key), block_table, longest=longest)
        v = gather_paged(blocks(value), block_table, longest=longest)
        if key_rope is not None:
            k = torch.cat((k, gather_paged(blocks(key_rope), block_table, longest=longest).to(k.dtype)), dim=-1)
    else:
        k = key.reshape(b, key.shape[1], num_kv_heads, -1)
        v = value.reshape(b, value.shape[1], num_kv_heads, -1)
        if key_rope is not None:
            k = torch.cat((k, key_rope.reshape(b, key_rope.shape[1], num_kv_heads, -1).to(k.dtype)), dim=-1)
    capacity = k.shape[1]
    kv = _host_lengths(kv_values, b, capacity, "actual_seq_lengths_kv").to(device).clamp(max=capacity)
    pos = _positions(capacity, device).view(1, 1, capacity)
    row = _positions(s, device).view(1, s, 1)
    allowed = (pos < kv.view(b, 1, 1)) & (row < ql.view(b, 1, 1))
    if sparse_mode == 3:  # causal, aligned at the bottom right of each (q_len, kv_len) rectangle
        allowed &= pos <= (kv - ql).view(b, 1, 1) + row
    else:
        if atten_mask is not None:
            m = atten_mask.to(torch.bool)
            m = m.reshape(m.shape[0], *m.shape[-2:]) if m.dim() == 4 else m
            width = m.shape[-1]
            if width >= capacity:
                m = m[..., :capacity]
            else:
                m = torch.nn.functional.pad(m, (0, capacity - width), value=False)
            allowed &= ~m[..., :s, :]
        if pre_tokens < _INT_MAX or next_tokens < _INT_MAX:  # band around the bottom-right diagonal
            diag = (kv - ql).view(b, 1, 1) + row
            allowed &= (pos >= diag - pre_tokens) & (pos <= diag + next_tokens)
    out, lse = _attend(q, k, v, allowed, scale)
    if layout == "TND":
        dv = out.shape[-1]
        result = query.new_zeros(query.shape[0], num_heads, dv)
        lse_t = torch.full((query.shape[0], num_heads, 1), float("-inf"), dtype=torch.float32, device=device)
        if valid:
            src = torch.tensor([i * s + j for i, j in valid], dtype=torch.int64, device=device)
            dst = torch.tensor([starts[i] + j for i, j in valid], dtype=torch.int64, device=device)
            result.index_copy_(0, dst, out.reshape(b * s, num_heads, dv).index_select(0, src))
            lse_t.index_copy_(0, dst, lse.transpose(1, 2).reshape(b * s, num_heads, 1).index_select(0, src))
        return result, lse_t
    if bnsd:  # BNSD_NBSD: (N, B, S, Dv) out
        return (out.permute(2, 0, 1, 3) if layout == "BNSD_NBSD" else out.transpose(1, 2)), lse.unsqueeze(-1)
    return (out.reshape(b, s, -1) if layout == "BSH" else out), lse.unsqueeze(-1)


def _fia_out_shape(query: Tensor, value: Tensor, num_heads: int, num_kv_heads: int, layout: str) -> tuple[int, ...]:
    if layout.startswith("BNSD"):
        b, n, s, dv = query.shape[0], query.shape[1], query.shape[2], value.shape[-1]
        return (n, b, s, dv) if layout == "BNSD_NBSD" else (b, n, s, dv)
    b, s = query.shape[:2]
    num_kv_heads = num_kv_heads or num_heads
    dv = value.shape[-1] if value.dim() == 4 else value.shape[-1] // num_kv_heads
    if layout == "TND":
        return (query.shape[0], num_heads, dv)
    return (b, s, num_heads * dv) if layout == "BSH" else (b, s, num_heads, dv)


def _lse_shape(query: Tensor, num_heads: int, flag: bool, layout: str) -> tuple[int, ...]:
    if not flag:
        return (1,)
    if layout.startswith("BNSD"):
        return (query.shape[0], num_heads, query.shape[2], 1)
    return (query.shape[0], num_heads, 1) if layout == "TND" else (query.shape[0], num_heads, query.shape[1], 1)


_FIA_V1_KWARGS = (
    "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, "
    "SymInt[]? actual_seq_lengths_kv=None, Tensor? block_table=None, int num_heads=1, float scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", "
    "int num_key_value_heads=0, int sparse_mode=0, int block_size=0, bool softmax_lse_flag=False, "
    "Tensor? query_rope=None, Tensor? key_rope=None"
)


def _fia_v1(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
            actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0, pre_tokens=_INT_MAX,
            next_tokens=_INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0, block_size=0,
            softmax_lse_flag=False, query_rope=None, key_rope=None):
    if pse_shift is not None:
        raise NotImplementedError("emulated FIA: pse_shift is not supported")
    out, lse = _fia_core(query, key, value, query_rope=query_rope, key_rope=key_rope, atten_mask=atten_mask,
                         q_lens=actual_seq_lengths, kv_lens=actual_seq_lengths_kv, block_table=block_table,
                         num_heads=num_heads, num_kv_heads=num_key_value_heads, scale=scale, layout=input_layout,
                         sparse_mode=sparse_mode, block_size=block_size, pre_tokens=pre_tokens,
                         next_tokens=next_tokens)
    return out, (lse if softmax_lse_flag else torch.zeros(1, dtype=torch.float32, device=query.device))


def _fia_v1_out(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0, pre_tokens=_INT_MAX,
                next_tokens=_INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0, block_size=0,
                softmax_lse_flag=False, query_rope=None, key_rope=None, workspace=None, attention_out, softmax_lse):
    out, lse = _fia_v1(query, key, value, pse_shift=pse_shift, atten_mask=atten_mask, query_rope=query_rope,
                       key_rope=key_rope,
                       actual_seq_lengths=actual_seq_lengths, actual_seq_lengths_kv=actual_seq_lengths_kv,
                       block_table=block_table, num_heads=num_heads, scale=scale, pre_tokens=pre_tokens,
                       next_tokens=next_tokens, input_layout=input_layout, num_key_value_heads=num_key_value_heads,
                       sparse_mode=sparse_mode, block_size=block_size, softmax_lse_flag=softmax_lse_flag)
    attention_out.copy_(out.reshape(attention_out.shape))
    if softmax_lse_flag:
        softmax_lse.copy_(lse.reshape(softmax_lse.shape))
    return attention_out, softmax_lse


def _fia_v1_fake(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
                 actual_seq_lengths_kv=None, block_table=None, num_heads=1, scale=1.0, pre_tokens=_INT_MAX,
                 next_tokens=_INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0, block_size=0,
                 softmax_lse_flag=False, query_rope=None, key_rope=None):
    shape = _fia_out_shape(query, value, num_heads, num_key_value_heads, input_layout)
    return query.new_empty(shape), query.new_empty(_lse_shape(query, num_heads, softmax_lse_flag, input_layout),
                                                   dtype=torch.float32)


def _fia_v1_out_fake(query, key, value, *, attention_out, softmax_lse, **kwargs):
    return attention_out, softmax_lse


_FIA_V2_KWARGS = (
    "Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? atten_mask=None, "
    "SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, Tensor? block_table=None, "
    "int num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, "
    "int pre_tokens=2147483647, int next_tokens=2147483647, str input_layout=\"BSH\", int sparse_mode=0, "
    "int block_size=0, bool return_softmax_lse=False"
)


def _fia_v2(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
            actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None, num_query_heads=1, num_key_value_heads=0,
            softmax_scale=1.0, pre_tokens=_INT_MAX, next_tokens=_INT_MAX, input_layout="BSH", sparse_mode=0,
            block_size=0, return_softmax_lse=False):
    if pse_shift is not None:
        raise NotImplementedError("emulated FIA v2: pse_shift is not supported")
    out, lse = _fia_core(query, key, value, query_rope=query_rope, key_rope=key_rope, atten_mask=atten_mask,
                         q_lens=actual_seq_qlen, kv_lens=actual_seq_kvlen, block_table=block_table,
                         num_heads=num_query_heads, num_kv_heads=num_key_value_heads, scale=softmax_scale,
                         layout=input_layout, sparse_mode=sparse_mode, block_size=block_size,
                         pre_tokens=pre_tokens, next_tokens=next_tokens)
    return out, (lse if return_softmax_lse else torch.zeros(1, dtype=torch.float32, device=query.device))


def _fia_v2_out(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
                actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None, num_query_heads=1,
                num_key_value_heads=0, softmax_scale=1.0, pre_tokens=_INT_MAX, next_tokens=_INT_MAX,
                input_layout="BSH", sparse_mode=0, block_size=0, return_softmax_lse=False, workspace=None,
                attention_out, softmax_lse):
    out, lse = _fia_v2(query, key, value, query_rope=query_rope, key_rope=key_rope, pse_shift=pse_shift,
                       atten_mask=atten_mask, actual_seq_qlen=actual_seq_qlen, actual_seq_kvlen=actual_seq_kvlen,
                       block_table=block_table, num_query_heads=num_query_heads,
                       num_key_value_heads=num_key_value_heads, softmax_scale=softmax_scale, pre_tokens=pre_tokens,
                       next_tokens=next_tokens, input_layout=input_layout, sparse_mode=sparse_mode,
                       block_size=block_size, return_softmax_lse=return_softmax_lse)
    attention_out.copy_(out.reshape(attention_out.shape))
    if return_softmax_lse:
        softmax_lse.copy_(lse.reshape(softmax_lse.shape))
    return attention_out, softmax_lse


def _fia_v2_fake(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
                 actual_seq_qlen=None, actual_seq_kvlen=None, block_table=None, num_query_heads=1,
                 num_key_value_heads=0, softmax_scale=1.0, pre_tokens=_INT_MAX, next_tokens=_INT_MAX,
                 input_layout="BSH", sparse_mode=0, block_size=0, return_softmax_lse=False):
    shape = _fia_out_shape(query, value, num_query_heads, num_key_value_heads, input_layout)
    return query.new_empty(shape), query.new_empty(_lse_shape(query, num_query_heads, return_softmax_lse, input_layout),
                                                   dtype=torch.float32)


# --------------------------------------------------------------------------------------------------
# Ascend: MLA (npu) and ATB paged attention


_MLA_ARGS = (
    "Tensor q_nope, Tensor q_rope, Tensor ctkv, Tensor k_rope, Tensor block_tables, SymInt[] context_lens, "
    "int q_headnum, float qk_scale, int kv_headnum, *, Tensor? mask=None, SymInt[]? qseqlen=None, "
    "Tensor? qk_descale=None, Tensor? pv_descale=None, str? mask_type=None, str? calc_type=None, "
    "str? cache_mode=None"
)


def _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, *,
         mask=None, qseqlen=None, qk_descale=None, pv_descale=None, mask_type=None, calc_type=None, cache_mode=None):
    if mask is not None or qseqlen is not None or qk_descale is not None or pv_descale is not None:
        raise NotImplementedError("emulated MLA: decode only (no mask, qseqlen or descale)")
    if cache_mode not in (None, "krope_ctkv"):
        raise NotImplementedError(f"emulated MLA: ND caches only (cache_mode None/'krope_ctkv'), not {cache_mode!r}")
    b = q_nope.shape[0]
    q = torch.cat((q_nope.reshape(b, q_headnum, -1), q_rope.reshape(b, q_headnum, -1).to(q_nope.dtype)), dim=-1)
    values = _host_length_values(context_lens, b, "context_lens")
    longest = max(values, default=0)
    c = gather_paged(ctkv.reshape(*ctkv.shape[:2], kv_headnum, -1), block_tables, longest=longest)
    kr = gather_paged(k_rope.reshape(*k_rope.shape[:2], kv_headnum, -1), block_tables, longest=longest)
    k = torch.cat((c, kr.to(c.dtype)), dim=-1)
    lens = torch.tensor(values, dtype=torch.int64, device=q.device)
    allowed = (_positions(c.shape[1], q.device).view(1, 1, -1) < lens.view(b, 1, 1))
    out, _ = _attend(q.unsqueeze(1), k, c, allowed, qk_scale)
    return out.squeeze(1)


def _mla_out(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, *,
             mask=None, qseqlen=None, qk_descale=None, pv_descale=None, mask_type=None, calc_type=None,
             cache_mode=None, attn_out):
    out = _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum,
               mask=mask, qseqlen=qseqlen, qk_descale=qk_descale, pv_descale=pv_descale, mask_type=mask_type,
               calc_type=calc_type, cache_mode=cache_mode)
    attn_out.copy_(out.reshape(attn_out.shape))
    return attn_out


def _mla_fake(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, qk_scale, kv_headnum, **kwargs):
    return q_nope.new_empty((q_nope.shape[0], q_headnum, ctkv.shape[-1] if ctkv.dim() == 4 else
                             ctkv.shape[-1] // kv_headnum))


def _mla_out_fake(*args, attn_out, **kwargs):
    return attn_out


def _paged_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor, lengths: Tensor,
                  scale: float, layout: str, longest: int | None) -> Tensor:
    """Decode attention over a paged cache, ``query (B, N, D)``, lengths a ``(B,)`` tensor, ``longest`` a host
    bound on them (``None``: none known on the host)."""
    b = query.shape[0]
    k = gather_paged(key_cache, block_table, layout, longest)
    v = gather_paged(value_cache, block_table, layout, longest)
    lens = lengths.reshape(-1).to(device=query.device, dtype=torch.int64)
    allowed = _positions(k.shape[1], query.device).view(1, 1, -1) < lens.view(b, 1, 1)
    out, _ = _attend(query.reshape(b, 1, query.shape[1], -1), k, v, allowed, scale)
    return out.squeeze(1)


def _atb_paged_attention(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table,
                         context_lens, out):
    values = _host_length_values(context_lens, query.shape[0], "context_lens")
    kc = key_cache.reshape(*key_cache.shape[:2], num_kv_heads, -1)
    vc = value_cache.reshape(*value_cache.shape[:2], num_kv_heads, -1)
    res = _paged_decode(query.reshape(query.shape[0], num_heads, -1), kc, vc, block_table,
                        torch.tensor(values, dtype=torch.int64), scale_value, "bshd", max(values, default=0))
    out.copy_(res.reshape(out.shape))


def _atb_paged_attention_mla(query, key_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens,
                             mla_vheadsize, out):
    values = _host_length_values(context_lens, query.shape[0], "context_lens")
    kc = key_cache.reshape(*key_cache.shape[:2], num_kv_heads, -1)
    res = _paged_decode(query.reshape(query.shape[0], num_heads, -1), kc, kc[..., :mla_vheadsize], block_table,
                        torch.tensor(values, dtype=torch.int64), scale_value, "bshd", max(values, default=0))
    out.copy_(res.reshape(out.shape))


# --------------------------------------------------------------------------------------------------
# Camb and MACA decode attention (invented names)


def _camb_decode(query, key_cache, value_cache, block_table, kv_seqlens, max_kv_seq_len, softmax_scale):
    lens = kv_seqlens.reshape(-1).to(torch.int64)
    if max_kv_seq_len > 0:
        # The kernel walks only max_kv_seq_len positions: a value frozen at capture that is smaller
        # than a later length silently drops the tail of that sequence.
        lens = lens.clamp(max=max_kv_seq_len)
    return _paged_decode(query, key_cache, value_cache, block_table, lens, softmax_scale, "bhsd",
                         max_kv_seq_len if max_kv_seq_len > 0 else None)


def _maca_decode(query, key_cache, value_cache, block_table, kv_seqlens, softmax_scale):
    return _paged_decode(query, key_cache, value_cache, block_table, kv_seqlens, softmax_scale, "bshd", None)


def _no_output(*args, **kwargs) -> None:
    return None


def _decode_fake(query, key_cache, value_cache, *args, **kwargs):
    return query.new_empty((*query.shape[:-1], value_cache.shape[-1]))


# --------------------------------------------------------------------------------------------------
# Ascend: the decoder-layer kernels dlinfer calls besides decode attention (norms, SwiGLU, rotary
# embedding, KV-cache fill, prefill attention). Semantics: docs/ascend_kernel_facts.md.
#
# Range checks on index data (a slot past the cache, a scatter index outside ``self``) are what a device
# assert would report: on CPU tensors (the simulator's device data) they read the index tensor when the
# op runs (at replay for a captured graph), elsewhere they are asynchronous asserts (no host sync).


def _raise_if_any(bad: Tensor, describe) -> None:
    """Raise ``RuntimeError(describe(first flat position where bad))`` when ``bad`` has any True entry."""
    if bad.numel() == 0:
        return
    if bad.device.type == "cpu":
        flat = bad.reshape(-1)
        if bool(flat.any()):
            raise RuntimeError(describe(int(flat.to(torch.uint8).argmax())))
    else:
        torch._assert_async(~bad.any(), describe(None))


def _rms_normed(x: Tensor, gamma: Tensor, epsilon: float, what: str) -> tuple[Tensor, Tensor]:
    """``(x / sqrt(mean(x^2) + eps) * gamma, rstd)`` over the trailing dims gamma covers; float32 math,
    ``y`` in x's dtype, ``rstd`` float32 with the normalised dims kept at size 1."""
    g = gamma.dim()
    if g == 0 or g > x.dim() or tuple(x.shape[x.dim() - g:]) != tuple(gamma.shape):
        raise RuntimeError(f"{what}: gamma {tuple(gamma.shape)} must equal the trailing dims of the input "
                           f"{tuple(x.shape)}")
    dims = tuple(range(x.dim() - g, x.dim()))
    xf = x.to(torch.float32)
    rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.to(torch.float32)).to(x.dtype), rstd


def _rstd_shape(x: Tensor, gamma: Tensor) -> tuple[int, ...]:
    lead = x.dim() - gamma.dim()
    return tuple(x.shape[:lead]) + (1,) * gamma.dim()


def _npu_rms_norm(self, gamma, epsilon=1e-6):
    return _rms_normed(self, gamma, epsilon, "npu_rms_norm")


def _npu_rms_norm_fake(self, gamma, epsilon=1e-6):
    return self.new_empty(self.shape), self.new_empty(_rstd_shape(self, gamma), dtype=torch.float32)


def _npu_add_rms_norm(x1, x2, gamma, epsilon=1e-6):
    x = (x1 + x2).to(x1.dtype)  # the sum in x1's dtype (fp16 sum, then fp32 for the norm)
    y, rstd = _rms_normed(x, gamma, epsilon, "npu_add_rms_norm")
    return y, rstd, x


def _npu_add_rms_norm_fake(x1, x2, gamma, epsilon=1e-6):
    return (x1.new_empty(x1.shape), x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32),
            x1.new_empty(x1.shape))


def _swiglu_dim(x: Tensor, dim: int) -> int:
    if x.numel() == 0:
        raise RuntimeError("npu_swiglu: the input must not be empty")
    d = dim % x.dim()
    if x.shape[d] % 2:
        raise RuntimeError(f"npu_swiglu: dim {dim} of {tuple(x.shape)} must have an even size")
    return d


def _npu_swiglu(self, dim=-1):
    a, b = self.chunk(2, _swiglu_dim(self, dim))  # A (first half) goes through SiLU
    return (torch.nn.functional.silu(a.to(torch.float32)) * b.to(torch.float32)).to(self.dtype)


def _npu_swiglu_fake(self, dim=-1):
    d = _swiglu_dim(self, dim)
    shape = list(self.shape)
    shape[d] //= 2
    return self.new_empty(shape)


_ROTARY_MODES = ("half", "quarter", "interleave")


def _check_rotary(query: Tensor, key: Tensor, cos: Tensor, sin: Tensor, layout: str, rotary_mode: str) -> None:
    """The binding's checks and the A2/A3 constraints of the op-plugin doc."""
    if rotary_mode not in _ROTARY_MODES:
        raise RuntimeError(f"npu_apply_rotary_pos_emb: rotary_mode should be half/quarter/interleave, got "
                           f"{rotary_mode!r}")
    if rotary_mode != "half":
        raise NotImplementedError(f"emulated npu_apply_rotary_pos_emb: A2/A3 support rotary_mode 'half' only, "
                                  f"not {rotary_mode!r}")
    if layout in ("SBND", "BNSD"):
        raise NotImplementedError(f"emulated npu_apply_rotary_pos_emb: A2/A3 support layouts BSND and TND, not "
                                  f"{layout!r}")
    rank = 3 if layout == "TND" else 4  # any other string is BSND, as in the binding
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        if t.dim() != rank:
            raise RuntimeError(f"npu_apply_rotary_pos_emb: {name} must be {rank}-d for layout {layout!r}, got "
                               f"{tuple(t.shape)}")
        if t.numel() == 0:
            raise RuntimeError(f"npu_apply_rotary_pos_emb: {name} must not be empty (A2/A3)")
        if t.dtype != query.dtype:
            raise RuntimeError(f"npu_apply_rotary_pos_emb: query, key, cos and sin must share a dtype; {name} is "
                               f"{t.dtype}, query {query.dtype}")
    d = query.shape[-1]
    if d not in (64, 128):
        raise RuntimeError(f"npu_apply_rotary_pos_emb: the head dim must be 64 or 128 on A2/A3, got {d}")
    lead = tuple(query.shape[:-2])
    if key.shape[-1] != d or tuple(key.shape[:-2]) != lead:
        raise RuntimeError(f"npu_apply_rotary_pos_emb: key {tuple(key.shape)} does not match query "
                           f"{tuple(query.shape)} outside the head count")
    expected = (*lead, 1, d)
    if tuple(cos.shape) != expected or tuple(sin.shape) != expected:
        raise RuntimeError(f"npu_apply_rotary_pos_emb: cos and sin must be {expected}, got {tuple(cos.shape)} and "
                           f"{tuple(sin.shape)}")


def _rotate_half(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    xf = x.to(torch.float32)
    half = x.shape[-1] // 2
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos.to(torch.float32) + rotated * sin.to(torch.float32)).to(x.dtype)


def _npu_apply_rotary_pos_emb(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    _check_rotary(query, key, cos, sin, layout, rotary_mode)
    q, k = _rotate_half(query, cos, sin), _rotate_half(key, cos, sin)
    query.copy_(q)
    key.copy_(k)
    return query, key


def _npu_apply_rotary_pos_emb_fake(query, key, cos, sin, layout="BSND", rotary_mode="half"):
    _check_rotary(query, key, cos, sin, layout, rotary_mode)
    return query, key


def _check_reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                             slot_indices: Tensor) -> None:
    """ATB ReshapeAndCache's host checks (ND caches, ``K_CACHE_V_CACHE``) and its tiling's ``numTokens > 0``."""
    what = "_npu_reshape_and_cache"
    if key.dim() != 3 or value.dim() != 3 or key_cache.dim() != 4 or value_cache.dim() != 4:
        raise RuntimeError(f"{what}: key/value must be 3-d [tokens, heads, dim] and the caches 4-d [blocks, "
                           f"block_size, heads, dim], got {tuple(key.shape)}, {tuple(value.shape)}, "
                           f"{tuple(key_cache.shape)}, {tuple(value_cache.shape)}")
    if slot_indices.dim() != 1:
        raise RuntimeError(f"{what}: slot_indices must be 1-d [tokens], got {tuple(slot_indices.shape)}")
    if slot_indices.dtype != torch.int32:
        raise RuntimeError(f"{what}: slot_indices must be int32, got {slot_indices.dtype}")
    tokens = key.shape[0]
    if tokens == 0:
        raise RuntimeError(f"{what}: num_tokens must be > 0 (an empty input is an error in ATB's tiling)")
    if value.shape[0] != tokens or slot_indices.shape[0] != tokens:
        raise RuntimeError(f"{what}: key, value and slot_indices disagree on num_tokens: {key.shape[0]}, "
                           f"{value.shape[0]}, {slot_indices.shape[0]}")
    heads = key.shape[1]
    if value.shape[1] != heads or key_cache.shape[2] != heads or value_cache.shape[2] != heads:
        raise RuntimeError(f"{what}: the head counts of key, value and the caches differ")
    if key_cache.shape[:2] != value_cache.shape[:2]:
        raise RuntimeError(f"{what}: the caches differ in num_blocks/block_size: {tuple(key_cache.shape)} and "
                           f"{tuple(value_cache.shape)}")
    if key_cache.shape[3] != key.shape[2] or value_cache.shape[3] != value.shape[2]:
        raise RuntimeError(f"{what}: head sizes differ between key/value and their caches")
    if not (key.dtype == value.dtype == key_cache.dtype == value_cache.dtype):
        raise RuntimeError(f"{what}: key, value and both caches must share a dtype, got {key.dtype}, {value.dtype},"
                           f" {key_cache.dtype}, {value_cache.dtype}")


def _repeated_slots(slots: Tensor) -> Tensor:
    """Per token: its non-negative slot is also the slot of an earlier token of the same call (no host sync)."""
    order = torch.argsort(slots, stable=True)
    ranked = slots.index_select(0, order)
    later = torch.zeros_like(ranked, dtype=torch.bool)
    later[1:] = (ranked[1:] == ranked[:-1]) & (ranked[1:] >= 0)
    return torch.zeros_like(later).index_copy_(0, order, later)


def _atb_reshape_and_cache(key, value, key_cache, value_cache, slot_indices):
    """Rules (docs/ascend_kernel_facts.md, "Rules the emulators enforce"): ATB's ReshapeAndCacheParam table
    gives slotMapping the open range (-num_blocks*block_size, num_blocks*block_size) "and no repeated values";
    the kernels skip a negative slot. A slot outside the range is refused when the op runs (at replay for a
    captured graph). A non-negative slot that two tokens share is written, but its contents are undefined ("重复时
    不保证正确性", correctness not guaranteed when values repeat): the emulator leaves a value none of those tokens
    wrote (their rows' sum plus one), so a later read of that slot gives wrong numbers, while a call that never
    reads it back (lmdeploy's warmup prefill, whose dummy block table sends every token to slot 0) runs. Several
    negative slots (every -1 of a padded graph, as dlinfer's own runner and vllm-ascend pad) write nothing,
    though the table read literally counts them as repeats too."""
    _check_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)
    nb, bs, heads = key_cache.shape[:3]
    capacity = nb * bs
    slots = slot_indices.to(torch.int64)
    _raise_if_any(slots >= capacity, lambda t: (
        f"_npu_reshape_and_cache: slot {int(slots[t]) if t is not None else '?'} (token {t}) is past the cache "
        f"(num_blocks*block_size = {capacity})"))
    _raise_if_any(slots <= -capacity, lambda t: (
        f"_npu_reshape_and_cache: slot {int(slots[t]) if t is not None else '?'} (token {t}) is below the "
        f"documented range (-{capacity}, {capacity}) (-num_blocks*block_size is excluded)"))
    repeated = _repeated_slots(slots)
    for src, cache in ((key, key_cache), (value, value_cache)):
        flat = cache.view(capacity, heads, cache.shape[-1])  # in place: the cache must be viewable flat
        _masked_slot_write(flat, src, slots)  # a negative slot writes nothing
        if repeated.device.type == "cpu" and bool(repeated.any()):  # (inside the emulated kernel: no host sync)
            for slot in slots[repeated].unique().tolist():
                flat[slot] = src[slots == slot].sum(dim=0) + 1


def _atb_reshape_and_cache_fake(key, value, key_cache, value_cache, slot_indices):
    _check_reshape_and_cache(key, value, key_cache, value_cache, slot_indices)


def _check_scatter_nd(self: Tensor, indices: Tensor, updates: Tensor) -> int:
    what = "npu_scatter_nd_update_"
    if indices.dtype not in (torch.int32, torch.int64):
        raise RuntimeError(f"{what}: indices must be int32 or int64, got {indices.dtype}")
    if indices.dim() < 2:
        raise RuntimeError(f"{what}: indices must be at least 2-d, got {tuple(indices.shape)}")
    a = indices.shape[-1]
    if not 1 <= a <= self.dim():
        raise RuntimeError(f"{what}: the last dim of indices ({a}) must be in [1, self.dim() = {self.dim()}]")
    expected = (*indices.shape[:-1], *self.shape[a:])
    if tuple(updates.shape) != expected:
        raise RuntimeError(f"{what}: updates must be indices.shape[:-1] + self.shape[{a}:] = {expected}, got "
                           f"{tuple(updates.shape)}")
    if updates.dtype != self.dtype:
        raise RuntimeError(f"{what}: updates ({updates.dtype}) and self ({self.dtype}) must share a dtype")
    return a


def _npu_scatter_nd_update_(self, indices, updates):
    a = _check_scatter_nd(self, indices, updates)
    idx = indices.reshape(-1, a).to(torch.int64)
    rows = idx.shape[0]
    if rows == 0:
        return self
    sizes = torch.tensor(self.shape[:a], dtype=torch.int64, device=idx.device)
    bad = ((idx < 0) | (idx >= sizes)).any(dim=-1)

    def describe(n):
        at = "?" if n is None else (int(idx[n, 0]) if a == 1 else idx[n].tolist())
        return (f"npu_scatter_nd_update_: index {at} at indices row {n} is outside self's leading dims "
                f"{tuple(self.shape[:a])} (out-of-range indices, -1 padding included, are unsupported)")

    _raise_if_any(bad, describe)
    # Repeated indices: the docs neither forbid them nor say which update wins (aclnnScatterNdUpdate states a
    # deterministic implementation; torch_npu's own example draws repeating random indices). Modelled as the
    # last update winning, order-independently: every row aimed at an index writes that index's last update.
    same = (idx.unsqueeze(1) == idx.unsqueeze(0)).all(-1)  # (rows, rows)
    order = torch.arange(rows, dtype=torch.int64, device=idx.device)
    winner = torch.where(same, order.unsqueeze(0), -1).amax(dim=1)
    src = updates.reshape(rows, *self.shape[a:]).index_select(0, winner)
    self.index_put_(tuple(idx[:, k] for k in range(a)), src)
    return self


def _npu_scatter_nd_update_fake(self, indices, updates):
    _check_scatter_nd(self, indices, updates)
    return self


def _prefill_batch(seq_len: Tensor, tokens: int, what: str) -> tuple[list[int], list[int]]:
    """Per-sequence starts and lengths from ATB's host ``seq_len`` (int32 ``[batch]``) over packed tokens."""
    if not isinstance(seq_len, Tensor) or seq_len.dtype != torch.int32 or seq_len.dim() != 1:
        raise RuntimeError(f"{what}: seq_len must be a 1-d int32 host tensor [batch]")
    lens = [int(v) for v in seq_len.tolist()]
    if any(n < 0 for n in lens) or sum(lens) > tokens:
        raise RuntimeError(f"{what}: seq_len {lens} does not fit the {tokens} packed query tokens")
    starts = [0]
    for n in lens[:-1]:
        starts.append(starts[-1] + n)
    return starts, lens


def _self_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, seq_len: Tensor, scale: float,
                    num_heads: int, num_kv_heads: int, out: Tensor, what: str) -> None:
    """ATB SelfAttention PA_ENCODER over packed tokens: sequence ``b`` is rows ``[start_b, start_b + len_b)`` of
    query/key/value (``[T, heads, D]`` or ``[T, heads*D]``) and attends within itself only. With a mask
    (``MASK_TYPE_NORM``), each sequence uses the top-left ``[len_b, len_b]`` window of the mask
    (``[S, S]``, ``[1 or B, S, S]`` or ``[1 or B, 1, S, S]``), a non-zero entry meaning masked; without one,
    every position of a sequence is visible. Rows past ``sum(seq_len)`` of ``out`` are not written."""
    num_kv_heads = num_kv_heads or num_heads
    if num_heads <= 0 or num_heads % num_kv_heads:
        raise RuntimeError(f"{what}: num_heads ({num_heads}) must be a positive multiple of num_kv_heads "
                           f"({num_kv_heads})")
    tokens = query.shape[0]
    if key.shape[0] != tokens or value.shape[0] != tokens or out.shape[0] != tokens:
        raise RuntimeError(f"{what}: query, key, value and out must share the token count {tokens}")
    starts, lens = _prefill_batch(seq_len, tokens, what)
    q = query.reshape(tokens, num_heads, -1)
    k = key.reshape(tokens, num_kv_heads, -1)
    v = value.reshape(tokens, num_kv_heads, -1)
    dv = v.shape[-1]
    if out.numel() != tokens * num_heads * dv:
        raise RuntimeError(f"{what}: out {tuple(out.shape)} cannot hold [{tokens}, {num_heads}, {dv}]")
    b, s = len(lens), max(lens, default=0)
    if b == 0 or s == 0:
        return
    device = query.device
    valid, pick = _packed_rows(starts, lens, s, device)

    def batched(x: Tensor) -> Tensor:
        return x.index_select(0, pick).reshape(b, s, x.shape[1], x.shape[2])

    pos = _positions(s, device)
    ln = torch.tensor(lens, dtype=torch.int64, device=device).view(b, 1, 1)
    allowed = (pos.view(1, s, 1) < ln) & (pos.view(1, 1, s) < ln)
    if mask is not None:
        m = mask.reshape(-1, *mask.shape[-2:]) if mask.dim() > 2 else mask.unsqueeze(0)
        if m.shape[0] not in (1, b) or m.shape[-2] < s or m.shape[-1] < s:
            raise RuntimeError(f"{what}: mask {tuple(mask.shape)} does not cover {b} sequences of up to {s} tokens")
        allowed &= m[:, :s, :s] == 0
    res, _ = _attend(batched(q), batched(k), batched(v), allowed, scale)
    src = torch.tensor([i * s + j for i, j in valid], dtype=torch.int64, device=device)
    dst = torch.tensor([starts[i] + j for i, j in valid], dtype=torch.int64, device=device)
    result = out.reshape(tokens, num_heads, dv).clone()
    result.index_copy_(0, dst, res.reshape(b * s, num_heads, dv).index_select(0, src).to(out.dtype))
    out.copy_(result.reshape(out.shape))


def _atb_flash_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out):
    _self_attention(query, key, value, mask, seq_len, scale_value, num_heads, num_kv_heads, out,
                    "_npu_flash_attention")


def _atb_flash_attention_unpad(query, key, value, seq_len, scale_value, num_heads, num_kv_heads, out):
    _self_attention(query, key, value, None, seq_len, scale_value, num_heads, num_kv_heads, out,
                    "_npu_flash_attention_unpad")


# --------------------------------------------------------------------------------------------------
# registration


def _exists(namespace: str, name: str, overload: str) -> bool:
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
    except (AttributeError, RuntimeError):
        return False
    return overload in packet.overloads()


def _register(namespace: str, schema: str, kernel, fake) -> None:
    head = schema.split("(", 1)[0]
    name, _, overload = head.partition(".")
    qualname = f"{namespace}::{head}"
    if _exists(namespace, name, overload or "default"):
        return  # a real implementation (or an earlier import of this module) owns it
    lib = _lib(namespace)
    lib.define(schema)
    lib.impl(head, kernel, "CPU")
    lib.impl(head, kernel, "CUDA")  # the same composite math on a GPU (real-graph conformance)
    torch.library.register_fake(qualname, fake, lib=lib)
    REGISTERED.append(qualname)
    _DEVICE_IMPLS.append((lib, head, kernel))


_DEVICE_IMPLS: list = []


def register_for(dispatch_key: str) -> None:
    """Also run the emulated operators on ``dispatch_key`` (``"PrivateUse1"`` for a real NPU). Not done
    at import: on the simulator, PrivateUse1 is the simulated device, whose tensors unwrap to CPU."""
    for lib, head, kernel in _DEVICE_IMPLS:
        lib.impl(head, kernel, dispatch_key)


def register() -> list[str]:
    """Register every emulated operator not already defined (done at import). Returns :data:`REGISTERED`."""
    fia_out = "Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse"
    _register("npu", f"npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, {_FIA_V1_KWARGS})"
              " -> (Tensor, Tensor)", _fia_v1, _fia_v1_fake)
    _register("npu", f"npu_fused_infer_attention_score.out(Tensor query, Tensor key, Tensor value, *, "
              f"{_FIA_V1_KWARGS}, {fia_out}) -> (Tensor(a!), Tensor(b!))", _fia_v1_out, _fia_v1_out_fake)
    _register("npu", f"npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, "
              f"{_FIA_V2_KWARGS}) -> (Tensor, Tensor)", _fia_v2, _fia_v2_fake)
    _register("npu", f"npu_fused_infer_attention_score_v2.out(Tensor query, Tensor key, Tensor value, *, "
              f"{_FIA_V2_KWARGS}, {fia_out}) -> (Tensor(a!), Tensor(b!))", _fia_v2_out, _fia_v1_out_fake)
    _register("npu", f"npu_multi_head_latent_attention({_MLA_ARGS}) -> Tensor", _mla, _mla_fake)
    _register("npu", f"npu_multi_head_latent_attention.out({_MLA_ARGS}, Tensor(a!) attn_out) -> Tensor(a!)",
              _mla_out, _mla_out_fake)
    _register("atb", "_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
              "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out) -> ()",
              _atb_paged_attention, _no_output)
    _register("atb", "_npu_paged_attention_mla(Tensor query, Tensor key_cache, int num_kv_heads, int num_heads, "
              "float scale_value, Tensor block_table, Tensor context_lens, int mla_vheadsize, Tensor(a!) out) -> ()",
              _atb_paged_attention_mla, _no_output)
    _register(SIM_NAMESPACE, "fill_kv_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
              "Tensor kv_start_indices, str layout=\"bshd\") -> ()", _fill_kv_cache, _no_output)
    _register(SIM_NAMESPACE, "camb_paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
              "Tensor block_table, Tensor kv_seqlens, int max_kv_seq_len, float softmax_scale) -> Tensor",
              _camb_decode, _decode_fake)
    _register(SIM_NAMESPACE, "maca_paged_decode_attention(Tensor query, Tensor key_cache, Tensor value_cache, "
              "Tensor block_table, Tensor kv_seqlens, float softmax_scale) -> Tensor", _maca_decode, _decode_fake)
    # the decoder-layer kernels of dlinfer's Ascend backend (schemas: op-plugin op_plugin_functions.yaml and
    # op_plugin/ops/atb/*.cpp; npu_apply_rotary_pos_emb adds the alias annotations its in-place kernel needs)
    _register("npu", "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
              _npu_rms_norm, _npu_rms_norm_fake)
    _register("npu", "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> "
              "(Tensor, Tensor, Tensor)", _npu_add_rms_norm, _npu_add_rms_norm_fake)
    _register("npu", "npu_swiglu(Tensor self, int dim=-1) -> Tensor", _npu_swiglu, _npu_swiglu_fake)
    _register("npu", "npu_apply_rotary_pos_emb(Tensor(a!) query, Tensor(b!) key, Tensor cos, Tensor sin, "
              "str layout=\"BSND\", str rotary_mode=\"half\") -> (Tensor(a!), Tensor(b!))",
              _npu_apply_rotary_pos_emb, _npu_apply_rotary_pos_emb_fake)
    _register("npu", "npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, Tensor updates) -> Tensor(a!)",
              _npu_scatter_nd_update_, _npu_scatter_nd_update_fake)
    _register("atb", "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
              "Tensor slot_indices) -> ()", _atb_reshape_and_cache, _atb_reshape_and_cache_fake)
    _register("atb", "_npu_flash_attention(Tensor query, Tensor key, Tensor value, Tensor mask, Tensor seq_len, "
              "float scale_value, int num_heads, int num_kv_heads, Tensor(a!) out) -> ()",
              _atb_flash_attention, _no_output)
    _register("atb", "_npu_flash_attention_unpad(Tensor query, Tensor key, Tensor value, Tensor seq_len, "
              "float scale_value, int num_heads, int num_kv_heads, Tensor(a!) out) -> ()",
              _atb_flash_attention_unpad, _no_output)
    return REGISTERED


register()


# --------------------------------------------------------------------------------------------------
# typed entry points (what the tiny model calls) and a reference


def _lengths_on_device(kernel: str, query: Tensor, lengths: Tensor) -> None:
    """Camb's and MACA's decode kernels read the lengths from device memory: a host tensor is refused (a graph
    capturing it would replay its capture-time lengths, the silent wrong answer)."""
    if lengths.device != query.device:
        raise RuntimeError(f"{kernel}: kv_seqlens is a {lengths.device.type} tensor and the query is on "
                           f"{query.device}: a host tensor reaching this device kernel (a captured graph would keep "
                           "its capture-time lengths); feed it from a device buffer")


def fill_kv_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, kv_start_indices: Tensor,
                  layout: str = "bshd") -> None:
    """Write ``key[t]``/``value[t]`` (``(T, KVH, D)``) at slot ``kv_start_indices[t]`` of each cache.

    ``kv_start_indices`` holds one slot per token in any shape (Ascend/Camb ``(T,)`` int32, MACA
    ``(T, 1)`` int64); a slot is ``block_id * block_size + offset``. A negative slot writes nothing:
    padding rows of a graph batch carry ``-1``. Nothing else in the caches changes.
    """
    torch.ops.vendor_graph_sim.fill_kv_cache(key, value, key_cache, value_cache, kv_start_indices, layout)


def camb_paged_decode_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
                                kv_seqlens: Tensor, max_kv_seq_len: int, softmax_scale: float) -> Tensor:
    """Camb decode attention: ``query (B, N, D)``, caches ``(blocks, KVH, block_size, D)``.

    ``kv_seqlens (B,)`` is a device tensor (lengths including this step's token). ``max_kv_seq_len``
    is a Python int, so a graph freezes it: ``<= 0`` lets the kernel take each row's length from
    ``kv_seqlens`` on the device (what a graph must pass); ``> 0`` makes it attend to at most that
    many positions per row, so a value frozen at capture that is smaller than a later length gives a
    wrong result. Rows of length 0 return zeros.
    """
    _lengths_on_device("camb_paged_decode_attention", query, kv_seqlens)
    return torch.ops.vendor_graph_sim.camb_paged_decode_attention(query, key_cache, value_cache, block_table,
                                                                  kv_seqlens, int(max_kv_seq_len), float(softmax_scale))


def maca_paged_decode_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
                                kv_seqlens: Tensor, softmax_scale: float) -> Tensor:
    """MACA decode attention: ``query (B, N, D)``, caches ``(blocks, block_size, KVH, D)``, lengths
    from the device tensor ``kv_seqlens (B,)`` only (lmdeploy passes ``max_kv_seq_len=-1`` in decode)."""
    _lengths_on_device("maca_paged_decode_attention", query, kv_seqlens)
    return torch.ops.vendor_graph_sim.maca_paged_decode_attention(query, key_cache, value_cache, block_table,
                                                                  kv_seqlens, float(softmax_scale))


def reference_paged_attention(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table, kv_lens,
                              scale: float, layout: str = "bshd") -> Tensor:
    """Straightforward decode attention for tests: per sequence, gather its ``kv_lens[b]`` cached
    positions one by one through the block table and run dense softmax attention per head (float64).
    ``query (B, N, D)``; returns ``(B, N, Dv)`` in the query's dtype; empty rows are zeros."""
    _check_layout(layout)
    table = block_table.tolist() if isinstance(block_table, Tensor) else [list(r) for r in block_table]
    lens = kv_lens.tolist() if isinstance(kv_lens, Tensor) else list(kv_lens)
    bsz, n = query.shape[:2]
    kvh = key_cache.shape[2] if layout == "bshd" else key_cache.shape[1]
    block = key_cache.shape[1] if layout == "bshd" else key_cache.shape[2]
    out = torch.zeros(bsz, n, value_cache.shape[-1], dtype=torch.float64)
    for b in range(bsz):
        if lens[b] <= 0:
            continue
        slots = [(table[b][p // block], p % block) for p in range(lens[b])]
        if layout == "bshd":
            k = torch.stack([key_cache[i, o] for i, o in slots]).double()  # (L, KVH, D)
            v = torch.stack([value_cache[i, o] for i, o in slots]).double()
        else:
            k = torch.stack([key_cache[i, :, o] for i, o in slots]).double()
            v = torch.stack([value_cache[i, :, o] for i, o in slots]).double()
        for h in range(n):
            g = h // (n // kvh)
            p = torch.softmax(k[:, g] @ query[b, h].double() * scale, dim=0)
            out[b, h] = p @ v[:, g]
    return out.to(query.dtype)


__all__ = [
    "LAYOUTS",
    "REGISTERED",
    "SIM_NAMESPACE",
    "camb_paged_decode_attention",
    "fill_kv_cache",
    "gather_paged",
    "maca_paged_decode_attention",
    "reference_paged_attention",
    "register",
]
