"""One table of upstream breakages (``vendor_graph.upstream.breakages.BREAKAGES``): ``vendor-graph doctor``,
``tools/support_matrix.py`` (docs/support.md) and the README's status grid read it, and they agree for every
lmdeploy series and vendor; none of them keeps a breakage of its own."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from load_by_path import load_by_path

from vendor_graph.install import bridges
from vendor_graph.ops import doctor
from vendor_graph.upstream import breakages as upstream
from vendor_graph.upstream import compat

ROOT = Path(__file__).resolve().parents[2]
matrix = load_by_path("_vg_support_matrix", ROOT / "tools" / "support_matrix.py")
SERIES = ("0.16", "0.17", "0.18")


def _readme_grid() -> dict[tuple[str, str], list[int]]:
    text = (ROOT / "README.md").read_text()
    block = text[text.index(matrix.STATUS_BEGIN):text.index(matrix.STATUS_END)]
    grid = {}
    for row in re.findall(r"^\| (\d+\.\d+)\.x \| (.*) \|$", block, re.M):
        for vendor, cell in zip(upstream.VENDORS, row[1].split(" | "), strict=True):
            found = re.search(r"\(([\d, ]+)\)$", cell)
            grid[(row[0], vendor)] = [int(n) for n in found.group(1).split(", ")] if found else []
    return grid


def _readme_rows() -> dict[int, str]:
    text = (ROOT / "README.md").read_text()
    return {int(n): row for n, row in re.findall(r"^\| (\d+) \| (.*)$", text, re.M)}


def _doctor(series: str, vendor: str) -> list[str]:
    return [text for text, _ in doctor._upstream_notes(series, vendor, None, on_device=False)]


@pytest.mark.parametrize("series", SERIES)
@pytest.mark.parametrize("vendor", upstream.VENDORS)
def test_doctor_the_readme_and_the_support_matrix_name_the_same_breakages(series, vendor):
    expected = upstream.applying(vendor, series)
    numbers = [upstream.BREAKAGES.index(b) + 1 for b in expected]
    assert _readme_grid()[(series, vendor)] == numbers, "regenerate: python tools/support_matrix.py --write"
    rows = _readme_rows()
    notes = _doctor(series, vendor)
    assert len(notes) == len(expected), notes
    for n, breakage in zip(numbers, expected, strict=True):
        assert breakage.what in rows[n] and breakage.span() in rows[n]
        assert sum(breakage.what.replace("`", "") in note for note in notes) == 1, (breakage.name, notes)
        assert any(breakage.what in row for row in matrix.breakage_rows())


def test_a_new_entry_reaches_doctor_the_grid_and_the_refusal(monkeypatch):
    refusing = upstream.Breakage("maca-backend", ("maca",), "0.18", "0.18", (upstream.POST_350,),
                                 "lmdeploy 0.18.0's MacaOpsBackend breaks", refuses=True)
    monkeypatch.setattr(upstream, "BREAKAGES", (*upstream.BREAKAGES, refusing))
    monkeypatch.setitem(compat.SUPPORTED_SERIES, "maca", ("0.16", "0.17"))
    assert any("MacaOpsBackend breaks" in note for note in _doctor("0.18", "maca"))
    assert not any("MacaOpsBackend breaks" in note for note in _doctor("0.18", "camb"))
    assert str(len(upstream.BREAKAGES)) in next(r for r in matrix.status_rows() if r.startswith("| 0.18.x |"))
    from packaging.version import Version

    with pytest.raises(compat.UnsupportedLmdeploy, match="0.18.0: lmdeploy 0.18.0's MacaOpsBackend breaks"):
        compat.check_lmdeploy_supported("maca", Version("0.18.0"))


BREAKAGE_FACTS = ("actual_seq_lengths_cpu", "is_mla", "allocate_caches", "state_specs", "dlinfer.vendor.ascend.version",
                  "head_size_v", "MacaOpsBackend")


@pytest.mark.parametrize("path", [
    "vendor_graph/ops/doctor.py", "tools/support_matrix.py", "vendor_graph/upstream/compat.py"])
def test_no_reader_keeps_a_breakage_of_its_own(path):
    """The readers render the table; a breakage written into one of them (as doctor's free text was) fails."""
    strings = [node.value for node in ast.walk(ast.parse((ROOT / path).read_text()))
               if isinstance(node, ast.Constant) and isinstance(node.value, str)]
    assert not [s for s in strings if any(fact in s for fact in BREAKAGE_FACTS)]


def test_every_bridge_answers_an_entry_and_every_entry_names_real_things():
    named = {b.bridge for b in upstream.BREAKAGES if b.bridge}
    assert set(bridges.NAMES) <= named and named <= {*bridges.NAMES, "runner"}
    for breakage in upstream.BREAKAGES:
        assert set(breakage.dlinfers) <= set(upstream.DLINFERS) and set(breakage.vendors) <= set(upstream.VENDORS)
        assert set(breakage.bridged_on) <= set(breakage.vendors) and bool(breakage.bridge) == bool(breakage.bridged_on)
        assert not breakage.refuses or breakage.since == breakage.until, "a refusal names one series"
    assert len({b.name for b in upstream.BREAKAGES}) == len(upstream.BREAKAGES)


def test_which_dlinfer_runs_each_series():
    assert upstream.dlinfers_that_run("ascend", "0.16") == [upstream.A50184E_ERA]  # post-#350: 0.16's mask
    assert upstream.dlinfers_that_run("ascend", "0.17") == [upstream.POST_350]
    assert upstream.dlinfers_that_run("ascend", "0.18") == [upstream.POST_350]
    # breakage 2 bridged for all three: Camb and MACA run on 0.18 with every dlinfer (their MLA limits block nothing)
    every = [upstream.PYPI_027, upstream.A50184E_ERA, upstream.POST_350]
    assert upstream.dlinfers_that_run("camb", "0.18") == upstream.dlinfers_that_run("maca", "0.18") == every


def test_doctor_flags_a_breakage_only_where_it_stops_this_dlinfer_on_a_device():
    class Here:
        name = upstream.A50184E_ERA

    flagged = [t for t, problem in doctor._upstream_notes("0.18", "ascend", Here, on_device=True) if problem]
    assert len(flagged) == 1 and "dlinfer.vendor.ascend.version" in flagged[0], flagged
    assert not any(p for _, p in doctor._upstream_notes("0.18", "ascend", Here, on_device=False))
    Here.name = upstream.POST_350
    assert not any(p for _, p in doctor._upstream_notes("0.18", "ascend", Here, on_device=True))
