"""The default ``vendor-graph demo`` (lmdeploy's engine on the simulated NPU), run once per test process for every
test that reads it: its output is the README's demo sample (tools/samples.py) and its ``--json`` record is what
the demo's own tests check. It takes about half a minute, so no test runs it again."""

from __future__ import annotations

import functools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[1]
samples = load_by_path("_vg_samples_default_demo", ROOT / "tools" / "samples.py")
SAMPLE = samples.BY_NAME["demo"]


@dataclass(frozen=True)
class DemoRun:
    status: int
    output: str  # stdout and stderr interleaved, as a terminal shows them
    record: dict[str, Any] | None  # what --json wrote; None when the demo wrote nothing


def dlinfer_source() -> str | None:
    """The dlinfer source checkout the engine demo runs on in these tests (tools/samples.py's)."""
    return samples.dlinfer_source()


def dlinfer_missing() -> str | None:
    """Why the engine demo cannot run in these tests (no dlinfer source to point it at), or None."""
    if dlinfer_source() is None:
        return (f"the default demo serves lmdeploy's engine over the real dlinfer: set {samples.DLINFER_ENV} to a "
                f"dlinfer checkout (.ci/run points it at the snapshot beside the clone)")
    return None


@functools.cache
def run() -> DemoRun:
    """The README sample's command (``vendor-graph demo``), with ``--json``, which prints nothing more."""
    with tempfile.TemporaryDirectory(prefix="vg-default-demo-") as tmp:
        path = Path(tmp) / "demo.json"
        result = samples.run(SAMPLE, extra=("--json", str(path)))
        record = json.loads(path.read_text()) if path.is_file() else None
    return DemoRun(result.status, result.output, record)
