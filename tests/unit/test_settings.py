"""vendor_graph.config.settings: every VENDOR_GRAPH_* variable parsed once, strictly and uniformly, and the
places that read it (activation, autoload, runner build, the doctor)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from vendor_graph.config import settings, switches
from vendor_graph.config.settings import SettingsError
from vendor_graph.install import patching
from vendor_graph.ops import doctor

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "vendor_graph"
FLAGS = [s.name for s in settings.SETTINGS.values() if isinstance(s.kind, settings.Flag)]
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
# tests' deliberate typos, which the doctor must flag and activation warn about
MISSPELT = {"VENDOR_GRAPH_SHADWO", "VENDOR_GRAPH_SHADOWS", "VENDOR_GRAPH_STATS_FIEL", "VENDOR_GRAPH_ZZZZZZ"}


def _parse(**env: str) -> settings.Settings:
    return settings.parse({f"VENDOR_GRAPH_{k}": v for k, v in env.items()})


def _error(**env: str) -> SettingsError:
    with pytest.raises(SettingsError) as info:
        _parse(**env)
    return info.value


# -- the rules -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FLAGS)
def test_every_boolean_takes_every_spelling_in_any_case_with_spaces(name):
    field = settings.SETTINGS[name].field
    for words, expected in ((TRUE_WORDS, True), (FALSE_WORDS, False)):
        for word in words:
            for text in (word, word.upper(), word.capitalize(), f"  {word}\t"):
                assert getattr(settings.parse({name: text}), field) is expected, (name, text)


@pytest.mark.parametrize("name", FLAGS)
def test_any_other_boolean_text_is_an_error_naming_value_accepted_and_fix(name):
    for text in ("2", "-1", "enabled", "y", "tru"):
        with pytest.raises(SettingsError) as info:
            settings.parse({name: text})
        message = str(info.value)
        assert message.startswith(f"{name}={text!r}: expected 1/0, true/false, yes/no or on/off"), message
        assert "Fix: use 1 (on) or 0 (off)" in message and "unset it for the default" in message


def test_disable_2_is_an_error_not_ignored():
    assert "VENDOR_GRAPH_DISABLE='2': expected 1/0" in str(_error(DISABLE="2"))
    assert _parse(DISABLE="Yes").disable is True


def test_allow_unsupported_lmdeploy_accepts_true_like_every_boolean(monkeypatch):
    from packaging.version import Version

    from vendor_graph.upstream import compat

    assert _parse(ALLOW_UNSUPPORTED_LMDEPLOY="true").allow_unsupported_lmdeploy is True
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "true")
    settings.load()
    assert compat.check_lmdeploy_supported("camb", Version("0.19.0")) == Version("0.19.0")
    monkeypatch.setenv(compat.ALLOW_UNSUPPORTED_ENV, "no")
    settings.load()
    with pytest.raises(compat.UnsupportedLmdeploy):
        compat.check_lmdeploy_supported("camb", Version("0.19.0"))


def test_empty_or_blank_is_the_default_for_every_setting():
    for blank in ("", "   ", "\t"):
        assert settings.parse({name: blank for name in settings.SETTINGS}) == settings.Settings()


def test_strings_are_stripped_and_choices_take_any_case():
    parsed = _parse(VENDOR=" Ascend\n", SHADOW_ACTION=" LOG ", SEQLEN_UPDATE="\tTask-Update ", SHADOW=" 3 ")
    assert (parsed.vendor, parsed.shadow_action, parsed.seqlen_update, parsed.shadow) == (
        "ascend", "log", "task-update", 3)


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "-0.5", "abc", "1e-3x"])
def test_shadow_tolerance_must_be_a_finite_number_at_least_zero(text):
    message = str(_error(SHADOW_TOL=text))
    assert message.startswith(f"VENDOR_GRAPH_SHADOW_TOL={text!r}: expected a finite number >= 0"), message
    assert "Fix:" in message and "by dtype" in message


def test_a_valid_shadow_tolerance_reaches_the_check(monkeypatch):
    from vendor_graph.runtime.shadow import ShadowCheck

    assert _parse(SHADOW_TOL="0").shadow_tol == 0.0
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW_TOL", " 1e-3 ")
    settings.load()
    tolerance = ShadowCheck().tolerance
    assert math.isfinite(tolerance) and tolerance == 1e-3


@pytest.mark.parametrize("name", ["SHADOW", "GUARD_WEIGHTS_EVERY"])
@pytest.mark.parametrize("text", ["-1", "x", "2.5", "1e3", "true"])
def test_counts_are_whole_numbers_at_least_zero(name, text):
    message = str(_error(**{name: text}))
    assert message.startswith(f"VENDOR_GRAPH_{name}={text!r}: expected a whole number N >= 0"), message
    assert "Fix: write a whole number >= 0 in digits" in message


def test_zero_keeps_its_meaning_off(monkeypatch):
    from vendor_graph.runtime.guard import DEFAULT_WEIGHTS_EVERY, StaleGraphGuard
    from vendor_graph.runtime.shadow import ShadowCheck

    settings.load({})
    assert StaleGraphGuard(None).weights_every == DEFAULT_WEIGHTS_EVERY == 256
    assert not ShadowCheck().enabled
    monkeypatch.setenv("VENDOR_GRAPH_GUARD_WEIGHTS_EVERY", "0")
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "0")
    settings.load()
    assert StaleGraphGuard(None).weights_every == 0
    assert not ShadowCheck().enabled
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "4")
    settings.load()
    assert ShadowCheck().every == 4


def test_event_budget_words_and_range():
    assert _parse().npu_event_budget == 1920
    for off in ("0", "off", "OFF", "none", "unlimited"):
        assert _parse(NPU_EVENT_BUDGET=off).npu_event_budget is None
    assert _parse(NPU_EVENT_BUDGET="1").npu_event_budget == 1
    for bad in ("-1", "lots", "1.5"):
        message = str(_error(NPU_EVENT_BUDGET=bad))
        assert "expected a whole number N >= 1, or 0/off/none/unlimited for no limit" in message, message


def test_progress_takes_booleans_and_is_automatic_when_unset(monkeypatch):
    import io

    from vendor_graph.runtime.counters import CaptureProgress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    for text, on_a_pipe, on_a_terminal in (("yes", True, True), ("OFF", False, False), ("", False, True)):
        monkeypatch.setenv("VENDOR_GRAPH_PROGRESS", text)
        settings.load()
        assert CaptureProgress(3, stream=io.StringIO()).visible is on_a_pipe, text
        assert CaptureProgress(3, stream=Terminal()).visible is on_a_terminal, text
    assert "VENDOR_GRAPH_PROGRESS='auto': expected 1/0" in str(_error(PROGRESS="auto"))


def test_every_bad_value_is_reported_in_one_error():
    error = _error(DISABLE="2", SHADOW="-1", SHADOW_TOL="nan", VENDOR="banana", DEBUG="1")
    assert error.names == ("VENDOR_GRAPH_VENDOR", "VENDOR_GRAPH_DISABLE", "VENDOR_GRAPH_SHADOW",
                           "VENDOR_GRAPH_SHADOW_TOL")
    message = str(error)
    assert message.startswith("4 VENDOR_GRAPH_* settings are not accepted:")
    for fragment in ("VENDOR_GRAPH_DISABLE='2'", "VENDOR_GRAPH_SHADOW='-1'", "VENDOR_GRAPH_SHADOW_TOL='nan'",
                     "VENDOR_GRAPH_VENDOR='banana'"):
        assert fragment in message
    assert error.partial == dataclasses.replace(settings.Settings(), debug=True)  # the good one parsed
    assert isinstance(error, ValueError)
    copy = pickle.loads(pickle.dumps(error))  # crosses process boundaries (lmdeploy's workers)
    assert str(copy) == message and copy.names == error.names


def test_an_unknown_vendor_lists_the_vendors_and_suggests_no_import_of_it():
    message = str(_error(VENDOR="banana"))
    assert "expected one of ascend, camb, maca, cuda" in message
    assert "use ascend, camb, maca or cuda" in message
    assert "vendor_graph.banana" not in message


def test_settings_are_frozen_and_current_is_the_last_good_parse(monkeypatch):
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "2")
    loaded = settings.load()
    with pytest.raises(dataclasses.FrozenInstanceError):
        loaded.shadow = 3
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "5")
    assert settings.current() is loaded and settings.current().shadow == 2  # read once, not at every use
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "often")
    with pytest.raises(SettingsError):
        settings.load()
    assert settings.current() is loaded
    settings.clear()
    with pytest.raises(SettingsError):
        settings.current()  # parses lazily when nothing was loaded
    monkeypatch.setenv("VENDOR_GRAPH_SHADOW", "5")
    assert settings.current().shadow == 5


def test_each_field_is_its_variable_and_the_modules_use_those_names():
    from vendor_graph.runtime import counters, guard, shadow
    from vendor_graph.upstream import compat
    from vendor_graph.vendors.ascend import limits, seqlen

    assert [s.name for s in settings.SETTINGS.values()] == [
        "VENDOR_GRAPH_" + f.name.upper() for f in dataclasses.fields(settings.Settings)]
    assert (patching.VENDOR_ENV, compat.ALLOW_UNSUPPORTED_ENV, switches.DISABLE_ENV, switches.DEBUG_ENV,
            shadow.SHADOW_ENV, shadow.ACTION_ENV, shadow.TOL_ENV, guard.WEIGHTS_EVERY_ENV, counters.PROGRESS_ENV,
            limits.EVENT_BUDGET_ENV, seqlen.SEQLEN_UPDATE_ENV) == tuple(
        settings.variable(f) for f in ("vendor", "allow_unsupported_lmdeploy", "disable", "debug", "shadow",
                                       "shadow_action", "shadow_tol", "guard_weights_every", "progress",
                                       "npu_event_budget", "seqlen_update"))
    assert settings.declared("shadow_action").kind.values == shadow.ACTIONS
    assert settings.declared("seqlen_update").kind.values == ("auto", seqlen.GRAPH_UPDATE, seqlen.TASK_UPDATE)
    assert limits.DEFAULT_EVENT_BUDGET == 1920


def _names_in(paths) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in paths:
        for name in re.findall(r"VENDOR_GRAPH_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="replace")):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_name_the_runtime_reads_is_a_declared_setting():
    declarations = SOURCE / "config" / "settings.py"
    runtime = [p for p in SOURCE.rglob("*.py") if "testing" not in p.relative_to(SOURCE).parts and p != declarations]
    unknown = {n: w for n, w in _names_in(runtime).items() if n not in settings.SETTINGS}
    assert not unknown, unknown
    # the declarations themselves: the runtime's settings, the names it sets for itself, and the simulator's
    # switch, which the CLI and the doctor name (vendor-graph-sim declares it)
    own = set(settings.SETTINGS) | set(settings.INTERNAL) | {settings.SIM_SWITCH}
    assert set(_names_in([declarations])) <= own, set(_names_in([declarations])) - own
    assert settings.declaration(settings.SIM_SWITCH).scope == "simulator"


def test_every_name_in_the_repository_is_known_to_the_registry():
    suffixes = {".py", ".sh", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini"}
    folders = ("vendor_graph", "sim", "tests", "scripts", "tools", "benchmarks", ".github", ".ci")
    files = [p for d in folders if (ROOT / d).is_dir()
             for p in (ROOT / d).rglob("*") if p.is_file() and (p.suffix in suffixes or p.parent.name == ".ci")]
    files += [p for p in ROOT.glob("*") if p.is_file() and p.suffix in suffixes]
    known = settings.known()
    unknown = {n: w for n, w in _names_in(files).items() if n not in known and n not in MISSPELT}
    assert not unknown, unknown
    assert known["VENDOR_GRAPH_TORCH_NPU_MANIFESTS"].scope == "simulator"
    assert {known[n].scope for n in ("VENDOR_GRAPH_NETWORK_TESTS", "VENDOR_GRAPH_WHEEL_CACHE",
                                     "VENDOR_GRAPH_VENV", "VENDOR_GRAPH_SKIP_OLDEST_TORCH",
                                     "VENDOR_GRAPH_LMDEPLOY_VERSIONS")} == {"tooling"}


# -- the simulator's and the test harness's variables, declared by vendor-graph-sim ----------------------------


def test_the_harness_names_are_declared_by_the_simulator_package_not_the_runtime():
    from vendor_graph_sim import variables

    elsewhere = settings.declared_elsewhere()
    assert set(elsewhere) == {s.name for s in variables.SIMULATOR + variables.TEST_HARNESS}
    assert not set(elsewhere) & (set(settings.SETTINGS) | set(settings.INTERNAL))
    assert {s.scope for s in variables.SIMULATOR} == {"simulator"}
    assert {s.scope for s in variables.TEST_HARNESS} == {"tooling"}
    assert all(s.meaning for s in elsewhere.values())
    assert settings.INTERNAL[settings.WORKER_REPORTS].meaning.startswith("set by vendor_graph")


def test_the_harness_names_are_looked_up_only_for_a_name_the_runtime_does_not_declare():
    code = """
        import sys
        from vendor_graph.config import settings
        assert settings.unknown({"VENDOR_GRAPH_SHADOW": "1", "VENDOR_GRAPH_WORKER_REPORTS": "/tmp"}) == []
        assert settings._elsewhere is None and "importlib.metadata" not in sys.modules, "looked up too early"
        assert settings.unknown({"VENDOR_GRAPH_FUZZ_EXAMPLES": "3"}) == []
        print(sorted(m for m in sys.modules if m.startswith("vendor_graph_sim")))
    """
    proc = _child(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['vendor_graph_sim', 'vendor_graph_sim.variables']"


def test_activation_knows_the_harness_names_and_names_them_for_a_misspelling(monkeypatch, caplog):
    import logging

    monkeypatch.setattr(settings, "_warned_unknown", set())
    misspelt = settings.PREFIX + "FUZZ_EXAMPLE"  # built: the registry test reads the names written out
    env = {"VENDOR_GRAPH_FUZZ_EXAMPLES": "3", "VENDOR_GRAPH_SIM": "G5", "VENDOR_GRAPH_DLINFER_SRC": "/nowhere",
           misspelt: "3"}
    caplog.set_level(logging.WARNING, logger="vendor_graph")
    assert settings.warn_unknown(env) == [
        f"{misspelt} is not a vendor_graph setting and does nothing (a typo?); did you mean "
        f"VENDOR_GRAPH_FUZZ_EXAMPLES?"]
    assert settings.parse(env) == settings.Settings()  # a harness name is no runtime setting, its value unread


def test_the_doctor_lists_the_harness_names_with_their_values():
    lines = dict(_doctor({"VENDOR_GRAPH_SIM": "g5", "VENDOR_GRAPH_FUZZ_EXAMPLES": "3",
                          "VENDOR_GRAPH_DLINFER_SRC": "/nowhere", "VENDOR_GRAPH_WORKER_REPORTS": "/tmp/r"}))
    assert lines["VENDOR_GRAPH_FUZZ_EXAMPLES=3  (tooling, not read by the runtime: examples each fuzz test "
                 "(tests/fuzz) runs (default 80))"] is False
    assert lines["VENDOR_GRAPH_SIM=g5  (simulator, not read by the runtime: the simulator switch: every interpreter "
                 "sees the simulated device from its start (vendor_graph_sim.boot): camb's MLU, maca's device, or the "
                 "NPU of this torch_npu generation or release)"] is False
    assert lines["VENDOR_GRAPH_WORKER_REPORTS=/tmp/r  (set by vendor_graph in lmdeploy's spawned workers: the folder "
                 "where a worker that dies leaves its error for the parent (vendor_graph.install.workers))"] is False
    problems = [t for t, p in lines.items() if p]
    assert len(problems) == 1 and problems[0].startswith(
        "VENDOR_GRAPH_DLINFER_SRC='/nowhere': expected a directory holding dlinfer/__init__.py"), problems
    assert settings.readings({"VENDOR_GRAPH_SIM": "g5"})[0].value == "G5"  # the doctor's simulated torch_npu


def test_a_package_whose_declarations_do_not_load_is_logged_not_raised(monkeypatch, caplog):
    import logging
    from importlib import metadata

    class Broken:
        value = "elsewhere.variables:BROKEN"

        def load(self):
            raise ImportError("no module named elsewhere")

    class Odd:
        value = "elsewhere.variables:ODD"

        def load(self):
            return ("not a Setting", settings.Setting("VENDOR_GRAPH_SHADOW", "a second declaration"),
                    settings.Setting(settings.PREFIX + "ELSEWHERE", "a new one", scope="tooling"))

    monkeypatch.setattr(metadata, "entry_points", lambda group: [Broken(), Odd()])
    monkeypatch.setattr(settings, "_elsewhere", None)
    caplog.set_level(logging.WARNING, logger="vendor_graph")
    assert list(settings.declared_elsewhere()) == [settings.PREFIX + "ELSEWHERE"]
    assert settings.declaration("VENDOR_GRAPH_SHADOW") is settings.SETTINGS["VENDOR_GRAPH_SHADOW"]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3 and "elsewhere.variables:BROKEN" in messages[0] and "ImportError" in messages[0]
    assert "'not a Setting'" in messages[1] and "VENDOR_GRAPH_SHADOW" in messages[2]


# -- where the settings are parsed ------------------------------------------------------------------------


class _Runner:
    def __call__(self, **kwargs):
        return kwargs


def _builder():
    from types import SimpleNamespace

    from vendor_graph.install import profile as vendor

    built = []

    def original(model, model_config, cache_config, backend_config, device):
        built.append(backend_config)
        return _Runner()

    profile = vendor.VendorProfile(name="ascend", build_spec=lambda api: None,
                                   build_runner=lambda original, *args, **kwargs: original(*args, **kwargs))
    wrapped = vendor._wrap_builder(profile, original)
    return (lambda: wrapped(None, None, None, SimpleNamespace(eager_mode=False), "cpu")), built


def test_a_bad_seqlen_path_fails_the_runner_build_not_a_capture(monkeypatch):
    build, built = _builder()
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "task-update")
    monkeypatch.setenv("VENDOR_GRAPH_DISABLE", "on")
    monkeypatch.setattr(switches, "_ANNOUNCED", True)
    build()
    assert built[-1].eager_mode is True and settings.current().seqlen_update == "task-update"
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "sometimes")  # after the last parse: the next build reads it
    with pytest.raises(SettingsError, match="VENDOR_GRAPH_SEQLEN_UPDATE='sometimes': expected one of auto"):
        build()
    assert len(built) == 1


def test_a_bad_setting_fails_the_activation(monkeypatch):
    pytest.importorskip("lmdeploy")
    settings.load()
    monkeypatch.setenv("VENDOR_GRAPH_SEQLEN_UPDATE", "sometimes")  # after the last parse: activation reads it
    with pytest.raises(SettingsError, match="VENDOR_GRAPH_SEQLEN_UPDATE"):
        importlib.import_module("vendor_graph.ascend").activate()
    assert patching.active() is None


def test_a_vendor_with_spaces_is_the_vendor_at_activation(monkeypatch):
    pytest.importorskip("lmdeploy")
    monkeypatch.setenv("VENDOR_GRAPH_VENDOR", " ascend ")
    activation = importlib.import_module("vendor_graph.ascend").activate()
    assert activation.vendor == "ascend" and not activation.exported_env


def test_a_conflicting_vendor_names_only_real_vendors(monkeypatch):
    pytest.importorskip("lmdeploy")
    monkeypatch.setenv("VENDOR_GRAPH_VENDOR", "CAMB")
    with pytest.raises(patching.VendorConflict, match="import vendor_graph.camb$"):
        importlib.import_module("vendor_graph.ascend").activate()
    monkeypatch.setenv("VENDOR_GRAPH_VENDOR", "banana")
    with pytest.raises(SettingsError) as info:
        importlib.import_module("vendor_graph.ascend").activate()
    assert "vendor_graph.banana" not in str(info.value) and "ascend, camb, maca, cuda" in str(info.value)


def test_the_event_budget_says_why_no_graph_fits():
    from vendor_graph.vendors.ascend import limits
    from vendor_graph.vendors.ascend.seqlen import TASK_UPDATE

    result = limits.fit_capture_sizes(2, [1, 2, 4], TASK_UPDATE, budget=1)
    assert result.kept == [] and result.off_reason == (
        "VENDOR_GRAPH_NPU_EVENT_BUDGET=1: not even one decode graph fits (each needs 2 ExternalEvents); raise it "
        "to 2 or more, or set it to 0 for no limit")
    assert limits.fit_capture_sizes(2, [1, 2, 4], TASK_UPDATE, budget=2).off_reason is None
    assert limits.fit_capture_sizes(2, [1, 2, 4], TASK_UPDATE, budget=None).off_reason is None


# -- the doctor reads through the same parser ---------------------------------------------------------------


def _doctor(env: dict[str, str]) -> list[tuple[str, bool]]:
    return doctor.settings_lines(settings.readings(env))


def test_doctor_shows_parsed_values_and_flags_every_value_activation_refuses():
    lines = dict(_doctor({"VENDOR_GRAPH_SHADOW": "4", "VENDOR_GRAPH_DISABLE": "yes", "VENDOR_GRAPH_DEBUG": "",
                          "VENDOR_GRAPH_NPU_EVENT_BUDGET": "off", "VENDOR_GRAPH_VENV": "/tmp/venv",
                          "VENDOR_GRAPH_SHADOW_TOL": "nan", "VENDOR_GRAPH_SHADWO": "4", "PATH": "/bin"}))
    assert lines["VENDOR_GRAPH_SHADOW=4  (N: every Nth replay also runs eager and is compared (0: off))"] is False
    assert lines["VENDOR_GRAPH_DISABLE=yes -> on  (on: graph mode off, every step eager (buffer patches stay))"] \
        is False
    assert lines["VENDOR_GRAPH_DEBUG= -> off (the default)  (on: detailed logs)"] is False
    assert lines["VENDOR_GRAPH_NPU_EVENT_BUDGET=off -> no limit  (Ascend: ExternalEvents the graphs may hold)"] is False
    assert any(t.startswith("VENDOR_GRAPH_VENV=/tmp/venv  (tooling, not read by the runtime") and not p
               for t, p in lines.items())
    problems = [t for t, p in lines.items() if p]
    assert len(problems) == 2 and problems[0].startswith("VENDOR_GRAPH_SHADOW_TOL='nan': expected a finite number")
    assert problems[1].startswith("VENDOR_GRAPH_SHADWO=4: not a vendor_graph setting (a typo?); did you mean "
                                  "VENDOR_GRAPH_SHADOW?; known: ")
    assert _doctor({}) == [("none set (all defaults)", False)]


@pytest.mark.parametrize("env", [
    {"VENDOR_GRAPH_DISABLE": "2"}, {"VENDOR_GRAPH_SHADOW": "-1"}, {"VENDOR_GRAPH_SEQLEN_UPDATE": "x"},
    {"VENDOR_GRAPH_GUARD_WEIGHTS_EVERY": "x"}, {"VENDOR_GRAPH_VENDOR": "banana"}, {"VENDOR_GRAPH_DEBUG": "on"},
    {"VENDOR_GRAPH_VENDOR": " ascend", "VENDOR_GRAPH_SHADOW_TOL": "inf", "VENDOR_GRAPH_PROGRESS": "0"},
])
def test_doctor_finds_a_problem_exactly_when_activation_would_refuse(env):
    refused = [p for p in _doctor(env) if p[1]]
    try:
        settings.parse(env)
    except SettingsError as exc:
        assert len(refused) == len(exc.problems) and [t for t, _ in refused] == [str(p) for p in exc.problems]
    else:
        assert not refused


# -- real processes: interpreter start, lmdeploy's import, the CLI ------------------------------------------


def _child(code: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    full.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          timeout=300)


WORKER = """
    import lmdeploy.pytorch.models.utils.cudagraph as m
    print(m.CudaGraphMixin.fill_buffers_cudagraph.__module__)
"""


def test_settings_import_nothing_heavy():
    proc = _child("import sys, vendor_graph.config.settings; print(sorted({'torch', 'lmdeploy', 'packaging'} & "
                  "set(m.split('.')[0] for m in sys.modules)))")
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr


def test_a_worker_with_a_spaced_vendor_activates_it():
    pytest.importorskip("lmdeploy")
    proc = _child(WORKER, VENDOR_GRAPH_VENDOR=" ascend", DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "vendor_graph.ascend"


def test_a_worker_with_an_unknown_vendor_lists_the_vendors_and_stays_off():
    pytest.importorskip("lmdeploy")
    proc = _child(WORKER, VENDOR_GRAPH_VENDOR="banana", DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "lmdeploy.pytorch.models.utils.cudagraph"
    assert "VENDOR_GRAPH_VENDOR='banana': expected one of ascend, camb, maca, cuda" in proc.stderr
    assert "graph mode stays off in this process" in proc.stderr and "vendor_graph.banana" not in proc.stderr
    proc = _child("import vendor_graph.ascend", VENDOR_GRAPH_VENDOR="banana", DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode != 0 and "SettingsError: VENDOR_GRAPH_VENDOR='banana'" in proc.stderr
    assert "vendor_graph.banana" not in proc.stderr


def test_a_worker_with_a_bad_setting_fails_at_activation_and_a_bad_switch_arms_nothing():
    pytest.importorskip("lmdeploy")
    proc = _child(WORKER, VENDOR_GRAPH_VENDOR="ascend", VENDOR_GRAPH_SEQLEN_UPDATE="sometimes",
                  DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode != 0 and "SettingsError: VENDOR_GRAPH_SEQLEN_UPDATE='sometimes'" in proc.stderr
    proc = _child(WORKER, VENDOR_GRAPH_VENDOR="ascend", VENDOR_GRAPH_DISABLE_AUTOLOAD="yes",
                  DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode == 0 and proc.stdout.strip() == "lmdeploy.pytorch.models.utils.cudagraph"
    proc = _child(WORKER, VENDOR_GRAPH_VENDOR="ascend", VENDOR_GRAPH_DISABLE_AUTOLOAD="2",
                  DLINFER_STUB_VENDOR="ascend")
    assert proc.returncode == 0 and proc.stdout.strip() == "lmdeploy.pytorch.models.utils.cudagraph"
    assert "VENDOR_GRAPH_DISABLE_AUTOLOAD='2': expected 1/0" in proc.stderr


def test_the_doctor_exits_1_for_a_value_activation_would_refuse():
    env = {k: v for k, v in os.environ.items() if not k.startswith("VENDOR_GRAPH_")}
    proc = subprocess.run([sys.executable, "-m", "vendor_graph", "doctor"], capture_output=True, text=True,
                          timeout=300, env={**env, "VENDOR_GRAPH_SHADOW_TOL": "nan"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "! VENDOR_GRAPH_SHADOW_TOL='nan': expected a finite number >= 0" in proc.stdout
    assert "no problems found" not in proc.stdout


@pytest.mark.parametrize(("text", "sizes"), [("1,2,4,8", (1, 2, 4, 8)), (" 8 4  2 ", (8, 4, 2)), ("[3, 5]", (3, 5))])
def test_capture_sizes_take_a_list_in_any_spelling(text, sizes):
    assert settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": text}).capture_sizes == sizes


def test_capture_sizes_take_a_plan_file_a_json_list_or_plain_text(tmp_path):
    plan, listed, plain = tmp_path / "plan.json", tmp_path / "list.json", tmp_path / "sizes.txt"
    plan.write_text(json.dumps({"capture_sizes": [3, 9, 64], "padded_fraction_after": 0.1}))
    listed.write_text("[2, 6]")
    plain.write_text("1 2\n4\n")
    for path, sizes in ((plan, (3, 9, 64)), (listed, (2, 6)), (plain, (1, 2, 4))):
        assert settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)}).capture_sizes == sizes


@pytest.mark.parametrize("text", ["0,2", "-1", "two", "/no/such/plan.json", "1.5,2"])
def test_bad_capture_sizes_are_an_error_naming_the_fix(text, tmp_path):
    with pytest.raises(settings.SettingsError, match="VENDOR_GRAPH_CAPTURE_SIZES.*Fix: give positive whole numbers"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": text})


def test_a_plan_file_without_sizes_is_an_error(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"capture_sizes": []}))
    with pytest.raises(settings.SettingsError, match="VENDOR_GRAPH_CAPTURE_SIZES"):
        settings.parse({"VENDOR_GRAPH_CAPTURE_SIZES": str(path)})


@pytest.mark.parametrize(("text", "value"), [("1048576", 2**20), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30),
                                             ("1.5g", int(1.5 * 2**30)), ("64k", 64 * 1024), ("AUTO", "auto"),
                                             ("off", "off"), ("", "auto")])
def test_graph_memory_takes_bytes_with_units_or_a_word(text, value):
    assert settings.parse({"VENDOR_GRAPH_GRAPH_MEMORY": text}).graph_memory == value


@pytest.mark.parametrize("text", ["lots", "-5MiB", "3 parsecs", "1e9"])
def test_bad_graph_memory_is_an_error_naming_the_fix(text):
    with pytest.raises(settings.SettingsError, match="VENDOR_GRAPH_GRAPH_MEMORY.*Fix: write bytes"):
        settings.parse({"VENDOR_GRAPH_GRAPH_MEMORY": text})


def test_plan_and_stats_settings():
    parsed = settings.parse({"VENDOR_GRAPH_PLAN": "Auto", "VENDOR_GRAPH_PLAN_MAX_GRAPHS": "5",
                             "VENDOR_GRAPH_STATS_FILE": "/tmp/s.json", "VENDOR_GRAPH_STATS_EVERY": "0"})
    assert (parsed.plan, parsed.plan_max_graphs, parsed.stats_file, parsed.stats_every) == ("auto", 5, "/tmp/s.json", 0)
    with pytest.raises(settings.SettingsError, match="VENDOR_GRAPH_PLAN_MAX_GRAPHS"):
        settings.parse({"VENDOR_GRAPH_PLAN_MAX_GRAPHS": "0"})
