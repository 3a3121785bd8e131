"""The emulated paged attention kernels gather only the block-table columns their host KV lengths address.

lmdeploy's engine hands a graph a block table ``num_gpu_blocks`` columns wide (thousands with a cache sized
from free memory); gathering all of it made a replayed decode step cost about 40x the eager one. The result
must stay the whole table's, bit for bit, whatever the columns past the addressed ones hold.
"""

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vendor_graph_sim import kernels as K

BS, HEADS, KV_HEADS, DIM, LATENT, ROPE = 16, 4, 2, 16, 16, 8
SCALE = 0.25
WIDE = 2000
WHOLE_GATHER = K.gather_paged
LENGTHS = {  # lengths of a batch with a padding row -> the columns they address
    "longest-one-past-a-block": ([33, 0, 9, 20], 3),
    "longest-a-whole-number-of-blocks": ([32, 0, 5, 16], 2),
    "padding-only": ([0, 0, 0, 0], 1),
}


class Case:
    """Caches in which every slot no sequence uses is NaN. ``table(width)`` holds each row's blocks, then poison
    up to ``width`` columns: NaN blocks and block ids out of range on both sides (they clamp onto NaN blocks);
    a padding row (length 0) holds poison only."""

    def __init__(self, seed: int, lens: list[int]):
        g = torch.Generator().manual_seed(seed)
        self.lens = lens
        need = [math.ceil(n / BS) for n in lens]
        used = sum(need)
        num_blocks = used + 3  # block 0 and the last two hold no sequence
        ids = (torch.randperm(used, generator=g) + 1).tolist()
        self.rows = [[ids.pop() for _ in range(n)] for n in need]
        self.poison = [used + 1, num_blocks + 5, -4, 2**30, used + 2]
        live = torch.zeros(num_blocks, BS, 1, 1, dtype=torch.bool)
        for row, n in zip(self.rows, lens, strict=True):
            for p in range(n):
                live[row[p // BS], p % BS] = True

        def cache(*inner):
            return torch.where(live, torch.randn(num_blocks, BS, *inner, generator=g), float("nan"))

        b = len(lens)
        self.k, self.v = cache(KV_HEADS, DIM), cache(KV_HEADS, DIM)
        self.k_rope = cache(KV_HEADS, ROPE)
        self.ctkv, self.c_rope = cache(1, LATENT), cache(1, ROPE)
        self.q, self.q_rope = torch.randn(b, HEADS, DIM, generator=g), torch.randn(b, HEADS, ROPE, generator=g)
        self.q_nope, self.q_mla_rope = torch.randn(b, HEADS, LATENT, generator=g), torch.randn(b, HEADS, ROPE,
                                                                                                 generator=g)
        self.q_lens = [max(1, min(n, 3)) for n in lens]
        self.prefill_q = torch.randn(sum(self.q_lens), HEADS, DIM, generator=g)
        self.template = torch.triu(torch.ones(2048, 2048, dtype=torch.int8), diagonal=1)
        self.kv_seqlens = torch.tensor(lens, dtype=torch.int32)

    def table(self, width: int) -> torch.Tensor:
        rows = [row[:width] + [self.poison[i % len(self.poison)] for i in range(width - len(row[:width]))]
                for row in self.rows]
        return torch.tensor(rows, dtype=torch.int32)


def _fia(c, table, layout):
    b, nb = len(c.lens), c.k.shape[0]
    query = {"BSH": c.q.view(b, 1, -1), "BSND": c.q.view(b, 1, HEADS, DIM), "TND": c.q}[layout]
    kc, vc = (c.k, c.v) if layout == "BSND" else (c.k.view(nb, BS, -1), c.v.view(nb, BS, -1))
    return torch.ops.npu.npu_fused_infer_attention_score(
        query, kc, vc, actual_seq_lengths=list(range(1, b + 1)) if layout == "TND" else None,
        actual_seq_lengths_kv=c.lens, block_table=table, num_heads=HEADS, scale=SCALE, input_layout=layout,
        num_key_value_heads=KV_HEADS, block_size=BS, softmax_lse_flag=True)


def _fia_prefill(c, table):
    nb = c.k.shape[0]
    ends = torch.tensor(c.q_lens).cumsum(0).tolist()
    return torch.ops.npu.npu_fused_infer_attention_score(
        c.prefill_q, c.k.view(nb, BS, -1), c.v.view(nb, BS, -1), atten_mask=c.template, actual_seq_lengths=ends,
        actual_seq_lengths_kv=c.lens, block_table=table, num_heads=HEADS, scale=SCALE, input_layout="TND",
        num_key_value_heads=KV_HEADS, block_size=BS, sparse_mode=3, softmax_lse_flag=True)


def _fia_out(c, table):
    b, nb = len(c.lens), c.k.shape[0]
    out = torch.empty(b, 1, HEADS * DIM, device=c.q.device)
    lse = torch.empty(b, HEADS, 1, 1, device=c.q.device)
    return torch.ops.npu.npu_fused_infer_attention_score.out(
        c.q.view(b, 1, -1), c.k.view(nb, BS, -1), c.v.view(nb, BS, -1), actual_seq_lengths_kv=c.lens,
        block_table=table, num_heads=HEADS, scale=SCALE, input_layout="BSH", num_key_value_heads=KV_HEADS,
        block_size=BS, softmax_lse_flag=True, attention_out=out, softmax_lse=lse)


def _fia_v2_rope(c, table):
    b, nb = len(c.lens), c.k.shape[0]
    return torch.ops.npu.npu_fused_infer_attention_score_v2(
        c.q.view(b, 1, -1), c.k.view(nb, BS, -1), c.v.view(nb, BS, -1), query_rope=c.q_rope.view(b, 1, -1),
        key_rope=c.k_rope.view(nb, BS, -1), actual_seq_kvlen=c.lens, block_table=table, num_query_heads=HEADS,
        num_key_value_heads=KV_HEADS, softmax_scale=SCALE, block_size=BS, return_softmax_lse=True)


def _fia_v2_out(c, table):
    b, nb = len(c.lens), c.k.shape[0]
    out = torch.empty(b, HEADS, DIM, device=c.q.device)
    lse = torch.empty(b, HEADS, 1, device=c.q.device)
    return torch.ops.npu.npu_fused_infer_attention_score_v2.out(
        c.q, c.k.view(nb, BS, -1), c.v.view(nb, BS, -1), actual_seq_qlen=list(range(1, b + 1)),
        actual_seq_kvlen=c.lens, block_table=table, num_query_heads=HEADS, num_key_value_heads=KV_HEADS,
        softmax_scale=SCALE, input_layout="TND", block_size=BS, return_softmax_lse=True, attention_out=out,
        softmax_lse=lse)


def _mla(c, table):
    return torch.ops.npu.npu_multi_head_latent_attention(c.q_nope, c.q_mla_rope, c.ctkv, c.c_rope, table, c.lens,
                                                         HEADS, SCALE, 1)


def _mla_out(c, table):
    out = torch.empty(len(c.lens), HEADS, LATENT, device=c.q.device)
    return torch.ops.npu.npu_multi_head_latent_attention.out(c.q_nope, c.q_mla_rope, c.ctkv, c.c_rope, table, c.lens,
                                                             HEADS, SCALE, 1, attn_out=out)


def _atb_paged(c, table):
    out = torch.empty_like(c.q)
    torch.ops.atb._npu_paged_attention(c.q, c.k, c.v, KV_HEADS, HEADS, SCALE, table,
                                       torch.tensor(c.lens, dtype=torch.int32), out)
    return out


def _atb_paged_mla(c, table):
    out = torch.empty(len(c.lens), HEADS, LATENT, device=c.q.device)
    torch.ops.atb._npu_paged_attention_mla(torch.cat((c.q_nope, c.q_mla_rope), -1), torch.cat((c.ctkv, c.c_rope), -1),
                                           1, HEADS, SCALE, table, torch.tensor(c.lens, dtype=torch.int32), LATENT, out)
    return out


def _camb_host_max(c, table):
    return K.camb_paged_decode_attention(c.q, c.k.transpose(1, 2).contiguous(), c.v.transpose(1, 2).contiguous(),
                                         table, c.kv_seqlens, max(max(c.lens), 1), SCALE)


KERNELS = {
    "fia-BSH": lambda c, t: _fia(c, t, "BSH"),
    "fia-BSND": lambda c, t: _fia(c, t, "BSND"),
    "fia-TND": lambda c, t: _fia(c, t, "TND"),
    "fia-TND-paged-prefill-sparse_mode-3": _fia_prefill,
    "fia.out": _fia_out,
    "fia_v2-rope": _fia_v2_rope,
    "fia_v2.out-TND": _fia_v2_out,
    "mla": _mla,
    "mla.out": _mla_out,
    "atb-paged_attention": _atb_paged,
    "atb-paged_attention_mla": _atb_paged_mla,
    "camb-max_kv_seq_len": _camb_host_max,
}


def _outputs(result):
    return result if isinstance(result, tuple) else (result,)


def _same(a, b):
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _gathering_whole_tables(cache, block_table, layout="bshd", longest=None):
    return WHOLE_GATHER(cache, block_table, layout)


def _counting(blocks: list[int]):
    def gather(cache, block_table, layout="bshd", longest=None):
        out = WHOLE_GATHER(cache, block_table, layout, longest)
        blocks.append(out.shape[0] * out.shape[1] // BS)
        return out

    return gather


@pytest.mark.parametrize("lengths", LENGTHS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_table_thousands_of_columns_wide_gives_the_whole_gathers_result_bit_for_bit(kernel, lengths, monkeypatch):
    lens, columns = LENGTHS[lengths]
    c = Case(7, lens)
    call = KERNELS[kernel]
    exact = _outputs(call(c, c.table(columns)))
    wide = _outputs(call(c, c.table(WIDE)))
    monkeypatch.setattr(K, "gather_paged", _gathering_whole_tables)
    whole = _outputs(call(c, c.table(WIDE)))
    assert not exact[0].isnan().any()
    assert (exact[0].flatten(1).abs().amax(1) > 0).any() == (max(lens) > 0)
    assert _same(wide, whole), "reading only the addressed columns changed the result"
    assert _same(exact, wide), "the table's columns past the addressed ones changed the result"


@pytest.mark.parametrize("kernel", KERNELS)
def test_only_the_columns_the_host_lengths_address_are_gathered(kernel, monkeypatch):
    blocks: list[int] = []
    monkeypatch.setattr(K, "gather_paged", _counting(blocks))
    for lens, columns in LENGTHS.values():
        c = Case(3, lens)
        KERNELS[kernel](c, c.table(WIDE))
        assert blocks and blocks == [len(lens) * columns] * len(blocks), (lens, blocks)
        blocks.clear()


@pytest.mark.parametrize("kernel", KERNELS)
def test_a_table_narrower_than_the_lengths_is_gathered_whole(kernel, monkeypatch):
    c = Case(5, [40, 3, 25, 0])
    narrow = c.table(2)  # 32 positions: the longest row is cut at the table's end, as before
    blocks: list[int] = []
    monkeypatch.setattr(K, "gather_paged", _counting(blocks))
    sliced = _outputs(KERNELS[kernel](c, narrow))
    assert blocks and blocks == [4 * 2] * len(blocks)
    monkeypatch.setattr(K, "gather_paged", _gathering_whole_tables)
    assert _same(sliced, _outputs(KERNELS[kernel](c, narrow)))


class _OpLog(TorchDispatchMode):
    """The aten ops run, the emulated kernels' own ops included: those are run here as Python functions."""

    def __init__(self):
        super().__init__()
        self.ops: set[str] = set()
        self.kernels = {f"{lib.ns}::{head}": kernel for lib, head, kernel in K._DEVICE_IMPLS}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(func.name())
        if func.name() in self.kernels:
            with self:
                return self.kernels[func.name()](*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_width_comes_from_host_values_not_from_a_read_of_tensor_data(kernel):
    """On a device, a scalar read of a tensor is a sync, which fails a graph capture; the simulator runs kernels on
    the CPU data behind its device tensors, where such a read goes uncounted, so the ops are watched here."""
    c = Case(11, LENGTHS["longest-one-past-a-block"][0])
    with _OpLog() as log:
        KERNELS[kernel](c, c.table(WIDE))
    assert "aten::index.Tensor" in log.ops, "the kernel body ran unwatched"
    assert not log.ops & {"aten::_local_scalar_dense", "aten::item", "aten::nonzero"}
