"""Time per output token inside lmdeploy's real PyTorch engine on a CUDA GPU: vendor_graph's CUDA
reference vendor (``import vendor_graph.cuda``: lmdeploy's runner adopted, vendor_graph's buffers)
against lmdeploy's own graph mode (and eager), on the same random-weight Llama, plus the greedy tokens.

    python benchmarks/engine_tpot.py gen MODEL_DIR                  # random Llama + word-level tokenizer
    python benchmarks/engine_tpot.py run {vendor,lmdeploy,eager} MODEL_DIR OUT.json [--repeats 4]

One engine mode per process (vendor_graph's patches are process-wide and two engines in one process
would share lmdeploy's globals; ``benchmarks/h200.sh part3`` alternates the processes, ABBA). Per batch
B (1, 8, 64), after one warm generation, ``--repeats`` generations of B requests x 144 new tokens (and,
for the older estimator, B x 16), greedy, ``ignore_eos``, each request a 32-token prompt of ids seeded
by B. Two TPOT estimators per generation:

* ``stream`` (the primary one): the arrival time of every streamed output is recorded; per request,
  (time of its last token - time it reached token 16) / (tokens in between), then the median over the
  B requests: decode steps only, within one generation, free of prefill and of the request's end;
* ``long - short``: (wall of B x 144 - wall of B x 16) / 128, as part2 measured it.
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

BATCHES = (1, 8, 64)
LONG, SHORT, PROMPT = 144, 16, 32
STREAM_FROM = 16  # the stream estimator starts at a request's 16th token (prefill and first steps left out)
REPEATS = 4
SEED = 0  # prompts: random.Random(SEED * 1000 + batch)


T0 = time.perf_counter()


def stream_tpot(arrivals: list[list[tuple[float, int]]]) -> float | None:
    """Seconds per decode step from streamed arrivals: per request, (time of the last token - time the
    request reached token :data:`STREAM_FROM`) / tokens in between; the median over requests (None when
    no request streamed at least 32 tokens after that point)."""
    per_request = []
    for seq in arrivals:
        start = next(((t, n) for t, n in seq if n >= STREAM_FROM), None)
        if start is None or not seq:
            continue
        (t_a, n_a), (t_b, n_b) = start, seq[-1]
        if n_b - n_a >= 32:
            per_request.append((t_b - t_a) / (n_b - n_a))
    return statistics.median(per_request) if per_request else None


def save_random_llama(model_dir: str, **config) -> int:
    """A random-weight bf16 Llama of ``config`` (seed 1234) with a word-level tokenizer over its 32000 ids,
    saved in ``model_dir``; returns its parameter count."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(1234)
    config = LlamaConfig(**config, vocab_size=32000, bos_token_id=1, eos_token_id=2, pad_token_id=3,
                         torch_dtype="bfloat16")
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(model_dir, safe_serialization=True)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, **{f"w{i}": i for i in range(4, 32000)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    fast.save_pretrained(model_dir)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3).save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


def gen(model_dir: str) -> None:
    params = save_random_llama(model_dir, hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                               num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=4096)
    print(json.dumps({"model_dir": model_dir, "params": params}))


def prompts(batch: int) -> list[list[int]]:
    rng = random.Random(SEED * 1000 + batch)
    return [[rng.randrange(4, 32000) for _ in range(PROMPT)] for _ in range(batch)]


def run(mode: str, model_dir: str, out: str, repeats: int) -> None:
    if mode == "vendor":
        import vendor_graph.cuda  # noqa: F401  (before lmdeploy builds its engine)
    from lmdeploy import GenerationConfig, PytorchEngineConfig
    from lmdeploy.pytorch.engine import Engine

    result = {"mode": mode, "repeats": repeats, "batches": {}, "tokens": {}, "seed": SEED,
              "long": LONG, "short": SHORT, "prompt": PROMPT, "stream_from": STREAM_FROM,
              "pid": os.getpid(),
              "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
              "marks_s": {"imports": time.perf_counter() - T0}}
    start = time.perf_counter()
    cfg = PytorchEngineConfig(device_type="cuda", eager_mode=(mode == "eager"), max_batch_size=64,
                              cache_max_entry_count=0.05, session_len=2048, dtype="bfloat16")
    try:
        engine = Engine.from_pretrained(model_dir, engine_config=cfg)
    except BaseException as exc:  # lmdeploy's checks call exit(1): keep the reason
        import traceback

        traceback.print_exc()
        raise SystemExit(f"engine construction failed: {exc!r}") from exc
    result["engine_build_s"] = time.perf_counter() - start
    result["marks_s"]["engine_built"] = time.perf_counter() - T0
    session = iter(range(1, 10**9))

    async def one(ids: list[int], new_tokens: int) -> tuple[list[int], list[tuple[float, int]]]:
        inst = engine.create_instance()
        # top_k=1: greedy. The engine API ignores do_sample (only lmdeploy's pipeline maps it); its
        # defaults (top_k 50, temperature 0.8) sample, so two runs would differ by chance.
        gen = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, top_k=1)
        tokens: list[int] = []
        arrivals: list[tuple[float, int]] = []  # (time, tokens so far) per streamed output
        async for output in inst.async_stream_infer(next(session), ids, gen_config=gen):
            tokens += list(output.token_ids)
            arrivals.append((time.perf_counter(), len(tokens)))
        return tokens, arrivals

    async def wall(batch: int, new_tokens: int) -> tuple[float, list[list[int]], float | None]:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[one(p, new_tokens) for p in prompts(batch)])
        return time.perf_counter() - t0, [t for t, _ in outs], stream_tpot([a for _, a in outs])

    async def main() -> None:
        engine.start_loop()
        for batch in BATCHES:
            _, tokens, _ = await wall(batch, LONG)  # warm (captures this batch's graph) and the tokens
            result["tokens"][str(batch)] = tokens
            tpots, streams, walls = [], [], []
            for _ in range(repeats):
                long, _, stream = await wall(batch, LONG)
                short, _, _ = await wall(batch, SHORT)
                tpots.append(1e3 * (long - short) / (LONG - SHORT))
                streams.append(None if stream is None else 1e3 * stream)
                walls.append({"long_s": long, "short_s": short})
            ok = [x for x in streams if x is not None]
            result["batches"][str(batch)] = {
                "tpot_ms": tpots, "min_ms": min(tpots), "median_ms": statistics.median(tpots),
                "stream_tpot_ms": streams, "stream_median_ms": statistics.median(ok) if ok else None,
                "stream_min_ms": min(ok) if ok else None, "walls": walls}
            result["marks_s"][f"batch_{batch}"] = time.perf_counter() - T0
            print(f"{mode} B={batch}: TPOT stream median {result['batches'][str(batch)]['stream_median_ms']} ms; "
                  f"long-short median {statistics.median(tpots):.3f} ms min {min(tpots):.3f} ms",
                  file=sys.stderr, flush=True)
        if mode == "vendor":
            from vendor_graph.install import patching
            from vendor_graph.runtime.counters import live_runners

            runners = live_runners()
            result["vendor_graph"] = {
                "active": getattr(patching.active(), "vendor", None),
                "runners": [type(r).__qualname__ for r in runners],
                "replays": sum(r.stats.replays for r in runners),
                "stats": [r.stats.summary() for r in runners],
            }
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        os._exit(0)  # the results are written; do not wait for the engine loop to wind down

    asyncio.run(main())


def fake(mode: str, out: str, round_: int, repeats: int) -> None:
    """A made-up result in ``run``'s schema (``"fake": true``), for the CPU dry run of the reporter; the
    stream estimator is also checked on made-up arrivals."""
    rng = random.Random(f"{mode}-{round_}")
    arrivals = [[(0.01 * i, i) for i in range(1, LONG + 1)], [(0.0, 1), (0.5, 40), (1.3, LONG)]]
    tp = stream_tpot(arrivals)
    assert tp is not None and abs(tp - statistics.median([0.01, (1.3 - 0.5) / (LONG - 40)])) < 1e-12, tp
    assert stream_tpot([[(0.0, 1), (0.1, 20)]]) is None
    result = {"mode": mode, "repeats": repeats, "batches": {}, "tokens": {}, "seed": SEED, "fake": True,
              "dry_run": True, "engine_build_s": 25.0 + rng.random(), "marks_s": {}}
    for batch in BATCHES:
        base = 2.0 + 0.01 * batch + (0.02 if mode == "vendor" else 0.0)
        tpots = [base * (1 + 0.1 * rng.random()) for _ in range(repeats)]
        streams = [base * (1 + 0.05 * rng.random()) for _ in range(repeats)]
        result["batches"][str(batch)] = {"tpot_ms": tpots, "min_ms": min(tpots), "median_ms": statistics.median(tpots),
                                         "stream_tpot_ms": streams, "stream_median_ms": statistics.median(streams),
                                         "stream_min_ms": min(streams), "walls": []}
        result["tokens"][str(batch)] = [prompts(batch)[i][:4] * (LONG // 4) for i in range(batch)]
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


def cli(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("model_dir")
    r = sub.add_parser("run")
    r.add_argument("mode", choices=("vendor", "lmdeploy", "eager"))
    r.add_argument("model_dir")
    r.add_argument("out")
    r.add_argument("--repeats", type=int, default=REPEATS)
    f = sub.add_parser("fake", help="a made-up result for the CPU dry run of the reporter")
    f.add_argument("mode", choices=("vendor", "lmdeploy"))
    f.add_argument("out")
    f.add_argument("--round", type=int, default=1)
    f.add_argument("--repeats", type=int, default=REPEATS)
    args = p.parse_args(argv)
    if args.cmd == "gen":
        gen(args.model_dir)
    elif args.cmd == "fake":
        fake(args.mode, args.out, args.round, args.repeats)
    else:
        run(args.mode, args.model_dir, args.out, args.repeats)


if __name__ == "__main__":  # lmdeploy's environment check spawns processes: everything under the guard
    cli()
