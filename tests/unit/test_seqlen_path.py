"""Which seq-len update path each torch_npu release and attention op gets."""

from types import SimpleNamespace

import pytest

from vendor_graph.config import settings
from vendor_graph.vendors.ascend import releases, seqlen
from vendor_graph.vendors.ascend.seqlen import FIA, FIA_V2, MLA, PAGED_ATTENTION, PAGED_ATTENTION_MLA, path_for

EXPECTED_FIA = {"G0": "none", "G1": "task-update", "G2a": "task-update", "G2b": "graph-update",
                "G2c": "graph-update", "G3a": "graph-update", "G3b": "graph-update", "G4": "graph-update",
                "G5": "graph-update"}


@pytest.mark.parametrize("generation", sorted(EXPECTED_FIA))
def test_fia_path_per_generation(generation):
    assert path_for(releases.GENERATION_FACTS[generation], FIA) == EXPECTED_FIA[generation]


def test_g2a_plain_name_branch_never_matches_a_default_call():
    facts = releases.GENERATION_FACTS["G2a"]
    assert path_for(facts, FIA, ".default") == "task-update"  # the suspected silent no-op is avoided
    assert path_for(facts, FIA, ".out") == "graph-update"


@pytest.mark.parametrize("op,paths", [
    (FIA_V2, {"G2b": "task-update", "G3a": "graph-update", "G5": "graph-update"}),
    (PAGED_ATTENTION, {"G2b": "task-update", "G2c": "graph-update", "G3a": "graph-update", "G5": "graph-update"}),
    (MLA, {"G3a": "task-update", "G5": "task-update"}),  # only .out is intercepted
    (PAGED_ATTENTION_MLA, {"G1": "task-update", "G3a": "task-update", "G5": "task-update"}),
])
def test_other_ops_paths(op, paths):
    for generation, path in paths.items():
        assert path_for(releases.GENERATION_FACTS[generation], op) == path, generation


def test_mla_out_calls_use_graph_update_from_g3a():
    assert path_for(releases.GENERATION_FACTS["G3a"], MLA, ".out") == "graph-update"


@pytest.mark.parametrize("version,path", [
    ("2.4.0", "none"), ("2.5.1", "task-update"), ("2.6.0", "task-update"), ("2.8.0", "graph-update"),
    ("2.8.0.post2", "graph-update"), ("2.14.0", "graph-update"), ("2.1.0.post12", "task-update"),
    ("2.8.0.post1", "graph-update"),  # not a PyPI release: the reference version rule
    ("2.7.5", "task-update"), ("9.9.9", "graph-update"), ("not a version", "none"), ("", "none"),
])
def test_seqlen_update_path_for_releases(version, path):
    assert seqlen.seqlen_update_path(version) == path


def test_installed_release_is_read_without_importing_torch_npu(monkeypatch):
    import sys

    monkeypatch.setattr(seqlen, "_installed_torch_npu_version", lambda: "2.9.0")
    assert seqlen.seqlen_update_path() == "graph-update"
    assert "torch_npu" not in sys.modules
    monkeypatch.setattr(seqlen, "_installed_torch_npu_version", lambda: None)
    assert seqlen.seqlen_update_path() == "none"


def test_forced_path(monkeypatch):
    caps = seqlen.Capabilities("2.9.0", "G3a", dict(releases.GENERATION_FACTS["G3a"]), "table")
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "task-update")
    settings.load()  # as activation and every runner build do
    assert caps.path(FIA) == "task-update"
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "auto")
    settings.load()
    assert caps.path(FIA) == "graph-update"
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "sometimes")
    with pytest.raises(ValueError, match="use auto, graph-update or task-update"):
        settings.load()  # refused where the settings are parsed, before any capture
    assert caps.path(FIA) == "graph-update"  # the settings in force stay those of the last parse that passed


def _npu_module(graph_api=True, update=True, auto_dispatch=True, tasks=True, event=True):
    def graph(npu_graph, pool=None, stream=None, capture_error_mode="global"):
        pass

    def graph_with_dispatch(npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                            capture_error_mode="global"):
        pass

    mod = SimpleNamespace()
    if graph_api:
        mod.NPUGraph = type("NPUGraph", (), {"update": lambda self, x: None} if update else {})
        mod.graph = graph_with_dispatch if auto_dispatch else graph
    if tasks:
        for name in ("graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin",
                     "graph_task_update_end"):
            setattr(mod, name, lambda *a: None)
    if event:
        mod.ExternalEvent = object
    return mod


def test_detect_agrees_with_the_table():
    caps = seqlen.detect(_npu_module(), "2.9.0")
    assert (caps.generation, caps.source) == ("G3a", "table")
    caps = seqlen.detect(_npu_module(update=False, auto_dispatch=False), "2.5.1")
    assert (caps.generation, caps.source, caps.path(FIA)) == ("G1", "table", "task-update")


def test_probe_wins_when_the_table_disagrees(caplog):
    # A build labelled 2.9.0 (G3a in the table) whose module has no update(): trust the module.
    caps = seqlen.detect(_npu_module(update=False, auto_dispatch=False), "2.9.0")
    assert caps.generation == "G1" and caps.source == "probe (table says G3a)"
    assert caps.path(FIA) == "task-update"
    assert "using G1 rules (probe (table says G3a))" in caplog.text


def test_unknown_release_uses_the_version_rule_with_the_probe():
    caps = seqlen.detect(_npu_module(), "2.15.0")
    assert caps.source == "probe (release not in table)" and caps.path(FIA) == "graph-update"
    caps = seqlen.detect(_npu_module(), "2.7.9")
    assert caps.path(FIA) == "task-update"
    caps = seqlen.detect(_npu_module(graph_api=False, tasks=False, event=False), None)
    assert caps.path(FIA) == "none"
