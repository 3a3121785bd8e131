"""``import vendor_graph.<vendor>`` activates, whatever vendor_graph's own code imported before it.

Code that needs a vendor's facts imports its room (``vendor_graph.vendors.<vendor>``), never the public
module; ``uninstall()`` lets the next public import activate again.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import vendor_graph
from vendor_graph.install import patching
from vendor_graph.upstream import compat

ROOT = Path(__file__).resolve().parents[2]
PUBLIC = {f"vendor_graph.{v}" for v in vendor_graph.VENDORS + vendor_graph.REFERENCE_VENDORS}
SUPPORTED_HERE = compat.vendors_supporting(compat.installed_lmdeploy_version())


def _child(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=str(ROOT))


def _imported_names(path: Path) -> list[tuple[int, str]]:
    """(line, module or module.name) of every import in ``path``, relative imports resolved."""
    top = ROOT / "sim" if ROOT / "sim" in path.parents else ROOT
    package = list(path.relative_to(top).parts[:-1])  # where its relative imports start (an __init__'s own package)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, module)] + [(node.lineno, f"{module}.{alias.name}") for alias in node.names]
    return found


def test_nothing_in_the_package_or_the_simulator_imports_a_public_vendor_module():
    found = []
    for folder in (ROOT / "vendor_graph", ROOT / "sim" / "vendor_graph_sim"):
        for path in folder.rglob("*.py"):
            if path.parent == ROOT / "vendor_graph" and f"vendor_graph.{path.stem}" in PUBLIC:
                continue
            found += [f"{path.relative_to(ROOT)}:{line} imports {name}" for line, name in _imported_names(path)
                      if name in PUBLIC]
    assert not found, "\n".join(found)


@pytest.mark.skipif("ascend" not in SUPPORTED_HERE, reason="Ascend does not support this lmdeploy")
def test_reading_every_vendors_facts_first_leaves_the_users_import_activating():
    proc = _child("""
        import importlib, pkgutil
        import vendor_graph, vendor_graph.vendors
        from vendor_graph.ops import doctor; from vendor_graph.sizing import planning
        for info in pkgutil.walk_packages(vendor_graph.vendors.__path__, "vendor_graph.vendors."):
            importlib.import_module(info.name)
        for vendor in ("ascend", "camb", "maca", "cuda"):
            vendor_graph.vendors.profile(vendor).spec
        workload = planning.Workload(vendor="ascend", max_batches=8, capture_sizes=(1, 2, 4, 8), steps={1: 10, 3: 5},
                                     weights={1: 10, 3: 5}, num_layers=2)
        planning.plan_for(workload, 2)  # reads the Ascend event budget
        doctor.report(None)
        from vendor_graph_sim import device as sim
        sim.install()
        with sim.use_torch_npu("G5"):
            pass
        print("before", vendor_graph.active_vendor())
        import vendor_graph.ascend
        print("after", vendor_graph.active_vendor())
    """)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == ["before None", "after ascend"], proc.stdout


@pytest.mark.parametrize("vendor", SUPPORTED_HERE)
def test_a_second_import_after_uninstall_activates_again(vendor):
    import importlib

    try:
        first = importlib.import_module(f"vendor_graph.{vendor}")
        assert patching.active().vendor == vendor
        vendor_graph.uninstall()
        assert patching.active() is None
        assert f"vendor_graph.{vendor}" not in sys.modules
        importlib.import_module(f"vendor_graph.{vendor}")
        assert patching.active().vendor == vendor
        vendor_graph.uninstall()
        first.activate()  # a module object held from before keeps working
        assert patching.active().vendor == vendor
    finally:
        vendor_graph.uninstall()
