"""torch_npu graph-API facts, checked against the committed manifests.

Offline and fast: everything is read from ``sim/vendor_graph_sim/data/torch_npu_manifests/*.json``, which
``tools/torch_npu_manifest.py`` extracted from the PyPI wheels.  The expected
values are the facts read from torch_npu's source.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from load_by_path import load_by_path

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "sim" / "vendor_graph_sim" / "data" / "torch_npu_manifests"
TOOL = ROOT / "tools" / "torch_npu_manifest.py"
MODULE = ROOT / "vendor_graph" / "vendors" / "ascend" / "releases.py"


av = load_by_path("_vg_test_ascend_versions", MODULE)
tool = load_by_path("_vg_test_torch_npu_manifest", TOOL)
# The releases; the pre-releases' manifests are checked in test_torch_npu_prereleases.py.
MANIFEST = {
    m["version"]: m
    for m in (json.loads(p.read_text()) for p in sorted(MANIFESTS.glob("torch_npu-*.json")))
    if not tool.is_prerelease(m["version"])
}
GENERATIONS = ("G0", "G1", "G2a", "G2b", "G2c", "G3a", "G3b", "G4", "G5")

# research file §1/§2: every PyPI release and its generation
RESEARCH = {
    "G0": ("2.1.0", "2.1.0.post3", "2.1.0.post6", "2.1.0.post8", "2.1.0.post10", "2.2.0", "2.2.0.post2", "2.3.1",
           "2.3.1.post2", "2.3.1.post4", "2.4.0", "2.4.0.post2"),  # 2.1.0 ... 2.3.1: cp310 wheels only
    "G1": ("2.1.0.post12", "2.3.1.post6", "2.4.0.post4", "2.5.1"),
    "G2a": ("2.1.0.post13", "2.5.1.post1", "2.6.0"),
    "G2b": ("2.1.0.post17", "2.7.1", "2.8.0"),
    "G2c": ("2.6.0.post3",),
    "G3a": ("2.6.0.post5", "2.7.1.post2", "2.8.0.post2", "2.9.0"),
    "G3b": (
        "2.7.1.post4",
        "2.7.1.post6",
        "2.8.0.post4",
        "2.8.0.post5",
        "2.9.0.post2",
        "2.9.0.post4",
        "2.9.1",
        "2.10.0",
        "2.10.0.post2",
    ),
    "G4": (
        "2.7.1.post8",
        "2.7.1.post10",
        "2.9.0.post6",
        "2.9.0.post8",
        "2.10.0.post4",
        "2.10.0.post6",
        "2.11.0",
        "2.11.0.post2",
        "2.12.0",
        "2.12.0.post2",
    ),
    "G5": (
        "2.7.1.post11",
        "2.9.0.post9",
        "2.10.0.post7",
        "2.11.0.post3",
        "2.12.0.post3",
        "2.13.0",
        "2.14.0",
    ),
}
FIA, FIA2 = "npu_fused_infer_attention_score", "npu_fused_infer_attention_score_v2"
PA, MLA = "_npu_paged_attention", "npu_multi_head_latent_attention"


def _params(sig: dict[str, Any]) -> list[str]:
    return [p["name"] for p in sig["params"]]


def _by_generation(generation: str) -> list[dict[str, Any]]:
    return [m for v, m in MANIFEST.items() if av.generation_of(v) == generation]


def _positional(manifest: dict[str, Any], op: str) -> list[tuple[int, str, bool]]:
    return [(e["index"], e["key"], e["key_guarded"]) for e in manifest["update"]["ops"][op]["positional"]]


# -- the table and the manifests


def test_every_generation_has_a_manifest() -> None:
    assert av.GENERATIONS == GENERATIONS
    covered = {av.generation_of(v) for v in MANIFEST}
    assert covered == set(GENERATIONS)


def test_table_covers_every_pypi_release_in_order() -> None:
    expected = {v: g for g, versions in RESEARCH.items() for v in versions}
    assert len(expected) == 53
    assert {v: g for v, g in av.GENERATION_BY_VERSION.items() if not av.is_prerelease(v)} == expected
    keys = [tool.version_key(v) for v in av.KNOWN_VERSIONS]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)
    assert set(av.GENERATION_FACTS) == set(GENERATIONS) == set(av.GENERATION_NOTES)


def test_table_agrees_with_manifests() -> None:
    for release in av.RELEASES:
        if av.is_prerelease(release.version):
            continue
        manifest = MANIFEST.get(release.version)
        assert (manifest is not None) == (release.source == "manifest"), release
        if manifest is None:
            assert release.source == "research"
            continue
        assert release.build_date == manifest["wheel"]["build_date"]
        assert tool.classify(manifest, av.GENERATION_FACTS) == release.generation
        assert tool.facts_from_manifest(manifest) == av.GENERATION_FACTS[release.generation]
    assert set(MANIFEST) <= set(av.KNOWN_VERSIONS)


def test_table_section_is_the_generated_one() -> None:
    # --write-table would leave the module unchanged: no hand edits, no drift.
    assert tool.table_text(MODULE, MANIFESTS) == MODULE.read_text()


def test_manifests_are_canonical() -> None:
    for path in sorted(MANIFESTS.glob("torch_npu-*.json")):
        text = path.read_text()
        manifest = json.loads(text)
        assert tool.dumps(manifest) == text, path
        assert path == tool.manifest_path(MANIFESTS, manifest["version"])
        assert manifest["schema"] == tool.SCHEMA
        # __version__ is the PyPI version: no +git local part; exactly for a release, while some pre-releases
        # spell it 2.12.0.rc1
        own = manifest["version_py"]["__version__"]
        assert "+" not in own and av.release_of(own).version == manifest["version"], path
        assert own == manifest["version"] or av.is_prerelease(own), path


# -- generation_of


@pytest.mark.parametrize(
    ("spelling", "generation"),
    [
        ("2.8.0.post2", "G3a"),
        ("2.8.0-post2", "G3a"),
        ("2.8.0post2", "G3a"),
        ("2.8.0.POST2", "G3a"),
        ("v2.8.0.post2", "G3a"),
        (" 2.8.0.post2 ", "G3a"),
        ("2.8.0.post2+git729dda35", "G3a"),
        ("2.12.0+cpu", "G4"),
        ("2.8.0", "G2b"),
        ("2.14", "G5"),
        ("2.4.0-2", "G0"),  # PEP 440 implicit post release
        ("2.7.1.post11", "G5"),
        ("2.9.0rc1", "G2b"),  # a pre-release has its own row: 2.9.0 is G3a
        ("2.9.0rc1+local", "G2b"),
        ("2.12.0.rc1", "G3b"),  # that wheel's own __version__ spelling
    ],
)
def test_generation_of_accepts_pep440_spellings(spelling: str, generation: str) -> None:
    assert av.generation_of(spelling) == generation


@pytest.mark.parametrize(
    "version", ["2.8.0.post1", "2.8.0.post3", "2.6.0.post1", "2.15.0", "1.11.0", "2.4.0.post"]
)
def test_generation_of_rejects_unknown_versions(version: str) -> None:
    with pytest.raises(ValueError) as err:
        av.generation_of(version)
    message = str(err.value)
    assert repr(version) in message
    assert "2.1.0" in message and "2.14.0" in message and "53 releases" in message


def test_generation_of_rejects_dev_builds_and_garbage() -> None:
    with pytest.raises(ValueError, match="development build"):
        av.generation_of("2.9.0.dev20260101")
    with pytest.raises(ValueError, match="not a PEP 440 version"):
        av.generation_of("latest")
    with pytest.raises(TypeError):
        av.generation_of(2.8)  # type: ignore[arg-type]


def test_version_gate_of_the_reference_plugin_is_wrong() -> None:
    # ">= 2.8.0.post1" misses update-capable releases, whatever comparison is used.
    gate = tool.version_key("2.8.0.post1")
    capable = {v for v, m in MANIFEST.items() if m["update"]["present"]}
    assert len(capable) == 37
    missed = {v for v in capable if tool.version_key(v) < gate}
    assert {"2.1.0.post13", "2.5.1.post1", "2.6.0", "2.7.1.post8", "2.7.1.post11", "2.8.0"} <= missed
    assert "2.10.0" < "2.8.0.post1"  # the string comparison is worse still


# -- facts of the research file


def test_g0_has_no_graph_api_at_all() -> None:
    for manifest in _by_generation("G0"):
        assert not manifest["files"]["torch_npu/npu/graphs.py"]
        assert not manifest["graph_api"]["present"]
        assert manifest["update"] == {"present": False}
        assert "ExternalEvent" not in manifest["streams"]["classes"]
        assert not manifest["task_group_api"]["present"]
        assert not manifest["binary_strings"]["_NPUGraph"]
        assert "NPUGraph" not in manifest["npu_exports"]


def test_npugraph_and_task_group_api_in_every_later_wheel() -> None:
    with_graph = [m for m in MANIFEST.values() if m["graph_api"]["present"]]
    assert len(with_graph) == 41
    for manifest in with_graph:
        functions = manifest["task_group_api"]["functions"]
        assert {n: _params(s) for n, s in functions.items()} == {
            "graph_task_group_begin": ["stream"],
            "graph_task_group_end": ["stream"],
            "graph_task_update_begin": ["stream", "handle"],
            "graph_task_update_end": ["stream"],
        }
        exports = manifest["npu_exports"]
        for name in (*functions, "NPUGraph", "graph", "ExternalEvent", "graph_pool_handle"):
            assert exports[name]["in_all"], (manifest["version"], name)
        assert manifest["binary_strings"]["_NPUGraph"]
        assert manifest["binary_strings"]["_NPUTaskGroupHandle"]
        event = manifest["streams"]["classes"]["ExternalEvent"]["methods"]
        for method in ("record", "wait", "reset"):
            assert _params(event[method]) == ["self", "stream"]


def test_g1_has_no_update_and_no_auto_dispatch_capture() -> None:
    for manifest in _by_generation("G1"):
        classes = manifest["graph_api"]["classes"]
        assert "update" not in classes["NPUGraph"]["methods"]
        assert _params(classes["graph"]["methods"]["__init__"]) == [
            "self",
            "npu_graph",
            "pool",
            "stream",
            "capture_error_mode",
        ]
        assert not manifest["auto_dispatch_capture"]["present"]


def test_auto_dispatch_capture_is_fourth_positional_before_capture_error_mode() -> None:
    for version, manifest in MANIFEST.items():
        if not manifest["update"]["present"]:
            continue
        init = manifest["graph_api"]["classes"]["graph"]["methods"]["__init__"]
        assert _params(init) == [
            "self",
            "npu_graph",
            "pool",
            "stream",
            "auto_dispatch_capture",
            "capture_error_mode",
        ], version
        assert manifest["auto_dispatch_capture"]["graph_init_index"] == 3
        assert "graph.__init__:param" in manifest["auto_dispatch_capture"]["locations"]
        assert _params(manifest["update"]["signature"]) == ["self", "cpu_update_input"]
        assert manifest["update"]["requires_auto_dispatch_capture"]


def test_cuda_only_arguments_do_not_exist() -> None:
    for manifest in MANIFEST.values():
        classes = manifest["graph_api"]["classes"]
        if not classes:
            continue
        methods = classes["NPUGraph"]["methods"]
        assert "instantiate" not in methods
        names = {*_params(classes["graph"]["methods"]["__init__"]), *_params(methods["capture_begin"])}
        for cuda_only in ("keep_graph", "enable_annotations", "check_input_liveness"):
            assert cuda_only not in names


def test_no_release_intercepts_paged_attention_mla() -> None:
    for manifest in MANIFEST.values():
        for op in manifest["update"].get("ops", {}):
            assert not op.startswith("_npu_paged_attention_mla")


def test_g2a_intercepts_fia_v1_bare_and_out_only() -> None:
    manifest = MANIFEST["2.6.0"]
    ops = manifest["update"]["ops"]
    assert set(ops) == {FIA, f"{FIA}.out"}
    for op in ops.values():
        assert op["recorded_as"] == f"{FIA}.out"
        assert op["kwargs_rule"] == "any_key"
        assert op["positional"] == []
    assert manifest["update"]["length_check"] == "compares_records_with_itself"
    assert manifest["update"]["update_stream"] == "per_instance"


def test_g2b_adds_fia_default() -> None:
    assert set(MANIFEST["2.8.0"]["update"]["ops"]) == {FIA, f"{FIA}.default", f"{FIA}.out"}


def test_g2c_patches_paged_attention_second_to_last_arg() -> None:
    ops = MANIFEST["2.6.0.post3"]["update"]["ops"]
    assert set(ops) == {FIA, f"{FIA}.default", f"{FIA}.out", PA, f"{PA}.default"}
    for name in (PA, f"{PA}.default"):
        assert _positional(MANIFEST["2.6.0.post3"], name) == [(-2, "context_lens", False)]


def test_g3a_positional_table_is_unguarded() -> None:
    manifest = MANIFEST["2.8.0.post2"]
    ops = manifest["update"]["ops"]
    assert set(ops) == {
        FIA,
        f"{FIA}.default",
        f"{FIA}.out",
        FIA2,
        f"{FIA2}.default",
        f"{FIA2}.out",
        f"{PA}.default",
        f"{MLA}.out",
    }
    assert {op["kwargs_rule"] for op in ops.values()} == {"existing_keys_only"}
    assert _positional(manifest, FIA) == [(6, "actual_seq_lengths_kv", False)]
    assert _positional(manifest, FIA2) == [(8, "actual_seq_kvlen", False)]
    assert _positional(manifest, f"{PA}.default") == [(7, "context_lens", False)]
    assert _positional(manifest, f"{MLA}.out") == [(5, "context_lens", False)]
    assert manifest["update"]["update_stream"] == "class_level"
    assert "debug_dump" in manifest["graph_api"]["classes"]["NPUGraph"]["methods"]


def test_g3b_moves_update_into_the_guarded_handler_registry() -> None:
    manifest = MANIFEST["2.10.0"]
    assert manifest["update"]["dispatch"] == "handler_registry"
    assert manifest["update"]["length_check"] == "raises_on_mismatch"
    assert _positional(manifest, f"{FIA}.default") == [(6, "actual_seq_lengths_kv", True)]
    assert {"NpuGraphOpHandler", "register_npu_graph_handler"} <= set(manifest["npu_exports"])
    assert "super_kernel_optimize" in manifest["graph_api"]["classes"]["NPUGraph"]["methods"]


def test_g4_adds_query_lengths_and_fa3() -> None:
    manifest = MANIFEST["2.12.0"]
    assert _positional(manifest, FIA) == [(5, "actual_seq_lengths", True), (6, "actual_seq_lengths_kv", True)]
    assert _positional(manifest, FIA2) == [(7, "actual_seq_qlen", True), (8, "actual_seq_kvlen", True)]
    fa3 = manifest["update"]["ops"]["npu_fusion_attention_v3"]
    assert fa3["should_handle"] and fa3["recorded_as"] == "npu_fusion_attention_v3.out"
    assert _positional(manifest, "npu_fusion_attention_grad_v3.default") == [
        (21, "actual_seq_qlen", True),
        (22, "actual_seq_kvlen", True),
    ]
    assert manifest["files"]["torch_npu/npu/_aclgraph_update_plan/"]
    assert "ExternalStream" not in manifest["streams"]["classes"]


def test_g5_adds_external_stream() -> None:
    for manifest in _by_generation("G5"):
        stream = manifest["streams"]["classes"]["ExternalStream"]
        assert stream["bases"] == ["Stream"]
        assert _params(stream["methods"]["__new__"]) == ["cls", "stream_ptr", "device", "kwargs"]


def test_host_empty_cache_on_capture_only_from_2_11() -> None:
    calling = {
        v
        for v, m in MANIFEST.items()
        if any(c["call"].endswith("host_empty_cache") for c in m["graph_api"]["graph_enter_calls"])
    }
    assert calling == {
        "2.11.0",
        "2.11.0.post2",
        "2.11.0.post3",
        "2.12.0",
        "2.12.0.post2",
        "2.12.0.post3",
        "2.13.0",
        "2.14.0",
    }


# -- against PyPI (opt-in)


@pytest.mark.network
@pytest.mark.skipif(
    os.environ.get("VENDOR_GRAPH_NETWORK_TESTS") != "1",
    reason="downloads a torch_npu wheel from PyPI; set VENDOR_GRAPH_NETWORK_TESTS=1",
)
def test_check_reextracts_a_release_identically(tmp_path: Path) -> None:
    # 2.4.0 is the smallest wheel (~14 MB, G0); 2.5.1 (~16 MB) has the graph API.
    proc = subprocess.run(
        [sys.executable, str(TOOL), "--check", "--cache", str(tmp_path), "--versions", "2.4.0", "2.5.1"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
