"""Generated command lines against every ``vendor-graph`` subcommand: exit status 0/1/2, no traceback, within the
bound, one line for a user error, nothing half-written."""

from __future__ import annotations

import pytest
from fuzz_harness import FUZZ, check, invoke, workspace
from fuzz_strategies import INTS, JUNK, LOG_LEVELS, NUMBER_TEXT, VENDOR_WORDS, WORD_TEXT, argv_of, flag
from hypothesis import given
from hypothesis import strategies as st

from vendor_graph.ops import cli

FILES = st.sampled_from(["good.json", "junk.json", "sizes.txt", "missing.json", "dir", "", ".", "/proc/self/status",
                         "/dev/null", "dir/../good.json", "good.json/x", "-", "☃.json"])
JSON_PATHS = st.sampled_from(["out.json", "dir/out.json", "missing/out.json", "dir", "", ".", "good.json",
                              "x" * 300 + ".json", "/proc/out.json", "☃.json", "-", "out\0.json"])
COMMANDS = st.one_of(
    st.sampled_from(["true", "false", "", "no-such-command-xyz", "./dir", "./plain.txt", "./script.sh", "dir",
                     "/", "./missing", "lmdeploy", "python", "a\0b", "-", "--"]),
    st.text(max_size=8),
)
GOOD_COUNT = st.integers(1, 300).map(str)
GOOD_VENDOR = st.sampled_from(["ascend", "camb", "maca"])
# Well-formed command lines (each run this far gets past argparse into the command) beside hostile ones.
WELL_FORMED = {
    "plan": argv_of([flag("--vendor", GOOD_VENDOR), flag("--max-batches", GOOD_COUNT),
                     flag("--capture-sizes", GOOD_COUNT, -1)], extra=st.nothing()),
    "plan-stats": argv_of([flag("--max-graphs", GOOD_COUNT), flag("--json"), flag("--capture-sizes", GOOD_COUNT, -1)],
                          extra=st.nothing()).map(lambda words: ["--from-stats", "good.json", *words]),
    "run": st.tuples(GOOD_VENDOR, st.lists(COMMANDS, min_size=1, max_size=3)).map(
        lambda t: ["--vendor", t[0], "--", *t[1]]),
    "demo": argv_of([flag("--vendor", GOOD_VENDOR), flag("--model", st.sampled_from(["tiny", "lmdeploy-llama"])),
                     flag("--generation", st.sampled_from(["G0", "G1", "G5", "2.9.0.post9"])),
                     flag("--requests", GOOD_COUNT), flag("--steps", GOOD_COUNT), flag("--seqs", GOOD_COUNT),
                     flag("--backend", st.sampled_from(["sim", "cuda"])), flag("--serve"), flag("--json", JSON_PATHS)],
                    extra=st.nothing()),
}
SUBCOMMANDS = {
    "plan": argv_of([flag("--vendor", VENDOR_WORDS), flag("--max-batches", NUMBER_TEXT),
                     flag("--capture-sizes", NUMBER_TEXT, -1), flag("--max-graphs", NUMBER_TEXT), flag("--json"),
                     flag("--from-stats", FILES, -1)]),
    "paths": argv_of([flag("--help")]),
    "doctor": argv_of([flag("--vendor", VENDOR_WORDS)]),
    "run": st.tuples(argv_of([flag("--vendor", VENDOR_WORDS)]), st.sampled_from([[], ["--"], ["--", "--"]]),
                     st.lists(COMMANDS, max_size=3)).map(lambda t: [*t[0], *t[1], *t[2]]),
    "demo": argv_of([flag("--vendor", VENDOR_WORDS), flag("--model", st.sampled_from(
        ["tiny", "lmdeploy-llama", "lmdeploy-mla", "llama", ""])), flag("--generation", WORD_TEXT),
        flag("--requests", NUMBER_TEXT), flag("--steps", NUMBER_TEXT), flag("--seqs", NUMBER_TEXT),
        flag("--seed", st.one_of(NUMBER_TEXT, INTS.map(str))), flag("--backend", st.sampled_from(
            ["sim", "cuda", "npu", ""])), flag("--serve"), flag("--json", JSON_PATHS)]),
}


def test_every_subcommand_is_fuzzed():
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    assert set(commands.choices) == set(SUBCOMMANDS), "give each new subcommand its strategy here"


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
@FUZZ
@given(data=st.data())
def test_generated_command_lines(tmp_path, command, data):
    good = [WELL_FORMED[k] for k in WELL_FORMED if k.split("-")[0] == command]
    words = data.draw(st.one_of(SUBCOMMANDS[command], *good), label="words")
    prefix = data.draw(st.sampled_from([[], ["--log-level"]]).flatmap(
        lambda p: st.just(p) if not p else LOG_LEVELS.map(lambda level: [*p, level])), label="prefix")
    check(invoke([*prefix, command, *words], cwd=workspace(tmp_path)))


@FUZZ
@given(words=st.lists(st.one_of(JUNK, st.sampled_from(sorted(SUBCOMMANDS))), max_size=5))
def test_generated_words(tmp_path, words):
    check(invoke(words, cwd=workspace(tmp_path)))
