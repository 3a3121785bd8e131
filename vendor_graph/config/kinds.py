"""How a ``VENDOR_GRAPH_*`` variable's text becomes a value, one kind per sort of value, each refusing what it does
not accept with the form it takes and a fix. Apart from the declarations so that other packages (the simulator)
declare their variables with the same kinds.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from .userfiles import MAX_DEPTH, UserFileError, json_depth, loads, read_text


def clipped_repr(value: Any) -> str:
    """``repr(value)``, cut to 200 characters."""
    text = repr(value)
    return text if len(text) <= 200 else text[:190] + "..." + text[-7:]


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
    """On or off, in the words people write for it."""

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
    """A whole number in a range; ``off`` words give None."""

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
    """A finite real number from ``minimum`` up."""

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
    """One word of ``values``, any case."""

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
    """Any text, as given."""

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
            raise Refused(f"{path}: capture_sizes is {clipped_repr(data)}, not a non-empty list of whole numbers of 1 "
                          f"or more; {fix}")
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

__all__ = ["FLAG", "Bytes", "Choice", "Flag", "Kind", "Number", "Refused", "Selection", "SizeList", "SourceTree",
           "Text", "TorchNpuRelease", "Whole", "WritableFile", "clipped_repr"]
