"""The MACA stand-ins of vendor_graph_sim.vendor_kernels_maca (flash_attn, mcoplib, dlinfer's MACA Triton kernels):
numerics against plain per-sequence references written here, on plain CPU tensors; the decode-path kernels run on
meta tensors (no host read of device data); real argument names; labels; registration only at build."""

from __future__ import annotations

import ast
import inspect
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from vendor_graph_sim import vendor_kernels_maca as VK
from vendor_graph_sim.boot import STANDIN_LABEL

MODULES = {name: VK.build_module(name) for name in VK.NAMES}
FA = MODULES["flash_attn"]
LMD = MODULES["mcoplib.lmdeploy"]
OP = MODULES["mcoplib.op"]
CTX = MODULES[VK.CONTEXT_ATTENTION]
MOE = MODULES[VK.FUSED_MOE]
ROOT = Path(__file__).resolve().parents[2]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=_gen(seed), dtype=torch.float32).to(dtype)


# ----------------------------------------------------------------------------------------------
# references (loops over sequences, rows, heads)


def ref_rows(q, k, v, allowed, scale):
    """q (Lq, N, D), k (Lk, KVH, D), v (Lk, KVH, Dv); allowed(i, j) -> bool. float64 (Lq, N, Dv); empty rows 0."""
    lq, n = q.shape[:2]
    group = n // k.shape[1]
    out = torch.zeros(lq, n, v.shape[-1], dtype=torch.float64)
    for i in range(lq):
        js = [j for j in range(k.shape[0]) if allowed(i, j)]
        if not js:
            continue
        for h in range(n):
            kv = h // group
            scores = [float(q[i, h].double() @ k[j, kv].double()) * scale for j in js]
            peak = max(scores)
            weights = [math.exp(s - peak) for s in scores]
            total = sum(weights)
            for w, j in zip(weights, js, strict=True):
                out[i, h] += w / total * v[j, kv].double()
    return out


def cache_rows(cache, table_row, length, block_size):
    """Positions 0..length-1 of one sequence, read one by one from a (blocks, block_size, KVH, D) cache."""
    if length == 0:
        return cache.new_zeros((0, *cache.shape[2:]))
    return torch.stack([cache[int(table_row[p // block_size]), p % block_size] for p in range(length)])


# ----------------------------------------------------------------------------------------------
# modules, names, registration


def test_names_are_what_maca_ops_imports_and_modules_are_labelled_fresh_stand_ins():
    assert VK.NAMES == ("flash_attn", "mcoplib", "mcoplib.lmdeploy", "mcoplib.op", "mcoplib._C", "mcoplib._moe_C",
                        "dlinfer.vendor.maca.context_flashattention", "dlinfer.vendor.maca.fused_moe")
    for name in VK.NAMES:
        module = VK.build_module(name)
        assert module.__name__ == name
        assert isinstance(getattr(module, STANDIN_LABEL), str) and getattr(module, STANDIN_LABEL)
        assert module is not VK.build_module(name)  # fresh each time
        assert (getattr(module, "__path__", None) == []) == (name in ("flash_attn", "mcoplib"))
    with pytest.raises(KeyError):
        VK.build_module("mcoplib.nothing")


def test_mcoplib_ops_have_the_real_names_and_schemas_and_building_is_idempotent():
    before = list(VK.REGISTERED)
    for name in VK.NAMES:
        VK.build_module(name)
    assert VK.REGISTERED == before
    schemas = {
        torch.ops._C.fused_add_rms_norm: "_C::fused_add_rms_norm(Tensor($0! -> ) input, Tensor($1! -> ) residual, "
                                         "Tensor weight, float epsilon) -> ()",
        torch.ops._C.silu_and_mul: "_C::silu_and_mul(Tensor($0! -> ) result, Tensor input) -> ()",
        torch.ops._C_cache_ops.reshape_and_cache_flash:
            "_C_cache_ops::reshape_and_cache_flash(Tensor key, Tensor value, Tensor($0! -> ) key_cache, "
            "Tensor($1! -> ) value_cache, Tensor slot_mapping, str kv_cache_dtype, Tensor k_scale, Tensor v_scale) "
            "-> ()",
        torch.ops._moe_C.topk_softmax: "_moe_C::topk_softmax(Tensor($0! -> ) topk_weights, Tensor($1! -> ) "
                                       "topk_indices, Tensor($2! -> ) token_expert_indices, Tensor gating_output, "
                                       "bool renormalize=False) -> ()",
    }
    for packet, schema in schemas.items():
        assert str(packet.default._schema) == schema
    for qualname in ("_moe_C::moe_align_block_size", "_moe_C::moe_sum"):
        assert qualname in VK.REGISTERED


def test_an_existing_operator_is_left_to_its_owner():
    lib = torch.library.Library("vg_maca_owner_test", "DEF")
    lib.define("own(Tensor x) -> Tensor")
    lib.impl("own", lambda x: x + 1, "CPU")
    VK._register("vg_maca_owner_test", "own(Tensor x) -> Tensor", lambda x: x * 0, lambda x: x)
    assert "vg_maca_owner_test::own" not in VK.REGISTERED
    assert torch.equal(torch.ops.vg_maca_owner_test.own(torch.ones(2)), torch.full((2,), 2.0))


def test_importing_the_file_registers_nothing():
    code = ("import torch, vendor_graph_sim.vendor_kernels_maca as VK\n"
            "names = [q for ops in VK.OPERATORS.values() for q in (f'{ns}::' + s.split('(')[0] for ns, s, _, _ in ops)]"
            "\nfound = [q for q in names if VK._exists(*q.split('::'))]\n"
            "assert not found and not VK.REGISTERED, found\n"
            "VK.build_module('mcoplib._C')\n"
            "assert VK._exists('_C', 'fused_add_rms_norm') and not VK._exists('_moe_C', 'topk_softmax')\n")
    env = {k: v for k, v in os.environ.items() if k != "VENDOR_GRAPH_SIM"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_served_functions_take_the_real_argument_names():
    def params(fn):
        return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]

    empty, pos = inspect.Parameter.empty, inspect.Parameter.POSITIONAL_ONLY
    key = inspect.Parameter.POSITIONAL_OR_KEYWORD
    assert [(n, d) for n, d, _ in params(FA.flash_attn_varlen_func)] == [
        ("q", empty), ("k", empty), ("v", empty), ("cu_seqlens_q", empty), ("cu_seqlens_k", empty),
        ("max_seqlen_q", empty), ("max_seqlen_k", empty), ("dropout_p", 0.0), ("softmax_scale", None),
        ("causal", False), ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
        ("deterministic", False), ("return_attn_probs", False), ("block_table", None)]
    assert [(n, d) for n, d, _ in params(FA.flash_attn_with_kvcache)] == [
        ("q", empty), ("k_cache", empty), ("v_cache", empty), ("k", None), ("v", None), ("rotary_cos", None),
        ("rotary_sin", None), ("cache_seqlens", None), ("cache_batch_idx", None), ("cache_leftpad", None),
        ("block_table", None), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
        ("softcap", 0.0), ("rotary_interleaved", True), ("alibi_slopes", None), ("num_splits", 0),
        ("return_softmax_lse", False)]
    assert params(LMD.lmdeploy_rotary_embedding) == [
        (n, empty, pos) for n in ("positions", "query", "key", "head_size", "cos", "sin", "is_neox")]
    assert params(OP.rms_norm) == [
        (n, empty, pos) for n in ("out", "input", "weight", "var_epsilon", "after_res", "residual", "rms_div")]
    assert params(CTX.context_attention_fwd) == [
        *[(n, empty, key) for n in ("q", "k", "v", "o", "k_cache", "v_cache", "b_loc", "b_start_loc", "b_seq_len",
                                    "b_ctx_len", "max_input_len")],
        ("k_scale", 1.0, key), ("v_scale", 1.0, key), ("alibi_slopes", None, key)]
    assert [(n, d) for n, d, _ in params(MOE.fused_experts)] == [
        ("hidden_states", empty), ("w1", empty), ("w2", empty), ("topk_weights", empty), ("topk_ids", empty),
        ("inplace", False), ("use_fp8_w8a8", False), ("use_int8_w8a16", False), ("w1_scale", None),
        ("w2_scale", None), ("a1_scale", None), ("a2_scale", None), ("block_shape", None)]


def test_a_wrong_keyword_raises_type_error():
    q, cu = torch.zeros(2, 1, 8), torch.tensor([0, 2], dtype=torch.int32)
    with pytest.raises(TypeError):
        FA.flash_attn_varlen_func(q, q, q, cu, cu, 2, 2, scale=0.5)
    with pytest.raises(TypeError):
        FA.flash_attn_with_kvcache(q.unsqueeze(0), q.unsqueeze(0), q.unsqueeze(0), seqlens=cu)
    x, w = torch.ones(2, 8), torch.ones(8)
    with pytest.raises(TypeError):
        OP.rms_norm(out=x, input=x, weight=w, var_epsilon=1e-6, after_res=None, residual=None, rms_div=False)
    with pytest.raises(TypeError):
        LMD.lmdeploy_rotary_embedding(torch.arange(2), x, x, 8, x, x, is_neox=True)
    with pytest.raises(TypeError):
        CTX.context_attention_fwd(q, q, q, q, q, q, cu, cu, cu, cu, 2, softmax_scale=0.5)
    with pytest.raises(TypeError):
        MOE.fused_experts(x, x, x, x, x, renormalize=True)


def _dlinfer_maca() -> Path | None:
    roots = [os.environ.get("VENDOR_GRAPH_DLINFER_SRC"), ROOT / "shared" / "third_party" / "dlinfer",
             ROOT.parent / "shared" / "third_party" / "dlinfer"]
    for root in roots:
        if root and (Path(root) / "dlinfer" / "vendor" / "maca" / "maca_ops.py").is_file():
            return Path(root) / "dlinfer" / "vendor" / "maca"
    return None


def _dotted(node: ast.AST) -> str:
    return f"{_dotted(node.value)}.{node.attr}" if isinstance(node, ast.Attribute) else getattr(node, "id", "?")


def test_everything_dlinfers_maca_ops_import_and_call_is_served():
    folder = _dlinfer_maca()
    if folder is None:
        pytest.skip("no dlinfer source (VENDOR_GRAPH_DLINFER_SRC)")
    aliases = {"ops": "mcoplib.lmdeploy", "op_origin": "mcoplib.op"}
    for file in ("maca_ops.py", "fused_moe.py", "context_flashattention.py"):
        tree = ast.parse((folder / file).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = f"dlinfer.vendor.maca.{node.module}" if node.level == 1 else node.module
                if module in VK.NAMES:
                    for alias in node.names:
                        sub = f"{module}.{alias.name}"
                        assert sub in VK.NAMES or hasattr(MODULES[module], alias.name), (file, sub)
                elif node.level == 0:
                    assert module.split(".")[0] in ("dlinfer", "typing", "torch", "triton"), (file, module)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] in ("mcoplib", "flash_attn"):
                        assert alias.name in VK.NAMES, (file, alias.name)
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                dotted = _dotted(node.func)
                head, _, attr = dotted.rpartition(".")
                if file == "maca_ops.py" and head in aliases:
                    fn = getattr(MODULES[aliases[head]], attr)
                    inspect.signature(fn).bind(*node.args, **{k.arg: None for k in node.keywords})
                elif dotted.startswith("torch.ops."):
                    _, _, namespace, name = dotted.split(".")
                    assert VK._exists(namespace, name), (file, dotted)
            if file == "maca_ops.py" and isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                fn = {"flash_attn_varlen_func": FA.flash_attn_varlen_func,
                      "flash_attn_with_kvcache": FA.flash_attn_with_kvcache,
                      "context_attention_fwd": CTX.context_attention_fwd,
                      "fused_experts": MOE.fused_experts}.get(node.func.id)
                if fn is not None:  # dlinfer's calls bind to the stand-ins' parameters
                    inspect.signature(fn).bind(*node.args, **{k.arg: None for k in node.keywords})


# ----------------------------------------------------------------------------------------------
# flash_attn


@pytest.mark.parametrize(("causal", "window", "q_lens", "k_lens"), [
    (True, (-1, -1), [3, 5, 1, 0], [3, 5, 1, 0]),  # prefill: causal self-attention
    (True, (-1, -1), [2, 4, 1], [5, 4, 3]),  # bottom-right causal with longer keys
    (False, (-1, -1), [2, 3], [4, 1]),
    (False, (2, 1), [4, 3], [6, 3]),
])
def test_flash_attn_varlen_func_matches_per_sequence_attention(causal, window, q_lens, k_lens):
    n, kvh, d = 4, 2, 8
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = _randn(int(cu_q[-1]), n, d, seed=1)
    k, v = _randn(int(cu_k[-1]), kvh, d, seed=2), _randn(int(cu_k[-1]), kvh, d, seed=3)
    scale = 0.37
    out = FA.flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(q_lens),
                                    max_seqlen_k=max(k_lens), softmax_scale=scale, causal=causal,
                                    window_size=window)
    assert out.shape == (q.shape[0], n, d) and out.dtype == q.dtype
    left, right = window
    for b, (lq, lk) in enumerate(zip(q_lens, k_lens, strict=True)):
        def allowed(i, j, lq=lq, lk=lk):
            diag = i + lk - lq
            hi = diag if causal else (diag + right if right >= 0 else lk)
            return j <= hi and (left < 0 or j >= diag - left)

        qs, ks = int(cu_q[b]), int(cu_k[b])
        expected = ref_rows(q[qs:qs + lq], k[ks:ks + lk], v[ks:ks + lk], allowed, scale)
        torch.testing.assert_close(out[qs:qs + lq].double(), expected, atol=2e-6, rtol=1e-5)


def test_flash_attn_varlen_func_default_scale_and_refusals():
    q, cu = _randn(3, 2, 16, seed=4), torch.tensor([0, 3], dtype=torch.int32)
    out = FA.flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, causal=True)
    expected = ref_rows(q, q, q, lambda i, j: j <= i, 16 ** -0.5)
    torch.testing.assert_close(out.double(), expected, atol=2e-6, rtol=1e-5)
    with pytest.raises(ValueError):
        FA.flash_attn_varlen_func(q, q, q, cu, cu, 2, 3)  # a sequence longer than max_seqlen_q
    with pytest.raises(NotImplementedError):
        FA.flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, dropout_p=0.1)


def _paged_case(seed=0, lens=(5, 12, 0, 1), block_size=4, width=3, blocks=16, n=4, kvh=2, d=8, s=1):
    g = _gen(seed)
    b = len(lens)
    table = torch.randperm(blocks, generator=g)[:b * width].view(b, width).to(torch.int32)
    k_cache = torch.full((blocks, block_size, kvh, d), float("nan"))
    v_cache = torch.full((blocks, block_size, kvh, d), float("nan"))
    for row, length in enumerate(lens):  # only the addressed slots hold numbers
        for p in range(length):
            blk, off = int(table[row, p // block_size]), p % block_size
            k_cache[blk, off] = torch.randn(kvh, d, generator=g)
            v_cache[blk, off] = torch.randn(kvh, d, generator=g)
        used = -(-length // block_size)
        table[row, used:] = torch.tensor([999, -7, 3][: width - used], dtype=torch.int32)  # garbage columns
    q = torch.randn(b, s, n, d, generator=g)
    return q, k_cache, v_cache, table, torch.tensor(lens, dtype=torch.int32)


def test_flash_attn_with_kvcache_decode_as_dlinfer_calls_it():
    q, k_cache, v_cache, table, lens = _paged_case()
    scale = 0.41
    out = FA.flash_attn_with_kvcache(q=q, k_cache=k_cache, v_cache=v_cache, block_table=table, cache_seqlens=lens,
                                     softmax_scale=scale, causal=True, softcap=0).squeeze(1)
    assert out.shape == (4, 4, 8) and not out.isnan().any()
    for b, length in enumerate(lens.tolist()):
        k = cache_rows(k_cache, table[b], length, 4)
        v = cache_rows(v_cache, table[b], length, 4)
        expected = ref_rows(q[b], k, v, lambda i, j: True, scale)[0]
        torch.testing.assert_close(out[b].double(), expected, atol=2e-6, rtol=1e-5)
    assert torch.equal(out[2], torch.zeros(4, 8))  # length 0: zeros
    plain = FA.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table,
                                       softmax_scale=scale)  # one query: causal or not, the same positions
    assert torch.equal(plain.squeeze(1), out)


def test_flash_attn_with_kvcache_reads_lengths_from_the_tensor_and_masks_causally_for_several_queries():
    q, k_cache, v_cache, table, lens = _paged_case(seed=5, lens=(7, 12, 3), s=3)
    out, lse = FA.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=lens, block_table=table,
                                          causal=True, return_softmax_lse=True)
    assert lse.shape == (3, 4, 3) and lse.dtype == torch.float32
    for b, length in enumerate(lens.tolist()):
        k, v = cache_rows(k_cache, table[b], length, 4), cache_rows(v_cache, table[b], length, 4)
        expected = ref_rows(q[b], k, v, lambda i, j, n=length: j <= i + n - 3, 8 ** -0.5)
        torch.testing.assert_close(out[b].double(), expected, atol=2e-6, rtol=1e-5)
    shorter = lens.clone()
    shorter[1] = 9  # same shapes, other device values: another answer
    again = FA.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=shorter, block_table=table, causal=True)
    assert torch.equal(again[0], out[0]) and not torch.allclose(again[1], out[1])


def test_flash_attn_with_kvcache_without_a_block_table():
    g = _gen(8)
    k_cache, v_cache = torch.randn(3, 6, 1, 8, generator=g), torch.randn(3, 6, 1, 8, generator=g)
    q = torch.randn(2, 1, 2, 8, generator=g)
    out = FA.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=4, causal=True)
    for b in range(2):
        expected = ref_rows(q[b], k_cache[b, :4], v_cache[b, :4], lambda i, j: True, 8 ** -0.5)
        torch.testing.assert_close(out[b].double(), expected, atol=2e-6, rtol=1e-5)


# ----------------------------------------------------------------------------------------------
# mcoplib._C / _C_cache_ops / _moe_C


@pytest.mark.parametrize(("slots", "tokens"), [
    ([3, -1, 9, 0, -1], 5),  # slot 0 live among padding
    ([-1, 14, 5, -1, -1], 6),  # padding only at slot 0's expense; key longer than slot_mapping
])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_reshape_and_cache_flash_writes_only_the_addressed_slots(slots, tokens, index_dtype):
    key, value = _randn(tokens, 2, 8, seed=10), _randn(tokens, 2, 8, seed=11)
    key_cache, value_cache = _randn(4, 4, 2, 8, seed=12), _randn(4, 4, 2, 8, seed=13)
    expected_k, expected_v = key_cache.clone(), value_cache.clone()
    for t, slot in enumerate(slots):
        if slot >= 0:
            expected_k[slot // 4, slot % 4] = key[t]
            expected_v[slot // 4, slot % 4] = value[t]
    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, key_cache, value_cache,
                                                   torch.tensor(slots, dtype=index_dtype), "auto",
                                                   torch.tensor(1.0), torch.tensor(1.0))
    assert torch.equal(key_cache, expected_k) and torch.equal(value_cache, expected_v)


def test_fused_add_rms_norm_is_in_place_on_input_and_residual():
    x, r, w = _randn(4, 16, seed=20) * 0.3, _randn(4, 16, seed=21) * 0.3, _randn(16, seed=22)
    eps = 0.05
    x0, r0 = x.clone(), r.clone()
    assert torch.ops._C.fused_add_rms_norm(x, r, w, eps) is None
    for t in range(4):
        total = [float(x0[t, i]) + float(r0[t, i]) for i in range(16)]
        rstd = 1 / math.sqrt(sum(v * v for v in total) / 16 + eps)
        torch.testing.assert_close(r[t].double(), torch.tensor(total, dtype=torch.float64), atol=1e-6, rtol=1e-6)
        expected = torch.tensor([total[i] * rstd * float(w[i]) for i in range(16)], dtype=torch.float64)
        torch.testing.assert_close(x[t].double(), expected, atol=1e-5, rtol=1e-5)


def test_fused_add_rms_norm_in_bfloat16():
    x, r, w = (_randn(3, 32, seed=s, dtype=torch.bfloat16) for s in (23, 24, 25))
    x0, r0 = x.clone(), r.clone()
    torch.ops._C.fused_add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(r, (x0.float() + r0.float()).to(torch.bfloat16))
    z = r.double()
    expected = z / torch.sqrt(z.square().mean(-1, keepdim=True) + 1e-6) * w.double()
    torch.testing.assert_close(x.double(), expected, atol=2e-2, rtol=1e-2)


def test_silu_and_mul():
    x = _randn(3, 2, 12, seed=30)
    out = torch.full((3, 2, 6), float("nan"))
    torch.ops._C.silu_and_mul(out, x)
    for idx in range(3 * 2):
        a, b = divmod(idx, 2)
        for i in range(6):
            g, u = float(x[a, b, i]), float(x[a, b, 6 + i])
            assert abs(float(out[a, b, i]) - g / (1 + math.exp(-g)) * u) < 1e-5


@pytest.mark.parametrize("renormalize", [None, False, True])
def test_topk_softmax(renormalize):
    gating = _randn(5, 6, seed=40)
    gating[2] = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0, -1.0])  # a three-way tie: lower expert first
    n, k = 5, 3
    weights = torch.empty(n, k)
    ids = torch.empty(n, k, dtype=torch.int32)
    token_expert = torch.empty(n, k, dtype=torch.int32)
    args = (weights, ids, token_expert, gating)
    torch.ops._moe_C.topk_softmax(*args) if renormalize is None else torch.ops._moe_C.topk_softmax(*args, renormalize)
    for t in range(n):
        exps = [math.exp(float(v)) for v in gating[t]]
        probs = [e / sum(exps) for e in exps]
        best = sorted(range(6), key=lambda e, p=probs: (-p[e], e))[:k]
        chosen = [probs[e] for e in best]
        if renormalize:
            chosen = [p / sum(chosen) for p in chosen]
        assert ids[t].tolist() == best
        torch.testing.assert_close(weights[t].double(), torch.tensor(chosen, dtype=torch.float64), atol=1e-6,
                                   rtol=1e-6)
        assert token_expert[t].tolist() == [j * n + t for j in range(k)]


def test_moe_align_block_size_and_moe_sum():
    topk_ids = torch.tensor([[2, 0], [1, 2], [2, 3], [0, 2], [3, 1]], dtype=torch.int32)
    experts, block = 4, 4
    numel = topk_ids.numel()
    length = numel + experts * (block - 1)
    sorted_ids = torch.full((length,), -5, dtype=torch.int32)
    expert_ids = torch.full((-(-length // block),), -5, dtype=torch.int32)
    post_pad = torch.empty(1, dtype=torch.int32)
    torch.ops._moe_C.moe_align_block_size(topk_ids, experts, block, sorted_ids, expert_ids, post_pad)
    flat = topk_ids.flatten().tolist()
    expected_ids, expected_experts = [], []
    for e in range(experts):
        mine = [i for i, x in enumerate(flat) if x == e]
        padded = mine + [numel] * (-len(mine) % block)
        expected_ids += padded
        expected_experts += [e] * (len(padded) // block)
    assert int(post_pad) == len(expected_ids)
    got = sorted_ids.tolist()
    for start in range(0, len(expected_ids), block):  # any order inside a block's expert run
        assert sorted(got[start:start + block]) == sorted(expected_ids[start:start + block])
    assert got[len(expected_ids):] == [numel] * (length - len(expected_ids))
    assert expert_ids.tolist() == expected_experts + [-1] * (expert_ids.numel() - len(expected_experts))

    partial = _randn(5, 2, 7, seed=41)
    out = torch.empty(5, 7)
    torch.ops._moe_C.moe_sum(partial, out)
    torch.testing.assert_close(out, partial[:, 0] + partial[:, 1])


# ----------------------------------------------------------------------------------------------
# mcoplib.lmdeploy / mcoplib.op


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [8, 4])
def test_lmdeploy_rotary_embedding(is_neox, rot_dim):
    tokens, n, kvh, hs = 3, 2, 1, 8
    query = _randn(1, tokens, n * hs, seed=50)
    key = _randn(1, tokens, kvh * hs, seed=51)
    cos, sin = _randn(6, rot_dim, seed=52), _randn(6, rot_dim, seed=53)  # full rows; only the first half is read
    positions = torch.tensor([4, 0, 2])
    q0, k0 = query.clone(), key.clone()
    assert LMD.lmdeploy_rotary_embedding(positions, query, key, hs, cos, sin, is_neox) is None
    e = rot_dim // 2
    for before, after, heads in ((q0, query, n), (k0, key, kvh)):
        expected = before.clone()
        for t in range(tokens):
            p = int(positions[t])
            for h in range(heads):
                for i in range(e):
                    xi, yi = (i, e + i) if is_neox else (2 * i, 2 * i + 1)
                    x, y = float(before[0, t, h * hs + xi]), float(before[0, t, h * hs + yi])
                    c, s = float(cos[p, i]), float(sin[p, i])
                    expected[0, t, h * hs + xi] = x * c - y * s
                    expected[0, t, h * hs + yi] = y * c + x * s
        torch.testing.assert_close(after, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("rms_div", [False, True])
@pytest.mark.parametrize("with_residual", [False, True])
def test_mcoplib_rms_norm(rms_div, with_residual):
    x, w, r = _randn(3, 16, seed=60) * 0.2, _randn(16, seed=61), _randn(3, 16, seed=62) * 0.2
    eps = 0.03
    out = torch.full((3, 16), float("nan"))
    after = torch.full((3, 16), float("nan")) if with_residual else None
    OP.rms_norm(out, x, w, eps, after, r if with_residual else None, rms_div)
    for t in range(3):
        vals = [float(x[t, i]) + (float(r[t, i]) if with_residual else 0.0) for i in range(16)]
        rstd = 1 / math.sqrt(sum(v * v for v in vals) / 16 + eps)
        factor = 1 / rstd if rms_div else rstd
        expected = torch.tensor([vals[i] * factor * float(w[i]) for i in range(16)], dtype=torch.float64)
        torch.testing.assert_close(out[t].double(), expected, atol=1e-5, rtol=1e-5)
        if with_residual:
            torch.testing.assert_close(after[t].double(), torch.tensor(vals, dtype=torch.float64), atol=1e-6,
                                       rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# dlinfer's MACA Triton kernels


def test_context_attention_fwd_as_dlinfers_paged_prefill_calls_it():
    n, kvh, d, block = 4, 2, 8, 4
    g = _gen(70)
    key_cache = torch.full((6, block, kvh, d), float("nan"))  # MACA layout (blocks, block_size, KVH, D)
    value_cache = torch.full((6, block, kvh, d), float("nan"))
    table = torch.tensor([[4, 1, 5], [0, 2, 3], [3, 0, 1]], dtype=torch.int32)
    ctx_lens, new_lens = [5, 0, 6], [3, 4, 0]
    for b, ctx in enumerate(ctx_lens):
        for p in range(ctx):
            key_cache[table[b, p // block], p % block] = torch.randn(kvh, d, generator=g)
            value_cache[table[b, p // block], p % block] = torch.randn(kvh, d, generator=g)
    total = sum(new_lens) + 1  # one row belongs to no sequence
    q, k, v = torch.randn(total, n, d, generator=g), torch.randn(total, kvh, d, generator=g), \
        torch.randn(total, kvh, d, generator=g)
    o = torch.full((total, n, d), 123.0)
    starts = torch.tensor([0, 3, 7], dtype=torch.int32)
    seq_lens = torch.tensor([c + m for c, m in zip(ctx_lens, new_lens, strict=True)], dtype=torch.int32)
    CTX.context_attention_fwd(q, k, v, o, key_cache.permute(0, 2, 3, 1), value_cache.permute(0, 2, 3, 1),
                              b_loc=table, b_start_loc=starts, b_seq_len=seq_lens,
                              b_ctx_len=torch.tensor(ctx_lens, dtype=torch.int32), max_input_len=4,
                              alibi_slopes=None)
    for b, (ctx, m) in enumerate(zip(ctx_lens, new_lens, strict=True)):
        st = int(starts[b])
        keys = torch.cat((cache_rows(key_cache, table[b], ctx, block), k[st:st + m]))
        values = torch.cat((cache_rows(value_cache, table[b], ctx, block), v[st:st + m]))
        expected = ref_rows(q[st:st + m], keys, values, lambda i, j, c=ctx: j < c or j - c <= i, d ** -0.5)
        torch.testing.assert_close(o[st:st + m].double(), expected, atol=2e-6, rtol=1e-5)
    assert torch.equal(o[7], torch.full((n, d), 123.0))  # not a query row of any sequence: untouched


@pytest.mark.parametrize("inplace", [False, True])
def test_fused_experts(inplace):
    tokens, hidden, experts, inter, top = 5, 16, 4, 6, 2
    x = _randn(tokens, hidden, seed=80)
    w1, w2 = _randn(experts, 2 * inter, hidden, seed=81) * 0.3, _randn(experts, hidden, inter, seed=82) * 0.3
    ids = torch.tensor([[2, 0], [1, 3], [3, 3], [0, 4], [1, 2]], dtype=torch.int32)  # 4: not an expert here
    weights = torch.rand(tokens, top, generator=_gen(83))
    x0 = x.clone()
    out = MOE.fused_experts(x, w1, w2, weights, ids, inplace=inplace)
    assert (out is x) == inplace and out.shape == (tokens, hidden)
    for t in range(tokens):
        expected = torch.zeros(hidden, dtype=torch.float64)
        for j in range(top):
            e = int(ids[t, j])
            if not 0 <= e < experts:
                continue
            gate_up = w1[e].double() @ x0[t].double()
            act = torch.tensor([float(gate_up[i]) / (1 + math.exp(-float(gate_up[i]))) * float(gate_up[inter + i])
                                for i in range(inter)], dtype=torch.float64)
            expected += float(weights[t, j]) * (w2[e].double() @ act)
        torch.testing.assert_close(out[t].double(), expected, atol=1e-5, rtol=1e-5)
    with pytest.raises(AssertionError):
        MOE.fused_experts(x0, w1[:, :, :8], w2, weights, ids)  # hidden size mismatch


# ----------------------------------------------------------------------------------------------
# capture rules and fake kernels


def test_decode_path_kernels_never_read_device_data_on_the_host():
    """Run on meta tensors, which have no data: any .item()/.tolist()/data-dependent shape raises."""
    m = {"device": "meta"}
    i32 = {"device": "meta", "dtype": torch.int32}
    K = VK.KERNELS
    cache = torch.empty(10, 4, 2, 8, **m)
    out, lse = K["vendor_graph_sim_maca::flash_attn_with_kvcache"](
        torch.empty(3, 1, 4, 8, **m), cache, cache, torch.empty(3, **i32), torch.empty(3, 5, **i32), 0.3, True, -1, -1)
    assert out.shape == (3, 1, 4, 8) and lse.shape == (3, 4, 1)
    K["_C_cache_ops::reshape_and_cache_flash"](torch.empty(3, 2, 8, **m), torch.empty(3, 2, 8, **m), cache, cache,
                                               torch.empty(3, **i32), "auto", torch.tensor(1.0), torch.tensor(1.0))
    x, w = torch.empty(3, 16, **m), torch.empty(16, **m)
    K["_C::fused_add_rms_norm"](x, torch.empty(3, 16, **m), w, 1e-6)
    K["_C::silu_and_mul"](torch.empty(3, 8, **m), x)
    K["vendor_graph_sim_maca::rms_norm"](torch.empty(3, 16, **m), x, w, 1e-6, None, None, False)
    K["vendor_graph_sim_maca::lmdeploy_rotary_embedding"](
        torch.empty(3, dtype=torch.int64, device="meta"), torch.empty(1, 3, 32, **m), torch.empty(1, 3, 16, **m), 8,
        torch.empty(5, 8, **m), torch.empty(5, 8, **m), True)
    weights, ids = torch.empty(3, 2, **m), torch.empty(3, 2, **i32)
    K["_moe_C::topk_softmax"](weights, ids, torch.empty(3, 2, **i32), torch.empty(3, 6, **m), True)
    K["_moe_C::moe_align_block_size"](ids, 6, 4, torch.empty(24, **i32), torch.empty(6, **i32),
                                      torch.empty(1, **i32), None)
    K["_moe_C::moe_sum"](torch.empty(3, 2, 16, **m), x)
    assert K["vendor_graph_sim_maca::fused_experts"](
        x, torch.empty(6, 8, 16, **m), torch.empty(6, 16, 4, **m), weights, ids).shape == (3, 16)
    with pytest.raises((NotImplementedError, RuntimeError)):  # prefill kernels do read their lengths
        K["vendor_graph_sim_maca::flash_attn_varlen_func"](
            torch.empty(4, 2, 8, **m), torch.empty(4, 2, 8, **m), torch.empty(4, 2, 8, **m), torch.empty(2, **i32),
            torch.empty(2, **i32), 4, 4, 0.3, True, -1, -1)


def test_fake_kernels_give_the_real_output_shapes():
    q, k_cache, v_cache, table, lens = _paged_case(s=2)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    packed = _randn(5, 4, 8, seed=90)
    packed_kv = _randn(5, 2, 8, seed=91)
    x, w1, w2 = _randn(3, 16, seed=92), _randn(4, 12, 16, seed=93), _randn(4, 16, 6, seed=94)
    weights, ids = torch.rand(3, 2), torch.tensor([[0, 1], [2, 3], [1, 1]], dtype=torch.int32)
    ns = torch.ops.vendor_graph_sim_maca

    def calls():
        return [ns.flash_attn_with_kvcache(q, k_cache, v_cache, lens, table, 0.3, True, -1, -1),
                ns.flash_attn_varlen_func(packed, packed_kv, packed_kv, cu, cu, 3, 3, 0.3, True, -1, -1),
                ns.fused_experts(x, w1, w2, weights, ids)]

    real = calls()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        q, k_cache, v_cache, table, lens, cu, packed, packed_kv, x, w1, w2, weights, ids = (
            mode.from_tensor(t) for t in (q, k_cache, v_cache, table, lens, cu, packed, packed_kv, x, w1, w2,
                                          weights, ids))
        fake = calls()
    flat_real = [t for r in real for t in (r if isinstance(r, tuple) else (r,))]
    flat_fake = [t for r in fake for t in (r if isinstance(r, tuple) else (r,))]
    assert [(t.shape, t.dtype) for t in flat_fake] == [(t.shape, t.dtype) for t in flat_real]
