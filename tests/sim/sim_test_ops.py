"""Stand-in attention ops for the simulator's own tests, in a test-only namespace.

They carry the real op names and the argument layout that matters to NPUGraph.update(): FIA takes its
KV lengths as a keyword-only host ``SymInt[]`` (``actual_seq_lengths_kv``) and has an ``.out`` overload;
paged attention and MLA take ``context_lens`` positionally (PA as a host tensor at args[7], second to
last; MLA as ``SymInt[]`` at args[5]). Each kernel scales the query rows by their host length, so a test
can read back which lengths a replay used.
"""

from __future__ import annotations

import torch
from torch.library import Library

NAMESPACE = "vg_simtest"
_lib = Library(NAMESPACE, "DEF")


def _scale(query: torch.Tensor, lens) -> torch.Tensor:
    lens = torch.as_tensor(list(lens) if not isinstance(lens, torch.Tensor) else lens.tolist(), dtype=query.dtype)
    return query * lens.view(-1, *([1] * (query.dim() - 1)))


_lib.define("npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
            "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
            "int num_heads=1) -> (Tensor, Tensor)")
_lib.define("npu_fused_infer_attention_score.out(Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, "
            "Tensor? atten_mask=None, SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, "
            "int num_heads=1, Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) "
            "-> (Tensor(a!), Tensor(b!))")
_lib.define("npu_fused_infer_attention_score_v2(Tensor query, Tensor key, Tensor value, *, Tensor? query_rope=None, "
            "Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, "
            "SymInt[]? actual_seq_kvlen=None) -> (Tensor, Tensor)")
_lib.define("npu_fused_infer_attention_score_v2.out(Tensor query, Tensor key, Tensor value, *, "
            "Tensor? query_rope=None, Tensor? key_rope=None, Tensor? pse_shift=None, Tensor? atten_mask=None, "
            "SymInt[]? actual_seq_qlen=None, SymInt[]? actual_seq_kvlen=None, Tensor? workspace=None, "
            "Tensor(a!) attention_out, Tensor(b!) softmax_lse) -> (Tensor(a!), Tensor(b!))")
_lib.define("_npu_paged_attention(Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, "
            "int num_heads, float scale_value, Tensor block_table, Tensor context_lens, Tensor(a!) out) -> ()")
_lib.define("npu_multi_head_latent_attention(Tensor q_nope, Tensor q_rope, Tensor ctkv, Tensor k_rope, "
            "Tensor block_tables, SymInt[] context_lens, int q_headnum) -> Tensor")
_lib.define("npu_multi_head_latent_attention.out(Tensor q_nope, Tensor q_rope, Tensor ctkv, Tensor k_rope, "
            "Tensor block_tables, SymInt[] context_lens, int q_headnum, *, Tensor(a!) attn_out) -> Tensor(a!)")
_lib.define("_npu_paged_attention_mla(Tensor query, Tensor key_cache, int num_kv_heads, int num_heads, "
            "float scale_value, Tensor block_table, Tensor context_lens, int mla_vheadsize, Tensor(a!) out) -> ()")


def _fia(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
         num_heads=1):
    lens = actual_seq_lengths_kv if actual_seq_lengths_kv is not None else [1] * query.shape[0]
    q = actual_seq_lengths if actual_seq_lengths is not None else [1] * query.shape[0]
    return _scale(query, lens) + value.sum() * 0, _scale(torch.ones(query.shape[0], dtype=torch.float32), q)


def _fia_out(query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None,
             actual_seq_lengths_kv=None, num_heads=1, workspace=None, attention_out, softmax_lse):
    out, lse = _fia(query, key, value, actual_seq_lengths=actual_seq_lengths,
                    actual_seq_lengths_kv=actual_seq_lengths_kv)
    attention_out.copy_(out)
    softmax_lse.copy_(lse)
    return attention_out, softmax_lse


def _fia_fake(query, key, value, **kwargs):
    return torch.empty_like(query), query.new_empty((query.shape[0],), dtype=torch.float32)


def _fia_out_fake(query, key, value, *, attention_out, softmax_lse, **kwargs):
    return attention_out, softmax_lse


def _fia2(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
          actual_seq_qlen=None, actual_seq_kvlen=None):
    return _fia(query, key, value, actual_seq_lengths=actual_seq_qlen, actual_seq_lengths_kv=actual_seq_kvlen)


def _fia2_out(query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None,
              actual_seq_qlen=None, actual_seq_kvlen=None, workspace=None, attention_out, softmax_lse):
    return _fia_out(query, key, value, actual_seq_lengths=actual_seq_qlen, actual_seq_lengths_kv=actual_seq_kvlen,
                    attention_out=attention_out, softmax_lse=softmax_lse)


def _pa(query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens, out):
    out.copy_(_scale(query, context_lens))


def _mla(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum):
    return _scale(q_nope, context_lens)


def _mla_out(q_nope, q_rope, ctkv, k_rope, block_tables, context_lens, q_headnum, *, attn_out):
    attn_out.copy_(_scale(q_nope, context_lens))
    return attn_out


def _pa_mla(query, key_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens, mla_vheadsize, out):
    out.copy_(_scale(query, context_lens))


for _name, _kernel in [
    ("npu_fused_infer_attention_score", _fia), ("npu_fused_infer_attention_score.out", _fia_out),
    ("npu_fused_infer_attention_score_v2", _fia2), ("npu_fused_infer_attention_score_v2.out", _fia2_out),
    ("_npu_paged_attention", _pa), ("npu_multi_head_latent_attention", _mla),
    ("npu_multi_head_latent_attention.out", _mla_out), ("_npu_paged_attention_mla", _pa_mla),
]:
    _lib.impl(_name, _kernel, "CPU")

torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score", _fia_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score.out", _fia_out_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score_v2", _fia_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_fused_infer_attention_score_v2.out", _fia_out_fake, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::_npu_paged_attention", lambda *a, **k: None, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::_npu_paged_attention_mla", lambda *a, **k: None, lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_multi_head_latent_attention",
                            lambda q_nope, *a, **k: torch.empty_like(q_nope), lib=_lib)
torch.library.register_fake(f"{NAMESPACE}::npu_multi_head_latent_attention.out",
                            lambda *a, attn_out, **k: attn_out, lib=_lib)

ops = getattr(torch.ops, NAMESPACE)
