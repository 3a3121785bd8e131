"""The committed manifests are what the extractor reads from the real wheels, for a few releases
downloaded from PyPI on the fly (one per extractor path: no graph API, inline update dispatch, the
G3 op table, the G4 handler registry). Skipped, saying so, only when PyPI cannot be reached."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "torch_npu_manifest.py"
# G0 (13 MB), G2a (23 MB), G3a (26 MB), G4 (37 MB): about 100 MB in all.
RELEASES = os.environ.get("VENDOR_GRAPH_REEXTRACT", "2.4.0 2.6.0 2.8.0.post2 2.11.0").split()


def _index_unreachable() -> str | None:
    """Why pip's index cannot be reached (None: it can), asked the way pip would ask it."""
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/")
    try:
        with urllib.request.urlopen(f"{index}/torch-npu/", timeout=15) as reply:
            reply.read(1)
    except (urllib.error.URLError, OSError) as exc:
        return f"{index}: {exc}"
    return None


def test_committed_manifests_match_a_fresh_extraction_from_pypi(tmp_path: Path) -> None:
    unreachable = _index_unreachable()
    if unreachable is not None:
        pytest.skip(f"no network to PyPI, committed manifests not re-checked against the wheels ({unreachable})")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--check", "--cache", os.environ.get("VENDOR_GRAPH_WHEEL_CACHE", str(tmp_path)),
         "--versions", *RELEASES],
        capture_output=True, text=True, timeout=300, check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, (
        f"re-extracting torch_npu {' '.join(RELEASES)} differs from the committed manifests "
        f"(exit {proc.returncode}); "
        f"if the extractor changed on purpose, regenerate them with "
        f"`python tools/torch_npu_manifest.py --all --write-table`:\n{output[-6000:]}")
    for version in RELEASES:
        assert f"{version}: ok" in proc.stderr, output
    assert time.monotonic() - start < 120, "re-extraction took over 2 minutes"
