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
import logging
import math
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .. import REFERENCE_VENDORS, VENDORS
from . import values as _values
from .userfiles import MAX_DEPTH, UserFileError, json_depth, loads, read_text

PREFIX = "VENDOR_GRAPH_"
logger = logging.getLogger("vendor_graph")


# -- kinds: how a variable's text becomes a value --------------------------------------------------------


class Refused(ValueError):
    """A kind's refusal that says why (the value is too large, a file cannot be read): the problem shows it."""


class Kind:
    """Parses a variable's stripped, non-empty text; raises ValueError for text it does not accept
    (:class:`Refused` where the reason is worth more than the accepted form)."""

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
    maximum: int | None = None  # the most its reader can use
    why_maximum: str = ""

    @property
    def accepted(self) -> str:
        if self.maximum is None:
            return f"a whole number N >= {self.minimum}"
        return f"a whole number N from {self.minimum} to {self.maximum}"

    @property
    def advice(self) -> str:
        if self.maximum is None:
            return f"write a whole number >= {self.minimum} in digits"
        return f"write a whole number from {self.minimum} to {self.maximum} in digits"

    def parse(self, text: str) -> int | None:
        if text.lower() in self.off:
            return None
        if len(text) > 30:
            raise ValueError(text)
        value = int(text)
        if value < self.minimum:
            raise ValueError(text)
        if self.maximum is not None and value > self.maximum:
            raise Refused(f"{value} is above {self.maximum}: {self.why_maximum}")
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

    file_bytes = 2**20  # a capture-size file holds a few hundred sizes at most

    def parse(self, text: str) -> tuple[int, ...]:
        if re.fullmatch(r"[\[\]\d\s,]+", text) and re.search(r"\d", text):
            return self._sizes(text)
        path = os.path.expanduser(text)
        if not os.path.exists(path):
            raise ValueError(text)
        fix = "give the sizes themselves (1,2,4,8) or a file of them (vendor-graph plan --json output, a JSON list)"
        try:
            body = read_text(path, fix=fix, what="capture-size file", limit=self.file_bytes)
            if body.lstrip()[:1] not in ("[", "{"):
                return self._sizes(body)
            if json_depth(body) <= MAX_DEPTH and re.fullmatch(r"[\[\]\d\s,]+", body) and re.search(r"\d", body):
                return self._sizes(body)  # a list of sizes, read as text whether or not its brackets close
            data = loads(body, where=path, fix=fix)
        except UserFileError as exc:
            raise Refused(str(exc)) from None
        if isinstance(data, dict):
            if "capture_sizes" not in data:
                raise Refused(f"{path}: holds a JSON object without capture_sizes (vendor-graph plan --json writes "
                              f"one); {fix}")
            data = data["capture_sizes"]
        if not isinstance(data, list) or not data or not all(type(v) is int and v >= 1 for v in data):
            raise Refused(f"{path}: capture_sizes is {_shown(data)}, not a non-empty list of whole numbers of 1 or "
                          f"more; {fix}")
        return tuple(data)

    @staticmethod
    def _sizes(text: str) -> tuple[int, ...]:
        values = tuple(int(v) for v in re.split(r"[\s,\[\]]+", text) if v)
        if not values or min(values) < 1:
            raise ValueError(text)
        return values

    def show(self, value: Any) -> str:
        return ",".join(map(str, value))


_BINARY_UNITS = {"": 0, "b": 0, "k": 1, "kib": 1, "m": 2, "mib": 2, "g": 3, "gib": 3, "t": 4, "tib": 4}
_DECIMAL_UNITS = {"kb": 1, "mb": 2, "gb": 3, "tb": 4}


@dataclass(frozen=True)
class Bytes(Kind):
    """A whole byte count (``512MiB``, ``2GiB``, ``1.5G``, ``1048576``) up to ``maximum``, or a word of ``words``
    (any case). ``MB``-style units are refused (10**6 or 2**20 bytes?), and so is a fraction of a byte."""

    words: tuple[str, ...] = ()
    maximum: int = 2**40
    why_maximum: str = "more memory than any accelerator has (the largest hold under 200 GiB)"

    @property
    def accepted(self) -> str:
        extra = f", or {'/'.join(self.words)}" if self.words else ""
        return f"a byte count such as 1073741824, 512MiB or 2GiB, at most {_binary(self.maximum)}" + extra

    @property
    def advice(self) -> str:
        return "write bytes, a whole number of them, with an optional unit (B, KiB, MiB, GiB, TiB; K, M, G, T mean " \
               "the same)" + (
            f", or {self.words[0]}" if self.words else "")

    def parse(self, text: str) -> int | str:
        word = text.lower()
        if word in self.words:
            return word
        match = re.fullmatch(r"(\d{1,20}(?:\.\d{1,20})?)\s*([a-z]*)", word)
        if match is None:
            raise ValueError(text)
        number, unit = match.groups()
        if unit in _DECIMAL_UNITS:
            power = _DECIMAL_UNITS[unit]
            binary = text[len(number):].strip()[:1].upper() + "iB"
            raise Refused(f"{binary[0]}B is ambiguous ({number}{binary[0]}B is {_whole(number, 1000 ** power)} bytes "
                          f"in SI units, {_whole(number, 1024 ** power)} in binary ones): write {number}{binary} for "
                          f"{number} x 2**{10 * power} bytes, or the byte count")
        if unit not in _BINARY_UNITS:
            raise Refused(f"{text[len(number):].strip()!r} is not a unit: use B, KiB, MiB, GiB or TiB (K, M, G, T mean "
                          f"the same)")
        value = Fraction(number) * 1024 ** _BINARY_UNITS[unit]
        if value.denominator != 1:
            raise Refused(f"{text} is {float(value):.6g} bytes, not a whole number of bytes: give whole bytes, or a "
                          f"fraction of a larger unit that is whole (0.5GiB = 512MiB)")
        if value > self.maximum:
            raise Refused(f"{text} is {int(value)} bytes, above {_binary(self.maximum)}: {self.why_maximum}")
        return int(value)

    def show(self, value: Any) -> str:
        return value if isinstance(value, str) else f"{value} bytes ({value / 2**20:.1f} MiB)"


def _whole(number: str, unit: int) -> str:
    value = Fraction(number) * unit
    return str(int(value)) if value.denominator == 1 else f"{float(value):.6g}"


def _binary(n: int) -> str:
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if n % 1024 ** power == 0:
            return f"{n // 1024 ** power}{unit}"
    return f"{n} bytes"


_KERNEL_TREES = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class WritableFile(Kind):
    """The path of a file vendor_graph writes (atomically: a temporary file beside it, then a rename): a regular
    file or none yet, in an existing, writable directory, outside the kernel's trees (``/proc``, ``/sys``,
    ``/dev``). The value is the text as given."""

    accepted = ("a file path in an existing, writable directory (not a directory, and not under /proc, /sys or "
                "/dev)")
    advice = "give a file in an existing directory, such as /tmp/vendor_graph_stats.json"

    def parse(self, text: str) -> str:
        if "\0" in text:
            raise ValueError(text)
        path = os.path.abspath(os.path.expanduser(text))
        real = os.path.realpath(path)
        for tree in _KERNEL_TREES:
            if real == tree or real.startswith(tree + os.sep):
                raise Refused(f"{real} is under {tree}, a kernel file system, not a place to keep a file")
        if os.path.isdir(real):
            raise Refused(f"{path} is a directory; give a file in it, such as "
                          f"{os.path.join(path, 'vendor_graph_stats.json')}")
        folder = os.path.dirname(real)
        if not os.path.isdir(folder):
            raise Refused(f"directory {folder} does not exist; create it first, or give a file in an existing "
                          f"directory")
        if os.path.lexists(real) and not stat.S_ISREG(os.stat(real).st_mode):
            raise Refused(f"{path} is not a regular file (a device, pipe or socket); give a file path")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise Refused(f"directory {folder} is not writable by this user (the file is written to a temporary "
                          f"file beside it, then renamed); give a file in a directory you can write")
        return text


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
    from ..install.bridges import NAMES

    return NAMES


@dataclass(frozen=True)
class TorchNpuRelease(Kind):
    """A torch_npu graph-API generation (``G5``, any case) or a release or pre-release of the table
    (``2.9.0.post9``, ``2.10.0rc2`` also spelled ``2.10.0.rc2``); the value is the generation's or the table's
    canonical spelling."""

    @property
    def accepted(self) -> str:
        from ..vendors.ascend.releases import GENERATIONS, KNOWN_VERSIONS, PRERELEASE_VERSIONS

        pre = ""
        if PRERELEASE_VERSIONS:
            pre = f" or pre-release from {PRERELEASE_VERSIONS[0]} to {PRERELEASE_VERSIONS[-1]}"
        return (f"a torch_npu generation ({', '.join(GENERATIONS)}) or a torch_npu release from {KNOWN_VERSIONS[0]} "
                f"to {KNOWN_VERSIONS[-1]}{pre}")

    advice = "name a generation such as G5, or a release that `vendor-graph paths` lists, such as 2.9.0.post9"

    def parse(self, text: str) -> str:
        from ..vendors.ascend.releases import GENERATIONS, release_of

        by_name = {g.lower(): g for g in GENERATIONS}
        if text.lower() in by_name:
            return by_name[text.lower()]
        try:
            return release_of(text).version
        except (TypeError, ValueError):
            raise ValueError(text) from None


FLAG = Flag()
# The periodic stats writer waits on a threading.Event, which refuses a timeout above threading.TIMEOUT_MAX.
STATS_EVERY_LIMIT = int(threading.TIMEOUT_MAX // 60)
STATS_EVERY_WHY = (f"the periodic stats writer waits with threading's timer, which cannot wait longer than "
                   f"threading.TIMEOUT_MAX ({STATS_EVERY_LIMIT} minutes here)")


def _shown(value: Any) -> str:
    """``repr(value)``, cut to 200 characters."""
    text = repr(value)
    return text if len(text) <= 200 else text[:190] + "..." + text[-7:]


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
WORKER_REPORTS = "VENDOR_GRAPH_WORKER_REPORTS"  # vendor_graph.install.workers sets it for the workers lmdeploy spawns
TOOLING: dict[str, Setting] = {s.name: s for s in (
    Setting(WORKER_REPORTS, "set by vendor_graph in lmdeploy's spawned workers: the folder where a worker that "
            "dies leaves its error for the parent (vendor_graph.install.workers)", scope="internal"),
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
    Setting("VENDOR_GRAPH_FUZZ_EXAMPLES", "examples each fuzz test (tests/fuzz) runs (default 80)", scope="tooling"),
    Setting("VENDOR_GRAPH_CONFORMANCE_SCHEDULES", "seeded schedules per decode-parity case", scope="tooling"),
    Setting("VENDOR_GRAPH_CONFORMANCE_GENERATIONS", "the torch_npu generations the decode-parity matrix runs "
            "(space-separated; default every one with a graph API)", scope="tooling"),
    Setting("VENDOR_GRAPH_REAL_STACK_GENERATIONS", "the torch_npu generations the real-stack leg runs (default all)",
            scope="tooling"),
)}
KNOWN: dict[str, Setting] = {**SETTINGS, **TOOLING}
_BY_FIELD = {s.field: s for s in SETTINGS.values()}


_warned_unknown: set[str] = set()


def closest(name: str) -> str | None:
    """The known ``VENDOR_GRAPH_*`` name closest to ``name`` (a typo's likely meaning), None where none is close."""
    import difflib

    if not isinstance(name, str):
        raise TypeError(f"name must be a variable name (a str), got {_values.show(name)}")
    # Compared without the common prefix, which would make every name look close to every other.
    tails = {known[len(PREFIX):]: known for known in KNOWN}
    near = difflib.get_close_matches(name[len(PREFIX):] if name.startswith(PREFIX) else name, list(tails), n=1)
    return tails[near[0]] if near else None


def unknown(environ: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """(name, closest known name) for each ``VENDOR_GRAPH_*`` variable of ``environ`` that vendor_graph does not
    know: a typo, which would otherwise do nothing without a word."""
    env = os.environ if environ is None else _values.environ("environ", environ, PREFIX)
    return [(name, closest(name)) for name in sorted(k for k in env if isinstance(k, str) and k.startswith(PREFIX)
                                                     and k not in KNOWN)]


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
    detail: str = ""  # why, where the kind says more than that the value is not accepted

    @property
    def name(self) -> str:
        return self.setting.name

    def __str__(self) -> str:
        s = self.setting
        why = self.detail or f"expected {s.accepted}"
        return (f"{s.name}={_shown(self.raw)}: {why} [{s.meaning}]. Fix: {s.advice}, or unset it for the default "
                f"({s.show(s.default)})")


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


__all__ = ["KNOWN", "PREFIX", "SETTINGS", "STATS_EVERY_LIMIT", "TOOLING", "Bytes", "Choice", "Flag", "Kind", "Number",
           "Problem", "Reading", "Refused", "Selection", "Setting", "Settings", "SettingsError", "SizeList", "Text",
           "TorchNpuRelease", "Whole", "WritableFile", "clear", "closest", "current", "declared", "load", "parse",
           "readings", "unknown", "unknown_message", "variable", "warn_unknown"]
