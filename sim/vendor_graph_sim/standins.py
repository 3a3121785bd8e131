"""Where the stand-in ``dlinfer`` lives, for runs on machines without the real one.

lmdeploy's Ascend op backend imports a few dlinfer names (and lmdeploy imports
``dlinfer.framework.lmdeploy_ext`` in its workers). The real dlinfer needs torch_npu and an Ascend
machine; this package's ``data/standins/dlinfer`` reproduces just those facts (see its README).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

STANDIN_ROOT = Path(__file__).resolve().parent / "data" / "standins"
STANDIN_MARK = '"""Stand-in dlinfer for vendor_graph'  # how the stand-in's dlinfer/__init__.py begins


def is_standin(origin: str | Path) -> bool:
    """Whether the ``dlinfer/__init__.py`` at ``origin`` is this stand-in (any copy of it, wherever it lies)."""
    with open(origin, encoding="utf-8") as f:
        return f.read(len(STANDIN_MARK)) == STANDIN_MARK


def use_standin_dlinfer_if_missing() -> bool:
    """Put the stand-in dlinfer on ``sys.path`` unless a real dlinfer is importable; True if it did."""
    if importlib.util.find_spec("dlinfer") is not None:
        return False
    if not (STANDIN_ROOT / "dlinfer").is_dir():
        raise RuntimeError(
            f"no dlinfer installed and no stand-in at {STANDIN_ROOT}: reinstall vendor-graph-sim"
        )
    sys.path.insert(0, str(STANDIN_ROOT))
    return True
