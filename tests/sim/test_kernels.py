"""The emulated vendor kernels against a straightforward reference, and their graph-relevant facts."""

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode
from vendor_graph_sim import kernels as K

SCALE = 0.25


def paged_case(seed, lens, *, heads=4, kv_heads=2, dim=16, block=4, layout="bshd", poison=True, table_width=None):
    """Random caches and non-contiguous block tables for sequences of ``lens``; slots no sequence uses
    hold NaN, so a kernel that reads past a length shows it."""
    g = torch.Generator().manual_seed(seed)
    need = [max(1, math.ceil(n / block)) for n in lens]
    width = table_width or max(need)
    num_blocks = 1 + sum(need) + 2
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = [[free.pop() for _ in range(n)] + [0] * (width - n) for n in need]
    if layout == "bshd":
        shape = (num_blocks, block, kv_heads, dim)
    else:
        shape = (num_blocks, kv_heads, block, dim)
    k = torch.randn(shape, generator=g)
    v = torch.randn(shape, generator=g)
    if poison:
        used = torch.zeros(num_blocks, block, dtype=torch.bool)
        for row, n in zip(tables, lens, strict=True):
            for p in range(n):
                used[row[p // block], p % block] = True
        mask = used.view(num_blocks, block, 1, 1) if layout == "bshd" else used.view(num_blocks, 1, block, 1)
        k = torch.where(mask, k, float("nan"))
        v = torch.where(mask, v, float("nan"))
    q = torch.randn(len(lens), heads, dim, generator=g)
    return q, k, v, torch.tensor(tables, dtype=torch.int32)


lengths = st.lists(st.integers(0, 23), min_size=1, max_size=5)


# -------------------------------------------------------------------------------------------------
# decode kernels vs the reference


@settings(max_examples=25, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16))
def test_camb_derives_lengths_from_the_tensor_when_max_kv_seq_len_is_not_positive(lens, seed):
    q, k, v, table = paged_case(seed, lens, layout="bhsd")
    ref = K.reference_paged_attention(q, k, v, table, lens, SCALE, layout="bhsd")
    for max_kv in (-1, 0):
        out = K.camb_paged_decode_attention(q, k, v, table, torch.tensor(lens, dtype=torch.int32), max_kv, SCALE)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
        assert not out.isnan().any()


def test_camb_too_small_max_kv_seq_len_truncates_like_a_frozen_value():
    lens = [9, 3, 14]
    q, k, v, table = paged_case(3, lens, layout="bhsd")
    kv = torch.tensor(lens, dtype=torch.int32)
    ref = K.reference_paged_attention(q, k, v, table, lens, SCALE, layout="bhsd")
    exact = K.camb_paged_decode_attention(q, k, v, table, kv, max(lens), SCALE)
    torch.testing.assert_close(exact, ref, rtol=0, atol=1e-6)
    frozen = K.camb_paged_decode_attention(q, k, v, table, kv, 5, SCALE)  # a max captured at an earlier step
    assert not torch.allclose(frozen, ref, atol=1e-3), "a too-small max_kv_seq_len must give a wrong result"
    torch.testing.assert_close(frozen[1], ref[1], rtol=0, atol=1e-6)  # rows within the frozen max are right
    truncated = K.reference_paged_attention(q, k, v, table, [min(n, 5) for n in lens], SCALE, layout="bhsd")
    torch.testing.assert_close(frozen, truncated, rtol=0, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16))
def test_maca_decode_matches_reference(lens, seed):
    q, k, v, table = paged_case(seed, lens)
    out = K.maca_paged_decode_attention(q, k, v, table, torch.tensor(lens, dtype=torch.int32), SCALE)
    torch.testing.assert_close(out, K.reference_paged_attention(q, k, v, table, lens, SCALE), rtol=0, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16), layout=st.sampled_from(["BSH", "BSND", "TND"]))
def test_fia_paged_decode_matches_reference(lens, seed, layout):
    q, k, v, table = paged_case(seed, lens)
    b, n, d = q.shape
    nb, bs = k.shape[:2]
    ref = K.reference_paged_attention(q, k, v, table, lens, SCALE)
    query = {"BSH": q.view(b, 1, n * d), "BSND": q.view(b, 1, n, d), "TND": q}[layout]
    kc, vc = (k, v) if layout == "BSND" else (k.view(nb, bs, -1), v.view(nb, bs, -1))
    q_lens = list(range(1, b + 1)) if layout == "TND" else None  # TND: cumulative query ends
    out, lse = torch.ops.npu.npu_fused_infer_attention_score(
        query, kc, vc, actual_seq_lengths=q_lens, actual_seq_lengths_kv=lens, block_table=table, num_heads=n,
        scale=SCALE, input_layout=layout, num_key_value_heads=k.shape[2], block_size=bs)
    assert out.shape == query.shape and lse.shape == (1,)
    torch.testing.assert_close(out.reshape(b, n, d), ref, rtol=0, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16))
def test_fia_v2_paged_decode_matches_reference_and_out_overload(lens, seed):
    q, k, v, table = paged_case(seed, lens)
    b, n, d = q.shape
    nb, bs = k.shape[:2]
    ref = K.reference_paged_attention(q, k, v, table, lens, SCALE)
    kwargs = dict(actual_seq_qlen=list(range(1, b + 1)), actual_seq_kvlen=lens, block_table=table,
                  num_query_heads=n, num_key_value_heads=k.shape[2], softmax_scale=SCALE, input_layout="TND",
                  block_size=bs)
    out, _ = torch.ops.npu.npu_fused_infer_attention_score_v2(q, k.view(nb, bs, -1), v.view(nb, bs, -1), **kwargs)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    att, lse = torch.empty_like(q), torch.empty(1)
    res = torch.ops.npu.npu_fused_infer_attention_score_v2.out(q, k.view(nb, bs, -1), v.view(nb, bs, -1), **kwargs,
                                                               attention_out=att, softmax_lse=lse)
    assert res[0] is att and res[1] is lse
    assert torch.equal(att, out)


def test_fia_out_overload_writes_the_given_buffers():
    lens = [5, 0, 12]
    q, k, v, table = paged_case(11, lens)
    b, n, d = q.shape
    nb, bs = k.shape[:2]
    kwargs = dict(actual_seq_lengths_kv=lens, block_table=table, num_heads=n, scale=SCALE, input_layout="BSH",
                  num_key_value_heads=k.shape[2], block_size=bs, softmax_lse_flag=True)
    out, lse = torch.ops.npu.npu_fused_infer_attention_score(q.view(b, 1, -1), k.view(nb, bs, -1),
                                                             v.view(nb, bs, -1), **kwargs)
    assert lse.shape == (b, n, 1, 1) and torch.isinf(lse[1]).all()
    att, lse_buf = torch.full_like(out, 7.0), torch.empty_like(lse)
    res = torch.ops.npu.npu_fused_infer_attention_score.out(q.view(b, 1, -1), k.view(nb, bs, -1), v.view(nb, bs, -1),
                                                            **kwargs, attention_out=att, softmax_lse=lse_buf)
    assert res[0] is att and res[1] is lse_buf
    assert torch.equal(att, out) and torch.equal(lse_buf, lse)
    assert (att[1] == 0).all(), "a row of KV length 0 (graph padding) gives zeros"


def test_fia_causal_multi_token_decode_and_dense_kv():
    """sparse_mode 3 (speculative decode): query row j of a sequence with q_len Q sees kv_len - Q + j + 1."""
    lens, qlens = [7, 13], [3, 2]
    q, k, v, table = paged_case(5, lens)
    g = torch.Generator().manual_seed(1)
    n, d = q.shape[1:]
    nb, bs = k.shape[:2]
    query = torch.randn(sum(qlens), n, d, generator=g)
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(
        query, k.view(nb, bs, -1), v.view(nb, bs, -1), atten_mask=torch.ones(2048, 2048, dtype=torch.bool).triu(1),
        actual_seq_lengths=[3, 5], actual_seq_lengths_kv=lens, block_table=table, num_heads=n, scale=SCALE,
        input_layout="TND", num_key_value_heads=k.shape[2], sparse_mode=3, block_size=bs)
    row = 0
    for b, (kv, ql) in enumerate(zip(lens, qlens, strict=True)):
        for j in range(ql):
            ref = K.reference_paged_attention(query[row:row + 1], k, v, table[b:b + 1], [kv - ql + j + 1], SCALE)
            torch.testing.assert_close(out[row:row + 1], ref, rtol=0, atol=1e-6)
            row += 1
    # dense (unpaged) KV in BSND with per-row KV lengths
    kd = torch.randn(2, 9, 2, d, generator=g)
    vd = torch.randn(2, 9, 2, d, generator=g)
    qd = torch.randn(2, 1, n, d, generator=g)
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(qd, kd, vd, actual_seq_lengths_kv=[9, 4], num_heads=n,
                                                           scale=SCALE, input_layout="BSND", num_key_value_heads=2)
    for b, kv in enumerate([9, 4]):
        kc, vc = kd[b:b + 1, :kv], vd[b:b + 1, :kv]  # one "block" holding the whole sequence
        ref = K.reference_paged_attention(qd[b, 0][None], kc, vc, [[0]], [kv], SCALE)
        torch.testing.assert_close(out[b, 0], ref[0], rtol=0, atol=1e-6)


@settings(max_examples=15, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16))
def test_atb_paged_attention_takes_host_context_lens(lens, seed):
    q, k, v, table = paged_case(seed, lens)
    out = torch.full_like(q, 3.0)
    res = torch.ops.atb._npu_paged_attention(q, k, v, k.shape[2], q.shape[1], SCALE, table,
                                             torch.tensor(lens, dtype=torch.int32), out)
    assert res is None
    torch.testing.assert_close(out, K.reference_paged_attention(q, k, v, table, lens, SCALE), rtol=0, atol=1e-6)


def mla_case(seed, lens, heads=4, latent=16, rope=8, block=4):
    q, c, kr, table = paged_case(seed, lens, heads=heads, kv_heads=1, dim=latent, block=block)
    g = torch.Generator().manual_seed(seed + 1)
    kr = torch.where(c[..., :1].isnan(), float("nan"), torch.randn(*c.shape[:3], rope, generator=g))
    q_rope = torch.randn(len(lens), heads, rope, generator=g)
    ref = K.reference_paged_attention(torch.cat((q, q_rope), -1), torch.cat((c, kr), -1), c, table, lens, SCALE)
    return q, q_rope, c, kr, table, ref


@settings(max_examples=15, deadline=None)
@given(lens=lengths, seed=st.integers(0, 2**16))
def test_mla_kernels_match_reference(lens, seed):
    q, q_rope, c, kr, table, ref = mla_case(seed, lens)
    out = torch.ops.npu.npu_multi_head_latent_attention(q, q_rope, c, kr, table, lens, q.shape[1], SCALE, 1,
                                                        cache_mode="krope_ctkv")
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    buf = torch.empty_like(out)
    assert torch.ops.npu.npu_multi_head_latent_attention.out(q, q_rope, c, kr, table, lens, q.shape[1], SCALE, 1,
                                                             attn_out=buf) is buf
    assert torch.equal(buf, out)
    pa = torch.empty_like(out)
    torch.ops.atb._npu_paged_attention_mla(torch.cat((q, q_rope), -1), torch.cat((c, kr), -1), 1, q.shape[1], SCALE,
                                           table, torch.tensor(lens, dtype=torch.int32), c.shape[-1], pa)
    torch.testing.assert_close(pa, ref, rtol=0, atol=1e-6)


# -------------------------------------------------------------------------------------------------
# KV fill


def expected_fill(cache, rows, slots, layout):
    exp = cache.clone()
    block = cache.shape[1] if layout == "bshd" else cache.shape[2]
    for t, s in enumerate(slots):
        if s < 0:
            continue
        if layout == "bshd":
            exp[s // block, s % block] = rows[t]
        else:
            exp[s // block, :, s % block] = rows[t]
    return exp


def same_bytes(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


@settings(max_examples=40, deadline=None)
@given(data=st.data(), layout=st.sampled_from(["bshd", "bhsd"]), shape=st.sampled_from(["flat32", "col64"]))
def test_fill_kv_cache_writes_live_slots_and_nothing_else(data, layout, shape):
    nb, block, heads, dim = 5, 4, 2, 3
    capacity = nb * block
    live = data.draw(st.lists(st.integers(0, capacity - 1), unique=True, max_size=6))
    pads = data.draw(st.integers(0, 4))
    slots = data.draw(st.permutations(live + [-1] * pads))
    seed = data.draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    cshape = (nb, block, heads, dim) if layout == "bshd" else (nb, heads, block, dim)
    k_cache, v_cache = torch.randn(cshape, generator=g), torch.randn(cshape, generator=g)
    k_cache[0].fill_(float("nan"))  # NaN bytes in block 0 must survive untouched too
    key = torch.randn(len(slots), heads, dim, generator=g)
    value = torch.randn(len(slots), heads, dim, generator=g)
    idx = torch.tensor(slots, dtype=torch.int32) if shape == "flat32" else torch.tensor(slots).view(-1, 1)
    exp_k = expected_fill(k_cache, key, slots, layout)
    exp_v = expected_fill(v_cache, value, slots, layout)
    K.fill_kv_cache(key, value, k_cache, v_cache, idx, layout)
    assert same_bytes(k_cache, exp_k) and same_bytes(v_cache, exp_v)


def test_fill_kv_cache_padding_next_to_a_live_write_of_slot_0():
    k_cache, v_cache = torch.zeros(2, 4, 1, 2), torch.zeros(2, 4, 1, 2)
    key = torch.arange(8.0).view(4, 1, 2)
    K.fill_kv_cache(key, -key, k_cache, v_cache, torch.tensor([-1, 0, -1, 5]))
    assert torch.equal(k_cache[0, 0, 0], key[1, 0]) and torch.equal(k_cache[1, 1, 0], key[3, 0])
    assert k_cache.count_nonzero() == 4  # slot 0 holds [2, 3], slot 5 [6, 7]; the rest stays 0
    only_padding = torch.zeros(2, 4, 1, 2)
    K.fill_kv_cache(key, key, only_padding, only_padding.clone(), torch.full((4,), -1))
    assert only_padding.count_nonzero() == 0


# -------------------------------------------------------------------------------------------------
# graph-relevant facts: schemas, shapes without data, no host reads of device tensors, determinism


def arguments(op):
    return [(a.name, a.kwarg_only) for a in op._schema.arguments]


def test_schemas_place_host_lengths_where_the_update_path_looks():
    fia = arguments(torch.ops.npu.npu_fused_infer_attention_score.default)
    assert [n for n, _ in fia[:7]] == ["query", "key", "value", "pse_shift", "atten_mask", "actual_seq_lengths",
                                       "actual_seq_lengths_kv"]
    assert [kw for _, kw in fia[:4]] == [False, False, False, True], "FIA is keyword-only after value"
    assert arguments(torch.ops.npu.npu_fused_infer_attention_score.out)[6] == ("actual_seq_lengths_kv", True)
    v2 = arguments(torch.ops.npu.npu_fused_infer_attention_score_v2.default)
    assert v2[7] == ("actual_seq_qlen", True) and v2[8] == ("actual_seq_kvlen", True)
    pa = arguments(torch.ops.atb._npu_paged_attention.default)
    assert pa[7] == ("context_lens", False) and pa[-2][0] == "context_lens" and pa[-1][0] == "out"
    mla = arguments(torch.ops.npu.npu_multi_head_latent_attention.out)
    assert mla[5] == ("context_lens", False)
    assert "SymInt[] context_lens" in str(torch.ops.npu.npu_multi_head_latent_attention.default._schema)
    assert set(K.REGISTERED) >= {"npu::npu_fused_infer_attention_score", "atb::_npu_paged_attention",
                                 "vendor_graph_sim::fill_kv_cache", "vendor_graph_sim::camb_paged_decode_attention"}
    assert K.register() == K.REGISTERED  # idempotent


def test_fake_kernels_give_the_real_output_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    lens = [5, 9]
    q, k, v, table = paged_case(2, lens)
    b, n, d = q.shape
    nb, bs = k.shape[:2]
    q_rope, kr = torch.randn(b, n, 4), torch.randn(nb, bs, 1, 4)
    calls = {
        "fia": lambda q, k, v, t: torch.ops.npu.npu_fused_infer_attention_score(
            q, k.view(nb, bs, -1), v.view(nb, bs, -1), actual_seq_lengths=[1, 2], actual_seq_lengths_kv=lens,
            block_table=t, num_heads=n, scale=SCALE, input_layout="TND", num_key_value_heads=2, block_size=bs,
            softmax_lse_flag=True),
        "fia_v2": lambda q, k, v, t: torch.ops.npu.npu_fused_infer_attention_score_v2(
            q.view(b, 1, -1), k.view(nb, bs, -1), v.view(nb, bs, -1), actual_seq_kvlen=lens, block_table=t,
            num_query_heads=n, num_key_value_heads=2, softmax_scale=SCALE, block_size=bs),
        "camb": lambda q, k, v, t: K.camb_paged_decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), t,
                                                                 t[:, 0], -1, SCALE),
        "maca": lambda q, k, v, t: K.maca_paged_decode_attention(q, k, v, t, t[:, 0], SCALE),
        "mla": lambda q, k, v, t: torch.ops.npu.npu_multi_head_latent_attention(
            q, q_rope.to(q.device), k[:, :, :1], kr.to(q.device), t, lens, n, SCALE, 1),
    }
    for name, call in calls.items():
        real = call(q, k, v, table)
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = call(*(mode.from_tensor(x) for x in (q, k, v, table)))
        flat_real = real if isinstance(real, tuple) else (real,)
        flat_fake = fake if isinstance(fake, tuple) else (fake,)
        assert [x.shape for x in flat_fake] == [x.shape for x in flat_real], name
        assert [x.dtype for x in flat_fake] == [x.dtype for x in flat_real], name
    meta = torch.empty(5, 4, 2, 3, device="meta")
    K.fill_kv_cache(torch.empty(2, 2, 3, device="meta"), torch.empty(2, 2, 3, device="meta"), meta, meta,
                    torch.empty(2, dtype=torch.int32, device="meta"))


class OpLog(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.name())
        return func(*args, **(kwargs or {}))


def test_device_tensors_are_never_read_on_the_host():
    """The CPU kernels of the device-length ops issue no scalar read (.item()/int()) and no
    data-dependent-shape op, so they capture as they are on a device."""
    banned = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique",
              "aten::_unique2", "aten::item"}
    q, k, v, table = paged_case(4, [6, 0, 11], layout="bhsd")
    kv = torch.tensor([6, 0, 11], dtype=torch.int32)
    with OpLog() as log:
        K._camb_decode(q, k, v, table, kv, -1, SCALE)
        K._camb_decode(q, k, v, table, kv, 4, SCALE)
        K._maca_decode(q, k.transpose(1, 2), v.transpose(1, 2), table, kv, SCALE)
        K._fill_kv_cache(torch.ones(3, 2, 16), torch.ones(3, 2, 16), k, v, torch.tensor([5, -1, 0]), "bhsd")
        K._fill_kv_cache(torch.ones(3, 2, 16), torch.ones(3, 2, 16), k.transpose(1, 2).contiguous(),
                         v.transpose(1, 2).contiguous(), torch.tensor([[5], [-1], [0]]), "bshd")
    assert log.ops and not banned & set(log.ops), sorted(banned & set(log.ops))


def test_decode_is_deterministic_and_independent_of_batch_and_table_width():
    lens = [13, 4, 21, 1]
    q, k, v, table = paged_case(9, lens)
    kv = torch.tensor(lens, dtype=torch.int32)
    once = K.maca_paged_decode_attention(q, k, v, table, kv, SCALE)
    assert torch.equal(once, K.maca_paged_decode_attention(q, k, v, table, kv, SCALE))
    # the same rows inside a padded graph batch with a wider block table
    wide = torch.cat((torch.nn.functional.pad(table, (0, 5)), torch.zeros(4, table.shape[1] + 5, dtype=torch.int32)))
    padded_q = torch.cat((q, torch.randn(4, *q.shape[1:])))
    padded = K.maca_paged_decode_attention(padded_q, k, v, wide, torch.cat((kv, torch.zeros(4, dtype=torch.int32))),
                                           SCALE)
    assert torch.equal(padded[:4], once) and (padded[4:] == 0).all()
    single = K.maca_paged_decode_attention(q[2:3], k, v, table[2:3, :6], kv[2:3], SCALE)
    assert torch.equal(single[0], once[2])
