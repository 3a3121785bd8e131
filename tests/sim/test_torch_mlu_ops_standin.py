"""The torch_mlu_ops stand-in (``vendor_graph_sim.vendor_kernels_camb``) against plain-torch references written
here, on plain CPU tensors: per-sequence / per-token loops, float64 where it matters."""

import inspect
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from vendor_graph_sim import vendor_kernels_camb as V
from vendor_graph_sim.boot import STANDIN_LABEL

tmo = V.build_module()
CAMB_OPS = Path("/work/shared/third_party/dlinfer/dlinfer/vendor/camb/camb_ops.py")
# every tmo function dlinfer's camb_ops.py calls
DLINFER_CALLS = ("active", "fused_rms_norm", "apply_rotary", "reshape_paged_cache", "flash_attention",
                 "single_query_cached_kv_attn", "moe_softmax_topk", "moe_gen_idx", "moe_expand_input", "group_gemm",
                 "moe_active", "moe_combine_result", "matmul", "matmul_allreduce", "per_token_smooth_quantize",
                 "smooth_quant_matmul")


def gen(seed):
    return torch.Generator().manual_seed(seed)


def bits(t):
    """The raw bytes of a tensor (NaN-safe equality)."""
    return t.contiguous().view(torch.uint8)


# --------------------------------------------------------------------------------------------------
# the module


def test_module_is_a_labelled_standin():
    assert tmo.__name__ == "torch_mlu_ops"
    reason = getattr(tmo, STANDIN_LABEL)
    assert isinstance(reason, str) and "torch_mlu_ops" in reason and "\n" not in reason
    assert isinstance(tmo.__version__, str)
    assert V.build_module() is not tmo  # a fresh module each time
    for name in DLINFER_CALLS:
        assert callable(getattr(tmo, name)), name
    assert sorted(tmo.__all__) == sorted(DLINFER_CALLS)


@pytest.mark.skipif(not CAMB_OPS.is_file(), reason="dlinfer's source snapshot is not here")
def test_covers_every_function_dlinfer_calls():
    called = set(re.findall(r"\btmo\.(\w+)", CAMB_OPS.read_text(encoding="utf-8")))
    assert called == set(DLINFER_CALLS)


def test_ops_registered_with_cpu_cuda_and_fake_kernels():
    names = [q.split("::")[1] for q in V.REGISTERED]
    assert V.REGISTERED and all(q.startswith("vendor_graph_sim_camb::") for q in V.REGISTERED)
    for name in names:
        qual = f"vendor_graph_sim_camb::{name}"
        for key in ("CPU", "CUDA", "Meta"):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(qual, key), (qual, key)
    assert V.register() == V.REGISTERED and len(set(V.REGISTERED)) == len(V.REGISTERED)  # again: nothing new


def test_wrong_keyword_raises_type_error():
    x = torch.randn(2, 8)
    with pytest.raises(TypeError):
        tmo.active(x, mode="silu", is_gated=True)
    with pytest.raises(TypeError):
        tmo.single_query_cached_kv_attn(x, x, x, x, x, x, None, None, None, max_contxt_len=-1,
                                        windows_size_left=-1, windows_size_right=-1, softmax_scale=1.0)
    with pytest.raises(TypeError):
        tmo.flash_attention(x, x, x, None, None, None, None, None, max_seq_len_q=1, max_seq_len_kv=1,
                            softmax_scale=1.0, causal=True)
    with pytest.raises(TypeError):
        tmo.moe_combine_result(x, x, x, None, None, 0, 1, biass=None)


def test_dlinfer_call_forms_bind():
    """The argument lists of dlinfer's calls (camb_ops.py) bind to the stand-in's signatures."""
    a = object()
    forms = {
        "active": ((a,), {"act_mode": "silu", "is_gated": True}),
        "fused_rms_norm": ((a, None, a, None, None, 1e-6, False, None, None), {}),
        "apply_rotary": ((a, a, a, None, None, False, False, False, 3), {}),
        "reshape_paged_cache": ((a, a, a, a, a), {}),
        "flash_attention": ((a, a, a, None, a, a, None, None, 4, 4, 0.5, True, -1, -1, torch.half, False), {}),
        "single_query_cached_kv_attn": ((a, a, a, a, a, a, None, None, None, 8, -1, -1, 0.5), {}),
        "moe_softmax_topk": ((a, 2), {}),
        "moe_gen_idx": ((a, 4), {}),
        "moe_expand_input": ((a, a, a, 0, 4), {}),
        "group_gemm": ((a, a, a), {"expand_idx": None, "c": None, "alpha": None, "beta": None,
                                   "max_in_group_list": 3}),
        "moe_active": ((a,), {"act_mode": "silu", "is_gated": True, "output": a, "bias": None,
                              "cusum_token_count": a, "start_expert_id": 0, "expert_size": 4}),
        "moe_combine_result": ((a,), {"reduce_weight": a, "gather_ids": a, "residual": None,
                                      "cusum_token_count": a, "start_expert_id": 0, "expert_size": 4,
                                      "bias": None}),
        "matmul": ((a, a, None), {}),
        "matmul_allreduce": ((a, a, a, None), {}),
        "per_token_smooth_quantize": ((a,), {"smooth": a}),
        "smooth_quant_matmul": ((a, a, a, 1.0, torch.half, None), {}),
    }
    assert set(forms) == set(DLINFER_CALLS)
    for name, (args, kwargs) in forms.items():
        inspect.signature(getattr(tmo, name)).bind(*args, **kwargs)
    paged_prefill = {"max_seq_len_q": 4, "max_seq_len_kv": 8, "softmax_scale": 0.5, "is_causal": True,
                     "block_tables": a}
    inspect.signature(tmo.flash_attention).bind(a, a, a, None, a, a, None, None, **paged_prefill)


def test_quantised_paths_refuse_clearly():
    x = torch.randn(2, 8)
    with pytest.raises(NotImplementedError, match="not simulated"):
        tmo.per_token_smooth_quantize(x, smooth=torch.ones(8))
    with pytest.raises(NotImplementedError, match="not simulated"):
        tmo.smooth_quant_matmul(x, x, x, 1.0, torch.half, None)
    with pytest.raises(NotImplementedError, match="not simulated"):
        tmo.matmul_allreduce(None, x, x, None)
    with pytest.raises(NotImplementedError, match="quant_scale"):
        tmo.fused_rms_norm(x, None, torch.ones(8), None, None, 1e-6, False, torch.ones(8), dynamic_quant=True)
    with pytest.raises(NotImplementedError, match="dynamic_quant"):
        tmo.fused_rms_norm(x, None, torch.ones(8), None, None, 1e-6, False, dynamic_quant=True)
    with pytest.raises(NotImplementedError, match="a_scale"):
        tmo.matmul(x, x, a_scale=1.0)


# --------------------------------------------------------------------------------------------------
# elementwise: activation, RMS norm, rotary


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_active_silu_gated(dtype):
    x = torch.randn(5, 3, 12, generator=gen(0)).to(dtype)
    out = tmo.active(x, act_mode="silu", is_gated=True)
    ref = torch.empty(5, 3, 6, dtype=torch.float64)
    for i in range(5):
        for j in range(3):
            for c in range(6):
                g, u = x[i, j, c].double(), x[i, j, c + 6].double()
                ref[i, j, c] = g / (1 + torch.exp(-g)) * u
    assert out.dtype == dtype and out.shape == (5, 3, 6)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=tol)


def test_active_other_modes():
    x = torch.randn(4, 10, generator=gen(1))
    torch.testing.assert_close(tmo.active(x, "gelu", False), F.gelu(x))
    torch.testing.assert_close(tmo.active(x, "gelu", False, gelu_approximate="tanh"), F.gelu(x, approximate="tanh"))
    torch.testing.assert_close(tmo.active(x, "swish", False, active_coef=2.0), x * torch.sigmoid(2.0 * x))
    with pytest.raises(ValueError):
        tmo.active(x, "tanh", False)


def rms_reference(x, residual, weight, eps):
    rows = x.reshape(-1, x.shape[-1]).double()
    res = None if residual is None else residual.reshape(-1, x.shape[-1]).double()
    out, added = torch.empty_like(rows), torch.empty_like(rows)
    for r in range(rows.shape[0]):
        v = rows[r] + (res[r] if res is not None else 0)
        added[r] = v
        out[r] = v / math.sqrt(float((v * v).mean()) + eps) * weight.double()
    return out.reshape(x.shape), added.reshape(x.shape)


@pytest.mark.parametrize("shape", [(7, 32), (2, 3, 32)])
def test_fused_rms_norm_without_residual(shape):
    x = torch.randn(shape, generator=gen(2)) * 3
    w = torch.randn(32, generator=gen(3))
    out = tmo.fused_rms_norm(x, None, w, None, None, 1e-5, False, None, None)  # dlinfer's rms_norm call
    ref, _ = rms_reference(x, None, w, 1e-5)
    assert isinstance(out, torch.Tensor) and out.shape == x.shape
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_fused_rms_norm_with_residual():
    x = torch.randn(6, 32, generator=gen(4))
    r = torch.randn(6, 32, generator=gen(5))
    w = torch.randn(32, generator=gen(6))
    x_before, r_before = x.clone(), r.clone()
    normed, added = tmo.fused_rms_norm(x, r, w, None, None, 1e-6, True, None)  # dlinfer's add_rms_norm call
    ref, ref_added = rms_reference(x, r, w, 1e-6)
    torch.testing.assert_close(normed.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(added.double(), ref_added, atol=1e-6, rtol=1e-6)
    assert torch.equal(x, x_before) and torch.equal(r, r_before)  # inputs untouched


def test_fused_rms_norm_bf16_and_beta():
    x = torch.randn(4, 16, generator=gen(7)).bfloat16()
    r = torch.randn(4, 16, generator=gen(8)).bfloat16()
    w = torch.randn(16, generator=gen(9)).bfloat16()
    beta = torch.randn(16, generator=gen(10)).bfloat16()
    normed, added = tmo.fused_rms_norm(x, r, w, beta, None, 1e-6, True)
    ref, ref_added = rms_reference(x, r, w, 1e-6)
    assert normed.dtype == added.dtype == torch.bfloat16
    torch.testing.assert_close(added.double(), ref_added, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(normed.double(), ref + beta.double(), atol=5e-2, rtol=2e-2)


def rotary_reference(x, cos, sin, positions, interleaved=False):
    """``x (T, H, D)``, positions per token; rotates the first ``cos.shape[-1]`` channels."""
    out = x.clone().double()
    rd = cos.shape[-1]
    for t in range(x.shape[0]):
        c, s = cos[positions[t]].double(), sin[positions[t]].double()
        for h in range(x.shape[1]):
            v = x[t, h].double()
            for i in range(rd):
                if interleaved:
                    partner = -v[i + 1] if i % 2 == 0 else v[i - 1]
                else:
                    partner = -v[i + rd // 2] if i < rd // 2 else v[i - rd // 2]
                out[t, h, i] = v[i] * c[i] + partner * s[i]
    return out


def test_apply_rotary_dlinfer_layout_in_place():
    """dlinfer: ``q.contiguous().unsqueeze(0)`` (1, T, H, D) and cos/sin (T, D) gathered per token, pad mode."""
    tokens, heads, dim = 5, 3, 8
    q = torch.randn(tokens, heads, dim, generator=gen(11))
    theta = torch.randn(tokens, dim // 2, generator=gen(12))
    cos, sin = torch.cat((theta, theta), -1).cos(), torch.cat((theta, theta), -1).sin()
    ref = rotary_reference(q, cos, sin, list(range(tokens)))
    query = q.clone().contiguous().unsqueeze(0)
    got = tmo.apply_rotary(query, sin, cos, None, None, False, False, False, tokens)
    assert got is query  # in place: the input is the output
    torch.testing.assert_close(query[0].double(), ref, atol=1e-6, rtol=1e-6)


def test_apply_rotary_pack_mode_interleaved_partial_with_output():
    tokens, heads, dim, rd = 7, 2, 8, 4
    x = torch.randn(tokens, heads, dim, generator=gen(13))
    table = torch.randn(20, rd, generator=gen(14))
    cos, sin = table.cos(), table.sin()
    cu = torch.tensor([0, 3, 7], dtype=torch.int32)
    starts = torch.tensor([5, 2], dtype=torch.int32)
    positions = [5, 6, 7, 2, 3, 4, 5]
    out = torch.empty_like(x)
    before = x.clone()
    got = tmo.apply_rotary(x, sin, cos, starts, cu, True, False, False, 4, output=out)
    assert got is out and torch.equal(x, before)  # output given: input untouched
    torch.testing.assert_close(out.double(), rotary_reference(x, cos, sin, positions, interleaved=True),
                               atol=1e-6, rtol=1e-6)
    discrete = torch.tensor(positions, dtype=torch.int32)
    got = tmo.apply_rotary(x.clone(), sin, cos, discrete, cu, True, True, False, 4)
    torch.testing.assert_close(got, out)


# --------------------------------------------------------------------------------------------------
# paged KV cache


def cache_case(seed, blocks=5, heads=2, block=4, dim=3):
    g = gen(seed)
    k_cache = torch.randn(blocks, heads, block, dim, generator=g)
    v_cache = torch.randn(blocks, heads, block, dim, generator=g)
    k_cache[1, :, 2] = float("nan")  # garbage the write must not disturb
    return k_cache, v_cache


@pytest.mark.parametrize("slots", [
    [5, -1, 17, -1, 0],      # a live row at slot 0 and padding rows
    [-1, -1, 9, 3],          # padding rows, nothing live at slot 0
    [-1, -1],                # only padding
])
def test_reshape_paged_cache_negative_slot_writes_nothing(slots):
    k_cache, v_cache = cache_case(20)
    heads, block, dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    key = torch.randn(len(slots), heads, dim, generator=gen(21))
    value = torch.randn(len(slots), heads, dim, generator=gen(22))
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    for i, s in enumerate(slots):
        if s >= 0:
            expect_k[s // block, :, s % block] = key[i]
            expect_v[s // block, :, s % block] = value[i]
    got = tmo.reshape_paged_cache(key, value, k_cache, v_cache, torch.tensor(slots, dtype=torch.int32))
    assert got[0] is k_cache and got[1] is v_cache
    assert torch.equal(bits(k_cache), bits(expect_k))  # every other byte unchanged (NaN included)
    assert torch.equal(bits(v_cache), bits(expect_v))


def test_reshape_paged_cache_gathers_with_direction():
    k_cache, v_cache = cache_case(23)
    block = k_cache.shape[2]
    slots = [6, -1, 13]
    key = torch.full((3, 2, 3), 7.0)
    value = torch.full((3, 2, 3), 8.0)
    tmo.reshape_paged_cache(key, value, k_cache, v_cache, torch.tensor(slots, dtype=torch.int32), direction=True)
    for i, s in enumerate(slots):
        want_k = k_cache[s // block, :, s % block] if s >= 0 else torch.full((2, 3), 7.0)
        want_v = v_cache[s // block, :, s % block] if s >= 0 else torch.full((2, 3), 8.0)
        assert torch.equal(bits(key[i]), bits(want_k)) and torch.equal(bits(value[i]), bits(want_v))


# --------------------------------------------------------------------------------------------------
# decode attention


def decode_reference(q, k_cache, v_cache, table, lens, scale, window=-1):
    """``q (B, H, D)``; per sequence, its positions one by one through the block table (float64)."""
    batch, heads, _ = q.shape
    kv_heads, block = k_cache.shape[1], k_cache.shape[2]
    out = torch.zeros(batch, heads, v_cache.shape[-1], dtype=torch.float64)
    for b in range(batch):
        n = int(lens[b])
        first = 0 if window < 0 else max(0, n - window - 1)
        if n <= 0:
            continue
        ks = torch.stack([k_cache[table[b][p // block], :, p % block] for p in range(first, n)]).double()
        vs = torch.stack([v_cache[table[b][p // block], :, p % block] for p in range(first, n)]).double()
        for h in range(heads):
            g = h // (heads // kv_heads)
            w = torch.softmax(ks[:, g] @ q[b, h].double() * scale, dim=0)
            out[b, h] = w @ vs[:, g]
    return out


def decode_case(seed, lens, heads=8, kv_heads=2, dim=16, block=4, width=6):
    """Caches where every slot no sequence uses holds NaN, and tables whose unused columns hold garbage ids."""
    g = gen(seed)
    need = [max(1, math.ceil(n / block)) for n in lens]
    num_blocks = sum(need) + 3
    free = (torch.randperm(num_blocks, generator=g)).tolist()
    table = [[free.pop() for _ in range(n)] + [10**6, -7][: width - n] + [3] * max(0, width - n - 2) for n in need]
    k_cache = torch.randn(num_blocks, kv_heads, block, dim, generator=g)
    v_cache = torch.randn(num_blocks, kv_heads, block, dim, generator=g)
    used = torch.zeros(num_blocks, block, dtype=torch.bool)
    for row, n in zip(table, lens, strict=True):
        for p in range(n):
            used[row[p // block], p % block] = True
    mask = used.view(num_blocks, 1, block, 1)
    k_cache = torch.where(mask, k_cache, float("nan"))
    v_cache = torch.where(mask, v_cache, float("nan"))
    q = torch.randn(len(lens), heads, dim, generator=g)
    return q, k_cache, v_cache, table


def dlinfer_decode(q, k_cache, v_cache, table, lens, max_kv_seq_len, scale, **extra):
    """dlinfer's paged_decode_attention call: (B, 1, H, D) views of the query and of the output."""
    batch, heads, dim = q.shape
    attn_output = torch.full_like(q, 123.0)
    block_table = torch.tensor(table, dtype=torch.int32)
    kv_seq_len = torch.tensor(lens, dtype=torch.int32)
    out = tmo.single_query_cached_kv_attn(q.view(batch, 1, heads, dim), k_cache, v_cache,
                                          attn_output.view(batch, 1, heads, dim), block_table, kv_seq_len, None, None,
                                          None, max_kv_seq_len, -1, -1, scale, **extra)
    return attn_output, out


def test_single_query_gqa_varying_lengths_zero_row_and_nan_slots():
    lens = [5, 9, 0, 3, 13]
    q, k_cache, v_cache, table = decode_case(30, lens)
    scale = 1 / math.sqrt(q.shape[-1])
    attn_output, out = dlinfer_decode(q, k_cache, v_cache, table, lens, -1, scale)
    assert out.data_ptr() == attn_output.data_ptr()  # written in place, returned
    ref = decode_reference(q, k_cache, v_cache, table, lens, scale)
    assert not torch.isnan(attn_output).any()
    assert torch.equal(attn_output[2], torch.zeros_like(attn_output[2]))  # length 0: zeros
    torch.testing.assert_close(attn_output.double(), ref, atol=1e-6, rtol=1e-6)
    # max_context_len = max(lens) is the same answer
    same, _ = dlinfer_decode(q, k_cache, v_cache, table, lens, max(lens), scale)
    torch.testing.assert_close(same, attn_output, atol=1e-6, rtol=1e-6)


def test_single_query_positive_max_context_len_truncates():
    lens = [5, 9, 2, 13]
    q, k_cache, v_cache, table = decode_case(31, lens)
    frozen = 6  # a value frozen at capture, smaller than later lengths
    got, _ = dlinfer_decode(q, k_cache, v_cache, table, lens, frozen, 0.3)
    truncated = decode_reference(q, k_cache, v_cache, table, [min(n, frozen) for n in lens], 0.3)
    full = decode_reference(q, k_cache, v_cache, table, lens, 0.3)
    torch.testing.assert_close(got.double(), truncated, atol=1e-6, rtol=1e-6)
    for b, n in enumerate(lens):
        assert torch.allclose(got[b].double(), full[b], atol=1e-6) == (n <= frozen)
    derived, _ = dlinfer_decode(q, k_cache, v_cache, table, lens, -1, 0.3)
    torch.testing.assert_close(derived.double(), full, atol=1e-6, rtol=1e-6)


def test_single_query_window_lse_and_half():
    lens = [7, 3, 0]
    q, k_cache, v_cache, table = decode_case(32, lens, heads=4, kv_heads=4, dim=8)
    batch, heads, dim = q.shape
    out, lse = tmo.single_query_cached_kv_attn(
        q.view(batch, 1, heads, dim), k_cache, v_cache, None, torch.tensor(table, dtype=torch.int32),
        torch.tensor(lens, dtype=torch.int32), None, None, None, -1, 2, -1, 0.5, return_lse=True)
    torch.testing.assert_close(out.view(batch, heads, dim).double(),
                               decode_reference(q, k_cache, v_cache, table, lens, 0.5, window=2), atol=1e-6, rtol=1e-6)
    assert lse.shape == (batch, heads, 1) and torch.isinf(lse[2]).all()
    ks = torch.stack([k_cache[table[0][p // 4], :, p % 4] for p in range(4, 7)]).double()
    want = torch.logsumexp(torch.einsum("phd,hd->hp", ks, q[0].double()) * 0.5, dim=-1)
    torch.testing.assert_close(lse[0, :, 0].double(), want, atol=1e-5, rtol=1e-5)
    half, _ = dlinfer_decode(q.half(), k_cache.half(), v_cache.half(), table, lens, -1, 0.5)
    assert half.dtype == torch.float16
    torch.testing.assert_close(half.double(), decode_reference(q, k_cache, v_cache, table, lens, 0.5),
                               atol=5e-3, rtol=5e-3)


# --------------------------------------------------------------------------------------------------
# prefill attention


def prefill_reference(q, k, v, q_lens, kv_lens, scale, causal):
    """Packed ``q (Tq, H, D)``, ``k/v (Tk, KVH, D)``; per sequence and query, the KV positions it may see
    (causal: end-aligned) in float64."""
    heads, kv_heads = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], heads, v.shape[-1], dtype=torch.float64)
    qs = ks = 0
    for ql, kl in zip(q_lens, kv_lens, strict=True):
        for i in range(ql):
            visible = kl - ql + i + 1 if causal else kl
            if visible <= 0:
                continue
            for h in range(heads):
                g = h // (heads // kv_heads)
                kk = k[ks:ks + visible, g].double()
                w = torch.softmax(kk @ q[qs + i, h].double() * scale, dim=0)
                out[qs + i, h] = w @ v[ks:ks + visible, g].double()
        qs, ks = qs + ql, ks + kl
    return out


def cu(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attention_varlen_prefill(causal):
    lens = [3, 1, 6, 4]
    g = gen(40)
    q = torch.randn(sum(lens), 8, 16, generator=g)
    k = torch.randn(sum(lens), 2, 16, generator=g)
    v = torch.randn(sum(lens), 2, 16, generator=g)
    start = cu(lens)
    # dlinfer's prefill_attention call: 16 positional arguments, out None
    out = tmo.flash_attention(q, k, v, None, start, start, None, None, max(lens), max(lens), 0.25, causal, -1, -1,
                              q.dtype, False)
    ref = prefill_reference(q, k, v, lens, lens, 0.25, causal)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-6)
    # an output tensor is written in place; an unknown maximum (-1) is the same answer
    given = torch.full_like(q, float("nan"))
    got = tmo.flash_attention(q, k, v, given, start, start, None, None, -1, -1, 0.25, causal)
    assert got is given
    torch.testing.assert_close(given, out, atol=1e-6, rtol=1e-6)


def test_flash_attention_paged_prefill_with_prefix():
    """dlinfer's paged_prefill_attention: k/v are the caches, read through the block table, KV longer than q."""
    q_lens, kv_lens, block = [2, 3], [7, 3], 4
    g = gen(41)
    tables = [[4, 1], [2, 0]]
    k_cache = torch.randn(5, 2, block, 8, generator=g)
    v_cache = torch.randn(5, 2, block, 8, generator=g)
    k_cache[3] = float("nan")  # a block no sequence uses
    k_cache[0, :, 3:] = float("nan")  # past the second sequence's length
    v_cache[0, :, 3:] = float("nan")
    q = torch.randn(sum(q_lens), 4, 8, generator=g)
    out = tmo.flash_attention(q, k_cache, v_cache, None, cu(q_lens), cu(kv_lens), None, None,
                              max_seq_len_q=max(q_lens), max_seq_len_kv=max(kv_lens), softmax_scale=0.3,
                              is_causal=True, block_tables=torch.tensor(tables, dtype=torch.int32))
    k = torch.cat([torch.stack([k_cache[t[p // block], :, p % block] for p in range(n)]) for t, n in
                   zip(tables, kv_lens, strict=True)])
    v = torch.cat([torch.stack([v_cache[t[p // block], :, p % block] for p in range(n)]) for t, n in
                   zip(tables, kv_lens, strict=True)])
    torch.testing.assert_close(out.double(), prefill_reference(q, k, v, q_lens, kv_lens, 0.3, True),
                               atol=1e-6, rtol=1e-6)


# --------------------------------------------------------------------------------------------------
# MoE


def softmax_topk_reference(logits, topk, normalize=False):
    weights = torch.empty(logits.shape[0], topk, dtype=torch.float64)
    ids = torch.empty(logits.shape[0], topk, dtype=torch.int64)
    for t in range(logits.shape[0]):
        p = torch.softmax(logits[t].double(), dim=0)
        order = sorted(range(p.numel()), key=lambda e: -float(p[e]))[:topk]
        ids[t] = torch.tensor(order)
        weights[t] = p[order] / (p[order].sum() if normalize else 1)
    return weights, ids


@pytest.mark.parametrize("normalize", [False, True])
def test_moe_softmax_topk(normalize):
    logits = torch.randn(9, 6, generator=gen(50))
    weights, ids = tmo.moe_softmax_topk(logits.float(), 2, normalize=normalize)
    ref_w, ref_ids = softmax_topk_reference(logits, 2, normalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights.double(), ref_w, atol=1e-6, rtol=1e-6)


def test_moe_softmax_topk_grouped():
    logits = torch.randn(5, 8, generator=gen(51))
    weights, ids = tmo.moe_softmax_topk(logits, 2, num_expert_group=4, topk_group=1)
    for t in range(5):
        p = torch.softmax(logits[t].double(), dim=0)
        best = max(range(4), key=lambda grp: float(p[2 * grp:2 * grp + 2].max()))
        assert sorted(ids[t].tolist()) == [2 * best, 2 * best + 1]
        torch.testing.assert_close(weights[t].double(), p[ids[t].long()], atol=1e-6, rtol=1e-6)


def test_moe_gen_idx_facts():
    expert_id = torch.tensor([[2, 0], [1, 2], [2, 3]], dtype=torch.int32)
    expand_idx, combine_idx, count, cusum = tmo.moe_gen_idx(expert_id, 5)
    assert count.tolist() == [1, 1, 3, 1, 0] and cusum.tolist() == [0, 1, 2, 5, 6, 6]
    flat = expert_id.reshape(-1).tolist()
    for pair, row in enumerate(combine_idx.tolist()):
        assert expand_idx[row] == pair // 2  # the pair's token
        assert cusum[flat[pair]] <= row < cusum[flat[pair] + 1]  # in its expert's rows


def moe_reference(x, gate_up, down, weights, ids):
    inter = down.shape[-1]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = gate_up[e].double() @ x[t].double()
            act = F.silu(h[:inter]) * h[inter:]
            out[t] += float(weights[t, k]) * (down[e].double() @ act)
    return out


def dlinfer_fused_moe(hidden_states, gate_up_weights, down_weights, topk_weights, topk_ids):
    """The sequence of dlinfer's camb fused_moe, with its argument forms."""
    seq_len, num_experts = hidden_states.shape[0], gate_up_weights.shape[0]
    gather_expand_idx, gather_combine_idx, token_count, cusum_token_count = tmo.moe_gen_idx(topk_ids, num_experts)
    expand = tmo.moe_expand_input(hidden_states, gather_expand_idx, cusum_token_count, 0, num_experts)
    up_proj = tmo.group_gemm(expand, gate_up_weights, token_count, expand_idx=None, c=None, alpha=None, beta=None,
                             max_in_group_list=seq_len)
    gate_cache = tmo.moe_active(up_proj, act_mode="silu", is_gated=True, output=up_proj, bias=None,
                                cusum_token_count=cusum_token_count, start_expert_id=0,
                                expert_size=num_experts)[:, : (up_proj.size()[-1] // 2)]
    down_proj = tmo.group_gemm(gate_cache, down_weights, token_count, expand_idx=None, c=None, alpha=None, beta=None,
                               max_in_group_list=seq_len)
    return tmo.moe_combine_result(down_proj, reduce_weight=topk_weights, gather_ids=gather_combine_idx, residual=None,
                                  cusum_token_count=cusum_token_count, start_expert_id=0, expert_size=num_experts,
                                  bias=None)


def test_fused_moe_pipeline_matches_per_token_reference():
    g = gen(52)
    tokens, hidden, inter, experts, topk = 7, 12, 5, 4, 2
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) / 3
    down = torch.randn(experts, hidden, inter, generator=g) / 3
    weights, ids = tmo.moe_softmax_topk(torch.randn(tokens, experts, generator=g), topk)
    out = dlinfer_fused_moe(x, gate_up, down, weights, ids)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out.double(), moe_reference(x, gate_up, down, weights, ids), atol=1e-5, rtol=1e-5)


def test_moe_pieces_partial_expert_range_and_residual():
    g = gen(53)
    x = torch.randn(4, 3, generator=g)
    ids = torch.tensor([[0, 2], [2, 1], [1, 0], [2, 2]], dtype=torch.int32)
    expand_idx, combine_idx, count, cusum = tmo.moe_gen_idx(ids, 3)
    # experts 1..2 only (expert parallelism): rows 0..5 of the expanded input, the rest zeros
    sub = tmo.moe_expand_input(x, expand_idx, cusum, 1, 2)
    first = int(cusum[1])
    for r in range(8):
        want = x[expand_idx[first + r]] if first + r < int(cusum[3]) else torch.zeros(3)
        assert torch.equal(sub[r], want)
    w = torch.rand(4, 2, generator=g)
    residual = torch.randn(4, 3, generator=g)
    combined = tmo.moe_combine_result(sub, w, combine_idx, residual, cusum, 1, 2)
    for t in range(4):
        want = residual[t].double()
        for k in range(2):
            if int(ids[t, k]) >= 1:
                want = want + float(w[t, k]) * x[t].double()
        torch.testing.assert_close(combined[t].double(), want, atol=1e-6, rtol=1e-6)


def test_group_gemm_and_matmul():
    g = gen(54)
    a = torch.randn(6, 5, generator=g)
    b = torch.randn(3, 4, 5, generator=g)
    counts = torch.tensor([2, 0, 3], dtype=torch.int32)  # 5 rows of 6: the last one belongs to no expert
    out = tmo.group_gemm(a, b, counts, None, None, None, None, 3)
    experts = [0, 0, 2, 2, 2]
    for r in range(6):
        want = b[experts[r]].double() @ a[r].double() if r < 5 else torch.zeros(4, dtype=torch.float64)
        torch.testing.assert_close(out[r].double(), want, atol=1e-5, rtol=1e-5)
    x = torch.randn(2, 3, 5, generator=g)
    w = torch.randn(4, 5, generator=g)
    bias = torch.randn(4, generator=g)
    got = tmo.matmul(x.view(-1, 5), w, bias).view(2, 3, -1)  # dlinfer's linear
    torch.testing.assert_close(got, x @ w.t() + bias, atol=1e-5, rtol=1e-5)
    c = torch.randn(6, 4, generator=g)
    got = tmo.matmul(x.view(-1, 5), w, None, c, "silu", alpha=0.5, beta=2.0, dtype=torch.float64)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, F.silu(0.5 * x.view(-1, 5).double() @ w.double().t() + 2.0 * c.double()),
                               atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# graph rules: the decode-path kernels never read device data on the host


class _HostReads(TorchDispatchMode):
    BAD = ("_local_scalar_dense", "nonzero", "masked_select", "item", "bincount", "unique", "_assert_async")

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.__name__.split(".")[0] in self.BAD:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_decode_path_kernels_read_nothing_on_the_host():
    lens = [5, 0, 3]
    q, k_cache, v_cache, table = decode_case(60, lens, heads=4, kv_heads=2, dim=8)
    bt, cl = torch.tensor(table, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    x = torch.randn(3, 8)
    logits = torch.randn(3, 4)
    with _HostReads() as mode:
        V._k_single_query(q.unsqueeze(1), k_cache, v_cache, torch.empty(3, 1, 4, 8), bt, cl, -1, -1, 0.3, -1, None)
        V._k_reshape_paged_cache(torch.randn(3, 2, 8), torch.randn(3, 2, 8), k_cache, v_cache,
                                 torch.tensor([4, -1, 0], dtype=torch.int32))
        V._k_fused_rms_norm(x, x, torch.ones(8), None, None, 1e-6, True)
        V._k_active(x, "silu", True, 1.0, False, "none")
        V._k_apply_rotary(q.unsqueeze(0), q.unsqueeze(0), torch.randn(3, 8), torch.randn(3, 8), None, None, False,
                          False, False, 3, False)
        w, ids = V._k_moe_softmax_topk(logits, 2, False, -1, 0, None, "topk_logit", 1.0, None)
        expand_idx, combine_idx, count, cusum, _ = V._k_moe_gen_idx(ids, 4)
        e = V._k_moe_expand_input(x, expand_idx, cusum, 0, 4)
        up = V._k_group_gemm(e, torch.randn(4, 6, 8), count, None, None, None, None, None, False, True, None)
        V._k_moe_active(up, up, None, cusum, "silu", True, 0, 4, False, "none", 0)
        V._k_moe_combine_result(up[:, :3], w, combine_idx, None, cusum, 0, 4)
        V._k_matmul(x, torch.randn(5, 8), None, None, "none", 1.0, 0.0, True, True, None, False, True)
    assert mode.seen == []


def test_fake_kernels_agree_with_the_real_ones():
    from torch._subclasses.fake_tensor import FakeTensorMode

    lens = [5, 0, 3]
    q, k_cache, v_cache, table = decode_case(61, lens, heads=4, kv_heads=2, dim=8)
    cases = {
        "active": lambda: tmo.active(torch.randn(3, 8), "silu", True),
        "rms": lambda: tmo.fused_rms_norm(torch.randn(3, 8), torch.randn(3, 8), torch.ones(8), None, None, 1e-6, True),
        "topk": lambda: tmo.moe_softmax_topk(torch.randn(3, 4), 2),
        "gen_idx": lambda: tmo.moe_gen_idx(torch.tensor([[0, 1], [1, 3], [2, 0]], dtype=torch.int32), 4),
        "expand": lambda: tmo.moe_expand_input(torch.randn(3, 8), torch.tensor([0, 2, 1, 1], dtype=torch.int32)),
        "gemm": lambda: tmo.group_gemm(torch.randn(4, 8), torch.randn(2, 6, 8), torch.tensor([1, 3]), None, None,
                                       None, None, 3),
        "combine": lambda: tmo.moe_combine_result(torch.randn(6, 8), torch.rand(3, 2), torch.arange(6), None, None,
                                                  0, 0),
        "matmul": lambda: tmo.matmul(torch.randn(2, 3, 8), torch.randn(2, 5, 8)),
    }
    for name, make in cases.items():
        real = make()
        with FakeTensorMode():
            fake = make()
        for r, f in zip(real if isinstance(real, tuple) else (real,), fake if isinstance(fake, tuple) else (fake,),
                        strict=True):
            assert (r.shape, r.dtype) == (f.shape, f.dtype), name
