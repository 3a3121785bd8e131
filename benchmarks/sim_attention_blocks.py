"""Cost of one emulated Ascend decode-attention call against the size of the KV cache (the simulator's kernels).

Inside lmdeploy's engine a graph's block table has ``num_gpu_blocks`` columns: thousands when the cache is
sized from free memory. The emulated kernels used to gather every column, so a replayed decode step with a
2096-block cache cost about 40x the eager one. They now gather the columns the call's host KV lengths
address. This times one call with a 64-block cache (a 64-column table) against a 2096-block cache (a
2096-column table), the same sequences, lengths and data, on plain CPU tensors (what the kernel runs on at
replay), for two kernels: FIA as dlinfer's decode calls it (``npu_fused_infer_attention_score``, TND,
host ``actual_seq_lengths_kv``) and MLA (``npu_multi_head_latent_attention``, host ``context_lens``).

Arms, alternating call by call in one process: ``small`` and ``large`` (the kernels as they are), and the
same two with ``gather_paged`` made to gather every column, the behaviour before the change (``small, whole
table`` / ``large, whole table``; a whole-table call on the large cache takes about a second here, so those
two arms run in every ``--whole-every``-th round only). Besides time, each arm's gathered blocks per call
are counted and every arm's output is checked bitwise against ``small``.

Workload (fixed in code): the tiny model's attention shapes (4 query heads, 2 KV heads of 16, block size 16;
MLA: 1 KV head, latent 32 + RoPE 8), a graph batch of 8 rows: 6 sequences of seeded lengths 1..128 in
distinct blocks below 64, and 2 padding rows (length 0, table row of zeros), seed 0.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/sim_attention_blocks.py [--rounds 60] [--whole-every 6]
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common  # noqa: E402
import torch  # noqa: E402, I001
from vendor_graph_sim import kernels as K  # noqa: E402

HEADS, KV_HEADS, DIM, BLOCK, LATENT, ROPE = 4, 2, 16, 16, 32, 8
CACHES = {"small": 64, "large": 2096}
LIVE, PADDING, MAX_LEN, SEED = 6, 2, 128, 0
SCALE = 0.25
WHOLE_GATHER = K.gather_paged


def workload(num_blocks: int) -> dict:
    """The same sequences and data in a cache of ``num_blocks`` blocks; the table has one column per block."""
    g = torch.Generator().manual_seed(SEED)
    lens = torch.randint(1, MAX_LEN + 1, (LIVE,), generator=g).tolist() + [0] * PADDING
    need = [math.ceil(n / BLOCK) for n in lens]
    ids = (torch.randperm(CACHES["small"] - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(lens), num_blocks, dtype=torch.int32)
    for row, n in enumerate(need):
        table[row, :n] = torch.tensor([ids.pop() for _ in range(n)], dtype=torch.int32)

    def cache(*inner):
        small = torch.randn(CACHES["small"], BLOCK, *inner, generator=g)
        return torch.cat((small, torch.zeros(num_blocks - CACHES["small"], BLOCK, *inner)))

    b = len(lens)
    return {"lens": lens, "table": table, "k": cache(KV_HEADS * DIM), "v": cache(KV_HEADS * DIM),
            "ctkv": cache(1, LATENT), "k_rope": cache(1, ROPE), "q": torch.randn(b, HEADS, DIM, generator=g),
            "q_nope": torch.randn(b, HEADS, LATENT, generator=g), "q_rope": torch.randn(b, HEADS, ROPE, generator=g)}


def fia(w: dict) -> torch.Tensor:
    b = len(w["lens"])
    out, _ = torch.ops.npu.npu_fused_infer_attention_score(
        w["q"], w["k"], w["v"], atten_mask=None, actual_seq_lengths=list(range(1, b + 1)),
        actual_seq_lengths_kv=w["lens"], block_table=w["table"], num_heads=HEADS, scale=SCALE, input_layout="TND",
        num_key_value_heads=KV_HEADS, sparse_mode=0, block_size=BLOCK)
    return out


def mla(w: dict) -> torch.Tensor:
    return torch.ops.npu.npu_multi_head_latent_attention(w["q_nope"], w["q_rope"], w["ctkv"], w["k_rope"],
                                                         w["table"], w["lens"], HEADS, SCALE, 1)


KERNELS = {"fia (TND decode)": fia, "mla": mla}


def whole_table(cache, block_table, layout="bshd", longest=None):
    return WHOLE_GATHER(cache, block_table, layout)


ARMS = {  # name -> (cache, gather)
    "small": ("small", None),
    "large": ("large", None),
    "small, whole table": ("small", whole_table),
    "large, whole table": ("large", whole_table),
}


def call(kernel, w: dict, gather) -> torch.Tensor:
    K.gather_paged = gather or WHOLE_GATHER
    try:
        return kernel(w)
    finally:
        K.gather_paged = WHOLE_GATHER


def gathered_blocks(kernel, w: dict, gather) -> list[int]:
    blocks: list[int] = []

    def counting(cache, block_table, layout="bshd", longest=None):
        out = (gather or WHOLE_GATHER)(cache, block_table, layout, longest)
        blocks.append(out.shape[0] * out.shape[1] // BLOCK)
        return out

    call(kernel, w, counting)
    return blocks


def run_kernel(name: str, kernel, rounds: int, whole_every: int) -> dict:
    work = {size: workload(n) for size, n in CACHES.items()}
    reference = call(kernel, work["small"], None)
    record: dict = {}
    for arm, (size, gather) in ARMS.items():
        out = call(kernel, work[size], gather)
        record[arm] = {"cache_blocks": CACHES[size], "table_columns": work[size]["table"].shape[1],
                       "blocks_gathered_per_gather": gathered_blocks(kernel, work[size], gather),
                       "bitwise_equal_to_small": bool(torch.equal(out, reference)), "times_us": []}
    perf = time.perf_counter_ns
    gc.collect()
    gc.disable()
    try:
        for i in range(rounds):
            for arm, (size, gather) in ARMS.items():
                if gather is whole_table and i % whole_every:
                    continue
                t0 = perf()
                call(kernel, work[size], gather)
                record[arm]["times_us"].append((perf() - t0) / 1e3)
    finally:
        gc.enable()
    for r in record.values():
        t = r["times_us"]
        r |= {"median_us": statistics.median(t), "min_us": min(t)}
    ratio = {"after": record["large"]["median_us"] / record["small"]["median_us"],
             "before": record["large, whole table"]["median_us"] / record["small, whole table"]["median_us"]}
    print(f"{name}: " + "  ".join(f"{arm} {r['median_us']:.0f}" for arm, r in record.items())
          + f" us (median); large/small {ratio['after']:.2f}x (whole table: {ratio['before']:.1f}x)", flush=True)
    return {"kernel": name, "lengths": work["small"]["lens"], "arms": record, "large_over_small_median": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60, help="timed calls per arm and kernel")
    parser.add_argument("--whole-every", type=int, default=6, help="whole-table arms: one timed call per this "
                        "many rounds")
    args = parser.parse_args()
    results = [run_kernel(name, kernel, args.rounds, args.whole_every) for name, kernel in KERNELS.items()]
    for r in results:
        if not all(a["bitwise_equal_to_small"] for a in r["arms"].values()):
            raise AssertionError(f"{r['kernel']}: an arm's output differs from the small cache's")
    payload = {"benchmark": "sim_attention_blocks", "what": "one emulated decode-attention call, 64-block vs "
               "2096-block KV cache (table as wide as the cache), same lengths, plain CPU tensors",
               "args": vars(args), "workload": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": DIM,
                                                 "block_size": BLOCK, "mla_latent": LATENT, "mla_rope": ROPE,
                                                 "live": LIVE, "padding_rows": PADDING, "seed": SEED},
               "environment": _common.environment(), "results": results}
    table = ["| kernel | arm | cache blocks = table columns | blocks gathered per gather | median µs | min µs | "
             "**large / small** (median) |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        for arm, a in r["arms"].items():
            ratio = {"large": r["large_over_small_median"]["after"],
                     "large, whole table": r["large_over_small_median"]["before"]}.get(arm)
            table.append(f"| {r['kernel']} | {arm} | {a['cache_blocks']} | {a['blocks_gathered_per_gather'][0]} | "
                         f"{a['median_us']:.0f} | {a['min_us']:.0f} | "
                         + (f"**{ratio:.2f}x** |" if ratio is not None else "|"))
    json_path, md_path = _common.write_results("sim_attention_blocks", payload, table)
    print("\n".join(table))
    print(f"wrote {json_path} and {md_path}")


if __name__ == "__main__":
    main()
