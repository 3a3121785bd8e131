"""Every ``VENDOR_GRAPH_*`` variable vendor_graph reads, declared once (:class:`Settings`) and parsed by one
function; :func:`load` runs at activation, in the autoload hook and at a runner's build, the rest reads
:func:`current`. Variables only other packages read are declared by them (:func:`declared_elsewhere`). Imports
neither torch nor lmdeploy: the autoload hook reads it at interpreter start.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .. import REFERENCE_VENDORS, VENDORS
from . import values as _values
from .kinds import (
    FLAG,
    Bytes,
    Choice,
    Flag,
    Kind,
    Number,
    Refused,
    Selection,
    SizeList,
    SourceTree,
    Text,
    TorchNpuRelease,
    Whole,
    WritableFile,
    clipped_repr,
)

PREFIX = "VENDOR_GRAPH_"
logger = logging.getLogger("vendor_graph")

# The periodic stats writer waits on a threading.Event, which refuses a timeout above threading.TIMEOUT_MAX.
STATS_EVERY_LIMIT = int(threading.TIMEOUT_MAX // 60)
STATS_EVERY_WHY = (f"the periodic stats writer waits with threading's timer, which cannot wait longer than "
                   f"threading.TIMEOUT_MAX ({STATS_EVERY_LIMIT} minutes here)")


# The names VENDOR_GRAPH_BRIDGES takes: the bridges of install/bridges.py, in its order
# (tests/lmdeploy/test_bridges.py holds the two equal).
BRIDGE_NAMES = ("state-cache", "prefill-attention")


def _bridge_names() -> tuple[str, ...]:
    return BRIDGE_NAMES


# -- declarations ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """One declared variable: its meaning, kind and default, and whose it is (``scope``). ``kind`` None: taken as
    text, by a reader outside the runtime."""

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
        except Refused as exc:
            raise SettingsError([Problem(self, raw or "", str(exc))]) from None
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
    """A :class:`Settings` field that carries its variable's declaration."""
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
    stats_file: str | None = _declare(WritableFile(), None,
                                      "PATH: write the graph stats and batch histogram there as JSON (at exit and "
                                      "every VENDOR_GRAPH_STATS_EVERY minutes); several ranks: PATH.rank<N>",
                                      none="not written")
    stats_every: int = _declare(Whole(maximum=STATS_EVERY_LIMIT, why_maximum=STATS_EVERY_WHY), 5,
                                "minutes between stats file writes (default 5; 0: only at exit)")
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


def _runtime_settings() -> dict[str, Setting]:
    declared = {}
    for f in dataclasses.fields(Settings):
        name = PREFIX + f.name.upper()
        declared[name] = Setting(name, f.metadata["meaning"], f.metadata["kind"], f.default, f.metadata["none"],
                                 field=f.name)
    return declared


SETTINGS: dict[str, Setting] = _runtime_settings()
WORKER_REPORTS = "VENDOR_GRAPH_WORKER_REPORTS"
INTERNAL: dict[str, Setting] = {WORKER_REPORTS: Setting(
    WORKER_REPORTS, "set by vendor_graph in lmdeploy's spawned workers: the folder where a worker that dies leaves "
    "its error for the parent (vendor_graph.install.workers)", scope="internal")}
_OWN = {**SETTINGS, **INTERNAL}
# vendor-graph-sim declares and reads it; the CLI and the doctor only name it, to say that the NPU is simulated.
SIM_SWITCH = "VENDOR_GRAPH_SIM"
_BY_FIELD = {s.field: s for s in SETTINGS.values()}


def declared(field: str) -> Setting:
    """The declaration of :class:`Settings` field ``field``."""
    return _BY_FIELD[field]


def variable(field: str) -> str:
    """The environment variable of :class:`Settings` field ``field``."""
    return _BY_FIELD[field].name


# -- variables other packages declare ---------------------------------------------------------------------

VARIABLES_GROUP = "vendor_graph.variables"  # entry points: a sequence of Setting, the variables a package reads
_elsewhere: dict[str, Setting] | None = None


def declared_elsewhere() -> dict[str, Setting]:
    """The variables other installed packages declare through :data:`VARIABLES_GROUP` (vendor-graph-sim: the
    simulator's and the test harness's), by name. Looked up on the first name that is not vendor_graph's own, not
    at import: importlib.metadata alone costs tens of milliseconds at every interpreter start."""
    global _elsewhere
    if _elsewhere is None:
        from importlib import metadata

        found: dict[str, Setting] = {}
        for entry in metadata.entry_points(group=VARIABLES_GROUP):
            try:
                declarations = tuple(entry.load())
            except Exception as exc:  # noqa: BLE001 - another package's fault must not stop an activation
                logger.warning("vendor_graph: entry point %s (%s) does not load, so the variables it declares are "
                               "unknown: %s: %s", entry.value, VARIABLES_GROUP, type(exc).__name__, exc)
                continue
            for s in declarations:
                if not isinstance(s, Setting) or not s.name.startswith(PREFIX) or s.name in _OWN:
                    logger.warning("vendor_graph: entry point %s (%s) declares %s, not a Setting of a new %s* name; "
                                   "ignored", entry.value, VARIABLES_GROUP, clipped_repr(s), PREFIX)
                    continue
                found.setdefault(s.name, s)
        _elsewhere = found
    return _elsewhere


def declaration(name: str) -> Setting | None:
    """The declaration of variable ``name``, wherever it is declared; None: unknown."""
    own = _OWN.get(name)
    return own if own is not None else declared_elsewhere().get(name)


def known() -> dict[str, Setting]:
    """Every declared variable by name: the runtime's settings, the internal ones, those declared elsewhere."""
    return {**_OWN, **declared_elsewhere()}


# -- unknown names ------------------------------------------------------------------------------------------


_warned_unknown: set[str] = set()


def closest(name: str) -> str | None:
    """The known ``VENDOR_GRAPH_*`` name closest to ``name`` (a typo's likely meaning), None where none is close."""
    import difflib

    if not isinstance(name, str):
        raise TypeError(f"name must be a variable name (a str), got {_values.show(name)}")
    # Compared without the common prefix, which would make every name look close to every other.
    tails = {known_name[len(PREFIX):]: known_name for known_name in known()}
    near = difflib.get_close_matches(name[len(PREFIX):] if name.startswith(PREFIX) else name, list(tails), n=1)
    return tails[near[0]] if near else None


def unknown(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(name, closest known name) for each ``VENDOR_GRAPH_*`` variable of ``environ`` that is declared nowhere: a
    typo, which would otherwise do nothing without a word."""
    env = os.environ if environ is None else _values.environ("environ", environ, PREFIX)
    names = sorted(k for k in env if isinstance(k, str) and k.startswith(PREFIX) and k not in _OWN)
    return [(name, closest(name)) for name in names if name not in declared_elsewhere()]


def unknown_message(name: str, near: str | None) -> str:
    hint = f"did you mean {near}?" if near else f"known: {', '.join(sorted(SETTINGS))}"
    return f"{name} is not a vendor_graph setting and does nothing (a typo?); {hint}"


def warn_unknown(environ: Mapping[str, str] | None = None) -> list[str]:
    """Log a warning (once per name in this process) for each unknown ``VENDOR_GRAPH_*`` variable; returns the
    messages logged now."""
    logged = []
    for name, near in unknown(environ):
        if name in _warned_unknown:
            continue
        _warned_unknown.add(name)
        message = unknown_message(name, near)
        logger.warning("vendor_graph: %s", message)
        logged.append(message)
    return logged


# -- errors ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """A variable whose value is not accepted."""

    setting: Setting
    raw: str
    detail: str = ""  # why, where the kind says more than that the value is not accepted

    @property
    def name(self) -> str:
        return self.setting.name

    def __str__(self) -> str:
        s = self.setting
        why = self.detail or f"expected {s.accepted}"
        return (f"{s.name}={clipped_repr(self.raw)}: {why} [{s.meaning}]. Fix: {s.advice}, or unset it for the "
                f"default ({s.show(s.default)})")


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
        raw, setting = env[name], declaration(name)
        if setting is None:
            out.append(Reading(name, raw, None))
            continue
        try:
            out.append(Reading(name, raw, setting, setting.parse(raw)))
        except SettingsError as exc:
            out.append(Reading(name, raw, setting, problem=exc.problems[0]))
    return out


__all__ = ["INTERNAL", "PREFIX", "SETTINGS", "SIM_SWITCH", "STATS_EVERY_LIMIT", "VARIABLES_GROUP", "WORKER_REPORTS",
           "Bytes", "Choice", "Flag", "Kind", "Number", "Problem", "Reading", "Refused", "Selection", "Setting",
           "Settings", "SettingsError", "SizeList", "SourceTree", "Text", "TorchNpuRelease", "Whole", "WritableFile",
           "clear", "closest", "current", "declaration", "declared", "declared_elsewhere", "known", "load", "parse",
           "readings", "unknown", "unknown_message", "variable", "warn_unknown"]
