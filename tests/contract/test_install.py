"""The README's install, as a user runs it: its install blocks (``<!-- install: NAME -->`` ... ``<!-- /install -->``),
read from the README itself, run one command after the other with a fresh virtualenv's pip in the clone; then a
user's script in that virtualenv starts lmdeploy's engine and pipeline in graph mode on the simulated NPU.

The fresh virtualenv starts with what the README presumes, the vendor's torch (here the CPU build of
:data:`VENDOR_TORCH`, which pip takes from local disk where the machine has it); everything else comes from the
README's commands, unchanged (``pip`` is the virtualenv's). Nothing of the test's own environment reaches it: no
``PYTHONPATH`` (the suite's stand-in dlinfer), no ``VENDOR_GRAPH_*`` setting but the two the script is run with.

The pipeline needs dlinfer's source (``VENDOR_GRAPH_DLINFER_SRC``, which ``.ci/run`` always sets): unset, that
test skips saying so, and an unusable setting fails it, as in tests/realstack. The install itself always runs.
Expensive (a 1.6 GB virtualenv; about 1.5 minutes of installs on a 2-core machine, more with a slow download),
so once per test run. pip's conflict warnings and ``pip check``'s complaints about lmdeploy's own pins are expected.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from once_per_run import newest_release_only
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from vendor_graph_sim.variables import DLINFER_SRC

pytestmark = newest_release_only

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCK = re.compile(r"^<!-- install: (?P<name>[\w.-]+) -->\n```bash\n(?P<body>.*?)^```\n<!-- /install -->$",
                   re.M | re.S)
ORDER = ("vendor-graph", "simulator")  # the README's blocks, run in this order
VENDOR_TORCH = "torch==2.13.0"  # the vendor's torch the README presumes: a CPU build stands in for it
VENV_TIMEOUT = 300
PIP_TIMEOUT = 1200  # one pip command; beyond torch the README downloads about 160 MiB (lmdeploy 102 MiB)
SCRIPT_TIMEOUT = 600
NEW_TOKENS = 6
PROMPTS = ("bako bami bobo", "dafo bike bude bali buke bara")  # words of the checkpoint's vocabulary

# What a user writes (the README's "Activate"), with a report of what ran on the last line of stdout.
USER_SCRIPT = f"""
import json, sys
from pathlib import Path

import vendor_graph.ascend  # before lmdeploy builds its engine
import lmdeploy
from lmdeploy import GenerationConfig, PytorchEngineConfig
from vendor_graph_sim.engine import write_model

model = write_model("lmdeploy-llama", Path(sys.argv[1]))
config = PytorchEngineConfig(device_type="ascend", eager_mode=False, max_batch_size=2, block_size=16,
                             session_len=256, num_gpu_blocks=32)
pipe = lmdeploy.pipeline(str(model), backend_config=config, log_level="ERROR")
gen = GenerationConfig(top_k=1, do_sample=False, ignore_eos=True, max_new_tokens={NEW_TOKENS})
outputs = pipe({list(PROMPTS)!r}, gen_config=gen)
runner = pipe.async_engine.engine.executor.model_agent.patched_model
stats = getattr(runner, "stats", None)
report = dict(
    texts=[o.text for o in outputs], tokens=[list(o.token_ids) for o in outputs],
    finish_reasons=[str(o.finish_reason) for o in outputs],
    runner=type(runner).__module__ + "." + type(runner).__qualname__,
    captures=getattr(stats, "captures", None), replays=getattr(stats, "replays", None),
    modules={{name: sys.modules[name].__file__ for name in ("vendor_graph", "vendor_graph_sim", "lmdeploy",
                                                           "xgrammar", "torch_npu", "dlinfer")}},
)
pipe.close()
print(json.dumps(report))
"""


# -- the README's commands --------------------------------------------------------------------------------------


def install_blocks(text: str) -> dict[str, list[list[str]]]:
    """The README's install blocks: name -> its commands, each split as the shell splits it (comments dropped)."""
    blocks = {}
    for match in BLOCK.finditer(text):
        commands = [shlex.split(line, comments=True) for line in match["body"].splitlines()]
        blocks[match["name"]] = [c for c in commands if c]
    return blocks


def readme_commands() -> list[list[str]]:
    """The README's install commands, in order; each a ``pip install`` (anything else would not be run as written)."""
    blocks = install_blocks(README.read_text())
    assert sorted(blocks) == sorted(ORDER), f"README.md's install blocks are {sorted(blocks)}, expected {ORDER}"
    commands = [c for name in ORDER for c in blocks[name]]
    for command in commands:
        assert command[:2] == ["pip", "install"], f"not a pip install, which this test runs: {shlex.join(command)}"
    return commands


def requirement_names(command: list[str]) -> set[str]:
    """The distributions ``command`` names: its requirement specifiers and the lines of its ``-r`` files."""
    names, args = set(), iter(command[2:])
    for arg in args:
        if arg in ("-r", "--requirement"):
            for line in (ROOT / next(args)).read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    names.add(canonicalize_name(Requirement(line).name))
        elif not arg.startswith("-") and not arg.startswith((".", "/")):
            names.add(canonicalize_name(Requirement(arg).name))
    return names


def test_the_readme_installs_every_requirements_file_and_lmdeploy_without_its_pins():
    commands = readme_commands()
    named = {arg for c in commands for a, arg in zip(c, c[1:], strict=False) if a in ("-r", "--requirement")}
    assert named == {f"requirements/{p.name}" for p in (ROOT / "requirements").glob("*.txt")}
    no_deps = set().union(*(requirement_names(c) for c in commands if "--no-deps" in c))
    assert {"lmdeploy", "xgrammar"} <= no_deps
    assert "torch" not in set().union(*(requirement_names(c) for c in commands))
    installed = {a for c in commands for a in c[2:] if a.startswith(".")}
    assert installed == {".", "./sim"}


@pytest.mark.parametrize("script", ["scripts/setup-env.sh", "scripts/setup-test-env.sh"])
def test_the_setup_scripts_install_the_readmes_requirements_files(script):
    """The demo's and the tests' environments get what the README installs: every requirements file, with
    ``--no-deps`` where the README gives it (each script checks every pin and installs a changed one again)."""
    text = (ROOT / script).read_text()
    for command in readme_commands():
        for flag, name in zip(command, command[1:], strict=False):
            if flag not in ("-r", "--requirement"):
                continue
            variable = re.search(rf"\b(\w+)=\$root/{re.escape(name)}\b", text)
            assert variable, f"{script} names no {name}"
            installs = re.findall(rf"pip_install\b[^\n]*-r \"\${variable[1]}\"", text)
            assert installs, f"{script} does not install {name}"
            assert all(("--no-deps" in line) == ("--no-deps" in command) for line in installs), (script, installs)


def test_the_block_parser_reads_what_the_shell_would_run():
    text = ("<!-- install: a -->\n```bash\npip install --no-deps x==1 -r r.txt  # why\n\n"
            "pip install 'y>=2'   # why\n```\n<!-- /install -->\n")
    assert install_blocks(text) == {"a": [["pip", "install", "--no-deps", "x==1", "-r", "r.txt"],
                                          ["pip", "install", "y>=2"]]}
    assert install_blocks(text.replace("```bash", "```console")) == {}


# -- the fresh virtualenv ---------------------------------------------------------------------------------------


@dataclass
class Step:
    command: list[str]
    returncode: int
    seconds: float
    output: str


@dataclass
class Venv:
    path: Path
    steps: list[Step] = field(default_factory=list)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def failed(self) -> Step | None:
        return next((s for s in self.steps if s.returncode != 0), None)

    def timings(self) -> str:
        lines = [f"{s.seconds:7.1f} s  {shlex.join(s.command)}" for s in self.steps]
        return "\n".join(lines + [f"{sum(s.seconds for s in self.steps):7.1f} s  in all"])


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would reach into the fresh virtualenv from the test's own."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP", "PYTHONNOUSERSITE")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("VENDOR_GRAPH_")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", OMP_NUM_THREADS="1", **extra)
    return env


def _step(venv: Venv, command: list[str], argv: list[str], timeout: int, cwd: Path = ROOT) -> Step:
    start = time.perf_counter()
    try:
        proc = subprocess.run(argv, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = -1, f"timed out after {timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
    step = Step(command, code, round(time.perf_counter() - start, 1), output)
    venv.steps.append(step)
    return step


@pytest.fixture(scope="module")
def fresh_venv() -> Iterator[Venv]:
    """A new virtualenv with the vendor's torch, then the README's install commands run in the clone with its
    pip, stopping at the first that fails."""
    with tempfile.TemporaryDirectory(prefix="vendor-graph-install-", ignore_cleanup_errors=True) as tmp:
        venv = Venv(Path(tmp) / "venv")
        if _step(venv, ["python", "-m", "venv", "<tmp>/venv"], [sys.executable, "-m", "venv", str(venv.path)],
                 VENV_TIMEOUT).returncode == 0:
            pip = str(venv.path / "bin" / "pip")
            for command in [["pip", "install", VENDOR_TORCH], *readme_commands()]:
                if _step(venv, command, [pip, *command[1:]], PIP_TIMEOUT).returncode != 0:
                    break
        print(f"\nthe README's install in a fresh virtualenv:\n{venv.timings()}")
        yield venv


def _installed(venv: Venv) -> None:
    failed = venv.failed
    assert failed is None, f"`{shlex.join(failed.command)}` exited {failed.returncode}:\n{failed.output[-6000:]}"


def test_the_readmes_install_succeeds_in_a_fresh_virtualenv(fresh_venv):
    for step in fresh_venv.steps:
        print(f"{step.seconds:>7} s  {shlex.join(step.command)}")  # shown with -rP, or when the test fails
    _installed(fresh_venv)
    # lmdeploy and its engine import, vendor_graph and the simulator come from the virtualenv (not the clone),
    # and the command line works (the doctor: no vendor runtime here, nothing wrong)
    code = ("import importlib, json; names = ['lmdeploy', 'lmdeploy.pytorch.engine.model_agent', "
            "'lmdeploy.serve.core.async_engine', 'lmdeploy.metrics.loggers', 'prometheus_client', 'vendor_graph', "
            "'vendor_graph_sim', 'xgrammar']; "
            "print(json.dumps({n: importlib.import_module(n).__file__ for n in names}))")
    proc = subprocess.run([str(fresh_venv.python), "-c", code], cwd=fresh_venv.path, env=clean_env(),
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    files = json.loads(proc.stdout.splitlines()[-1])
    outside = {n: f for n, f in files.items() if not Path(f).is_relative_to(fresh_venv.path)}
    assert not outside, f"imported from outside the fresh virtualenv: {outside}"
    doctor = subprocess.run([str(fresh_venv.path / "bin" / "vendor-graph"), "doctor"], cwd=fresh_venv.path,
                            env=clean_env(), capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    assert doctor.returncode == 0 and "no problems found" in doctor.stdout, doctor.stdout + doctor.stderr
    assert "autoload hook vendor_graph_autoload.pth: installed" in doctor.stdout, doctor.stdout


def test_the_only_unmet_requirements_are_the_pins_left_out_on_purpose(fresh_venv):
    """pip reports lmdeploy's (and xgrammar's) own pins as unmet, by design; every other package's needs are met."""
    _installed(fresh_venv)
    no_deps = set().union(*(requirement_names(s.command) for s in fresh_venv.steps if "--no-deps" in s.command))
    proc = subprocess.run([str(fresh_venv.python), "-m", "pip", "check"], cwd=fresh_venv.path, env=clean_env(),
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    complaints = [line for line in proc.stdout.splitlines() if line.strip() and "No broken requirements" not in line]
    others = [line for line in complaints if canonicalize_name(line.split()[0]) not in no_deps]
    assert not others, f"unmet requirements beyond the --no-deps installs ({sorted(no_deps)}):\n" + "\n".join(others)


@pytest.fixture(scope="module")
def dlinfer_src(dlinfer_available) -> Path:
    """dlinfer's source for the fresh virtualenv (:func:`dlinfer_available` decides it)."""
    origin, root = dlinfer_available
    if root is None:
        pytest.skip(f"dlinfer is installed in this environment, not in the fresh virtualenv: set "
                    f"{DLINFER_SRC.name} to a dlinfer checkout")
    return Path(root).resolve()


def test_lmdeploys_pipeline_runs_in_graph_mode_on_the_simulated_npu(fresh_venv, dlinfer_src, tmp_path):
    _installed(fresh_venv)
    script = tmp_path / "user.py"
    script.write_text(USER_SCRIPT)
    env = clean_env(VENDOR_GRAPH_SIM="G5", VENDOR_GRAPH_DLINFER_SRC=str(dlinfer_src))
    start = time.perf_counter()
    proc = subprocess.run([str(fresh_venv.python), str(script), str(tmp_path / "model")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=SCRIPT_TIMEOUT)
    print(f"user script: {time.perf_counter() - start:.1f} s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-8000:]
    report = json.loads(proc.stdout.splitlines()[-1])
    assert len(report["texts"]) == len(PROMPTS), report
    assert all(t.strip() for t in report["texts"]), report
    assert [len(t) for t in report["tokens"]] == [NEW_TOKENS] * len(PROMPTS), report
    assert report["finish_reasons"] == ["length"] * len(PROMPTS), report
    assert report["runner"] == "vendor_graph.vendors.ascend.runner.AscendGraphRunner", report
    assert report["captures"] >= 1 and report["replays"] >= NEW_TOKENS - 1, report  # decode replayed graphs
    modules = report["modules"]
    assert "vendor_graph_sim" in Path(modules["torch_npu"]).parts, modules  # the simulated torch_npu
    local = ("vendor_graph", "vendor_graph_sim", "lmdeploy", "xgrammar", "torch_npu")
    assert all(Path(modules[n]).is_relative_to(fresh_venv.path) for n in local), modules
