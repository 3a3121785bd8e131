"""lmdeploy's engine with tensor parallelism on CUDA GPUs: vendor_graph's CUDA reference vendor against
lmdeploy's own graph mode and eager, greedy, on an irregular workload; tokens, the logit margin where they
differ, time per output token, throughput, and graph stats per rank.

    python benchmarks/engine_tp.py gen MODEL_DIR [--small]            # random-weight Llama, GQA
    python benchmarks/engine_tp.py run {vendor,lmdeploy,eager} MODEL_DIR OUT.json --tp 2
    python benchmarks/engine_tp.py compare OUT_A.json OUT_B.json [OUT_C.json ...] > comparison.json

One mode per process. ``vendor``: ``VENDOR_GRAPH_VENDOR=cuda`` in the environment lmdeploy's workers inherit
(each rank activates vendor_graph through the installed autoload hook and logs the runner it built) and
``VENDOR_GRAPH_STATS_FILE`` set, so every rank writes its own stats file (``<stem>.rank<N>.json``). The
workload (:data:`REQUESTS` requests, prompt lengths and output lengths drawn from :data:`SEED`, arrivals
staggered so that batches grow, shrink and change bucket) runs twice: a warm pass, then the measured one.
The top-2 log-probabilities of every output token (``logprobs_mode="raw_logprobs"``) give the margin at
the first position where two modes' tokens differ: random weights give near-tied logits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time

REQUESTS = 48
SEED = 0
PROMPT_LENGTHS = (16, 200)
NEW_TOKENS = (16, 128)
ARRIVAL_SPREAD_S = 2.0  # arrivals drawn uniformly over this many seconds
STATS_WAIT_S = 65  # VENDOR_GRAPH_STATS_EVERY=1: each rank writes its stats file every minute
LOGPROBS = 2  # top-2 log-probabilities per output token: the margin between the chosen token and the next
FULL = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=24, num_attention_heads=32,
            num_key_value_heads=8, max_position_embeddings=4096)
SMALL = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=4, max_position_embeddings=4096)


def workload() -> list[dict]:
    rng = random.Random(SEED)
    return [{"prompt": [rng.randrange(4, 32000) for _ in range(rng.randint(*PROMPT_LENGTHS))],
             "new_tokens": rng.randint(*NEW_TOKENS), "arrival_s": rng.uniform(0, ARRIVAL_SPREAD_S)}
            for _ in range(REQUESTS)]


def gen(model_dir: str, small: bool) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from engine_tpot import save_random_llama

    params = save_random_llama(model_dir, **(SMALL if small else FULL))
    print(json.dumps({"model_dir": model_dir, "params": params, "config": SMALL if small else FULL}))


def run(mode: str, model_dir: str, out: str, tp: int) -> None:
    if mode == "vendor":
        os.environ["VENDOR_GRAPH_VENDOR"] = "cuda"  # the workers lmdeploy spawns activate it through the hook
        os.environ.setdefault("VENDOR_GRAPH_STATS_FILE", out.replace(".json", ".stats.json"))
        os.environ.setdefault("VENDOR_GRAPH_STATS_EVERY", "1")
        import vendor_graph.cuda  # noqa: F401  (this process too: tp=1 runs the model here)
    from lmdeploy import GenerationConfig, PytorchEngineConfig
    from lmdeploy.pytorch.engine import Engine

    cfg = PytorchEngineConfig(device_type="cuda", tp=tp, eager_mode=(mode == "eager"), max_batch_size=64,
                              cache_max_entry_count=0.3, session_len=2048, dtype="bfloat16",
                              logprobs_mode="raw_logprobs")
    started = time.perf_counter()
    engine = Engine.from_pretrained(model_dir, engine_config=cfg)
    result = {"mode": mode, "tp": tp, "requests": REQUESTS, "seed": SEED,
              "engine_build_s": time.perf_counter() - started}
    session = iter(range(1, 10**9))

    async def one(req: dict, t0: float) -> dict:
        await asyncio.sleep(max(0.0, req["arrival_s"] - (time.perf_counter() - t0)))
        inst = engine.create_instance()
        gen_cfg = GenerationConfig(max_new_tokens=req["new_tokens"], ignore_eos=True, top_k=1, logprobs=LOGPROBS)
        tokens, arrivals, margins = [], [], []  # arrivals: (time, tokens so far) per streamed output
        async for output in inst.async_stream_infer(next(session), req["prompt"], gen_config=gen_cfg):
            tokens += list(output.token_ids)
            arrivals.append((time.perf_counter(), len(tokens)))
            for top in (getattr(output, "logprobs", None) or []):
                values = sorted(top.values(), reverse=True) if isinstance(top, dict) else []
                margins.append(values[0] - values[1] if len(values) > 1 else None)
        # decode steps only: from the 8th token (prefill and the first steps left out) to the last
        (t_a, n_a), (t_b, n_b) = next(a for a in arrivals if a[1] >= 8), arrivals[-1]
        return {"tokens": tokens, "margins": margins, "tpot_s": (t_b - t_a) / (n_b - n_a) if n_b > n_a else None}

    async def measured() -> tuple[float, list[dict]]:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[one(r, t0) for r in workload()])
        return time.perf_counter() - t0, outs

    async def main() -> None:
        engine.start_loop()
        await measured()  # warm: captures, kernel caches
        wall, outs = await measured()
        total = sum(len(o["tokens"]) for o in outs)
        tpots = [o["tpot_s"] for o in outs if o["tpot_s"] is not None]
        result.update(wall_s=wall, output_tokens=total, throughput_tok_s=total / wall,
                      tpot_ms_median=1e3 * statistics.median(tpots),
                      tpot_ms_spread=[1e3 * min(tpots), 1e3 * max(tpots)],
                      tokens=[o["tokens"] for o in outs], margins=[o["margins"] for o in outs])
        with open(out, "w") as f:
            json.dump(result, f)
        if mode == "vendor":  # every rank's stats file is rewritten each minute: one more write after the run
            await asyncio.sleep(STATS_WAIT_S)
        print(f"{mode} tp={tp}: {total} tokens in {wall:.2f} s, TPOT median {result['tpot_ms_median']:.2f} ms",
              flush=True)
        os._exit(0)  # the results are written; the workers go with the process

    asyncio.run(main())


def compare(paths: list[str]) -> dict:
    runs = [json.load(open(p)) for p in paths]
    base = runs[0]
    keys = ("mode", "tp", "wall_s", "output_tokens", "throughput_tok_s", "tpot_ms_median", "tpot_ms_spread")
    report = {"runs": [{k: r[k] for k in keys} for r in runs], "versus": {}}
    for other in runs[1:]:
        differing = []
        for i, (a, b) in enumerate(zip(base["tokens"], other["tokens"], strict=True)):
            if a != b:
                pos = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
                margin = base["margins"][i][pos] if pos < len(base["margins"][i]) else None
                differing.append({"request": i, "position": pos, "margin": margin})
        report["versus"][f"{base['mode']} vs {other['mode']}"] = {
            "requests_identical": len(base["tokens"]) - len(differing), "requests": len(base["tokens"]),
            "first_differences": differing,
            "tpot_ratio": base["tpot_ms_median"] / other["tpot_ms_median"],
            "throughput_ratio": base["throughput_tok_s"] / other["throughput_tok_s"]}
    return report


def cli(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("model_dir")
    g.add_argument("--small", action="store_true")
    r = sub.add_parser("run")
    r.add_argument("mode", choices=("vendor", "lmdeploy", "eager"))
    r.add_argument("model_dir")
    r.add_argument("out")
    r.add_argument("--tp", type=int, default=2)
    c = sub.add_parser("compare")
    c.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "gen":
        gen(args.model_dir, args.small)
    elif args.cmd == "run":
        run(args.mode, args.model_dir, args.out, args.tp)
    else:
        print(json.dumps(compare(args.paths), indent=1))


if __name__ == "__main__":
    cli()
