"""Time per output token inside lmdeploy's real PyTorch engine on a CUDA GPU: vendor_graph's CUDA
reference vendor (``import vendor_graph.cuda``: lmdeploy's runner adopted, vendor_graph's buffers)
against lmdeploy's own graph mode (and eager), on the same random-weight Llama, plus the greedy tokens.

    python benchmarks/engine_tpot.py gen MODEL_DIR                  # random Llama + word-level tokenizer
    python benchmarks/engine_tpot.py run {vendor,lmdeploy,eager} MODEL_DIR OUT.json [--repeats 5]

One engine mode per process. TPOT at batch B = (wall of B requests x 144 new tokens - wall of B x 16)
/ 128: one decode step of the whole batch, free of prefill and of how outputs are chunked. Greedy,
``ignore_eos``; each request a 32-token prompt of seeded ids.
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


def gen(model_dir: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(1234)
    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
                         num_key_value_heads=16, vocab_size=32000, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=3, torch_dtype="bfloat16")
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
    print(json.dumps({"model_dir": model_dir, "params": sum(p.numel() for p in model.parameters())}))


def prompts(batch: int) -> list[list[int]]:
    rng = random.Random(batch)
    return [[rng.randrange(4, 32000) for _ in range(PROMPT)] for _ in range(batch)]


def run(mode: str, model_dir: str, out: str, repeats: int) -> None:
    if mode == "vendor":
        import vendor_graph.cuda  # noqa: F401  (before lmdeploy builds its engine)
    from lmdeploy import GenerationConfig, PytorchEngineConfig
    from lmdeploy.pytorch.engine import Engine

    result = {"mode": mode, "repeats": repeats, "batches": {}, "tokens": {}}
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
    session = iter(range(1, 10**9))

    async def one(ids: list[int], new_tokens: int) -> list[int]:
        inst = engine.create_instance()
        # top_k=1: greedy. The engine API ignores do_sample (only lmdeploy's pipeline maps it); its
        # defaults (top_k 50, temperature 0.8) sample, so two runs would differ by chance.
        gen = GenerationConfig(max_new_tokens=new_tokens, ignore_eos=True, top_k=1)
        tokens: list[int] = []
        async for output in inst.async_stream_infer(next(session), ids, gen_config=gen):
            tokens += list(output.token_ids)
        return tokens

    async def wall(batch: int, new_tokens: int) -> tuple[float, list[list[int]]]:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[one(p, new_tokens) for p in prompts(batch)])
        return time.perf_counter() - t0, outs

    async def main() -> None:
        engine.start_loop()
        for batch in BATCHES:
            _, tokens = await wall(batch, LONG)  # warm (captures this batch's graph) and the tokens
            result["tokens"][str(batch)] = tokens
            tpots = []
            for _ in range(repeats):
                long, _ = await wall(batch, LONG)
                short, _ = await wall(batch, SHORT)
                tpots.append(1e3 * (long - short) / (LONG - SHORT))
            result["batches"][str(batch)] = {"tpot_ms": tpots, "min_ms": min(tpots),
                                             "median_ms": statistics.median(tpots)}
            print(f"{mode} B={batch}: TPOT median {statistics.median(tpots):.3f} ms min {min(tpots):.3f} ms",
                  file=sys.stderr, flush=True)
        if mode == "vendor":
            from vendor_graph import patching
            from vendor_graph.stats import live_runners

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


def cli(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gen")
    g.add_argument("model_dir")
    r = sub.add_parser("run")
    r.add_argument("mode", choices=("vendor", "lmdeploy", "eager"))
    r.add_argument("model_dir")
    r.add_argument("out")
    r.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    if args.cmd == "gen":
        gen(args.model_dir)
    else:
        run(args.mode, args.model_dir, args.out, args.repeats)


if __name__ == "__main__":  # lmdeploy's environment check spawns processes: everything under the guard
    cli()
