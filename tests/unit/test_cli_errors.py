"""A user error on the command line: exit status 2, one line on stderr naming the fix, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from vendor_graph_sim import demo

from vendor_graph.install import patching
from vendor_graph.ops import cli, commands
from vendor_graph.upstream import compat
from vendor_graph.vendors.ascend.releases import GENERATIONS

GENERATION_LIST = ", ".join(GENERATIONS)

# argv -> what the one line on stderr must say
CASES = [
    (["demo", "--generation", "G9"], ["vendor-graph demo: error: argument --generation: 'G9'", GENERATION_LIST,
                                      "a release string such as 2.5.1"]),
    (["demo", "--generation", "2.99.0"], ["'2.99.0' is neither a torch_npu graph-API generation", GENERATION_LIST,
                                          "a release string such as 2.5.1"]),
    (["demo", "--steps", "0"], ["argument --steps: 0:", "give --steps from 1 to 98"]),
    (["demo", "--steps", "-3"], ["argument --steps: -3:", "give --steps from 1 to 98"]),
    (["demo", "--steps", "many"], ["argument --steps: 'many' is not a whole number", "give --steps from 1 to 98"]),
    (["demo", "--steps", "1000"], ["argument --steps: 1000 is too large: a sequence of the tiny decoder holds 128 "
                                   "tokens, a prompt takes up to 30", "give --steps from 1 to 98 (default 64)"]),
    (["demo", "--seqs", "0"], ["argument --seqs: 0: the demo decodes at least 1 sequence", "give --seqs from 1 to"]),
    (["demo", "--seqs", "100000"], ["argument --seqs: 100000 is too large", "give --seqs from 1 to 256"]),
    (["demo", "--seqs", "2000"], ["argument --seqs: 2000 is too large: 256 is lmdeploy's default max_batch_size on "
                                  "Ascend, Camb and MACA", "give --seqs from 1 to 256 (default 20)"]),
    (["demo", "--json", "/no/such/dir/demo.json"], ["argument --json", "directory /no/such/dir does not exist"]),
    (["demo", "--requests", "0"], ["argument --requests: 0: the engine demo serves at least 1 request",
                                   "give --requests from 1 to 32 (default 8)"]),
    (["demo", "--requests", "33"], ["argument --requests: 33 is too large: the requests decode 8, 11, 14 ... new "
                                    "tokens, so 32 requests already decode 1744 tokens",
                                    "give --requests from 1 to 32"]),
    (["demo", "--steps", "4"], ["vendor-graph demo: error: --steps is an option of the tiny decoder's demo: add "
                                "--model tiny (the engine demo, --model lmdeploy-llama, serves requests"]),
    (["demo", "--model", "lmdeploy-mla", "--seqs", "3", "--backend", "sim"], [
        "--seqs and --backend are options of the tiny decoder's demo: add --model tiny (the engine demo, --model "
        "lmdeploy-mla,"]),
    (["demo", "--model", "tiny", "--requests", "3"], ["--requests sets the engine demo's workload; the tiny "
                                                      "decoder's demo (--model tiny) takes --steps and --seqs"]),
    (["demo", "--vendor", "maca", "--model", "tiny", "--serve"], [
        "--serve runs lmdeploy's OpenAI server on the simulated MetaX MACA device: use --model lmdeploy-llama or "
        "lmdeploy-mla (the tiny decoder has no server)"]),
    (["demo", "--generation", "G0"], ["torch_npu 2.4.0.post2 (G0) has no NPUGraph API", "give --generation G1 or "
                                      "later (--model tiny runs G0)"]),
    (["plan", "--max-batches", "0"], ["vendor-graph plan: error: argument --max-batches: 0: lmdeploy's "
                                      "max_batch_size is at least 1", "give --max-batches from 1 to 65536"]),
    (["plan", "--max-batches", "100000000"], ["argument --max-batches: 100000000 is too large",
                                              "lmdeploy's own max_batch_size defaults are 128-1024",
                                              "give --max-batches from 1 to 65536"]),
    (["plan", "--capture-sizes", "8", "4", "--max-batches", "2"], [
        "vendor-graph plan: error: --capture-sizes 8 4: every size is above --max-batches 2",
        "give at least one size <= 2"]),
    (["plan", "--capture-sizes", "0", "4"], ["argument --capture-sizes: 0:", "give --capture-sizes 1 or more"]),
    (["plan", "--vendor", "banana"], ["argument --vendor: invalid choice: 'banana'", "ascend"]),
    (["--log-level", "loud", "paths"], ["vendor-graph: error: argument --log-level: invalid choice: 'LOUD'"]),
    (["frobnicate"], ["vendor-graph: error: argument command: invalid choice: 'frobnicate'"]),
    (["run", "--vendor", "ascend"], ["vendor-graph run: error: nothing to run; usage: vendor-graph run"]),
]


def _one_line_error(capsys, argv: list[str]) -> str:
    status = cli.main(argv)
    out, err = capsys.readouterr()
    assert status == 2, (out, err)
    assert out == "", out
    assert err.count("\n") == 1 and err.endswith("\n"), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("argv,expected", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_user_errors_are_one_line_with_the_fix(capsys, argv, expected):
    err = _one_line_error(capsys, argv)
    for text in expected:
        assert text in err, (text, err)


def test_json_path_that_is_a_directory_is_refused(capsys, tmp_path):
    err = _one_line_error(capsys, ["demo", "--json", str(tmp_path)])
    assert f"argument --json: {tmp_path} is a directory" in err


def test_generation_accepts_names_in_any_case_and_release_strings():
    assert cli.generation_type("g2a") == "G2a"
    assert cli.generation_type("2.5.1") == "2.5.1"
    assert cli.generation_type("2.8.0.post2") == "2.8.0.post2"


def _settings_error_class(monkeypatch) -> type[ValueError]:
    from vendor_graph.config.settings import SettingsError

    class Raised(SettingsError):  # built from a message, whatever SettingsError's own constructor takes
        def __init__(self, message: str):
            ValueError.__init__(self, message)

    return Raised


def test_settings_error_is_a_user_error_on_one_line(capsys, monkeypatch):
    error = _settings_error_class(monkeypatch)

    def command(args):
        raise error("2 VENDOR_GRAPH_* settings are not accepted:\n  VENDOR_GRAPH_SHADOW='x': not a whole number"
                    "\n  VENDOR_GRAPH_DISABLE='2': not a boolean")

    monkeypatch.setattr(commands, "cmd_paths", command)
    assert cli.main(["paths"]) == 2
    assert capsys.readouterr().err == ("vendor-graph paths: error: 2 VENDOR_GRAPH_* settings are not accepted: "
                                       "VENDOR_GRAPH_SHADOW='x': not a whole number; VENDOR_GRAPH_DISABLE='2': "
                                       "not a boolean\n")


@pytest.mark.parametrize("error", [
    compat.UnsupportedLmdeploy("vendor_graph.camb does not support the installed lmdeploy 9.9. Supported: 0.16.x."),
    patching.VendorConflict("vendor_graph.ascend is already active in this process; call uninstall() first"),
    cli.UsageError("a message"),
], ids=lambda e: type(e).__name__)
def test_user_error_classes_raised_by_a_command_are_caught_in_main(capsys, monkeypatch, error):
    def command(args):
        print("partial report")
        raise error

    monkeypatch.setattr(commands, "cmd_paths", command)
    status = cli.main(["paths"])
    out, err = capsys.readouterr()
    assert status == 2 and out == "partial report\n"
    assert err == f"vendor-graph paths: error: {error}\n"


@pytest.mark.parametrize("bug", [ValueError("a bug"), RuntimeError("a bug"), KeyError("a bug")],
                         ids=lambda e: type(e).__name__)
def test_real_bugs_keep_their_traceback(monkeypatch, bug):
    def command(args):
        raise bug

    monkeypatch.setattr(commands, "cmd_paths", command)
    with pytest.raises(type(bug)):
        cli.main(["paths"])


def test_paths_into_a_closed_pipe_stops_quietly():
    """`vendor-graph paths | head`: the reader is gone before the table is written."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "vendor_graph", "paths"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == cli.BROKEN_PIPE_STATUS == 141 and proc.stderr == ""


def test_paths_output_is_unchanged_by_the_move():
    from vendor_graph.vendors.ascend.seqlen import seqlen_path_table

    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "paths"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == seqlen_path_table() + "\n"


def test_doctor_does_not_import_the_cli():
    code = ("import sys; from vendor_graph.ops import doctor; doctor._torch_npu_lines('2.8.0.post2'); "
            "assert 'vendor_graph.ops.cli' not in sys.modules, 'doctor imports the CLI'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_run_refuses_when_the_autoload_hook_is_missing(capsys, monkeypatch):
    from vendor_graph.ops import doctor

    monkeypatch.setattr(doctor, "autoload_hook", lambda: doctor.AutoloadHook(None))
    err = _one_line_error(capsys, ["run", "--vendor", "ascend", "--", "true"])
    assert err.startswith("vendor-graph run: error: the autoload hook is NOT installed")
    assert "pip install --force-reinstall vendor-graph" in err


def test_autoload_hook_is_a_structured_result(tmp_path):
    from vendor_graph.ops.doctor import AutoloadHook, autoload_hook

    hook = autoload_hook()
    assert isinstance(hook, AutoloadHook) and hook.installed == (hook.path is not None)
    assert AutoloadHook(tmp_path / "x.pth").describe() == f"installed ({tmp_path / 'x.pth'})"
    assert not AutoloadHook(None).installed and AutoloadHook(None).describe().startswith("NOT installed")


def test_plan_notes_how_lmdeploy_normalises_explicit_sizes():
    sizes, note = commands.plan_sizes("ascend", 16, [8, 4, 300, 4])
    assert sizes == [4, 8, 16]
    assert note == ("--capture-sizes 8 4 300 4 normalised as lmdeploy does: sorted; repeats removed; 300 dropped "
                    "(above max_batch_size 16); max_batch_size 16 added (always captured)")
    assert commands.plan_sizes("ascend", 16, [4, 16]) == ([4, 16], None)
    assert commands.plan_sizes("camb", 8, None) == ([1, 2, 4, 8], None)


def test_demo_json_names_a_real_dlinfer_and_not_the_stand_in(monkeypatch, tmp_path):
    from vendor_graph_sim import standins

    standin_root = tmp_path / "stubs"  # a copy of the stand-in elsewhere, as a machine's PYTHONPATH may hold one
    (standin_root / "dlinfer").mkdir(parents=True)
    (standin_root / "dlinfer" / "__init__.py").write_text(
        (standins.STANDIN_ROOT / "dlinfer" / "__init__.py").read_text())
    real = tmp_path / "site"
    (real / "dlinfer").mkdir(parents=True)
    (real / "dlinfer" / "__init__.py").write_text("")
    (real / "dlinfer_ascend-0.2.7.dist-info").mkdir()
    (real / "dlinfer_ascend-0.2.7.dist-info" / "METADATA").write_text("Name: dlinfer-ascend\nVersion: 0.2.7\n")
    for name in [m for m in sys.modules if m == "dlinfer" or m.startswith("dlinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(standin_root))
    assert demo._dlinfer_in_use() is None
    monkeypatch.syspath_prepend(str(real))
    assert demo._dlinfer_in_use() == "0.2.7"


def test_write_json_replaces_the_file_whole_or_not_at_all(monkeypatch, tmp_path):
    path = tmp_path / "demo.json"
    demo.write_json(path, {"parity": True})
    assert json.loads(path.read_text()) == {"parity": True}

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(demo.os, "replace", refuse)
    with pytest.raises(cli.UsageError, match=f"cannot write --json {path}: Permission denied"):
        demo.write_json(path, {"parity": False})
    assert json.loads(path.read_text()) == {"parity": True}
    assert [p.name for p in tmp_path.iterdir()] == ["demo.json"]


def test_demo_without_the_simulator_package_names_the_install(capsys, monkeypatch):
    monkeypatch.setattr(cli.metadata, "entry_points", lambda group: [])
    err = _one_line_error(capsys, ["demo", "--vendor", "ascend", "--steps", "4"])
    assert err == f"vendor-graph demo: error: {cli.DEMO_MISSING}\n"
