"""What the public functions accept from Python callers, checked at their entry.

Where an int is meant: an int or any integer with ``__index__`` (numpy integer scalars), never a bool, a float
or a Decimal. Where a sequence of ints is meant: any iterable of such ints (list, tuple, range, a 1-d integer
array), never a str, bytes or a mapping. Anything else is refused with the argument's name and the type
expected, before it reaches code that would fail with a message from deep inside (numpy's "truth value of an
array is ambiguous", "int too large to convert to float"). Duck typing only: numpy is never imported here.
"""

from __future__ import annotations

import math
import numbers
import operator
import os
from collections.abc import Iterable, Mapping
from fractions import Fraction
from itertools import islice
from typing import Any

# Far above any count of tokens or steps a workload records (2**63: a signed 64-bit counter), far below what
# turns a float (and a printed figure) into an overflow.
COUNT_LIMIT = 2**63 - 1


def brief(value: Any) -> str:
    """``value``'s repr, short; an int too long to print (Python refuses over 4300 digits) as its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an int of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr that fails (an int over the digit limit inside a container)
        text = "<unprintable>"
    return text if len(text) <= 60 else text[:57] + "..."


def show(value: Any) -> str:
    """``value`` for a message: :func:`brief` and its type."""
    text = brief(value)
    return text if text.startswith("an int of") else f"{text} ({type(value).__name__})"


def is_index(value: Any) -> bool:
    """An int or an integer with ``__index__`` (a numpy integer), not a bool."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def whole(name: str, value: Any, error: type[Exception] = TypeError) -> int:
    """``value`` as an int: an int or an integer with ``__index__`` (a numpy integer), never a bool."""
    if type(value) is int:
        return value
    if not isinstance(value, bool):
        try:
            return operator.index(value)
        except TypeError:
            pass
    raise error(f"{name} must be an int (or a numpy integer), got {show(value)}")


def whole_sequence(name: str, values: Any, error: type[Exception] = TypeError, *,
                   limit: int | None = None) -> list[int]:
    """``values`` as a list of ints: any iterable of ints (list, tuple, range, a 1-d integer array), at most
    ``limit`` of them; a str, bytes, a mapping or a single number is refused naming ``name``."""
    return [whole(f"{name}[{i}]", value, error) for i, value in enumerate(items(name, values, error, limit=limit))]


def items(name: str, values: Any, error: type[Exception] = TypeError, *, limit: int | None = None) -> list:
    """The items of ``values``, unchecked: any iterable but a str, bytes, a mapping or a single number."""
    expected = f"{name} must be a sequence of ints (a list, tuple, range or 1-d integer array)"
    if isinstance(values, (str, bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise error(f"{expected}, got {show(values)}")
    try:
        given = list(values if limit is None else islice(values, limit + 1))
    except TypeError:  # a 0-d array is Iterable but cannot be iterated
        raise error(f"{expected}, got {show(values)}") from None
    if limit is not None and len(given) > limit:
        raise error(f"{name} holds more than {limit} values; give at most {limit}")
    return given


def count(name: str, value: Any, error: type[Exception] = ValueError) -> Fraction:
    """A finite, non-negative amount (tokens, steps), exactly: an int or numpy integer, a float or numpy float,
    a Fraction; never a bool, a Decimal, NaN, infinity or more than :data:`COUNT_LIMIT`."""
    if is_index(value):
        exact = Fraction(operator.index(value))
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise error(f"{name} must be a number (an int or a float), got {show(value)}")
    elif isinstance(value, Fraction):
        exact = value
    else:
        number = float(value)
        if not math.isfinite(number):
            raise error(f"{name} must be a finite number, got {show(value)}")
        exact = Fraction(number)
    if exact < 0:
        raise error(f"{name} must be 0 or more, got {show(value)}")
    if exact > COUNT_LIMIT:
        raise error(f"{name} is {show(value)}, above {COUNT_LIMIT} (2**63 - 1): no workload records that many")
    return exact


def path(name: str, value: Any, error: type[Exception] = TypeError) -> str | os.PathLike:
    """A file path: a str or an ``os.PathLike`` (never an int, which ``open`` would take for a file descriptor)."""
    if isinstance(value, str) or (isinstance(value, os.PathLike) and isinstance(os.fspath(value), str)):
        return value
    raise error(f"{name} must be a path (a str or pathlib.Path), got {show(value)}")


def environ(name: str, value: Any, prefix: str) -> Mapping[str, Any]:
    """A mapping of environment variables whose ``prefix`` names hold text (or None: unset)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping of variable name -> text, like os.environ, got {show(value)}")
    for key, text in value.items():
        if isinstance(key, str) and key.startswith(prefix) and text is not None and not isinstance(text, str):
            raise TypeError(f"{name}[{key!r}] must be a str (environment values are text), got {show(text)}; "
                            f"pass str(value), or None for unset")
    return value
