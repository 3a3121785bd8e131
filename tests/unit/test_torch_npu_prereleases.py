"""torch_npu's pre-releases on PyPI, each classified from its own wheel.

A pre-release is a snapshot of an earlier release train than the release it precedes: 2.10.0rc2 (built
2026-01-22) is G3a while 2.10.0 (2026-04-29) is G3b, 2.9.0rc1 is G2b while 2.9.0 is G3a. Mapping an rc to its
release, as ``generation_of()`` did, named the wrong generation (and for 2.5.1rc1 … 2.9.0rc1 the wrong seq-len
paths) in ``vendor-graph doctor`` and ``vendor-graph paths``. Offline: everything is read from the committed
manifests (``sim/vendor_graph_sim/data/torch_npu_manifests/``); the PyPI checks are opt-in
(``VENDOR_GRAPH_NETWORK_TESTS=1``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "sim" / "vendor_graph_sim" / "data" / "torch_npu_manifests"
TOOL = ROOT / "tools" / "torch_npu_manifest.py"
MODULE = ROOT / "vendor_graph" / "vendors" / "ascend" / "releases.py"

av = load_by_path("_vg_test_prerelease_versions", MODULE)
tool = load_by_path("_vg_test_prerelease_tool", TOOL)

GRAPH, TASK, NONE = "graph-update", "task-update", "none"
# pre-release -> (generation, wheel build date, the release it precedes (None: not in the table),
#                 seq-len path per op of vendor-graph paths: FIA .default, FIA .out, FIA v2 .out, paged attention,
#                 MLA .out, paged attention MLA)
EXPECTED: dict[str, tuple[str, str, str | None, tuple[str, ...]]] = {
    "2.1.0rc1": ("G0", "2023-10-16", "2.1.0", (NONE,) * 6),
    "2.2.0rc1": ("G0", "2024-02-07", "2.2.0", (NONE,) * 6),
    "2.3.1rc1": ("G0", "2024-06-06", "2.3.1", (NONE,) * 6),
    "2.4.0rc1": ("G0", "2024-08-09", "2.4.0", (NONE,) * 6),
    "2.5.1rc1": ("G0", "2024-11-08", "2.5.1", (NONE,) * 6),
    "2.6.0rc1": ("G1", "2025-04-24", "2.6.0", (TASK,) * 6),
    "2.7.1rc1": ("G2a", "2025-06-10", "2.7.1", (TASK, GRAPH, TASK, TASK, TASK, TASK)),
    "2.8.0rc1": ("G2a", "2025-08-11", "2.8.0", (TASK, GRAPH, TASK, TASK, TASK, TASK)),
    "2.9.0rc1": ("G2b", "2025-10-16", "2.9.0", (GRAPH, GRAPH, TASK, TASK, TASK, TASK)),
    "2.10.0rc1": ("G3a", "2026-01-22", "2.10.0", (GRAPH, GRAPH, GRAPH, GRAPH, GRAPH, TASK)),
    "2.10.0rc2": ("G3a", "2026-01-22", "2.10.0", (GRAPH, GRAPH, GRAPH, GRAPH, GRAPH, TASK)),
    "2.11.0rc1": ("G3b", "2026-03-24", "2.11.0", (GRAPH, GRAPH, GRAPH, GRAPH, GRAPH, TASK)),
    "2.12.0rc1": ("G3b", "2026-05-14", "2.12.0", (GRAPH, GRAPH, GRAPH, GRAPH, GRAPH, TASK)),
    "2.13.0rc1": ("G5", "2026-08-10", "2.13.0", (GRAPH, GRAPH, GRAPH, GRAPH, GRAPH, TASK)),
}
# An older generation than the release each precedes (the others: the same one, or a release not in the table).
OLDER_THAN_THEIR_RELEASE = {
    "2.5.1rc1", "2.6.0rc1", "2.7.1rc1", "2.8.0rc1", "2.9.0rc1", "2.10.0rc1", "2.10.0rc2", "2.11.0rc1", "2.12.0rc1",
}
# Facts that match no generation exactly: the newest generation each covers (tool.nearest_generation).
NOT_EXACT = {"2.7.1rc1": "G2a", "2.12.0rc1": "G3b"}


def _manifest(version: str) -> dict[str, Any]:
    return json.loads((MANIFESTS / f"torch_npu-{version}.json").read_text())


def _paths(facts: dict[str, Any]) -> tuple[str, ...]:
    from vendor_graph.vendors.ascend.seqlen import path_for, seqlen_ops

    return tuple(path_for(facts, op, overload) for _, op, overload in seqlen_ops())


# -- each pre-release, from its manifest


@pytest.mark.parametrize("version", list(EXPECTED))
def test_each_prerelease_has_the_generation_and_seqlen_paths_its_wheel_shows(version: str) -> None:
    generation, build_date, release, paths = EXPECTED[version]
    manifest = _manifest(version)
    assert manifest["version"] == version and manifest["wheel"]["build_date"] == build_date
    assert tool.classify(manifest, av.GENERATION_FACTS) == generation
    # generation_of() agrees with the manifest's classification, in every spelling, the wheel's own included
    own = manifest["version_py"]["__version__"]
    for spelling in {version, own, version.replace("rc", ".rc"), version.replace("rc", "-rc"), f"{version}+git0"}:
        assert av.generation_of(spelling) == generation, spelling
    row = av.release_of(version)
    assert row == av.Release(version, generation, build_date, "manifest")
    # the seq-len paths of the wheel's own facts are the generation's (so also for the two inexact matches)
    assert _paths(tool.facts_from_manifest(manifest)) == _paths(av.GENERATION_FACTS[generation]) == paths
    preceded = av.preceded_release(version)
    assert (preceded.version if preceded else None) == release
    if preceded is not None:
        older = av.GENERATIONS.index(generation) < av.GENERATIONS.index(preceded.generation)
        assert older == (version in OLDER_THAN_THEIR_RELEASE)
        assert manifest["wheel"]["build_date"] < preceded.build_date  # an earlier train


def test_the_table_has_every_prerelease_manifest_and_no_other() -> None:
    on_disk = sorted(
        (m["version"] for m in (json.loads(p.read_text()) for p in MANIFESTS.glob("torch_npu-*.json"))
         if tool.is_prerelease(m["version"])),
        key=tool.version_key,
    )
    assert list(av.PRERELEASE_VERSIONS) == on_disk == list(EXPECTED)
    assert not set(av.PRERELEASE_VERSIONS) & set(av.KNOWN_VERSIONS)
    assert all(not av.is_prerelease(r.version) for r in av.RELEASES)
    assert set(av.PRERELEASE_DECIDING) == set(EXPECTED)
    for version in EXPECTED:
        release = av.preceded_release(version)
        assert list(av.PRERELEASE_DECIDING[version]) == tool.deciding(
            _manifest(version), av.GENERATION_FACTS, release.generation if release else None)


def test_what_decides_an_older_generation_is_named_from_the_files() -> None:
    deciding = av.PRERELEASE_DECIDING
    # 2.10.0rc*: no op-handler registry, which 2.10.0 (G3b) has
    for version in ("2.10.0rc1", "2.10.0rc2"):
        assert not _manifest(version)["files"]["torch_npu/npu/_npugraph_handlers/"]
        assert _manifest("2.10.0")["files"]["torch_npu/npu/_npugraph_handlers/"]
        assert any("_npugraph_handlers/" in text and "(G3b: yes)" in text for text in deciding[version])
    assert not _manifest("2.5.1rc1")["files"]["torch_npu/npu/graphs.py"]
    assert any("`NPUGraph`" in text for text in deciding["2.5.1rc1"])
    assert "update" not in _manifest("2.6.0rc1")["graph_api"]["classes"]["NPUGraph"]["methods"]
    assert any("`NPUGraph.update`: no" in text for text in deciding["2.6.0rc1"])
    assert "ExternalStream" in _manifest("2.13.0rc1")["streams"]["classes"]


# -- the two pre-releases between generations


def test_inexact_prereleases_take_the_newest_generation_they_cover() -> None:
    from vendor_graph.vendors.ascend.seqlen import ATTENTION_OPS

    found = {}
    for version in EXPECTED:
        manifest = _manifest(version)
        generation, exact = tool.classification(manifest, av.GENERATION_FACTS)
        if exact:
            assert tool.facts_from_manifest(manifest) == av.GENERATION_FACTS[generation], version
            continue
        found[version] = generation
        facts, rules = tool.facts_from_manifest(manifest), av.GENERATION_FACTS[generation]
        assert {k: v for k, v in facts.items() if k != "update_ops"} == {
            k: v for k, v in rules.items() if k != "update_ops"}
        mine, theirs = facts["update_ops"], rules["update_ops"]
        # every op rule a call can reach (<op>.<overload>) that the generation has, the wheel has alike
        for op, rule in theirs.items():
            assert "." not in op or mine.get(op) == rule, (version, op)
        # what it intercepts beyond the generation is no attention op vendor_graph calls
        extra = {op.split(".")[0] for op in set(mine) - set(theirs)}
        assert not extra & set(ATTENTION_OPS), (version, extra)
        assert any(text.startswith(f"not exactly {generation}:") for text in av.PRERELEASE_DECIDING[version])
    assert found == NOT_EXACT
    # 2.7.1rc1 records no call under the bare op name that G2a records as .out
    assert _manifest("2.7.1rc1")["update"]["ops"]["npu_fused_infer_attention_score"]["recorded_as"] is None


def test_a_release_must_match_a_generation_exactly() -> None:
    manifest = {**_manifest("2.12.0rc1"), "version": "2.12.0.post9"}
    with pytest.raises(tool.ExtractionError, match="match no generation"):
        tool.classify(manifest, av.GENERATION_FACTS)


# -- spellings, and pre-releases PyPI does not have


def test_version_order_puts_prereleases_before_their_release() -> None:
    order = ["2.9.1", "2.10.0rc1", "2.10.0rc2", "2.10.0", "2.10.0.post2", "2.11.0rc1"]
    assert sorted(reversed(order), key=tool.version_key) == order
    assert tool.final_of("2.10.0rc2") == "2.10.0" and tool.final_of("2.10.0.post2") == "2.10.0.post2"


@pytest.mark.parametrize("version", ["2.9.0rc2", "2.10.0rc3", "2.14.0rc1", "2.9.0a1", "2.9.0b1"])
def test_a_prerelease_not_on_pypi_is_refused_not_mapped_to_its_release(version: str) -> None:
    with pytest.raises(ValueError, match="is a pre-release that is not on PyPI") as err:
        av.generation_of(version)
    assert "14 pre-releases" in str(err.value) and "53 releases" in str(err.value)


def test_settings_and_the_cli_take_prerelease_spellings() -> None:
    from vendor_graph.config import settings
    from vendor_graph.ops import cli

    kind = settings.TorchNpuRelease()
    assert kind.parse("2.10.0.RC2") == kind.parse("2.10.0rc2") == "2.10.0rc2"
    assert cli.generation_type(" 2.12.0.rc1 ") == "2.12.0rc1"
    assert "pre-release from 2.1.0rc1 to 2.13.0rc1" in kind.accepted
    with pytest.raises(ValueError):
        kind.parse("2.9.0rc2")


def test_paths_and_doctor_name_the_prereleases_own_generation() -> None:
    from vendor_graph.ops import doctor
    from vendor_graph.vendors.ascend.seqlen import seqlen_path_table

    table = seqlen_path_table()
    for version, (generation, _, _, paths) in EXPECTED.items():
        assert f"| {version} | {generation} | {' | '.join(paths)} |" in table.splitlines()
    lines = doctor._torch_npu_lines("2.9.0.rc1")  # as that wheel's torch_npu.__version__ would be read
    assert lines[0].strip().startswith("generation G2b;")


# -- the simulator as a pre-release


def test_a_generation_still_runs_as_its_newest_release_not_a_prerelease() -> None:
    pytest.importorskip("torch")
    from vendor_graph_sim import boot
    from vendor_graph_sim import device as sim

    for generation in av.GENERATIONS:
        assert not av.is_prerelease(sim.resolve(generation)[0]), generation
        try:
            assert not av.is_prerelease(boot.pinned_release(generation)), generation
        except boot.SimSwitchError:
            pass  # no release of it inside dlinfer's pins


def test_the_simulator_comes_up_as_a_prerelease_in_process() -> None:
    torch = pytest.importorskip("torch")
    from vendor_graph_sim import boot
    from vendor_graph_sim import device as sim

    release = boot.pinned_release("2.10.0.rc2")
    assert release == "2.10.0rc2"
    with sim.use_torch_npu(release) as torch_npu:
        import torch_npu as imported

        assert imported is torch_npu and torch.npu is torch_npu.npu
        assert torch_npu.__version__ == "2.10.0rc2" and torch_npu.npu.__sim_generation__ == "G3a"
        assert av.generation_of(torch_npu.version.__version__) == "G3a"
        assert hasattr(torch.npu.NPUGraph, "update")
        assert not hasattr(torch.npu, "register_npu_graph_handler")  # G3b's registry: 2.10.0 has it, rc2 not


def test_the_simulator_switch_comes_up_as_a_prerelease(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = textwrap.dedent("""
        import json, sys
        before = "torch" in sys.modules
        import torch_npu
        print(json.dumps({"before": before, "version": torch_npu.__version__,
                          "generation": torch_npu.npu.__sim_generation__}))
    """)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    environ.update(OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp_path / "cache"), VENDOR_GRAPH_SIM="2.10.0rc2")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environ,
                          cwd=str(tmp_path), timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"before": False, "version": "2.10.0rc2", "generation": "G3a"}


# -- the extractor picks up releases and pre-releases alike


def _file(name: str, **extra: Any) -> dict[str, Any]:
    return {"filename": name, "packagetype": "bdist_wheel", "yanked": False, "url": f"x/{name}", **extra}


def test_one_wheel_per_version_by_one_rule() -> None:
    files = [
        _file("torch_npu-2.10.0rc2-cp311-cp311-manylinux_2_28_aarch64.whl"),
        _file("torch_npu-2.10.0rc2-cp310-cp310-manylinux_2_28_x86_64.whl"),
        _file("torch_npu-2.10.0rc2-cp311-cp311-manylinux_2_28_x86_64.whl"),
        _file("torch_npu-2.10.0rc2-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", yanked=True),
        {"filename": "torch_npu-2.10.0rc2.tar.gz", "packagetype": "sdist", "yanked": False, "url": "x"},
    ]
    chosen = tool.choose_wheel(files)
    assert chosen["filename"] == "torch_npu-2.10.0rc2-cp311-cp311-manylinux_2_28_x86_64.whl"
    assert tool.choose_wheel(list(reversed(files))) == chosen
    assert tool.choose_wheel(files[:2])["filename"].startswith("torch_npu-2.10.0rc2-cp310")  # no cp311 x86_64
    assert tool.choose_wheel(files[:1]) is None  # aarch64 only
    project = {"releases": {"2.10.0": [_file("torch_npu-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl")],
                            "2.10.0rc2": files, "2.10.0rc1": files[:1], "2.9.1": []}}
    assert tool.list_pypi_versions(project) == ["2.10.0rc2", "2.10.0"]


def test_every_committed_wheel_is_the_one_the_rule_takes() -> None:
    for path in MANIFESTS.glob("torch_npu-*.json"):
        manifest = json.loads(path.read_text())
        name = manifest["wheel"]["filename"]
        assert name.split("-")[1] == manifest["version"] and tool._wheel_rank(name) is not None, name
        # cp311 wherever the version has one: the releases from 2.1.0.post8 on, the pre-releases from 2.5.1rc1 on
        cp310_only = {"2.1.0rc1", "2.2.0rc1", "2.3.1rc1", "2.4.0rc1",
                      "2.1.0", "2.1.0.post3", "2.1.0.post6", "2.2.0", "2.2.0.post2", "2.3.1"}
        assert ("-cp310-" if manifest["version"] in cp310_only else "-cp311-") in name, name


@pytest.mark.network
@pytest.mark.skipif(
    os.environ.get("VENDOR_GRAPH_NETWORK_TESTS") != "1",
    reason="reads PyPI's JSON API and downloads torch_npu wheels; set VENDOR_GRAPH_NETWORK_TESTS=1",
)
def test_pypi_has_no_version_without_a_manifest_and_two_reextract_identically(tmp_path: Path) -> None:
    on_pypi = tool.list_pypi_versions()
    assert [v for v in on_pypi if tool.is_prerelease(v)] == list(av.PRERELEASE_VERSIONS)
    assert [v for v in on_pypi if not tool.is_prerelease(v)] == list(av.KNOWN_VERSIONS)  # cp310-only ones too
    # the two inexact ones (17 MB and 44 MB)
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--check", "--cache", os.environ.get("VENDOR_GRAPH_WHEEL_CACHE", str(tmp_path)),
         "--versions", "2.7.1rc1", "2.12.0rc1"],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
