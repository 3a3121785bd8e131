"""The support tables (lmdeploy x dlinfer x torch_npu x CANN x torch), generated from the facts the code holds,
and how each cell was verified: README's short status grid and its upstream breakages, and the full matrix
in docs/support.md.

Sources, one each: the lmdeploy series are ``vendor_graph.upstream.compat.SUPPORTED_SERIES``; the upstream breakages
(and any refusal) are ``vendor_graph.upstream.breakages.BREAKAGES``; torch_npu generations and seq-len paths are
``vendor_graph.vendors.ascend.releases`` and ``vendor_graph.vendors.ascend.seqlen``; the minimum torch is
``[tool.vendor_graph] min-torch`` in pyproject.toml. This file holds the rest: the (CANN, torch_npu, torch) pairs
(also the matrix of ``.github/workflows/ascend-torch-npu-matrix.yml``, which a test keeps equal).
``python tools/support_matrix.py`` prints both blocks; ``--write`` rewrites them between their markers.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SUPPORT = ROOT / "docs" / "support.md"
BEGIN = "<!-- BEGIN support-matrix (generated: python tools/support_matrix.py --write) -->"
END = "<!-- END support-matrix -->"
STATUS_BEGIN = "<!-- BEGIN support-status (generated: python tools/support_matrix.py --write) -->"
STATUS_END = "<!-- END support-status -->"
VENDORS = ("ascend", "camb", "maca")


class Pair(NamedTuple):
    torch_npu: str
    cann: str
    torch: str
    cann_source: str  # "torch_npu table" (Ascend/pytorch README, "Ascend Auxiliary Software") or "assumed"


# One per generation, plus the torch 2.1 line. CANN for G0..G3a: torch_npu's own compatibility table,
# which stops at CANN 8.5.0; later trains' CANN is an assumption to confirm before the first hardware run.
PAIRS: tuple[Pair, ...] = (
    Pair("2.4.0", "8.0.RC3", "2.4.0", "torch_npu table"),
    Pair("2.1.0.post10", "8.0.0", "2.1.0", "torch_npu table"),
    Pair("2.1.0.post12", "8.1.RC1", "2.1.0", "torch_npu table"),
    Pair("2.5.1", "8.1.RC1", "2.5.1", "torch_npu table"),
    Pair("2.1.0.post13", "8.2.RC1", "2.1.0", "torch_npu table"),
    Pair("2.6.0", "8.2.RC1", "2.6.0", "torch_npu table"),
    Pair("2.8.0", "8.3.RC1", "2.8.0", "torch_npu table"),
    Pair("2.6.0.post3", "8.3.RC1", "2.6.0", "torch_npu table"),
    Pair("2.8.0.post2", "8.5.0", "2.8.0", "torch_npu table"),
    Pair("2.9.0", "8.5.0", "2.9.0", "torch_npu table"),
    Pair("2.9.0.post2", "9.0.0", "2.9.0", "assumed"),
    Pair("2.9.0.post8", "9.0.0", "2.9.0", "assumed"),
    Pair("2.9.0.post9", "9.0.0", "2.9.0", "assumed"),
)

WHERE_TO_GET = {
    "ascend": "dlinfer's GitHub main from source, or dlinfer-ascend 0.2.7 (PyPI, aarch64 only)",
    "camb": "no distribution: build dlinfer from source (`DEVICE=camb`)",
    "maca": "no distribution: build dlinfer from source (`DEVICE=maca`)",
}
SHOWN = {"ascend": "Ascend", "camb": "Camb", "maca": "MACA"}
NEWEST = "0.18"  # the lmdeploy series whose CI leg also runs post-#350 dlinfer (tests/realstack/test_dlinfer_pr350.py)


def simulated(series: str) -> str:
    over = "a50184e, and post-#350: PR #350's files laid over it" if series == NEWEST else "a50184e"
    return (f"CI here ({series}.0): lmdeploy's real classes and, for Ascend, its engine and pipeline over the real "
            f"dlinfer ({over}), on the CPU simulator")


NEVER = "hardware: never run"


def min_torch() -> str:
    text = (ROOT / "pyproject.toml").read_text()
    section = re.search(r"^\[tool\.vendor_graph\]\n(.*?)(?=^\[)", text, re.M | re.S)
    found = re.search(r'^min-torch\s*=\s*"([^"]+)"', section.group(1) if section else "", re.M)
    if not found:
        raise SystemExit("pyproject.toml lacks [tool.vendor_graph] min-torch")
    return found.group(1)


def ci_torch() -> str:
    """The torch scripts/setup-env.sh installs for the main CI legs."""
    found = re.search(r"installed torch (\S+) \|\|", (ROOT / "scripts" / "setup-env.sh").read_text())
    if not found:
        raise SystemExit("scripts/setup-env.sh no longer pins torch as `installed torch X || ...`")
    return found.group(1)


def _first_clause(text: str) -> str:
    return text.split(" (")[0].split(", which")[0]


def _all_series() -> list[str]:
    from vendor_graph.upstream.breakages import refused_series, series_key
    from vendor_graph.upstream.compat import SUPPORTED_SERIES

    return sorted({s for v in VENDORS for s in SUPPORTED_SERIES[v]} | refused_series(), key=series_key)


def _number(breakage) -> int:
    from vendor_graph.upstream.breakages import BREAKAGES

    return BREAKAGES.index(breakage) + 1


def lmdeploy_rows() -> list[str]:
    from vendor_graph.upstream import breakages as upstream
    from vendor_graph.upstream.compat import SUPPORTED_SERIES

    rows = ["| lmdeploy | vendor | dlinfer | vendor_graph | verified |", "|---|---|---|---|---|"]
    for s in _all_series():
        for vendor in VENDORS:
            refused = upstream.refusal(vendor, s)
            if s in SUPPORTED_SERIES[vendor]:
                status = "supported"
                verified = f"{simulated(s)}; {NEVER}"
                runs = upstream.dlinfers_that_run(vendor, s)
                if runs:
                    dlinfer = f"{WHERE_TO_GET[vendor]}; runs with: {', '.join(runs)}"
                else:
                    dlinfer = "**no dlinfer works**: " + "; ".join(
                        f"{b.what} (breakage {_number(b)})" for b in upstream.blocking(vendor, s))
                    verified = f"{simulated(s)}; hardware: blocked upstream, never run"
            elif refused is not None:
                status = f"**refused**: {_first_clause(refused.what)}"
                verified = f"CI here: the refusal ({s}.0)"
                dlinfer = WHERE_TO_GET[vendor]
            else:
                continue
            rows.append(f"| {s}.x | {vendor} | {dlinfer} | {status} | {verified} |")
    return rows


def status_rows() -> list[str]:
    """README's grid: per lmdeploy series and vendor, whether vendor_graph supports it, with the numbers of the
    upstream breakages (the table under the grid) that apply."""
    from vendor_graph.upstream import breakages as upstream
    from vendor_graph.upstream.compat import SUPPORTED_SERIES

    rows = ["| lmdeploy | " + " | ".join(VENDORS) + " |", "|---" * (len(VENDORS) + 1) + "|"]
    for s in _all_series():
        cells = []
        for vendor in VENDORS:
            refused = upstream.refusal(vendor, s)
            if s in SUPPORTED_SERIES[vendor]:
                cell = "yes"
            elif refused is not None:
                cell = f"**refused**: {_first_clause(refused.what)}"
            else:
                cell = "no"
            notes = [str(_number(b)) for b in upstream.applying(vendor, s)]
            cells.append(cell + (f" ({', '.join(notes)})" if notes else ""))
        rows.append(f"| {s}.x | " + " | ".join(cells) + " |")
    return rows


def breakage_rows() -> list[str]:
    """The upstream breakages, one row each: vendors, lmdeploy series, the dlinfer generations that have it, what
    breaks, and what vendor_graph does about it."""
    from vendor_graph.upstream import breakages as upstream

    rows = ["| # | vendors | lmdeploy | dlinfer with it | what breaks | vendor_graph |", "|---|---|---|---|---|---|"]
    for n, b in enumerate(upstream.BREAKAGES, 1):
        if b.bridge:
            doing = f"**bridged** on {', '.join(SHOWN[v] for v in b.bridged_on)}: {b.does}"
        elif b.refuses:
            doing = f"**refuses** the series{': ' + b.does if b.does else ''}"
        else:
            doing = b.does or ("no bridge: the engine cannot run" if b.blocks else "nothing to bridge")
        rows.append(f"| {n} | {', '.join(SHOWN[v] for v in b.vendors)} | {b.span()} | "
                    f"{', '.join(b.dlinfers)} | {b.what} | {doing} |")
    return rows


def dlinfer_lines() -> list[str]:
    from vendor_graph.upstream import breakages as upstream

    return ["dlinfer generations (recognised by what their modules contain; `vendor-graph doctor` names the one "
            "found): " + "; ".join(f"{key}: {text}" for key, text in upstream.DLINFERS.items()) + "."]


def torch_npu_rows() -> list[str]:
    from vendor_graph.vendors.ascend.releases import GENERATION_FACTS, generation_of
    from vendor_graph.vendors.ascend.seqlen import FIA, path_for

    rows = ["| torch_npu | generation | CANN | torch | FIA `.default` seq-len path | verified |",
            "|---|---|---|---|---|---|"]
    for pair in PAIRS:
        generation = generation_of(pair.torch_npu)
        cann = pair.cann if pair.cann_source != "assumed" else f"{pair.cann} (assumed)"
        path = path_for(GENERATION_FACTS[generation], FIA)
        rows.append(f"| {pair.torch_npu} | {generation} | {cann} | {pair.torch} | {path} | CI here: API contract "
                    f"against the wheel's manifest, simulated {generation}; {NEVER} |")
    return rows


def prerelease_rows() -> list[str]:
    """Every torch_npu pre-release on PyPI: its generation as its own wheel shows it (not its release's), what
    decides that, and its seq-len paths where they differ from the release's."""
    from vendor_graph.vendors.ascend.releases import (
        GENERATION_FACTS,
        GENERATIONS,
        PRERELEASE_DECIDING,
        PRERELEASES,
        preceded_release,
    )
    from vendor_graph.vendors.ascend.seqlen import path_for, seqlen_ops

    def paths(generation: str) -> list[tuple[str, str]]:
        return [(name, path_for(GENERATION_FACTS[generation], op, overload)) for name, op, overload in seqlen_ops()]

    rows = ["| torch_npu pre-release | build date | precedes | generation | what decides it (read from its wheel) "
            "| seq-len paths |", "|---|---|---|---|---|---|"]
    for pre in PRERELEASES:
        release = preceded_release(pre.version)
        mine = paths(pre.generation)
        if release is None:
            precedes, generation = "a release not in the table", pre.generation
            seqlen = "; ".join(f"{name} {path}" for name, path in mine)
            if len({path for _, path in mine}) == 1:
                seqlen = f"{mine[0][1]} for every op"
        else:
            precedes = f"{release.version} ({release.generation})"
            older = GENERATIONS.index(pre.generation) < GENERATIONS.index(release.generation)
            generation = f"**{pre.generation}** (older than {release.version}'s)" if older else pre.generation
            differ = [f"{name} {path} ({release.version}: {theirs})"
                      for (name, path), (_, theirs) in zip(mine, paths(release.generation), strict=True)
                      if path != theirs]
            seqlen = "; ".join(differ) if differ else f"as {release.version}'s"
        rows.append(f"| {pre.version} | {pre.build_date} | {precedes} | {generation} | "
                    f"{'; '.join(PRERELEASE_DECIDING[pre.version])} | {seqlen} |")
    return rows


def torch_rows() -> list[str]:
    return [
        "| torch | what runs | verified |",
        "|---|---|---|",
        f"| {min_torch()} (declared minimum) | runtime modules' unit and lmdeploy-class tests with lmdeploy 0.16.0 "
        f"(not the simulator, which needs a current torch) | CI here: oldest-torch leg |",
        f"| {ci_torch()} (CPU) | everything, simulator included, lmdeploy 0.16.0 / 0.17.0 / 0.18.0 | CI here |",
        "| the torch each torch_npu above pins | the pairs above | never run |",
        "| torch_mlu's / MACA's torch builds | Camb, MACA | never run |",
    ]


def render() -> str:
    """docs/support.md's block."""
    return "\n".join([
        BEGIN,
        *lmdeploy_rows(),
        "",
        *torch_npu_rows(),
        "",
        *prerelease_rows(),
        "",
        *torch_rows(),
        END,
    ])


def render_status() -> str:
    """README's block."""
    return "\n".join([STATUS_BEGIN, *status_rows(), "", *breakage_rows(), "", *dlinfer_lines(), STATUS_END])


def _replace(path: Path, begin: str, end: str, block: str) -> bool:
    text = path.read_text()
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{path} has no {begin} ... {end} markers")
    new = pattern.sub(lambda _: block, text)
    if new != text:
        path.write_text(new)
    return new != text


def write() -> dict[str, bool]:
    """Rewrite both blocks in place; which files changed."""
    return {"README.md": _replace(README, STATUS_BEGIN, STATUS_END, render_status()),
            "docs/support.md": _replace(SUPPORT, BEGIN, END, render())}


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    if "--write" in sys.argv[1:]:
        for name, changed in write().items():
            print(f"{name} " + ("updated" if changed else "unchanged"))
    else:
        print(render_status() + "\n\n" + render())
