"""The runtime modules (everything outside ``vendor_graph_sim``) import on the torch installed here,
and the oldest-torch leg really runs the declared minimum torch.

``scripts/test-oldest-torch.sh`` runs this file (with ``VENDOR_GRAPH_OLDEST_TORCH_LEG=1``) on the
minimum torch of ``[tool.vendor_graph] min-torch`` in ``pyproject.toml``; ``scripts/test.sh`` runs it on
the current torch.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "vendor_graph"
# Importing these activates a vendor (patches lmdeploy): each is imported in a process of its own.
ACTIVATING = {"vendor_graph.ascend", "vendor_graph.camb", "vendor_graph.maca", "vendor_graph.cuda"}


def runtime_modules() -> list[str]:
    names = []
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        if "testing" in parts or parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def min_torch() -> Version:
    """``[tool.vendor_graph] min-torch`` of pyproject.toml (read without tomllib, which 3.10 lacks)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = re.search(r"^\[tool\.vendor_graph\]\n(.*?)(?=^\[)", text, re.M | re.S)
    found = re.search(r'^min-torch\s*=\s*"([^"]+)"', section.group(1) if section else "", re.M)
    assert found, "pyproject.toml must declare [tool.vendor_graph] min-torch = \"X.Y.Z\""
    return Version(found.group(1))


def test_runtime_modules_are_found() -> None:
    modules = runtime_modules()
    wanted = {"vendor_graph.buffers", "vendor_graph.vendors.ascend.runner", "vendor_graph.vendors.ascend.seqlen"}
    assert wanted <= set(modules)
    assert not any(m.startswith("vendor_graph_sim") for m in modules)


@pytest.mark.parametrize("module", [m for m in runtime_modules() if m not in ACTIVATING])
def test_runtime_module_imports(module: str) -> None:
    importlib.import_module(module)


@pytest.mark.parametrize("module", sorted(ACTIVATING))
def test_vendor_module_imports_in_a_fresh_process(module: str) -> None:
    """A vendor's import activates it; lmdeploy must be present (it refuses an unsupported release by
    raising UnsupportedLmdeploy, which counts as importing fine here)."""
    assert (SOURCE / f"{module.split('.')[-1]}.py").is_file(), f"{module} is not a module of this tree"
    try:
        importlib.import_module("lmdeploy")
    except ImportError:
        pytest.skip("lmdeploy is not installed")
    code = (f"from vendor_graph.upstream import compat\ntry:\n    import {module}\n"
            f"except compat.UnsupportedLmdeploy as exc:\n    print('refused:', exc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "VENDOR_GRAPH_DISABLE_AUTOLOAD": "1"}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_installed_torch_is_at_least_the_declared_minimum() -> None:
    import torch

    installed = Version(torch.__version__.split("+")[0])
    assert installed >= min_torch(), (
        f"torch {torch.__version__} is older than [tool.vendor_graph] min-torch = {min_torch()} in pyproject.toml")
    if os.environ.get("VENDOR_GRAPH_OLDEST_TORCH_LEG") == "1":
        assert installed.release[:2] == min_torch().release[:2], (
            f"the oldest-torch leg runs torch {torch.__version__}, not the declared minimum {min_torch()}: "
            f"rebuild it with scripts/setup-oldest-torch.sh")
