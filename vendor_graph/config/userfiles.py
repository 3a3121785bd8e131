"""The one reader of files a user names: stats files, plan files, capture-size files, manifests.

Every file vendor_graph reads because a user pointed at it (``plan --from-stats``, ``VENDOR_GRAPH_STATS_FILE``
for ``VENDOR_GRAPH_PLAN=auto``, graph memory and the doctor, ``VENDOR_GRAPH_CAPTURE_SIZES``, the simulator's
torch_npu manifest folder) is read here, and nowhere else calls ``json.load`` on one:

- a path must be a ``str`` or ``os.PathLike`` (an int would be taken for a file descriptor), naming a regular
  file (or a pipe: ``<(...)``), not a directory or a device;
- at most :data:`MAX_BYTES` are read (the size is checked, never trusted: a file that grows is cut there);
- the bytes must be UTF-8 (a byte-order mark is allowed); the first bad byte's offset is named;
- JSON must nest at most :data:`MAX_DEPTH` levels, found by scanning its brackets before the decoder runs
  (CPython's decoder recurses once per level and raises RecursionError at about a thousand);
- ``NaN`` and ``Infinity``, which Python's decoder accepts but JSON does not, are refused.

Every refusal is a :class:`UserFileError` (a ``ValueError``) of one line: the path, what is wrong with it, and the
caller's fix. :func:`expect` names a value of the wrong shape the same way. Standard library only.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

MAX_BYTES = 8 * 2**20  # a stats file of 65536 batch sizes and a few query lengths is under 4 MiB
MAX_DEPTH = 32  # vendor_graph's own files nest 5 levels deep
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


class UserFileError(ValueError):
    """A file a user named that cannot be used; the message names the path, the problem and the fix."""


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def check_path(path: Any, what: str = "path") -> Path:
    """``path`` as a :class:`~pathlib.Path` (``~`` expanded); :class:`UserFileError` where it is not a path.

    An int is refused rather than opened: ``open(1)`` would read (and then close) the caller's stdout."""
    if isinstance(path, bool) or not isinstance(path, (str, os.PathLike)):
        raise UserFileError(f"{what} {path!r} is a {type(path).__name__}, not a path: give a file path (a str or "
                            f"pathlib.Path)")
    try:
        text = os.fspath(path)
    except TypeError as exc:
        raise UserFileError(f"{what} {path!r} is not a path ({exc}): give a file path (a str or "
                            f"pathlib.Path)") from None
    if isinstance(text, bytes):
        raise UserFileError(f"{what} {path!r} is a bytes path: give it as a str")
    if not text.strip():
        raise UserFileError(f"{what} is empty: give a file path")
    if "\0" in text:
        raise UserFileError(f"{what} {text!r} holds a NUL byte, which no file name can: remove it")
    return Path(text).expanduser()


def read_bytes(path: Any, *, fix: str, what: str = "file", limit: int = MAX_BYTES) -> bytes:
    """At most ``limit`` bytes of the file at ``path``; :class:`UserFileError` (``path: problem; fix``) where it
    is missing, not a regular file or a pipe, unreadable, or longer than ``limit``."""
    path = check_path(path, what)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserFileError(f"{path}: no such file; {fix}") from None
    except OSError as exc:
        raise UserFileError(f"{path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserFileError(f"{path}: is a directory, not a {what}; {fix}")
    pipe = stat.S_ISFIFO(info.st_mode)
    if not (stat.S_ISREG(info.st_mode) or pipe):
        raise UserFileError(f"{path}: is not a regular file (a device or socket), not a {what}; {fix}")
    if info.st_size > limit:
        raise UserFileError(f"{path}: is {_mib(info.st_size)}, above the {_mib(limit)} vendor_graph reads from a "
                            f"{what}; {fix}")
    try:
        # A pipe nobody writes to reads as empty instead of blocking the open.
        fd = os.open(path, os.O_RDONLY | (os.O_NONBLOCK if pipe else 0))
    except OSError as exc:
        raise UserFileError(f"{path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    try:
        if pipe:
            os.set_blocking(fd, True)
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(limit + 1 - size, 2**20))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise UserFileError(f"{path}: cannot be read ({exc.strerror or exc}); {fix}") from None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise UserFileError(f"{path}: is more than the {_mib(limit)} vendor_graph reads from a {what}; {fix}")
    return data


def read_text(path: Any, *, fix: str, what: str = "file", limit: int = MAX_BYTES) -> str:
    """The file at ``path`` as text (:func:`read_bytes`, then strict UTF-8, a leading byte-order mark dropped)."""
    data = read_bytes(path, fix=fix, what=what, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{check_path(path, what)}: is not UTF-8 text (byte {exc.start} is "
                            f"{data[exc.start:exc.start + 1]!r}); {fix}") from None
    return text[1:] if text.startswith("\ufeff") else text


def json_depth(text: str, limit: int = MAX_DEPTH) -> int:
    """How deep the arrays and objects of JSON ``text`` nest, counted up to ``limit + 1`` (then it stops):
    strings are skipped, so brackets inside them do not count. Text that is not JSON gets a number too."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    # Peel the innermost pairs level by level (each pass runs in C): JSON nested within ``limit`` is gone by then.
    passes = 0
    while brackets and passes <= limit:
        peeled = _EMPTY_PAIR.sub("", brackets)
        if peeled == brackets:  # mismatched or unclosed brackets: walk what is left
            break
        brackets, passes = peeled, passes + 1
    if not brackets:
        return passes
    depth = deepest = 0
    for char in brackets:
        depth += 1 if char in "[{" else -1
        if depth > deepest:
            deepest = depth
            if passes + deepest > limit:
                break
    return passes + max(deepest, 1)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: Any, *, fix: str, what: str = "JSON file", limit: int = MAX_BYTES,
              max_depth: int = MAX_DEPTH) -> Any:
    """The JSON document in the file at ``path`` (:func:`read_text`), nested at most ``max_depth`` levels."""
    text = read_text(path, fix=fix, what=what, limit=limit)
    return loads(text, where=str(check_path(path, what)), fix=fix, max_depth=max_depth)


def loads(text: str, *, where: str, fix: str, max_depth: int = MAX_DEPTH) -> Any:
    """JSON ``text`` (read from ``where``) decoded with the same checks as :func:`read_json`."""
    if not text.strip():
        raise UserFileError(f"{where}: is empty, not JSON; {fix}")
    depth = json_depth(text, max_depth)
    if depth > max_depth:
        raise UserFileError(f"{where}: nests arrays or objects more than {max_depth} levels deep, vendor_graph's "
                            f"bound (its own files nest 5); {fix}")
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # pragma: no cover - the depth scan refuses this first
        raise UserFileError(f"{where}: nests too deep to decode; {fix}") from None
    except ValueError as exc:
        raise UserFileError(f"{where}: is not JSON ({exc}); {fix}") from None


def expect(value: Any, kind: type | tuple[type, ...], *, where: Any, name: str, fix: str) -> Any:
    """``value`` when it is a ``kind``; else :class:`UserFileError` naming ``where``, ``name`` and the JSON type
    it holds instead."""
    if isinstance(value, kind) and not (isinstance(value, bool) and bool not in _kinds(kind)):
        return value
    wanted = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in _kinds(kind))
    raise UserFileError(f"{where}: {name} is {_json_name(value)}, not {wanted}; {fix}")


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "a whole number", float: "a number",
               bool: "true/false"}


def _json_name(value: Any) -> str:
    if value is None:
        return "null"
    for kind in (bool, dict, list, str, int, float):
        if isinstance(value, kind):
            return _JSON_NAMES[kind]
    return type(value).__name__


__all__ = ["MAX_BYTES", "MAX_DEPTH", "UserFileError", "check_path", "expect", "json_depth", "loads", "read_bytes",
           "read_json", "read_text"]
