"""The tiny demo's bounds on --steps and --seqs are what its decoder can hold: no run within them fails with
"reached max_seq_len" or "out of KV blocks" (both were tracebacks), and a run past them is refused as one line."""

from __future__ import annotations

import os
import subprocess
import sys

from vendor_graph_sim import demo, harness
from vendor_graph_sim.tiny_model import TinyConfig


def test_the_bounds_follow_the_tiny_decoder_and_its_prompts():
    config = TinyConfig()
    assert demo.TINY_TOKENS == config.max_seq_len
    longest = max(len(p) for seed in range(200) for p in harness.prompts(20, seed))
    replaced = max(len(p) for seed in range(200) for _, p in harness.retirements(20, 64, seed).values())
    assert max(longest, replaced) == demo.TINY_PROMPT
    assert demo.MAX_STEPS + demo.TINY_PROMPT <= config.max_seq_len


def test_the_demo_gives_every_sequence_room_for_its_longest_run():
    config = TinyConfig()
    assert demo.tiny_blocks(20, 64) == config.num_blocks  # the pinned default run keeps the pinned cache
    for seqs, steps in ((64, 4), (256, demo.MAX_STEPS), (1, 1)):
        per_sequence = -(-(demo.TINY_PROMPT + steps) // config.block_size)
        assert demo.tiny_blocks(seqs, steps) >= seqs * per_sequence + 1


def test_more_sequences_than_the_default_cache_holds_run():
    """100 sequences' prompts alone take more than the 127 blocks of the model's default cache, which ran out."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_") or k == "VENDOR_GRAPH_DLINFER_SRC"}
    seed = 0
    assert sum(-(-len(p) // TinyConfig().block_size) for p in harness.prompts(100, seed)) > 127
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "demo", "--model", "tiny", "--vendor", "camb",
                           "--seqs", "100", "--steps", "4", "--seed", str(seed)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout
