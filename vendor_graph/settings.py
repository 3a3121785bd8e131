"""Every ``VENDOR_GRAPH_*`` environment variable, declared once and parsed by one function.

Each field of :class:`Settings` is one variable (``shadow_tol``: ``VENDOR_GRAPH_SHADOW_TOL``), declared
there with its kind, default and meaning. :func:`load` parses the environment when a vendor activates,
when the autoload hook runs in a worker and when a graph runner is built; everything else reads
:func:`current`, the frozen result of the latest parse. Names only the repository's scripts, tests or
simulator read are listed in :data:`TOOLING`, so that ``vendor-graph doctor`` knows them. Imports
neither torch nor lmdeploy: the autoload hook reads this module at interpreter start.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import REFERENCE_VENDORS, VENDORS, _values

PREFIX = "VENDOR_GRAPH_"


# -- kinds: how a variable's text becomes a value --------------------------------------------------------


class Kind:
    """Parses a variable's stripped, non-empty text; raises ValueError for text it does not accept."""

    accepted = ""  # what it accepts, for errors and the doctor
    advice = ""  # how to write a good value

    def parse(self, text: str) -> Any:
        raise NotImplementedError

    def show(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Flag(Kind):
    accepted = "1/0, true/false, yes/no or on/off (any case)"
    advice = "use 1 (on) or 0 (off)"

    def parse(self, text: str) -> bool:
        word = text.lower()
        if word in ("1", "true", "yes", "on"):
            return True
        if word in ("0", "false", "no", "off"):
            return False
        raise ValueError(text)

    def show(self, value: Any) -> str:
        return "on" if value else "off"


@dataclass(frozen=True)
class Whole(Kind):
    minimum: int = 0
    off: tuple[str, ...] = ()  # words (any case) that give None, which the setting's ``none`` describes

    @property
    def accepted(self) -> str:
        return f"a whole number N >= {self.minimum}"

    @property
    def advice(self) -> str:
        return f"write a whole number >= {self.minimum} in digits"

    def parse(self, text: str) -> int | None:
        if text.lower() in self.off:
            return None
        value = int(text)
        if value < self.minimum:
            raise ValueError(text)
        return value


@dataclass(frozen=True)
class Number(Kind):
    minimum: float = 0.0

    @property
    def accepted(self) -> str:
        return f"a finite number >= {self.minimum:g}"

    @property
    def advice(self) -> str:
        return f"write a finite number >= {self.minimum:g}, such as 0.01 or 1e-3"

    def parse(self, text: str) -> float:
        value = float(text)
        if not math.isfinite(value) or value < self.minimum:
            raise ValueError(text)
        return value

    def show(self, value: Any) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    @property
    def accepted(self) -> str:
        return f"one of {', '.join(self.values)} (any case)"

    @property
    def advice(self) -> str:
        return f"use {', '.join(self.values[:-1])} or {self.values[-1]}"

    def parse(self, text: str) -> str:
        word = text.lower()
        if word not in self.values:
            raise ValueError(text)
        return word


@dataclass(frozen=True)
class Text(Kind):
    accepted = "any text"

    def parse(self, text: str) -> str:
        return text


@dataclass(frozen=True)
class SourceTree(Kind):
    """A directory holding ``<package>/__init__.py`` (a source checkout's root); the value is its absolute path."""

    package: str = ""

    @property
    def accepted(self) -> str:
        return f"a directory holding {self.package}/__init__.py (a {self.package} source checkout's root)"

    @property
    def advice(self) -> str:
        return f"give the checkout's root, the folder that holds the {self.package}/ package"

    def parse(self, text: str) -> str:
        root = os.path.abspath(os.path.expanduser(text))
        if not os.path.isfile(os.path.join(root, self.package, "__init__.py")):
            raise ValueError(text)
        return root


@dataclass(frozen=True)
class SizeList(Kind):
    """Graph batch sizes: a list (``1,2,4,8``, ``1 2 4 8`` or ``[1, 2, 4, 8]``) or a file holding one: the JSON
    of ``vendor-graph plan --json`` (its ``capture_sizes``), a JSON list, or the sizes as text."""

    accepted = ("batch sizes such as 1,2,4,8 (commas, spaces or a JSON list), or a file holding them "
                "(vendor-graph plan --json output, a JSON list or plain text)")
    advice = "give positive whole numbers, such as 1,2,4,8,16,32,64, or the path of a vendor-graph plan --json file"

    def parse(self, text: str) -> tuple[int, ...]:
        if re.fullmatch(r"[\[\]\d\s,]+", text) and re.search(r"\d", text):
            return self._sizes(text)
        path = os.path.expanduser(text)
        if not os.path.isfile(path):
            raise ValueError(text)
        with open(path, encoding="utf-8") as f:
            body = f.read()
        try:
            data = json.loads(body)
        except ValueError:
            return self._sizes(body)
        if isinstance(data, dict):
            data = data.get("capture_sizes")
        if not isinstance(data, list) or not data or not all(type(v) is int and v >= 1 for v in data):
            raise ValueError(text)
        return tuple(data)

    @staticmethod
    def _sizes(text: str) -> tuple[int, ...]:
        values = tuple(int(v) for v in re.split(r"[\s,\[\]]+", text) if v)
        if not values or min(values) < 1:
            raise ValueError(text)
        return values

    def show(self, value: Any) -> str:
        return ",".join(map(str, value))


@dataclass(frozen=True)
class Bytes(Kind):
    """A byte count (``512MiB``, ``2GiB``, ``1.5G``, ``1048576``), or a word of ``words`` (any case)."""

    words: tuple[str, ...] = ()

    @property
    def accepted(self) -> str:
        extra = f", or {'/'.join(self.words)}" if self.words else ""
        return "a byte count such as 1073741824, 512MiB or 2GiB" + extra

    @property
    def advice(self) -> str:
        return "write bytes with an optional unit (KiB, MiB, GiB; K, M, G mean the same)" + (
            f", or {self.words[0]}" if self.words else "")

    def parse(self, text: str) -> int | str:
        word = text.lower()
        if word in self.words:
            return word
        match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?", word)
        if match is None:
            raise ValueError(text)
        return int(float(match.group(1)) * 1024 ** "_kmgt".index(match.group(2) or "_"))

    def show(self, value: Any) -> str:
        return value if isinstance(value, str) else f"{value} bytes ({value / 2**20:.1f} MiB)"


@dataclass(frozen=True)
class Selection(Kind):
    """``words`` (any case), or a comma-separated list of names from a catalogue (``names`` is called when a value
    is parsed or described, so the catalogue's module is imported only then)."""

    names: Callable[[], tuple[str, ...]]
    words: tuple[str, ...] = ("auto", "off")

    @property
    def values(self) -> tuple[str, ...]:
        return self.words + self.names()

    @property
    def accepted(self) -> str:
        return f"{' or '.join(self.words)}, or a comma-separated list of: {', '.join(self.names())} (any case)"

    @property
    def advice(self) -> str:
        return f"use {' or '.join(self.words)}, or names among {', '.join(self.names())} separated by commas"

    def parse(self, text: str) -> str | tuple[str, ...]:
        word = text.lower()
        if word in self.words:
            return word
        chosen = [part.strip().lower() for part in text.split(",") if part.strip()]
        if not chosen or any(name not in self.names() for name in chosen):
            raise ValueError(text)
        return tuple(dict.fromkeys(chosen))

    def show(self, value: Any) -> str:
        return value if isinstance(value, str) else ",".join(value)


def _bridge_names() -> tuple[str, ...]:
    from .bridges import NAMES

    return NAMES


@dataclass(frozen=True)
class TorchNpuRelease(Kind):
    """A torch_npu graph-API generation (``G5``, any case) or a release or pre-release of the table
    (``2.9.0.post9``, ``2.10.0rc2`` also spelled ``2.10.0.rc2``); the value is the generation's or the table's
    canonical spelling."""

    @property
    def accepted(self) -> str:
        from .vendors.ascend.releases import GENERATIONS, KNOWN_VERSIONS, PRERELEASE_VERSIONS

        pre = ""
        if PRERELEASE_VERSIONS:
            pre = f" or pre-release from {PRERELEASE_VERSIONS[0]} to {PRERELEASE_VERSIONS[-1]}"
        return (f"a torch_npu generation ({', '.join(GENERATIONS)}) or a torch_npu release from {KNOWN_VERSIONS[0]} "
                f"to {KNOWN_VERSIONS[-1]}{pre}")

    advice = "name a generation such as G5, or a release that `vendor-graph paths` lists, such as 2.9.0.post9"

    def parse(self, text: str) -> str:
        from .vendors.ascend.releases import GENERATIONS, release_of

        by_name = {g.lower(): g for g in GENERATIONS}
        if text.lower() in by_name:
            return by_name[text.lower()]
        try:
            return release_of(text).version
        except (TypeError, ValueError):
            raise ValueError(text) from None


FLAG = Flag()


# -- declarations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One declared variable. ``kind`` None: a name the runtime never reads (``scope`` says whose it is)."""

    name: str
    meaning: str
    kind: Kind | None = None
    default: Any = None
    none: str = "unset"  # what the value None means, in words
    scope: str = "runtime"  # runtime, internal (set by the runtime itself), tooling (scripts and tests) or simulator
    field: str = ""  # its attribute on Settings

    def parse(self, raw: str | None) -> Any:
        """The value of ``raw`` (None: unset); :class:`SettingsError` when it is not accepted."""
        text = (raw or "").strip()
        if self.kind is None:
            return text
        if not text:
            return self.default
        try:
            return self.kind.parse(text)
        except ValueError:
            raise SettingsError([Problem(self, raw or "")]) from None

    def show(self, value: Any) -> str:
        if value is None:
            return self.none
        return self.kind.show(value) if self.kind is not None else str(value)

    @property
    def accepted(self) -> str:
        off = getattr(self.kind, "off", ())
        return self.kind.accepted + (f", or {'/'.join(off)} for {self.none}" if off else "")

    @property
    def advice(self) -> str:
        off = getattr(self.kind, "off", ())
        return self.kind.advice + (f", or {off[0]} for {self.none}" if off else "")


def _declare(kind: Kind, default: Any, meaning: str, *, none: str = "unset") -> Any:
    return dataclasses.field(default=default, metadata={"kind": kind, "meaning": meaning, "none": none})


@dataclass(frozen=True)
class Settings:
    """The parsed settings: each field is ``VENDOR_GRAPH_`` and its name in capitals."""

    vendor: str | None = _declare(Choice(VENDORS + REFERENCE_VENDORS), None,
                                  "vendor activated in this process and its workers", none="none")
    disable_autoload: bool = _declare(FLAG, False, "on: ignore VENDOR_GRAPH_VENDOR at interpreter start")
    allow_unsupported_lmdeploy: bool = _declare(FLAG, False, "on: activate on an unsupported lmdeploy release")
    disable: bool = _declare(FLAG, False, "on: graph mode off, every step eager (buffer patches stay)")
    debug: bool = _declare(FLAG, False, "on: detailed logs")
    shadow: int = _declare(Whole(), 0, "N: every Nth replay also runs eager and is compared (0: off)")
    shadow_action: str = _declare(Choice(("eager", "log")), "eager",
                                  "eager (default) or log: what a shadow divergence does")
    shadow_tol: float | None = _declare(Number(), None, "relative tolerance of the shadow comparison",
                                        none="by dtype")
    guard_weights_every: int = _declare(Whole(), 256, "replays between stale-weight checks (default 256, 0 off)")
    progress: bool | None = _declare(FLAG, None, "on/off: force the capture progress bar on/off",
                                     none="on a terminal")
    npu_event_budget: int | None = _declare(Whole(minimum=1, off=("0", "off", "none", "unlimited")), 1920,
                                            "Ascend: ExternalEvents the graphs may hold", none="no limit")
    seqlen_update: str = _declare(Choice(("auto", "graph-update", "task-update")), "auto",
                                  "Ascend: auto, graph-update or task-update")
    stats_file: str | None = _declare(Text(), None,
                                      "PATH: write the graph stats and batch histogram there as JSON (at exit and "
                                      "every VENDOR_GRAPH_STATS_EVERY minutes); several ranks: PATH.rank<N>",
                                      none="not written")
    stats_every: int = _declare(Whole(), 5, "minutes between stats file writes (default 5; 0: only at exit)")
    capture_sizes: tuple[int, ...] | None = _declare(SizeList(), None,
                                                     "the graph batch sizes to capture (a list or a file)",
                                                     none="the vendor's default sizes")
    plan: str = _declare(Choice(("off", "auto")), "off",
                         "auto: capture the sizes fitted to the batch histogram of VENDOR_GRAPH_STATS_FILE from the "
                         "previous run")
    plan_max_graphs: int | None = _declare(Whole(minimum=1), None, "VENDOR_GRAPH_PLAN=auto: at most N graphs",
                                           none="as many as the vendor's default sizes")
    graph_memory: int | str = _declare(Bytes(words=("auto", "off")), "auto",
                                       "device memory kept out of the KV cache for the graphs: auto (what the stats "
                                       "file's previous run measured), off, or a byte count")
    bridges: str | tuple[str, ...] = _declare(Selection(_bridge_names), "auto",
                                              "lmdeploy/dlinfer call bridges: auto (each where its signature check "
                                              "finds the gap), off, or the bridge names allowed")
    dlinfer_src: str | None = _declare(SourceTree("dlinfer"), None,
                                       "the dlinfer source tree the real-stack tests and demo run on the simulator",
                                       none="an installed dlinfer, if any")


def _runtime_settings() -> dict[str, Setting]:
    declared = {}
    for f in dataclasses.fields(Settings):
        name = PREFIX + f.name.upper()
        declared[name] = Setting(name, f.metadata["meaning"], f.metadata["kind"], f.default, f.metadata["none"],
                                 field=f.name)
    return declared


SETTINGS: dict[str, Setting] = _runtime_settings()
SIM_SWITCH = "VENDOR_GRAPH_SIM"  # vendor-graph-sim's: the simulated NPU in every interpreter (doctor shows it)
WORKER_REPORTS = "VENDOR_GRAPH_WORKER_REPORTS"  # vendor_graph.workers sets it for the workers lmdeploy spawns
TOOLING: dict[str, Setting] = {s.name: s for s in (
    Setting(WORKER_REPORTS, "set by vendor_graph in lmdeploy's spawned workers: the folder where a worker that "
            "dies leaves its error for the parent (vendor_graph.workers)", scope="internal"),
    Setting("VENDOR_GRAPH_TORCH_NPU_MANIFESTS", "the folder of torch_npu release manifests the simulator reads",
            scope="simulator"),
    Setting(SIM_SWITCH, "the simulator switch: every interpreter sees the simulated NPU of this torch_npu "
            "generation or release from its start (vendor_graph_sim.boot)", kind=TorchNpuRelease(), none="off",
            scope="simulator"),
    Setting("VENDOR_GRAPH_VENV", "the demo's virtualenv (scripts/setup-env.sh and demo.sh)", scope="tooling"),
    Setting("VENDOR_GRAPH_TEST_VENVS", "the folder of the test environments scripts/test.sh builds and uses "
            "(default .venvs)", scope="tooling"),
    Setting("VENDOR_GRAPH_LMDEPLOY_VERSIONS", "the lmdeploy releases scripts/test.sh tests", scope="tooling"),
    Setting("VENDOR_GRAPH_SKIP_OLDEST_TORCH", "1: scripts/test.sh leaves out the oldest-torch leg", scope="tooling"),
    Setting("VENDOR_GRAPH_MUTATIONS_ON", "the lmdeploy release scripts/test.sh runs the mutation checks with "
            "(default 0.17.0)", scope="tooling"),
    Setting("VENDOR_GRAPH_OLDEST_VENV", "the virtualenv of the oldest-torch leg", scope="tooling"),
    Setting("VENDOR_GRAPH_OLDEST_TORCH", "the torch release of the oldest-torch leg", scope="tooling"),
    Setting("VENDOR_GRAPH_OLDEST_LMDEPLOY", "the lmdeploy release of the oldest-torch leg", scope="tooling"),
    Setting("VENDOR_GRAPH_OLDEST_TORCH_LEG", "1: the tests run as the oldest-torch leg", scope="tooling"),
    Setting("VENDOR_GRAPH_WHEEL_CACHE", "where tests keep the torch_npu wheels they download", scope="tooling"),
    Setting("VENDOR_GRAPH_NETWORK_TESTS", "1: run the tests that download from PyPI", scope="tooling"),
    Setting("VENDOR_GRAPH_REEXTRACT", "the torch_npu releases the manifest re-extraction test checks",
            scope="tooling"),
    Setting("VENDOR_GRAPH_RANDOM_SCHEDULES", "random schedules the conformance suite runs", scope="tooling"),
    Setting("VENDOR_GRAPH_PROPERTY_EXAMPLES", "examples the property tests run", scope="tooling"),
    Setting("VENDOR_GRAPH_CONFORMANCE_SCHEDULES", "seeded schedules per decode-parity case", scope="tooling"),
    Setting("VENDOR_GRAPH_CONFORMANCE_GENERATIONS", "the torch_npu generations the decode-parity matrix runs "
            "(space-separated; default every one with a graph API)", scope="tooling"),
    Setting("VENDOR_GRAPH_REAL_STACK_GENERATIONS", "the torch_npu generations the real-stack leg runs (default all)",
            scope="tooling"),
)}
KNOWN: dict[str, Setting] = {**SETTINGS, **TOOLING}
_BY_FIELD = {s.field: s for s in SETTINGS.values()}


def declared(field: str) -> Setting:
    """The declaration of :class:`Settings` field ``field``."""
    return _BY_FIELD[field]


def variable(field: str) -> str:
    """The environment variable of :class:`Settings` field ``field``."""
    return _BY_FIELD[field].name


# -- errors ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A variable whose value is not accepted."""

    setting: Setting
    raw: str

    @property
    def name(self) -> str:
        return self.setting.name

    def __str__(self) -> str:
        s = self.setting
        return (f"{s.name}={self.raw!r}: expected {s.accepted} [{s.meaning}]. Fix: {s.advice}, or unset it for "
                f"the default ({s.show(s.default)})")


class SettingsError(ValueError):
    """One or more ``VENDOR_GRAPH_*`` values are not accepted; the message names each, and its fix.

    ``partial``: the settings with the default in place of each value not accepted.
    """

    def __init__(self, problems: Iterable[Problem], partial: Settings | None = None):
        self.problems = tuple(problems)
        self.partial = partial
        if len(self.problems) == 1:
            message = str(self.problems[0])
        else:
            message = f"{len(self.problems)} {PREFIX}* settings are not accepted:" + "".join(
                f"\n  {p}" for p in self.problems)
        super().__init__(message)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.problems)

    def __reduce__(self):
        return type(self), (self.problems, self.partial)


# -- parsing -----------------------------------------------------------------------------------------------


def parse(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of ``environ`` (default ``os.environ``); :class:`SettingsError` naming every bad value.
    ``environ``: a mapping of names to text (None: unset); TypeError naming the entry that is not text."""
    env = os.environ if environ is None else _values.environ("environ", environ, PREFIX)
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for setting in SETTINGS.values():
        try:
            values[setting.field] = setting.parse(env.get(setting.name))
        except SettingsError as exc:
            problems.extend(exc.problems)
    if problems:
        raise SettingsError(problems, Settings(**values))
    return Settings(**values)


_current: Settings | None = None


def load(environ: Mapping[str, str] | None = None) -> Settings:
    """Parse now and make the result :func:`current` (unchanged when parsing fails)."""
    global _current
    _current = parse(environ)
    return _current


def current() -> Settings:
    """The settings of the latest :func:`load` (loaded now if there was none)."""
    return _current if _current is not None else load()


def clear() -> None:
    """Forget the current settings: the next :func:`current` parses the environment again."""
    global _current
    _current = None


@dataclass(frozen=True)
class Reading:
    """One ``VENDOR_GRAPH_*`` variable as set: its declaration (None: unknown), its value or its problem."""

    name: str
    raw: str
    setting: Setting | None
    value: Any = None
    problem: Problem | None = None


def readings(environ: Mapping[str, str] | None = None) -> list[Reading]:
    """Every ``VENDOR_GRAPH_*`` variable set in ``environ`` (default ``os.environ``), by name, through
    the parser :func:`parse` uses."""
    env = os.environ if environ is None else _values.environ("environ", environ, PREFIX)
    out = []
    for name in sorted(k for k in env if isinstance(k, str) and k.startswith(PREFIX)):
        raw, setting = env[name], KNOWN.get(name)
        if setting is None:
            out.append(Reading(name, raw, None))
            continue
        try:
            out.append(Reading(name, raw, setting, setting.parse(raw)))
        except SettingsError as exc:
            out.append(Reading(name, raw, setting, problem=exc.problems[0]))
    return out


__all__ = ["KNOWN", "PREFIX", "SETTINGS", "TOOLING", "Bytes", "Choice", "Flag", "Kind", "Number", "Problem",
           "Reading", "Selection", "Setting", "Settings", "SettingsError", "SizeList", "Text", "TorchNpuRelease",
           "Whole", "clear", "current", "declared", "load", "parse", "readings", "variable"]
