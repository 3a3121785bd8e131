"""Reset/recapture cycles inside lmdeploy's real PyTorch engine on a CUDA GPU with vendor_graph's CUDA
reference vendor: device memory after each reset returns to the same figure, reserved memory stops
growing, and every cycle's greedy tokens equal the first's.

    python benchmarks/engine_leaks.py MODEL_DIR OUT.json     # MODEL_DIR from engine_tpot.py gen-small

Per cycle (:data:`CYCLES`): :data:`BATCHES` generations of :data:`NEW_TOKENS` greedy tokens (each captures
its bucket's graph, then replays it), memory and the cycle's graph captures and replays measured (a cycle
with none fails the run), lmdeploy's ``reset_graph_runner()`` (what its sleep and weight updates call),
memory measured again.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_tpot import prompts  # noqa: E402

CYCLES = 100
BATCHES = (1, 8)
NEW_TOKENS = 12
ALLOWED_GROWTH = 0  # bytes


def main(model_dir: str, out: str) -> int:
    import torch
    from lmdeploy import GenerationConfig, PytorchEngineConfig
    from lmdeploy.pytorch.engine import Engine

    import vendor_graph.cuda  # noqa: F401  (before lmdeploy builds its engine)
    from vendor_graph.runtime.counters import live_runners

    cfg = PytorchEngineConfig(device_type="cuda", max_batch_size=16, cache_max_entry_count=0.05,
                              session_len=1024, dtype="bfloat16")
    engine = Engine.from_pretrained(model_dir, engine_config=cfg)
    session = iter(range(1, 10**9))

    async def one(ids: list[int]) -> list[int]:
        inst = engine.create_instance()
        gen = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True, top_k=1)
        tokens: list[int] = []
        async for output in inst.async_stream_infer(next(session), ids, gen_config=gen):
            tokens += list(output.token_ids)
        return tokens

    def memory() -> tuple[int, int]:
        gc.collect()
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated(), torch.cuda.memory_reserved()

    def reset() -> None:
        agent = getattr(getattr(engine, "executor", None), "model_agent", None)
        if agent is not None and hasattr(agent, "reset_graph_runner"):
            agent.reset_graph_runner()
        else:
            for runner in live_runners():
                runner.reset()

    result = {"cycles": CYCLES, "batches": list(BATCHES), "new_tokens": NEW_TOKENS,
              "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}

    async def run() -> None:
        engine.start_loop()
        reference = None
        with_graphs, after_reset, reserved, differing, captures, replays = [], [], [], [], [], []
        counted = (0, 0)
        started = time.perf_counter()
        for cycle in range(CYCLES):
            tokens = {b: await asyncio.gather(*[one(p) for p in prompts(b)]) for b in BATCHES}
            if reference is None:
                reference = tokens
            elif tokens != reference:
                differing.append(cycle)
            with_graphs.append(memory()[0])
            # the runner's counters are the run's (a reset keeps them): this cycle's are the growth since the last
            runners = live_runners()
            total = (sum(r.stats.captures for r in runners), sum(r.stats.replays for r in runners))
            captures.append(total[0] - counted[0])
            replays.append(total[1] - counted[1])
            counted = total
            reset()
            alloc, res = memory()
            after_reset.append(alloc)
            reserved.append(res)
        runners = live_runners()
        result.update(
            seconds=round(time.perf_counter() - started, 1), cycles_with_other_tokens=differing,
            allocated_after_reset_first=after_reset[0], allocated_after_reset_last=after_reset[-1],
            allocated_after_reset_spread=max(after_reset) - min(after_reset),
            allocated_with_graphs_first=with_graphs[0], allocated_with_graphs_last=with_graphs[-1],
            allocated_with_graphs_spread=max(with_graphs) - min(with_graphs),
            reserved_after_first_cycle=reserved[0], reserved_last=reserved[-1],
            reserved_growth_after_first_cycle=reserved[-1] - reserved[0],
            runners=[type(r).__qualname__ for r in runners],
            captures_per_cycle_min=min(captures), captures_per_cycle_max=max(captures),
            replays_per_cycle_min=min(replays), replays_total=sum(replays))
        problems = []
        idle = [c for c in range(CYCLES) if not captures[c] or not replays[c]]
        if idle:  # memory figures from a cycle that never captured or replayed a graph prove nothing
            problems.append(f"cycles {idle[:5]} captured or replayed no graph")
        if differing:
            problems.append(f"cycles {differing[:5]} gave other tokens than the first")
        if result["allocated_after_reset_spread"] > ALLOWED_GROWTH:
            problems.append(f"allocated after reset varies by {result['allocated_after_reset_spread']} bytes")
        if result["reserved_growth_after_first_cycle"] > ALLOWED_GROWTH:
            problems.append(f"reserved grew {result['reserved_growth_after_first_cycle']} bytes")
        result["problems"] = problems
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        print(json.dumps(result, indent=1), flush=True)
        os._exit(1 if problems else 0)  # the results are written; do not wait for the engine loop to wind down

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
