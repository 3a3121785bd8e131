"""The emulated Ascend decoder-layer kernels dlinfer calls (norms, SwiGLU, rotary, KV fill, prefill attention)
against plain-torch references, on CPU tensors and on the simulated ``npu`` device.

Semantics: docs/ascend_kernel_facts.md. The calls mirror dlinfer a50184e
(``dlinfer/vendor/ascend/torch_npu_ops.py`` and ``attention.py``), keyword for keyword.
"""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from vendor_graph_sim import device as sim
from vendor_graph_sim import kernels as K

DEVICES = ["cpu", "npu"]
npu = torch.ops.npu
atb = torch.ops.atb


def on(device, *tensors):
    moved = tuple(t.to(device) for t in tensors)
    return moved if len(moved) > 1 else moved[0]


def host(t):
    return t.cpu() if isinstance(t, sim.SimTensor) else t


def same_bytes(a, b):
    a, b = host(a), host(b)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.contiguous().view(torch.uint8),
                                                                      b.contiguous().view(torch.uint8))


def dense_attention(q, k, v, allowed, scale):
    """Plain softmax attention of one sequence, per head, in float64: ``q [L, N, D]``, ``k/v [P, KVH, D]``,
    ``allowed [L, P]``; query head h reads KV head ``h // (N // KVH)``; rows with nothing allowed are 0."""
    n, kvh = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], n, v.shape[-1], dtype=torch.float64)
    for h in range(n):
        g = h // (n // kvh)
        scores = (q[:, h].double() @ k[:, g].double().T) * scale
        scores = scores.masked_fill(~allowed, float("-inf"))
        rows = allowed.any(-1)
        probs = torch.softmax(scores[rows], dim=-1)
        out[rows, h] = probs @ v[:, g].double()
    return out


# -------------------------------------------------------------------------------------------------
# norms and activation


def ref_rms(x, gamma, eps):
    dims = tuple(range(x.dim() - gamma.dim(), x.dim()))
    xd = x.double()
    rstd = 1.0 / torch.sqrt(xd.pow(2).mean(dim=dims, keepdim=True) + eps)
    return xd * rstd * gamma.double(), rstd


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gamma_dims", [1, 2])
def test_rms_norm_matches_reference(device, dtype, gamma_dims):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 5, 4, 8, generator=g) * 3).to(dtype)
    gamma = torch.randn(*x.shape[x.dim() - gamma_dims:], generator=g).to(dtype)
    eps = 1e-5
    y, rstd = npu.npu_rms_norm(*on(device, x, gamma), eps)  # dlinfer: positional, keeps [0]
    assert y.device.type == device and y.dtype == dtype and y.shape == x.shape
    assert rstd.dtype == torch.float32
    assert rstd.shape == (3, 5, 4, 1) if gamma_dims == 1 else rstd.shape == (3, 5, 1, 1)
    ref_y, ref_rstd = ref_rms(x, gamma, eps)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
    torch.testing.assert_close(host(y).double(), ref_y.to(dtype).double(), **tol)
    torch.testing.assert_close(host(rstd).double(), ref_rstd, rtol=1e-5, atol=0)
    assert torch.equal(host(npu.npu_rms_norm(*on(device, x, gamma))[0]), host(npu.npu_rms_norm(
        *on(device, x, gamma), 1e-6)[0])), "epsilon defaults to 1e-6"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_add_rms_norm_returns_normed_rstd_and_the_new_residual(device, dtype):
    g = torch.Generator().manual_seed(1)
    x1, x2 = (torch.randn(6, 16, generator=g) * 2).to(dtype), torch.randn(6, 16, generator=g).to(dtype)
    gamma = torch.randn(16, generator=g).to(dtype)
    a, b, w = on(device, x1, x2, gamma)
    normed, rstd, added = npu.npu_add_rms_norm(a, b, w, 1e-6)  # dlinfer unpacks three, drops the middle
    total = x1 + x2  # the sum in x1's dtype, then the norm of that sum
    assert same_bytes(added, total), "the third output is x1 + x2 (the next residual)"
    ref_y, ref_rstd = ref_rms(total, gamma, 1e-6)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-3, atol=2e-3)
    torch.testing.assert_close(host(normed).double(), ref_y.to(dtype).double(), **tol)
    assert rstd.dtype == torch.float32 and rstd.shape == (6, 1)
    torch.testing.assert_close(host(rstd).double(), ref_rstd, rtol=1e-5, atol=0)
    assert same_bytes(a, x1) and same_bytes(b, x2), "the inputs are not modified"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_swiglu_gates_the_first_half(device, dim):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, 6, 10, generator=g)
    out = npu.npu_swiglu(on(device, x), dim)  # dlinfer: positional dim
    gate, up = x.double().chunk(2, dim)
    ref = gate * torch.sigmoid(gate) * up
    assert out.device.type == device and out.dtype == x.dtype
    torch.testing.assert_close(host(out).double(), ref, rtol=1e-5, atol=1e-6)
    swapped = up * torch.sigmoid(up) * gate
    assert not torch.allclose(host(out).double(), swapped, atol=1e-3), "the second half is not the gated one"
    with pytest.raises(RuntimeError, match="even"):
        npu.npu_swiglu(on(device, torch.randn(3, 5)))


# -------------------------------------------------------------------------------------------------
# rotary embedding


def ref_rotate_half(x, cos, sin):
    half = x.shape[-1] // 2
    xd = x.double()
    return xd * cos.double() + torch.cat((-xd[..., half:], xd[..., :half]), -1) * sin.double()


def rotary_case(seed, tokens=5, heads=4, kv_heads=2, dim=128):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dim, generator=g)
    k = torch.randn(tokens, kv_heads, dim, generator=g)
    pos = torch.arange(tokens, dtype=torch.float64).view(-1, 1)
    freqs = pos / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    emb = torch.cat((freqs, freqs), -1)
    return q, k, emb.cos().float(), emb.sin().float()


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_full_head_128_updates_query_and_key_in_place(device):
    q, k, cos, sin = rotary_case(3)
    tokens = q.shape[0]
    # dlinfer: contiguous().unsqueeze(0) -> [1, T, N, D]; cos/sin reshaped to [1, T, 1, D]; "BSND" positional
    query, key = on(device, q.clone().contiguous().unsqueeze(0), k.clone().contiguous().unsqueeze(0))
    c, s = on(device, cos.reshape(1, tokens, 1, -1), sin.reshape(1, tokens, 1, -1))
    q_out, k_out = npu.npu_apply_rotary_pos_emb(query, key, c, s, "BSND")
    assert q_out is query and k_out is key, "the op returns its own (updated) query and key"
    torch.testing.assert_close(host(query).double(), ref_rotate_half(q.unsqueeze(0), c.cpu(), s.cpu()),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(host(key).double(), ref_rotate_half(k.unsqueeze(0), c.cpu(), s.cpu()),
                               rtol=1e-5, atol=1e-5)
    # TND: [T, N, D] with cos/sin [T, 1, D]
    query, key = on(device, q.clone(), k.clone())
    q_out, k_out = npu.npu_apply_rotary_pos_emb(query, key, *on(device, cos.unsqueeze(1), sin.unsqueeze(1)),
                                                layout="TND", rotary_mode="half")
    assert q_out is query and k_out is key
    torch.testing.assert_close(host(query).double(), ref_rotate_half(q, cos.unsqueeze(1), sin.unsqueeze(1)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_partial_dim_as_dlinfer_calls_it(device):
    """rotary_dim 64 < head_size 128: dlinfer rotates contiguous copies of the first 64 channels."""
    q, k, cos, sin = rotary_case(4, dim=64)
    g = torch.Generator().manual_seed(5)
    qf = torch.cat((q, torch.randn(*q.shape[:2], 64, generator=g)), -1).unsqueeze(0)
    query = on(device, qf.clone())
    kf = on(device, torch.cat((k, torch.randn(*k.shape[:2], 64, generator=g)), -1).unsqueeze(0))
    q_rot, k_rot = query[..., :64].contiguous(), kf[..., :64].contiguous()
    c, s = on(device, cos.reshape(1, q.shape[0], 1, -1), sin.reshape(1, q.shape[0], 1, -1))
    q_rot, k_rot = npu.npu_apply_rotary_pos_emb(q_rot, k_rot, c, s, "BSND")
    out = torch.cat((q_rot, query[..., 64:]), -1)
    torch.testing.assert_close(host(out[..., :64]).double(), ref_rotate_half(q.unsqueeze(0), c.cpu(), s.cpu()),
                               rtol=1e-5, atol=1e-5)
    assert same_bytes(out[..., 64:], qf[..., 64:]) and same_bytes(query, qf), "the original query is untouched"


def test_rotary_rejects_what_a2_a3_do_not_support():
    q, k, cos, sin = rotary_case(6, dim=32)
    args = (q.unsqueeze(0), k.unsqueeze(0), cos.view(1, 5, 1, -1), sin.view(1, 5, 1, -1))
    with pytest.raises(RuntimeError, match="64 or 128"):
        npu.npu_apply_rotary_pos_emb(*args, "BSND")
    q, k, cos, sin = rotary_case(6)
    args = (q.unsqueeze(0), k.unsqueeze(0), cos.view(1, 5, 1, -1), sin.view(1, 5, 1, -1))
    with pytest.raises(NotImplementedError, match="half"):
        npu.npu_apply_rotary_pos_emb(*args, "BSND", "interleave")
    with pytest.raises(RuntimeError, match="half/quarter/interleave"):
        npu.npu_apply_rotary_pos_emb(*args, "BSND", "spiral")
    with pytest.raises(RuntimeError, match="dtype"):
        npu.npu_apply_rotary_pos_emb(args[0], args[1], args[2].half(), args[3].half())


# -------------------------------------------------------------------------------------------------
# KV-cache fill: ReshapeAndCache (non-MLA) and scatter_nd_update_ (MLA)


def expected_cache(cache, rows, slots):
    exp = cache.clone()
    block = cache.shape[1]
    for t, s in enumerate(slots):
        if s >= 0:
            exp[s // block, s % block] = rows[t]
    return exp


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_reshape_and_cache_writes_live_slots_and_skips_negative_ones(device, data):
    nb, block, heads, dk, dv = 4, 4, 2, 3, 5  # unequal K/V head sizes (ATB's ND unequal-head variant)
    capacity = nb * block
    live = data.draw(st.lists(st.integers(0, capacity - 1), unique=True, min_size=0, max_size=6))
    pads = data.draw(st.lists(st.sampled_from([-1, -2, -capacity + 1]), min_size=0 if live else 1, max_size=4))
    slots = data.draw(st.permutations(live + pads))
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    k_cache, v_cache = torch.randn(nb, block, heads, dk, generator=g), torch.randn(nb, block, heads, dv, generator=g)
    k_cache[0].fill_(float("nan"))  # block 0 (lmdeploy's reserved block) must keep every byte, NaN included
    v_cache[0, 1:].fill_(float("-inf"))
    key, value = torch.randn(len(slots), heads, dk, generator=g), torch.randn(len(slots), heads, dv, generator=g)
    exp_k, exp_v = expected_cache(k_cache, key, slots), expected_cache(v_cache, value, slots)
    kc, vc = on(device, k_cache, v_cache)
    res = atb._npu_reshape_and_cache(key=on(device, key), value=on(device, value), key_cache=kc, value_cache=vc,
                                     slot_indices=on(device, torch.tensor(slots, dtype=torch.int32)))
    assert res is None
    assert same_bytes(kc, exp_k) and same_bytes(vc, exp_v)


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_and_cache_rejects_empty_input_wrong_dtype_and_slots_past_the_cache(device):
    kc, vc = on(device, torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8))
    before = kc.cpu().clone()
    empty = on(device, torch.empty(0, 1, 8))
    with pytest.raises(RuntimeError, match="num_tokens must be > 0"):
        atb._npu_reshape_and_cache(empty, empty, kc, vc, on(device, torch.empty(0, dtype=torch.int32)))
    kv = on(device, torch.ones(2, 1, 8))
    with pytest.raises(RuntimeError, match="int32"):
        atb._npu_reshape_and_cache(kv, kv, kc, vc, on(device, torch.tensor([1, 2])))  # int64: dlinfer converts
    with pytest.raises(RuntimeError, match="slot 8 .*past the cache"):
        atb._npu_reshape_and_cache(kv, kv, kc, vc, on(device, torch.tensor([3, 8], dtype=torch.int32)))
    with pytest.raises(RuntimeError, match="dtype"):
        atb._npu_reshape_and_cache(kv.half(), kv.half(), kc, vc, on(device, torch.tensor([0, 1], dtype=torch.int32)))
    assert torch.equal(kc.cpu(), before)


@pytest.mark.parametrize("device", DEVICES)
def test_reshape_and_cache_leaves_a_repeated_slot_undefined_and_refuses_one_below_the_documented_range(device):
    """ATB's ReshapeAndCacheParam table: slotMapping in (-num_blocks*block_size, num_blocks*block_size) "and no
    repeated values", correctness not guaranteed when they repeat (docs/ascend_kernel_facts.md). A slot two tokens
    share holds a value neither wrote; several -1 (every padded graph's padding, as dlinfer pads) write nothing:
    the kernels skip a negative slot before writing. Below the range is refused and writes nothing."""
    kc, vc = on(device, torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8))
    before = kc.cpu().clone()
    kv = on(device, torch.arange(4 * 8, dtype=torch.float32).view(4, 1, 8))
    with pytest.raises(RuntimeError, match=r"slot -8 .*below the documented range \(-8, 8\)"):
        atb._npu_reshape_and_cache(kv, kv, kc, vc, on(device, torch.tensor([5, -8, -1, 2], dtype=torch.int32)))
    assert torch.equal(kc.cpu(), before), "a refused call writes nothing"
    atb._npu_reshape_and_cache(kv, kv, kc, vc, on(device, torch.tensor([5, 3, -1, 3], dtype=torch.int32)))
    written = kc.cpu().view(8, 1, 8)
    assert torch.equal(written[5], kv.cpu()[0]) and torch.equal(written[0], before.view(8, 1, 8)[0])
    assert not torch.equal(written[3], kv.cpu()[1]) and not torch.equal(written[3], kv.cpu()[3])
    atb._npu_reshape_and_cache(kv, kv, kc, vc, on(device, torch.tensor([-1, 6, -1, -7], dtype=torch.int32)))
    assert torch.equal(kc.cpu().view(8, 1, 8)[6], kv.cpu()[1])


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_update_with_a_repeated_index_keeps_the_last_update(device):
    """Its docs neither forbid repeated indices nor say which update wins (aclnnScatterNdUpdate: deterministic;
    torch_npu's own example draws repeating indices): modelled as the last update winning."""
    cache = on(device, torch.zeros(6, 1, 2))
    updates = torch.arange(8, dtype=torch.float32).view(4, 1, 2)
    npu.npu_scatter_nd_update_(cache, on(device, torch.tensor([[2], [5], [2], [0]], dtype=torch.int32)),
                               on(device, updates))
    exp = torch.zeros(6, 1, 2)
    exp[5], exp[2], exp[0] = updates[1], updates[2], updates[3]
    assert torch.equal(host(cache), exp)


@pytest.mark.parametrize("device", DEVICES)
def test_scatter_nd_update_fills_the_mla_cache_in_place(device):
    """dlinfer's MLA branch: the 4-d key cache flattened to [blocks*block_size, H, D], kv_indices.view(-1, 1)."""
    g = torch.Generator().manual_seed(7)
    cache4 = torch.randn(3, 4, 1, 6, generator=g)
    key = torch.randn(3, 1, 6, generator=g)
    slots = torch.tensor([9, 0, 4], dtype=torch.int32)
    exp = expected_cache(cache4, key, slots.tolist())
    key_cache = on(device, cache4.clone())
    flat = torch.flatten(key_cache, start_dim=0, end_dim=1)
    res = npu.npu_scatter_nd_update_(flat, on(device, slots).view(-1, 1), on(device, key))
    assert res is flat, "returns self"
    assert same_bytes(key_cache, exp), "written through the view into the 4-d cache"
    # int64 indices and a 2-d index (a = 2) address [block, offset]
    cache = on(device, cache4.clone())
    npu.npu_scatter_nd_update_(cache, on(device, torch.tensor([[2, 1], [0, 0], [1, 0]])), on(device, key))
    assert same_bytes(cache, exp)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [-1, 12, -12])
def test_scatter_nd_update_rejects_an_out_of_range_index(device, bad):
    cache = on(device, torch.zeros(12, 1, 4))
    idx = on(device, torch.tensor([[3], [bad], [5]], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=rf"index {bad} at indices row 1"):
        npu.npu_scatter_nd_update_(cache, idx, on(device, torch.ones(3, 1, 4)))
    assert host(cache).count_nonzero() == 0, "nothing is written"


# -------------------------------------------------------------------------------------------------
# prefill attention: ATB flash attention (no history) and FIA TND sparse_mode 3 (paged, with history)


def packed_case(seed, lens, heads=4, kv_heads=2, dim=16, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    t = sum(lens)
    return (torch.randn(t, heads, dim, generator=g).to(dtype), torch.randn(t, kv_heads, dim, generator=g).to(dtype),
            torch.randn(t, kv_heads, dim, generator=g).to(dtype))


def ref_packed(q, k, v, lens, scale, causal):
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[-1], dtype=torch.float64)
    start = 0
    for n in lens:
        rows = slice(start, start + n)
        allowed = torch.ones(n, n, dtype=torch.bool)
        if causal:
            allowed = allowed.tril()
        out[rows] = dense_attention(q[rows], k[rows], v[rows], allowed, scale)
        start += n
    return out


def lmdeploy_masks(lens, dtype):
    """The masks lmdeploy hands dlinfer for prefill without history: 0.16/0.17 ``triu(ones(max_q, max_kv),
    diagonal=max_kv - max_q + 1)`` in the cache dtype (1.0 = masked), 0.18 the 2048 x 2048 int8 FIA template;
    plus a -inf additive-style mask."""
    m = max(lens)
    v016 = torch.triu(torch.ones(m, m, dtype=dtype), diagonal=1)
    template = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), diagonal=1)
    neg_inf = torch.zeros(m, m, dtype=dtype).masked_fill(torch.ones(m, m, dtype=torch.bool).triu(1), float("-inf"))
    return {"lmdeploy_0.16": v016, "fia_template": template, "neg_inf": neg_inf}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mask_kind", ["lmdeploy_0.16", "fia_template", "neg_inf"])
def test_flash_attention_is_per_sequence_causal_with_gqa(device, mask_kind):
    lens = [5, 1, 9, 3]
    q, k, v = packed_case(11, lens)
    scale = 1.0 / math.sqrt(q.shape[-1])
    mask = lmdeploy_masks(lens, q.dtype)[mask_kind]
    out = on(device, torch.full_like(q, 7.0))
    query, key, value = on(device, q, k, v)
    res = atb._npu_flash_attention(query=query, key=key, value=value, mask=on(device, mask),
                                   seq_len=torch.tensor(lens, dtype=torch.int32), scale_value=scale, num_heads=4,
                                   num_kv_heads=2, out=out)
    assert res is None
    ref = ref_packed(q, k, v, lens, scale, causal=True)
    torch.testing.assert_close(host(out).double(), ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(host(out).double(), ref_packed(q, k, v, lens, scale, causal=False), atol=1e-3)
    # MHA and a different scale
    out1 = on(device, torch.empty(q.shape[0], 4, 16))
    atb._npu_flash_attention(query, on(device, k.repeat_interleave(2, 1)), on(device, v.repeat_interleave(2, 1)),
                             on(device, mask), torch.tensor(lens, dtype=torch.int32), 0.5, 4, 4, out1)
    torch.testing.assert_close(host(out1).double(), ref_packed(q, k, v, lens, 0.5, causal=True), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attention_unpad_has_no_mask(device):
    lens = [4, 7]
    q, k, v = packed_case(12, lens)
    out = on(device, torch.empty_like(q))
    atb._npu_flash_attention_unpad(query=on(device, q), key=on(device, k), value=on(device, v),
                                   seq_len=torch.tensor(lens, dtype=torch.int32), scale_value=0.25, num_heads=4,
                                   num_kv_heads=2, out=out)
    torch.testing.assert_close(host(out).double(), ref_packed(q, k, v, lens, 0.25, causal=False), rtol=1e-5,
                               atol=1e-6)


def test_flash_attention_checks_its_arguments():
    q, k, v = packed_case(13, [3, 3])
    out = torch.empty_like(q)
    lens = torch.tensor([3, 3], dtype=torch.int32)
    with pytest.raises(RuntimeError, match="multiple"):
        atb._npu_flash_attention_unpad(q, k, v, lens, 1.0, 3, 2, out)
    with pytest.raises(RuntimeError, match="does not fit"):
        atb._npu_flash_attention_unpad(q, k, v, torch.tensor([3, 4], dtype=torch.int32), 1.0, 4, 2, out)
    with pytest.raises(RuntimeError, match="int32"):
        atb._npu_flash_attention_unpad(q, k, v, lens.long(), 1.0, 4, 2, out)
    with pytest.raises(RuntimeError, match="does not cover"):
        atb._npu_flash_attention(q, k, v, torch.zeros(2, 2), lens, 1.0, 4, 2, out)


def paged_prefill_case(seed, q_lens, kv_lens, heads=4, kv_heads=2, dim=16, block=128):
    """Paged caches (lmdeploy layout [blocks, block_size, KVH, D]) holding each sequence's whole KV (history
    plus this step's tokens), non-contiguous block tables, NaN in every slot no sequence uses."""
    g = torch.Generator().manual_seed(seed)
    need = [math.ceil(n / block) for n in kv_lens]
    width = max(need) + 1
    num_blocks = 1 + sum(need) + 1
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = [[free.pop() for _ in range(n)] + [0] * (width - n) for n in need]
    k_cache = torch.full((num_blocks, block, kv_heads, dim), float("nan"))
    v_cache = torch.full((num_blocks, block, kv_heads, dim), float("nan"))
    keys, values = [], []
    for row, n in zip(tables, kv_lens, strict=True):
        ks, vs = torch.randn(n, kv_heads, dim, generator=g), torch.randn(n, kv_heads, dim, generator=g)
        for p in range(n):
            k_cache[row[p // block], p % block] = ks[p]
            v_cache[row[p // block], p % block] = vs[p]
        keys.append(ks)
        values.append(vs)
    query = torch.randn(sum(q_lens), heads, dim, generator=g)
    return query, k_cache, v_cache, torch.tensor(tables, dtype=torch.int32), keys, values


def ref_paged_prefill(query, keys, values, q_lens, kv_lens, scale):
    """Query row j of a sequence (q_len Q, kv_len L) sees KV positions p <= L - Q + j (right-down causal)."""
    out = torch.zeros(query.shape[0], query.shape[1], values[0].shape[-1], dtype=torch.float64)
    start = 0
    for ks, vs, ql, kl in zip(keys, values, q_lens, kv_lens, strict=True):
        allowed = torch.arange(kl).view(1, -1) <= (kl - ql + torch.arange(ql)).view(-1, 1)
        out[start:start + ql] = dense_attention(query[start:start + ql], ks, vs, allowed, scale)
        start += ql
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lengths_as", ["host_tensor", "list"])
def test_fia_tnd_sparse_mode_3_paged_prefill_matches_reference(device, lengths_as):
    q_lens, kv_lens = [3, 130, 1, 5], [40, 200, 1, 5]  # prefix-cached, chunked across blocks, no history
    query, k_cache, v_cache, table, keys, values = paged_prefill_case(21, q_lens, kv_lens)
    scale = 1.0 / math.sqrt(query.shape[-1])
    cu = torch.tensor(q_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32)  # lmdeploy: cumulative q ends
    kv = torch.tensor(kv_lens, dtype=torch.int32)  # per-sequence kv lengths
    q_arg, kv_arg = (cu, kv) if lengths_as == "host_tensor" else (cu.tolist(), kv.tolist())
    nb, bs = k_cache.shape[:2]
    mask = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), diagonal=1)
    kc, vc = on(device, k_cache, v_cache)
    out, lse = npu.npu_fused_infer_attention_score(  # dlinfer paged_prefill_attention, keyword for keyword
        query=on(device, query), key=kc.view(nb, bs, -1), value=vc.view(nb, bs, -1), atten_mask=on(device, mask),
        block_table=on(device, table), input_layout="TND", block_size=bs, actual_seq_lengths=q_arg,
        actual_seq_lengths_kv=kv_arg, num_key_value_heads=2, num_heads=4, scale=scale, sparse_mode=3)
    assert out.shape == query.shape and lse.shape == (1,)
    torch.testing.assert_close(host(out).double(), ref_paged_prefill(query, keys, values, q_lens, kv_lens, scale),
                               rtol=1e-5, atol=1e-6)
    # a bool template behaves the same
    out_b, _ = npu.npu_fused_infer_attention_score(
        query=on(device, query), key=kc.view(nb, bs, -1), value=vc.view(nb, bs, -1),
        atten_mask=on(device, mask.bool()), block_table=on(device, table), input_layout="TND", block_size=bs,
        actual_seq_lengths=q_arg, actual_seq_lengths_kv=kv_arg, num_key_value_heads=2, num_heads=4, scale=scale,
        sparse_mode=3)
    assert torch.equal(host(out_b), host(out))


@pytest.mark.parametrize("device", DEVICES)
def test_fia_tnd_decode_as_attention_py_calls_it(device):
    kv_lens = [1, 77, 129]
    query, k_cache, v_cache, table, keys, values = paged_prefill_case(22, [1, 1, 1], kv_lens)
    nb, bs = k_cache.shape[:2]
    kc, vc = on(device, k_cache, v_cache)
    out, _ = npu.npu_fused_infer_attention_score(
        query=on(device, query), key=kc.view(nb, bs, -1), value=vc.view(nb, bs, -1),
        atten_mask=None, block_table=on(device, table), input_layout="TND", block_size=bs,
        actual_seq_lengths=torch.arange(1, 4, dtype=torch.int32), actual_seq_lengths_kv=torch.tensor(
            kv_lens, dtype=torch.int32), num_key_value_heads=2, num_heads=4, scale=0.3, sparse_mode=0)
    torch.testing.assert_close(host(out).double(), ref_paged_prefill(query, keys, values, [1, 1, 1], kv_lens, 0.3),
                               rtol=1e-5, atol=1e-6)


def test_fia_sparse_mode_3_needs_the_template_and_cumulative_q_lengths():
    query, k_cache, v_cache, table, _, _ = paged_prefill_case(23, [2, 2], [2, 6], block=4)
    nb, bs = k_cache.shape[:2]
    kwargs = dict(block_table=table, input_layout="TND", block_size=bs, actual_seq_lengths=[2, 4],
                  actual_seq_lengths_kv=[2, 6], num_key_value_heads=2, num_heads=4, scale=0.5, sparse_mode=3)
    kv = (k_cache.view(nb, bs, -1), v_cache.view(nb, bs, -1))
    with pytest.raises(ValueError, match="needs the optimised"):
        npu.npu_fused_infer_attention_score(query, *kv, **kwargs)
    with pytest.raises(ValueError, match="2048"):
        npu.npu_fused_infer_attention_score(query, *kv, atten_mask=torch.ones(4, 6, dtype=torch.bool).triu(1),
                                            **kwargs)
    template = torch.ones(1, 2048, 2048, dtype=torch.bool).triu(1)
    npu.npu_fused_infer_attention_score(query, *kv, atten_mask=template, **kwargs)  # (1, 2048, 2048) is allowed
    kwargs["actual_seq_lengths"] = [4, 2]  # decreasing: not cumulative ends
    with pytest.raises(ValueError, match="cumulative"):
        npu.npu_fused_infer_attention_score(query, *kv, atten_mask=template, **kwargs)
    kwargs["actual_seq_lengths"] = [2, 9]  # past the 4 query rows
    with pytest.raises(ValueError, match="cumulative"):
        npu.npu_fused_infer_attention_score(query, *kv, atten_mask=template, **kwargs)


# -------------------------------------------------------------------------------------------------
# a captured graph replays the kernels on current data


def test_graph_replay_reruns_norm_fill_and_prefill_on_current_data():
    g = torch.Generator().manual_seed(31)
    x, gamma = on("npu", torch.randn(4, 2, 16, generator=g), torch.randn(16, generator=g))
    kc, vc = on("npu", torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 2, 16))
    slots = on("npu", torch.tensor([5, -1, 0, 2], dtype=torch.int32))
    seq_len = torch.tensor([3, 1], dtype=torch.int32)
    out = on("npu", torch.zeros(4, 2, 16))
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        normed = npu.npu_rms_norm(x, gamma, 1e-6)[0]
        atb._npu_reshape_and_cache(normed, normed, kc, vc, slots)
        atb._npu_flash_attention_unpad(normed, normed, normed, seq_len, 0.25, 2, 2, out)
    assert kc.cpu().count_nonzero() == 0, "capture runs nothing"
    for step in range(2):
        x.copy_(torch.randn(4, 2, 16, generator=g))
        slots.copy_(torch.tensor([[5, -1, 0, 2], [1, 7, -1, 3]][step], dtype=torch.int32))
        kc.zero_()
        graph.replay()
        ref = ref_rms(x.cpu(), gamma.cpu(), 1e-6)[0].float()
        exp = expected_cache(torch.zeros(2, 4, 2, 16), ref, slots.cpu().tolist())
        torch.testing.assert_close(kc.cpu(), exp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out.cpu().double(), ref_packed(ref, ref, ref, [3, 1], 0.25, causal=False),
                                   rtol=1e-5, atol=1e-6)
    slots.copy_(torch.tensor([0, 1, 2, 8], dtype=torch.int32))  # a slot past the cache: the replay fails
    with pytest.raises(RuntimeError, match="slot 8"):
        graph.replay()


def decoder_step(x, gamma, cos, sin, kc, vc, slots, seq_len):
    """One dlinfer-style layer slice: add_rms_norm, rotary (in place), KV fill, prefill attention, SwiGLU."""
    normed, _, residual = npu.npu_add_rms_norm(x, x, gamma, 1e-6)
    q = normed.view(1, 4, 2, 128).contiguous()
    k = (normed * 0.5).view(1, 4, 2, 128).contiguous()
    q, k = npu.npu_apply_rotary_pos_emb(q, k, cos, sin, "BSND")
    q, k = q.squeeze(0), k.squeeze(0)
    atb._npu_reshape_and_cache(key=k, value=q, key_cache=kc, value_cache=vc, slot_indices=slots)
    out = torch.empty_like(q)
    atb._npu_flash_attention_unpad(query=q, key=k, value=q, seq_len=seq_len, scale_value=0.1, num_heads=2,
                                   num_kv_heads=2, out=out)
    return npu.npu_swiglu(out.reshape(4, 256), -1), residual


def test_deferred_execution_matches_eager(lazy):
    """With ``eager_drain`` off every op is queued with outputs pre-allocated from the fake kernels."""
    g = torch.Generator().manual_seed(51)
    _, _, cos, sin = rotary_case(52, tokens=4)
    host_args = (torch.randn(4, 256, generator=g), torch.randn(256, generator=g), cos.view(1, 4, 1, -1),
                 sin.view(1, 4, 1, -1), torch.zeros(2, 4, 2, 128), torch.zeros(2, 4, 2, 128),
                 torch.tensor([6, -1, 0, 3], dtype=torch.int32))
    seq_len = torch.tensor([1, 3], dtype=torch.int32)
    want = decoder_step(*(t.clone() for t in host_args), seq_len)
    dev = on("npu", *host_args)
    got = decoder_step(*dev, seq_len)
    assert sim.pending_work(), "the work is queued, not run"
    sim.synchronize()
    for a, b in zip(got, want, strict=True):
        assert same_bytes(a, b)
    assert same_bytes(dev[4], decoder_step_caches(host_args, seq_len)[0])


def decoder_step_caches(host_args, seq_len):
    args = [t.clone() for t in host_args]
    decoder_step(*args, seq_len)
    return args[4], args[5]


# -------------------------------------------------------------------------------------------------
# schemas and fake kernels


REAL_SCHEMAS = {  # op-plugin op_plugin_functions.yaml / op_plugin/ops/atb/*.cpp (517f2e7)
    npu.npu_rms_norm.default: "npu::npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    npu.npu_add_rms_norm.default: "npu::npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) "
                                  "-> (Tensor, Tensor, Tensor)",
    npu.npu_swiglu.default: "npu::npu_swiglu(Tensor self, int dim=-1) -> Tensor",
    npu.npu_scatter_nd_update_.default: "npu::npu_scatter_nd_update_(Tensor(a!) self, Tensor indices, "
                                        "Tensor updates) -> Tensor(a!)",
    atb._npu_reshape_and_cache.default: "atb::_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache,"
                                        " Tensor(b!) value_cache, Tensor slot_indices) -> ()",
    atb._npu_flash_attention.default: "atb::_npu_flash_attention(Tensor query, Tensor key, Tensor value, "
                                      "Tensor mask, Tensor seq_len, float scale_value, int num_heads, "
                                      "int num_kv_heads, Tensor(a!) out) -> ()",
    atb._npu_flash_attention_unpad.default: "atb::_npu_flash_attention_unpad(Tensor query, Tensor key, "
                                            "Tensor value, Tensor seq_len, float scale_value, int num_heads, "
                                            "int num_kv_heads, Tensor(a!) out) -> ()",
    # the real schema is "(Tensor query, Tensor key, ...) -> (Tensor, Tensor)": same names and defaults, with
    # the alias annotations its in-place kernel needs
    npu.npu_apply_rotary_pos_emb.default: "npu::npu_apply_rotary_pos_emb(Tensor(a!) query, Tensor(b!) key, "
                                          "Tensor cos, Tensor sin, str layout=\"BSND\", str rotary_mode=\"half\") "
                                          "-> (Tensor(a!), Tensor(b!))",
}


def test_schemas_are_the_real_ones():
    for op, schema in REAL_SCHEMAS.items():
        assert str(op._schema) == str(torch._C.parse_schema(schema)), op
        assert op._schema.name in K.REGISTERED
    assert K.register() == K.REGISTERED  # idempotent


def test_fake_kernels_give_the_real_shapes_and_dtypes():
    g = torch.Generator().manual_seed(41)
    x, gamma = torch.randn(3, 7, 8, generator=g).half(), torch.randn(8, generator=g).half()
    q, k, cos, sin = rotary_case(42)
    q4, k4, c4, s4 = q.unsqueeze(0), k.unsqueeze(0), cos.view(1, 5, 1, -1), sin.view(1, 5, 1, -1)
    cache, kvals = torch.zeros(2, 4, 2, 8), torch.randn(3, 2, 8, generator=g)
    slots = torch.tensor([1, -1, 6], dtype=torch.int32)
    pq, pk, pv = packed_case(43, [2, 3])
    seq, pmask, pout = torch.tensor([2, 3], dtype=torch.int32), torch.ones(3, 3).triu(1), torch.empty_like(pq)
    calls = {
        "rms_norm": lambda: npu.npu_rms_norm(x, gamma, 1e-6),
        "add_rms_norm": lambda: npu.npu_add_rms_norm(x, x, gamma, 1e-6),
        "swiglu": lambda: npu.npu_swiglu(x, 2),
    }
    for name, call in calls.items():
        real = call()
        with FakeTensorMode(allow_non_fake_inputs=True):
            fake = call()
        real, fake = (real if isinstance(real, tuple) else (real,)), (fake if isinstance(fake, tuple) else (fake,))
        assert [t.shape for t in fake] == [t.shape for t in real], name
        assert [t.dtype for t in fake] == [t.dtype for t in real], name

    with FakeTensorMode() as mode:
        fq, fk, fc, fs = (mode.from_tensor(t) for t in (q4, k4, c4, s4))
        rq, rk = npu.npu_apply_rotary_pos_emb(fq, fk, fc, fs, "BSND")
        assert rq is fq and rk is fk
        fcache, fkv, fslots = mode.from_tensor(cache), mode.from_tensor(kvals), mode.from_tensor(slots)
        assert atb._npu_reshape_and_cache(fkv, fkv, fcache, fcache.clone(), fslots) is None
        with pytest.raises(RuntimeError, match="num_tokens must be > 0"):
            atb._npu_reshape_and_cache(fkv[:0], fkv[:0], fcache, fcache.clone(), fslots[:0])
        flat = fcache.flatten(0, 1)
        assert npu.npu_scatter_nd_update_(flat, fslots.view(-1, 1), fkv) is flat
        fout = mode.from_tensor(pout)
        args = [mode.from_tensor(t) for t in (pq, pk, pv)]
        assert atb._npu_flash_attention(*args, mode.from_tensor(pmask), mode.from_tensor(seq), 0.5, 4, 2,
                                        fout) is None
        assert atb._npu_flash_attention_unpad(*args, mode.from_tensor(seq), 0.5, 4, 2, fout) is None
    # the meta path the simulator uses to pre-allocate outputs
    meta = torch.empty(3, 7, 8, device="meta", dtype=torch.bfloat16)
    y, rstd = npu.npu_rms_norm(meta, torch.empty(7, 8, device="meta", dtype=torch.bfloat16))
    assert y.shape == meta.shape and y.dtype == torch.bfloat16 and rstd.shape == (3, 1, 1)
    assert rstd.dtype == torch.float32
