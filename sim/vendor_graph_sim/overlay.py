"""A dlinfer source tree with an overlay laid over it: the post-#350 dlinfer the tests run.

No whole snapshot of dlinfer after its PR #350 (commit ae9862a1) exists; only the files that commit changed do,
in ``../shared/third_party/dlinfer_pr350`` (its ``OVERLAY.md`` says what each one is). :func:`overlaid` copies a
base tree (dlinfer main a50184e, ``../shared/third_party/dlinfer``) into the user's cache, lays the overlay's
``dlinfer/`` and ``requirements/`` over it path for path, and returns the copy's root: a tree usable as
``VENDOR_GRAPH_DLINFER_SRC``. The copy is made once per pair of trees (its folder is named by their contents) and
shared by every process; nothing of either tree is changed.

``python -m vendor_graph_sim.overlay [BASE OVERLAY]`` prints the root (and, on stderr, what it laid over what).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

LAID = ("dlinfer", "requirements")  # the overlay's folders laid over the base
MARK = "OVERLAID.txt"  # written into every overlaid tree: what was laid over what


def _third_party() -> Path:
    return Path(__file__).resolve().parents[3] / "shared" / "third_party"


def default_base() -> Path:
    """dlinfer main a50184e beside the clone (``../shared/third_party/dlinfer``)."""
    return _third_party() / "dlinfer"


def default_overlay() -> Path:
    """dlinfer PR #350's changed files (commit ae9862a1) beside the clone (``../shared/third_party/dlinfer_pr350``)."""
    return _third_party() / "dlinfer_pr350"


def _files(root: Path, folders: tuple[str, ...]) -> list[Path]:
    out = []
    for folder in folders:
        for here, dirs, names in os.walk(root / folder):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            out += [Path(here, n) for n in sorted(names) if not n.endswith(".pyc")]
    return sorted(out)


def _content_key(base: Path, overlay: Path) -> str:
    """A digest of every file's relative path and bytes in both trees (the folders named, nothing else)."""
    digest = hashlib.sha256()
    for label, root, folders in (("base", base, LAID), ("overlay", overlay, LAID)):
        for path in _files(root, folders):
            digest.update(f"{label}:{path.relative_to(root)}\n".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:20]


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vendor_graph" / "dlinfer-overlaid"


def overlaid(base: Path | None = None, overlay: Path | None = None, *, say=None) -> Path:
    """The root of ``base`` with ``overlay``'s ``dlinfer/`` and ``requirements/`` laid over it, in the user's cache
    (made once per content; a second call returns the same folder). ``say(line)`` (default: print to stderr)
    is told what was laid over what. :class:`FileNotFoundError` when either tree has no ``dlinfer/``."""
    base = Path(base or default_base()).resolve()
    overlay = Path(overlay or default_overlay()).resolve()
    for root in (base, overlay):
        if not (root / "dlinfer").is_dir():
            raise FileNotFoundError(f"{root} holds no dlinfer/ folder")
    say = say or (lambda line: print(line, file=sys.stderr))
    laid = [p.relative_to(overlay) for p in _files(overlay, LAID)]
    target = _cache_root() / _content_key(base, overlay)
    what = (f"vendor_graph_sim.overlay: {len(laid)} file(s) of {overlay} laid over a copy of {base}: {target} "
            f"({', '.join(str(p) for p in laid)})")
    if (target / MARK).is_file():
        say(what + " (cached)")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    building = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    shutil.rmtree(building, ignore_errors=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in LAID:
        if (base / folder).is_dir():
            shutil.copytree(base / folder, building / folder, ignore=ignore)
    for relative in laid:
        (building / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(overlay / relative, building / relative)
    (building / MARK).write_text(f"base: {base}\noverlay: {overlay}\nlaid over the base:\n"
                                 + "".join(f"  {p}\n" for p in laid))
    try:
        os.rename(building, target)
    except OSError:  # another process made the same tree first
        shutil.rmtree(building, ignore_errors=True)
    say(what)
    return target


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (0, 2):
        print("usage: python -m vendor_graph_sim.overlay [BASE OVERLAY]", file=sys.stderr)
        return 2
    print(overlaid(*(Path(a) for a in args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
