"""Shared pieces of the CPU benchmarks: the straightforward fill they compare against, synthetic decode
steps shaped like each vendor's lmdeploy metadata, and result writing (JSON + markdown table)."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def separate_copies_write(self: Any, writes: list) -> None:
    """The straightforward fill: per field, one ``copy_`` of the live extent, then one ``fill_`` per
    dimension whose extent shrank since the previous fill (exact high-water resets), slices built
    every step. A drop-in for ``BufferSpec._write``, so both arms share every other line of fill/bind."""
    for st, src, extent, _plan in writes:
        dst = st.tensor
        live = tuple(slice(0, n) for n in extent)
        dst[live].copy_(src)
        for d, (n, hw) in enumerate(zip(extent, st.high_water, strict=True)):
            if n < hw:
                idx = [slice(0, e) for e in extent]
                idx[d] = slice(n, hw)
                for later in range(d + 1, len(extent)):
                    idx[later] = slice(0, max(extent[later], st.high_water[later]))
                box = dst[tuple(idx)]
                box.fill_(st.pad) if st.pad_full is None else box.copy_(st.pad_full[tuple(idx)])
        st.high_water = tuple(extent)


@contextlib.contextmanager
def separate_copies() -> Iterator[None]:
    """Swap the straightforward fill into ``BufferSpec`` for the block."""
    from vendor_graph.buffers import BufferSpec

    saved = BufferSpec._write, BufferSpec.fast_fill
    BufferSpec._write = separate_copies_write  # type: ignore[method-assign]
    BufferSpec.fast_fill = False  # its steady state would not go through _write
    try:
        yield
    finally:
        BufferSpec._write, BufferSpec.fast_fill = saved  # type: ignore[method-assign]


def specs() -> dict[str, Any]:
    """Every vendor's buffer spec for the lmdeploy releases whose layouts differ."""
    from packaging.version import Version

    from vendor_graph.upstream.compat import LmdeployApi
    from vendor_graph.vendors.ascend.spec import ascend_spec
    from vendor_graph.vendors.cuda_style import camb_spec, maca_spec

    api_017 = LmdeployApi(Version("0.17.0"), frozenset(), max_q_attr="max_q_seq_len", separate_host_seqlens=False)
    api_018 = LmdeployApi(Version("0.18.0"), frozenset(), max_q_attr="max_q_seqlen", separate_host_seqlens=True)
    return {"ascend-0.17": ascend_spec(api_017), "ascend-0.18": ascend_spec(api_018),
            "camb-0.17": camb_spec(api_017), "maca-0.17": maca_spec(api_017)}


BLOCK = 16


def graph_meta(batch: int, num_blocks: int) -> SimpleNamespace:
    return SimpleNamespace(max_batchs=batch, max_tokens=batch, num_blocks=num_blocks, device="cpu",
                           decode_query_len=1, input_buffers=None, is_ssm=False, use_mrope=False,
                           mla_index_topk=None)


def decode_step(name: str, batch: int, blocks: int, seed: int) -> tuple[dict, SimpleNamespace, SimpleNamespace]:
    """One decode step's (model kwargs, attn_metadata, StepContext) as lmdeploy hands them to the vendor."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randint(1, blocks * BLOCK + 1, (batch,), generator=g, dtype=torch.int32)
    table = torch.randint(1, 500, (batch, blocks), generator=g, dtype=torch.int32)
    slots = (table[torch.arange(batch), ((kv - 1) // BLOCK).long()] * BLOCK + (kv - 1) % BLOCK).to(torch.int32)
    inputs = {"input_ids": torch.randint(0, 1000, (1, batch), generator=g), "position_ids": (kv - 1).long().view(1, -1)}
    context = SimpleNamespace(kv_seqlens=kv.clone(), q_seqlens=torch.ones(batch, dtype=torch.int32),
                              q_start_loc=torch.arange(batch, dtype=torch.int64), block_offsets=table,
                              local_adapter_ids=None, moe_metadata=None)
    attn = SimpleNamespace(block_offsets=table, kv_start_indices=slots, block_size=BLOCK, attention_mask=[],
                           cache_seqlens=None, q_start_loc=None, max_kv_seq_len=None)
    vendor, release = name.split("-")
    if vendor == "ascend" and release == "0.18":
        cu = torch.arange(batch + 1, dtype=torch.int32)
        attn.__dict__.update(kv_seqlens=kv, kv_seqlens_cpu=kv.clone(), q_seqlens=torch.ones(batch, dtype=torch.int64),
                             cu_seqlens_q=cu, cu_seqlens_q_cpu=cu.clone(), q_start_loc=cu[:-1], max_q_seqlen=1,
                             max_kv_seq_len=int(kv.max()))
    elif vendor == "ascend":
        attn.__dict__.update(kv_seqlens=kv.clone(), q_seqlens=torch.arange(1, batch + 1, dtype=torch.int32),
                             max_q_seq_len=1)
    else:
        attn.__dict__.update(kv_seqlens=kv, q_seqlens=torch.ones(batch, dtype=torch.int64),
                             q_start_loc=torch.arange(batch + 1, dtype=torch.int32), max_q_seq_len=1,
                             max_kv_seq_len=int(kv.max()))
        if vendor == "maca":
            attn.kv_start_indices = slots.long().view(-1, 1)
    return inputs, attn, context


def dlinfer_problem() -> str | None:
    """Why the real dlinfer cannot run here (``VENDOR_GRAPH_DLINFER_SRC`` unusable, or no dlinfer at all), or None."""
    from vendor_graph_sim import realstack

    from vendor_graph.config import settings

    try:
        realstack.dlinfer_origin()
    except (settings.SettingsError, realstack.DlinferUnavailable) as exc:
        return str(exc)
    return None


def environment() -> dict[str, Any]:
    from importlib import metadata

    try:
        lmdeploy = metadata.version("lmdeploy")
    except metadata.PackageNotFoundError:
        lmdeploy = None
    return {"python": sys.version.split()[0], "torch": torch.__version__, "lmdeploy": lmdeploy,
            "platform": platform.platform(),
            "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}


def write_results(name: str, payload: dict[str, Any], table: list[str]) -> tuple[Path, Path]:
    """``benchmarks/results/<name>.json`` and ``<name>.md``."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    json_path, md_path = RESULTS / f"{name}.json", RESULTS / f"{name}.md"
    json_path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    md_path.write_text("\n".join(table) + "\n")
    return json_path, md_path
