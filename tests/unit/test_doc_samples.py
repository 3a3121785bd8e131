"""What the documents show is what the code and the saved results say: each command sample is what its command
prints (tools/samples.py), the H200 and CPU figures come from benchmarks/results, no document holds a path of
this machine, and every relative link resolves."""

from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import default_demo
import pytest
from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


samples = load_by_path("_vg_samples", ROOT / "tools" / "samples.py")
_WHY = samples.documented_environment()
# The samples show the demo's environment: once per test run, in the newest lmdeploy's leg.
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"{_WHY}: runs once per test run, in that leg")

DOCUMENTS = sorted({ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "sim" / "README.md",
                    *(ROOT / "docs").rglob("*.md")})
LINKED = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("sample", samples.SAMPLES, ids=[s.name for s in samples.SAMPLES])
def test_the_sample_is_what_its_command_prints(sample) -> None:
    fresh = None
    if sample.name == default_demo.SAMPLE.name:  # the engine demo's one run of this test process
        why = default_demo.dlinfer_missing()
        if why:
            pytest.skip(why)
        demo = default_demo.run()
        fresh = samples.Run(demo.status, demo.output)
    problem = samples.check(sample, fresh)
    assert problem is None, (f"sample {sample.name!r} in {sample.document} is stale; regenerate it with "
                             f"`python tools/samples.py --write {sample.name}`:\n{problem}")


def test_the_normaliser_hides_times_and_paths_and_nothing_else(monkeypatch, tmp_path) -> None:
    _, output = samples.stored(samples.BY_NAME["demo"])
    retimed = re.sub(r"\d+\.\d s\b", "123.4 s", output)
    retimed = re.sub(r"(%\s+)\d\.\d{3}", r"\g<1>9.999", retimed)
    assert retimed != output and samples.comparable(retimed) == samples.comparable(output)
    for old, new in ((": yes", ": NO"), ("lmdeploy 0.18.0", "lmdeploy 0.18.1"), ("65 replays", "64 replays"),
                     ("graph-update", "task-update"), ("148 tokens", "147 tokens"), ("18.8%", "18.9%"),
                     ("1: 23", "1: 22")):
        assert old in output, old
        assert samples.comparable(output.replace(old, new, 1)) != samples.comparable(output), old
    line = f"hook: {ROOT}/x.pth, {samples.tempfile.gettempdir()}/tmpab12/s.json, {Path.home()}/.cache/vg  \n"
    assert samples.present(line) == "hook: <repo>/x.pth, <tmp>/s.json, ~/.cache/vg\n"
    monkeypatch.setenv(samples.DLINFER_ENV, str(tmp_path / "dlinfer-src"))
    assert samples.present(f"dlinfer source checkout {tmp_path}/dlinfer-src\n") == (
        f"dlinfer source checkout ${samples.DLINFER_ENV}\n")


def test_every_sample_in_the_documents_is_registered() -> None:
    assert samples.unregistered() == []


def test_the_fitted_sizes_shown_are_the_plan_the_h200_run_applied() -> None:
    sample = samples.BY_NAME["plan-from-stats"]
    _, output = samples.stored(sample)
    plan = json.loads((ROOT / samples.FROM_STATS / "plan.json").read_text())
    shown = [int(line.split()[0]) for line in output.splitlines() if re.match(r"\d+\s+\d+(-\d+)?\s+\d+", line)]
    assert shown == plan["capture_sizes"]
    assert (f"before {plan['padded_tokens_before']:.0f} ({plan['padded_fraction_before']:.1%}" in output
            and f"after {plan['padded_tokens_after']:.0f} ({plan['padded_fraction_after']:.1%})" in output)


# -- no machine's paths, no dead links ----------------------------------------------------------------------

MACHINE_PATH = re.compile(r"/work/|/root/|/home/|/tmp/[\w.-]|/Users/|[A-Za-z]:\\")


def test_no_document_holds_an_absolute_path_of_a_machine() -> None:
    found = [f"{doc.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for doc in DOCUMENTS
             for n, line in enumerate(doc.read_text().splitlines(), 1) if MACHINE_PATH.search(line)]
    assert not found, "absolute paths (write them relative to the clone, or as ~ / $TMPDIR):\n" + "\n".join(found)


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_relative_link_resolves() -> None:
    dead = []
    for doc in LINKED:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists():
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                dead.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not dead, "\n".join(dead)


def test_the_demo_options_listed_are_the_demos() -> None:
    from vendor_graph.ops.cli import build_parser
    from vendor_graph.vendors.ascend.releases import GENERATIONS

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    flags = [o for a in sub.choices["demo"]._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    for doc in (ROOT / "README.md", ROOT / "docs" / "verification.md"):
        text = doc.read_text()
        assert [f for f in flags if f"`{f}" not in text] == [], doc.name
        assert ", ".join(GENERATIONS) in text, f"{doc.name} lists the generations as {', '.join(GENERATIONS)}"


# -- benchmark figures against the saved results ------------------------------------------------------------

NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?")


def _report_scripts() -> tuple[Any, Any]:
    return (load_by_path("_vg_report_h200", ROOT / "benchmarks" / "report_h200.py"),
            load_by_path("_vg_report_capacity", ROOT / "benchmarks" / "report_capacity.py"))


def _h200_reports() -> str:
    """The H200 reports as the report scripts render them from the saved raw results."""
    h200, capacity = _report_scripts()
    parts = [h200.markdown(h200.summarise(RESULTS / folder)) for folder in ("h200", "h200_part3_2026-12-01")]
    for folder in ("capacity_h200", "capacity_refit_h200"):
        parts.append("\n".join(capacity.markdown(capacity.report(RESULTS / folder))))
    parts += [p.read_text() for p in sorted((RESULTS / "graph_leaks").glob("*"))]  # the leak runs' own output
    return "\n".join(parts)


def test_the_h200_reports_regenerate_from_the_saved_results() -> None:
    h200, capacity = _report_scripts()
    summary = h200.summarise(RESULTS / "h200")
    assert h200.markdown(summary) == (RESULTS / "h200" / "summary.md").read_text()
    assert json.dumps(summary, indent=1) + "\n" == (RESULTS / "h200" / "summary.json").read_text()
    for folder, name in (("capacity_h200", "capacity"), ("capacity_refit_h200", "capacity_refit")):
        report = capacity.report(RESULTS / folder)
        assert "\n".join(capacity.markdown(report)) + "\n" == (RESULTS / f"{name}.md").read_text(), name
        assert json.dumps(report, indent=2) + "\n" == (RESULTS / f"{name}.json").read_text(), name


def _quoted(text: str) -> list[tuple[int, str]]:
    """The (line number, line) of table rows and of the lines of plain (untagged) fenced blocks in ``text``."""
    out, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("```"):
            fence = line[3:].strip() if fence is None else None
        elif (line.startswith("|") and not re.fullmatch(r"\|[-:| ]+\|", line)) or fence == "":
            out.append((n, line))
    return out


def _missing(lines: list[tuple[int, str]], source: str) -> list[str]:
    """Lines whose numbers are not in ``source``: each as given, or rounded to the digits it is quoted with."""
    pool = {Decimal(x) for x in NUMBER.findall(source)}
    by_exponent: dict[int, set[Decimal]] = {}

    def found(quoted: str) -> bool:
        exponent = Decimal(quoted).as_tuple().exponent
        if exponent not in by_exponent:
            step = Decimal(1).scaleb(exponent)
            by_exponent[exponent] = {p.quantize(step, rounding=ROUND_HALF_UP) for p in pool}
        return Decimal(quoted) in by_exponent[exponent]

    return [f"line {n}: {', '.join(miss)} not in the results: {line[:100]}" for n, line in lines
            if line not in source and (miss := [q for q in NUMBER.findall(line) if not found(q)])]


def test_the_h200_figures_in_the_documents_are_in_the_saved_results() -> None:
    reports = _h200_reports()
    text = (ROOT / "BENCHMARKS.md").read_text()
    start = text.index("\n## H200")
    offset = text[:start].count("\n")
    missing = [f"BENCHMARKS.md {m}" for m in
               _missing([(n + offset, line) for n, line in _quoted(text[start:])], reports)]
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^<!-- h200 -->\n(.*?)^<!-- /h200 -->$", doc.read_text(), re.M | re.S):
            lines = list(enumerate(block.splitlines(), 1))
            missing += [f"{doc.relative_to(ROOT)} h200 block {m}" for m in _missing(lines, reports)]
    assert not missing, "\n".join(missing)


def test_the_cpu_benchmark_tables_are_in_their_results_files() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    cpu = text[:text.index("\n## H200")]
    results = "\n".join(p.read_text() for p in sorted(RESULTS.glob("*.md")))
    missing = _missing(_quoted(cpu), results)
    assert not missing, "BENCHMARKS.md figures not in benchmarks/results/*.md:\n" + "\n".join(missing)
