"""The torch_npu API contract: vendor_graph's own torch_npu uses against every release's manifest.

``tools/npu_contract.py`` scans ``vendor_graph`` (outside ``testing/``) for every ``torch.npu`` /
``torch_npu`` attribute, method, keyword and argument count, and checks each use against the
manifests of the releases its guard lets it run on. These tests: the real source passes; planted
uses that one generation lacks fail; the declarations stay in step with the code; and the generation
detector (``seqlen.detect``), fed a ``torch.npu`` built from each manifest, finds that release's
generation.
"""

from __future__ import annotations

import inspect
import re
import shutil
import types
from pathlib import Path
from typing import Any

import pytest
from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]


contract_tool = load_by_path("_vg_npu_contract", ROOT / "tools" / "npu_contract.py")


@pytest.fixture(scope="module")
def contract():
    return contract_tool.Contract()


def test_the_runtime_source_keeps_the_contract_of_every_release(contract) -> None:
    problems = [str(v) for v in contract.violations()]
    assert not problems, "\n".join(problems)


def test_the_scan_sees_the_torch_npu_calls_the_runner_makes(contract) -> None:
    """A scan that silently found nothing would pass everything: pin what it must see."""
    keys = {u.key for u in contract.uses if not u.probe}
    expected = {
        "torch.npu.NPUGraph", "torch.npu.graph", "torch.npu.graph_pool_handle", "torch.npu.current_stream",
        "torch.npu.Event", "torch.npu.ExternalEvent", "torch.npu.Stream", "torch.npu.stream",
        "torch.npu.graph_task_group_begin", "torch.npu.graph_task_group_end",
        "torch.npu.graph_task_update_begin", "torch.npu.graph_task_update_end",
        "NPUGraph.update", "NPUGraph.replay", "ExternalEvent.wait", "ExternalEvent.reset", "ExternalEvent.record",
        "Event.record", "Stream.wait_event",
    }
    assert expected <= keys, f"the scan no longer sees {sorted(expected - keys)}"
    graph = next(u for u in contract.uses if u.key == "torch.npu.graph" and not u.probe)
    assert {"pool", "stream", "auto_dispatch_capture"} <= set(graph.keywords), graph.keywords
    update = next(u for u in contract.uses if u.key == "NPUGraph.update" and not u.probe)
    assert update.keywords == ("cpu_update_input",)


def test_guards_limit_each_use_to_the_releases_where_it_can_run(contract) -> None:
    manifests = contract.manifests
    g0 = {v for v in manifests if not manifests[v]["graph_api"]["present"]}
    no_update = {v for v in manifests if not manifests[v]["update"]["present"]}
    assert g0 and no_update > g0
    by_key = {u.key: u for u in contract.uses if not u.probe and not u.hasattr_guarded}
    assert set(contract.runs_on(by_key["torch.npu.NPUGraph"])) == set(manifests) - g0
    assert set(contract.runs_on(by_key["NPUGraph.update"])) == set(manifests) - no_update
    assert set(contract.runs_on(by_key["NPUGraph.replay"])) == set(manifests) - g0
    assert set(contract.runs_on(by_key["torch.npu.Event"])) == set(manifests)
    graph = by_key["torch.npu.graph"]
    auto = set(contract.runs_on(graph, dict(graph.keyword_guards)["auto_dispatch_capture"]))
    assert auto == {v for v in manifests if manifests[v]["auto_dispatch_capture"]["present"]}


def test_declarations_match_the_source(contract) -> None:
    assert contract.stale() == []
    assert contract.scanner.unclassified == [], (
        "identifiers that look like torch_npu holders; declare each in MODULE_HOLDERS or NOT_HOLDERS of "
        "tools/npu_contract.py: " + ", ".join(contract.scanner.unclassified))


def test_every_release_in_the_version_table_has_a_manifest(contract) -> None:
    av = load_by_path("_vg_contract_av", ROOT / "vendor_graph" / "vendors" / "ascend" / "releases.py")
    from_manifest = {r.version for r in av.RELEASES if r.source == "manifest"} if hasattr(av, "RELEASES") else None
    if from_manifest is None:
        from_manifest = {v for v in contract.manifests if av.generation_of(v)}
    assert from_manifest <= set(contract.manifests)
    assert len(contract.manifests) >= 40


# -- planted uses: the contract must fail on them ---------------------------------------------------

def _planted(tmp_path: Path, file: str, old: str, new: str) -> Any:
    """A copy of the source with the one line holding ``old`` rewritten: ``old`` replaced by ``new``,
    whose further lines (``\n``-separated) take that line's indentation."""
    source = tmp_path / "vendor_graph"
    shutil.copytree(ROOT / "vendor_graph", source, ignore=shutil.ignore_patterns("__pycache__"))
    path = source / file
    lines = path.read_text().splitlines(keepends=True)
    sites = [i for i, line in enumerate(lines) if old in line]
    assert len(sites) == 1, f"the plant site moved: {old!r} is on {len(sites)} lines of {file}"
    line = lines[sites[0]]
    indent = line[: len(line) - len(line.lstrip())]
    lines[sites[0]] = line.replace(old, new.replace("\n", "\n" + indent))
    path.write_text("".join(lines))
    return contract_tool.Contract(source=source, root=tmp_path)


def _reported(contract, fragment: str) -> list[str]:
    return [str(v) for v in contract.violations() if fragment in str(v)]


def test_a_keyword_one_generation_lacks_fails_the_contract(tmp_path: Path) -> None:
    """``auto_dispatch_capture=`` passed without its capability test: G1 releases (graph() without
    that parameter) must be reported, the releases that have it must not."""
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "npu.graph(npu_graph, **graph_kwargs)",
                       "npu.graph(npu_graph, auto_dispatch_capture=False, **graph_kwargs)")
    found = _reported(planted, "torch.npu.graph(auto_dispatch_capture=)")
    assert found, [str(v) for v in planted.violations()]
    lacking = set(re.findall(r"\d+\.\d+\.\d+(?:\.?(?:post|rc)\d+)?", found[0].split("missing")[1]))
    assert {"2.1.0.post12", "2.5.1", "2.6.0rc1"} <= lacking and "2.6.0" not in lacking, found[0]


def test_a_method_one_generation_lacks_fails_the_contract(tmp_path: Path) -> None:
    """``NPUGraph.debug_dump`` exists only from G3a on: an unguarded call must fail, through the
    ``graph.graph`` alias the runner keeps its graphs under."""
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "graph.graph.replay()",
                       "graph.graph.replay()\ngraph.graph.debug_dump('/tmp/x')")
    assert _reported(planted, "NPUGraph.debug_dump is missing from torch_npu 2.1.0.post12")


def test_a_module_function_reached_through_a_local_alias_fails_the_contract(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "npu.graph_task_update_end(stream)",
                       "alias = self._npu\nalias.super_kernel_scope_begin()\nnpu.graph_task_update_end(stream)")
    assert _reported(planted, "torch.npu.super_kernel_scope_begin is missing")


def test_too_many_positional_arguments_fail_the_contract(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/hook.py", "npu.graph_task_group_begin(self.stream)",
                       "npu.graph_task_group_begin(self.stream, 0)")
    assert _reported(planted, "2 positional arguments, takes 1")


def test_a_hasattr_guard_makes_the_same_call_pass(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "graph.graph.replay()",
                       "graph.graph.replay()\nif hasattr(graph.graph, 'debug_dump'):\n"
                       "    graph.graph.debug_dump('/tmp/x')")
    assert planted.violations() == []


def test_a_negated_capability_test_is_no_guard(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "graph.graph.replay()",
                       "graph.graph.replay()\nif not self._caps.facts.get('debug_dump'):\n"
                       "    graph.graph.debug_dump('/tmp/x')")
    assert _reported(planted, "NPUGraph.debug_dump is missing")


def test_a_capability_test_in_place_guards_the_call(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "graph.graph.replay()",
                       "graph.graph.replay()\nif self._caps.facts.get('debug_dump') and graph.tasks:\n"
                       "    graph.graph.debug_dump('/tmp/x')")
    assert planted.violations() == []


def test_removing_a_declared_capability_test_is_reported(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/runner.py", "if not caps.facts.get(\"graph_api\"):", "if False:")
    assert any("no longer tests" in p and "graph_api" in p for p in planted.stale()), planted.stale()


def test_an_untracked_holder_of_torch_npu_is_reported(tmp_path: Path) -> None:
    planted = _planted(tmp_path, "vendors/ascend/seqlen.py", "def forced_path() -> str | None:",
                       "def use(my_npu):\n    return my_npu.anything()\n\n\ndef forced_path() -> str | None:")
    assert any("my_npu" in u for u in planted.scanner.unclassified), planted.scanner.unclassified


# -- the generation detector against the manifests ----------------------------------------------


def _function(name: str, params: list[dict[str, Any]]):
    parts, star = [], False
    for p in params:
        if p["kind"] == "var_positional":
            parts.append(f"*{p['name']}")
            star = True
        elif p["kind"] == "var_keyword":
            parts.append(f"**{p['name']}")
        elif p["kind"] == "keyword_only" and not star:
            parts.extend(["*", f"{p['name']}=None"])
            star = True
        else:
            parts.append(f"{p['name']}=None" if "default" in p else p["name"])
    namespace: dict[str, Any] = {}
    exec(f"def {name}({', '.join(parts)}):\n    raise AssertionError('stand-in only')", namespace)  # noqa: S102
    return namespace[name]


def fake_npu(manifest: dict[str, Any]) -> types.ModuleType:
    """A ``torch.npu`` with exactly the names, methods and signatures the manifest records."""
    module = types.ModuleType("torch.npu")
    classes = {**manifest["streams"]["classes"], **manifest["graph_api"]["classes"]}
    functions = {**manifest["graph_api"].get("functions", {}), **manifest["task_group_api"].get("functions", {})}
    for name in manifest["npu_exports"]:
        if name in classes:
            body = {m: _function(m, spec["params"]) for m, spec in classes[name]["methods"].items()
                    if m not in ("__new__", "__repr__", "__eq__", "__hash__")}
            setattr(module, name, type(name, (), body))
        elif name in functions:
            setattr(module, name, _function(name, functions[name]["params"]))
        else:
            setattr(module, name, object())
    return module


def test_the_detector_finds_each_manifests_generation_from_the_module_alone(contract) -> None:
    from vendor_graph.vendors.ascend import releases, seqlen

    wrong = []
    for version, manifest in contract.manifests.items():
        npu = fake_npu(manifest)
        probed = seqlen.probe_facts(npu)
        facts = contract.facts[version]
        mismatched = {k: (probed[k], facts[k]) for k in probed if probed[k] != facts[k]}
        table = releases.generation_of(version)
        with_version = seqlen.detect(npu, version)
        if mismatched or with_version.generation != table or with_version.source != "table":
            wrong.append(f"{version}: probe {mismatched}, detect -> {with_version.generation} "
                         f"({with_version.source}), table {table}")
            continue
        # No version at all: the probe alone must land on a generation with this release's probed features.
        blind = seqlen.detect(npu, None)
        blind_facts = releases.GENERATION_FACTS.get(blind.generation or "", {})
        if any(blind_facts.get(k) != probed[k] for k in probed):
            wrong.append(f"{version}: detect(None) -> {blind.generation}, features {probed}")
    assert not wrong, "\n".join(wrong)


def test_the_probe_outranks_a_wrong_version_string(contract) -> None:
    """A G5 module reported as a G0 version: detect must trust the module, and say so."""
    from vendor_graph.vendors.ascend import seqlen

    newest = contract.manifests["2.9.1"]
    caps = seqlen.detect(fake_npu(newest), "2.4.0")
    assert caps.source.startswith("probe"), caps
    assert caps.facts["graph_api"] and caps.facts["update"]


def test_fake_module_signatures_are_what_the_probe_reads(contract) -> None:
    npu = fake_npu(contract.manifests["2.6.0"])
    params = inspect.signature(npu.graph.__init__).parameters
    assert "auto_dispatch_capture" in params
    assert not hasattr(fake_npu(contract.manifests["2.5.1"]).NPUGraph, "update")
