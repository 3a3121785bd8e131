"""The support matrix (docs/support.md) and README's status table are generated from the code's facts, and the
hardware matrix workflow runs exactly the matrix's (CANN, torch_npu, torch) pairs, each torch being the one that
torch_npu release pins."""

from __future__ import annotations

import json
import re
from pathlib import Path

from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "sim" / "vendor_graph_sim" / "data" / "torch_npu_manifests"
WORKFLOW = ROOT / ".github" / "workflows" / "ascend-torch-npu-matrix.yml"


matrix = load_by_path("_vg_support_matrix", ROOT / "tools" / "support_matrix.py")


def test_the_support_matrix_is_generated_from_the_code() -> None:
    text = (ROOT / "docs" / "support.md").read_text()
    found = re.search(re.escape(matrix.BEGIN) + r".*?" + re.escape(matrix.END), text, re.S)
    assert found, "docs/support.md lost its support-matrix markers"
    assert found.group(0) == matrix.render(), "regenerate it with: python tools/support_matrix.py --write"


def test_readme_status_table_is_generated_from_the_code() -> None:
    text = (ROOT / "README.md").read_text()
    found = re.search(re.escape(matrix.STATUS_BEGIN) + r".*?" + re.escape(matrix.STATUS_END), text, re.S)
    assert found, "README lost its support-status markers"
    assert found.group(0) == matrix.render_status(), "regenerate it with: python tools/support_matrix.py --write"


def test_the_status_table_flips_with_the_supported_series_and_a_refusing_breakage(monkeypatch) -> None:
    from vendor_graph.upstream import breakages as upstream
    from vendor_graph.upstream import compat

    refusing = upstream.Breakage("maca-backend", ("maca",), "0.18", "0.18", (upstream.POST_350,),
                                 "lmdeploy 0.18.0's MacaOpsBackend breaks", refuses=True)
    monkeypatch.setitem(compat.SUPPORTED_SERIES, "maca", ("0.16", "0.17"))
    monkeypatch.setattr(upstream, "BREAKAGES", (*upstream.BREAKAGES, refusing))
    row = next(r for r in matrix.status_rows() if r.startswith("| 0.18.x |"))
    assert row.split(" | ")[3].startswith("**refused**: lmdeploy 0.18.0's MacaOpsBackend breaks")
    assert any("| maca | " in r and "**refused**" in r for r in matrix.lmdeploy_rows() if r.startswith("| 0.18.x"))
    monkeypatch.setitem(compat.SUPPORTED_SERIES, "maca", ("0.16", "0.17", "0.18"))
    monkeypatch.setattr(upstream, "BREAKAGES", tuple(b for b in upstream.BREAKAGES if b is not refusing))
    row = next(r for r in matrix.status_rows() if r.startswith("| 0.18.x |"))
    assert row.split(" | ")[3].startswith("yes")


def test_the_matrix_lists_every_supported_series_and_what_runs_it() -> None:
    from vendor_graph.upstream.compat import SUPPORTED_SERIES

    rows = "\n".join(matrix.lmdeploy_rows())
    for vendor in ("ascend", "camb", "maca"):
        for series in SUPPORTED_SERIES[vendor]:
            assert f"| {series}.x | {vendor} |" in rows
    assert "| 0.18.x | ascend | dlinfer's GitHub main from source, or dlinfer-ascend 0.2.7 (PyPI, aarch64 only); " \
           "runs with: post-#350 |" in rows
    for vendor in ("camb", "maca"):  # breakage 2 bridged for them too
        assert (f"| 0.18.x | {vendor} | no distribution: build dlinfer from source (`DEVICE={vendor}`); runs with: "
                f"0.2.7, a50184e-era, post-#350 |") in rows


def _workflow_pairs() -> list[dict[str, str]]:
    rows = re.findall(r"^\s*- \{(generation: .*)\}\s*$", WORKFLOW.read_text(), re.M)
    return [dict((k.strip(), v.strip().strip('"')) for k, v in (item.split(":", 1) for item in row.split(",")))
            for row in rows]


def test_the_hardware_matrix_runs_exactly_the_documented_pairs() -> None:
    from vendor_graph.vendors.ascend.releases import generation_of

    documented = [{"generation": generation_of(p.torch_npu), "cann": p.cann, "torch_npu": p.torch_npu,
                   "torch": p.torch} for p in matrix.PAIRS]
    assert _workflow_pairs() == documented


def test_every_generation_has_a_pair_and_each_torch_is_the_pinned_one() -> None:
    from vendor_graph.vendors.ascend.releases import GENERATIONS, generation_of

    assert {generation_of(p.torch_npu) for p in matrix.PAIRS} == set(GENERATIONS)
    for pair in matrix.PAIRS:
        manifest = json.loads((MANIFESTS / f"torch_npu-{pair.torch_npu}.json").read_text())
        pins = " ".join(manifest["wheel"]["requires_dist"])
        assert re.search(rf"torch\s*\(?==\s*{re.escape(pair.torch)}(\+cpu|\.\*)?\b", pins), (pair, pins)
