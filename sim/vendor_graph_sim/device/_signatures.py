"""Functions generated with the exact parameter lists a torch_npu wheel (or torch) declares: a keyword the real
function lacks raises ``TypeError`` here too. Shared by the simulated ``torch_npu.npu`` (:mod:`._torch_npu`),
the rest of torch_npu's surface (:mod:`._npu_surface`) and the CUDA-style graph API (:mod:`._cuda`).
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any


def _param_source(params: list[dict[str, Any]], skip_first: bool = False) -> tuple[str, str, dict[str, Any]]:
    parts: list[str] = []
    call: list[str] = []
    defaults: dict[str, Any] = {}
    star = False
    # before a *args parameter, arguments must be passed on by position
    positional = any(p["kind"] == "var_positional" for p in params)
    for i, p in enumerate(params):
        name, kind = p["name"], p["kind"]
        default = ""
        if "default" in p:
            key = f"_default_{i}"
            try:
                defaults[key] = ast.literal_eval(p["default"])
            except ValueError:
                defaults[key] = None
            default = f"={key}"
        if kind == "var_positional":
            parts.append(f"*{name}")
            call.append(f"*{name}")
            star = True
        elif kind == "var_keyword":
            parts.append(f"**{name}")
            call.append(f"**{name}")
        elif kind == "keyword_only":
            if not star:
                parts.append("*")
                star = True
            parts.append(name + default)
            call.append(f"{name}={name}")
        else:
            parts.append(name + default)
            call.append(name if positional and not star else f"{name}={name}")
        if kind == "positional_only" and (i + 1 == len(params) or params[i + 1]["kind"] != "positional_only"):
            parts.append("/")
    return ", ".join(parts), ", ".join(call), defaults


def generate(name: str, params: list[dict[str, Any]], impl: Callable[..., Any], qualname: str, module: str
             ) -> Callable[..., Any]:
    """A function named ``name`` with exactly ``params`` that forwards every argument by name to ``impl``."""
    signature, call, defaults = _param_source(params)
    namespace: dict[str, Any] = {"_impl": impl, **defaults}
    exec(f"def {name}({signature}):\n    return _impl({call})\n", namespace)  # noqa: S102
    fn = namespace[name]
    fn.__qualname__ = qualname
    fn.__module__ = module
    fn.__doc__ = f"Simulated {qualname} (parameters from the torch_npu wheel)."
    return fn
