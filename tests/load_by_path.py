"""Tests import a tool, a benchmark or one package file by its path (tools and benchmarks are not packages;
a file loaded alone does not depend on the rest of vendor_graph)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import ``path`` as module ``name`` (registered in ``sys.modules``: its dataclasses look it up)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"{path} is not a Python module"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
