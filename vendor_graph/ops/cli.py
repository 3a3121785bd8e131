"""``vendor-graph`` / ``python -m vendor_graph``: command-line entry points.

The parser and :func:`main`: the subcommands ``plan``, ``paths``, ``doctor`` and ``run`` (their functions are in
:mod:`vendor_graph.ops.commands`), and those other distributions add through the ``vendor_graph.commands`` entry
points (``demo``: the simulator package, ``vendor_graph_sim.demo``).

A user error (a bad argument or setting, an unsupported lmdeploy, a second vendor) exits with status 2 and
one line on stderr naming the fix; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import NoReturn

from .. import VENDORS
from ..install import patching
from ..sizing.buckets import MAX_BATCHES_LIMIT
from . import commands
from .commands import UsageError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
MAX_BATCHES_WHY = (f"{MAX_BATCHES_LIMIT} is vendor_graph's bound: lmdeploy's own max_batch_size defaults are "
                   f"128-1024 (256 on Ascend, Camb and MACA) and every live sequence holds a KV-cache block")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)", prog=self.prog)


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that are a user's to fix; anything else is a bug and keeps its traceback."""
    from ..config.settings import SettingsError
    from ..sizing.capacity import CapturePlanError
    from ..sizing.planning import PlanError
    from ..upstream import compat

    # CapturePlanError: capture-size settings a runner refuses where it is built (the demo builds one)
    return (UsageError, compat.UnsupportedLmdeploy, patching.VendorConflict, SettingsError, PlanError,
            CapturePlanError)


def count_type(flag: str, what: str, default: int | None = None, *, high: int | None = None,
                why_high: str = "") -> Callable[[str], int]:
    """An argparse type: an int from 1 (to ``high``), with a message naming ``flag`` and its range."""
    wanted = f"give {flag} 1 or more" if high is None else f"give {flag} from 1 to {high}"
    if default is not None:
        wanted += f" (default {default})"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number; {wanted}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{value}: {what}; {wanted}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{value} is too large: {why_high}; {wanted}")
        return value

    return parse


class OnceAction(argparse.Action):
    """``nargs="+"`` that may be given once: a second ``--capture-sizes`` would silently replace the first."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        if before is not None:
            first, second = " ".join(map(str, before)), " ".join(map(str, values))
            raise UsageError(f"{option_string} given twice ({option_string} {first} ... {option_string} {second}); "
                             f"give it once with every size: {option_string} {first} {second}",
                             prog=parser.prog)
        setattr(namespace, self.dest, values)


def generation_type(text: str) -> str:
    """A simulated torch_npu: a graph-API generation name (any case) or a torch_npu release on PyPI."""
    from ..config.settings import TorchNpuRelease
    from ..vendors.ascend.releases import GENERATIONS

    try:
        return TorchNpuRelease().parse(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a torch_npu graph-API generation ({', '.join(GENERATIONS)}) nor a torch_npu "
            f"release on PyPI; give one of those names or a release string such as 2.5.1 "
            f"(vendor-graph paths lists every release and its generation)") from None


def json_path_type(text: str) -> Path:
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a NUL byte, which no file name can: give a file path")
    path = Path(text).expanduser()
    try:
        if path.is_dir():
            raise argparse.ArgumentTypeError(f"{text} is a directory; give a file path such as {path / 'demo.json'}")
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(f"{text}: directory {path.parent} does not exist; create it first")
    except OSError as exc:  # a name too long for the file system (ENAMETOOLONG), a loop of links
        shown = text if len(text) <= 80 else text[:77] + "..."
        raise argparse.ArgumentTypeError(f"{shown} cannot be a file path here ({exc.strerror or exc}); give a "
                                         f"shorter path") from None
    return path


PLUGIN_GROUP = "vendor_graph.commands"  # entry points: a function that adds its subcommand to the parser
DEMO_MISSING = ("the demo comes with the simulator package, which is not installed here: pip install ./sim from a "
                "clone of vendor_graph (scripts/demo.sh does), then run vendor-graph demo again")


def _add_plugin_commands(sub: argparse._SubParsersAction) -> None:
    """Subcommands other distributions supply (``demo``: the simulator package, vendor-graph-sim)."""
    for entry in metadata.entry_points(group=PLUGIN_GROUP):
        entry.load()(sub)
    if "demo" not in sub.choices:
        demo = sub.add_parser("demo", help="lmdeploy's pipeline on the simulated NPU (needs vendor-graph-sim)",
                              add_help=False, prefix_chars="+")
        demo.add_argument("rest", nargs=argparse.REMAINDER)
        demo.set_defaults(handler=_demo_missing)


def _demo_missing(args: argparse.Namespace) -> int:
    raise UsageError(DEMO_MISSING)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="vendor-graph", description=__doc__.splitlines()[0])
    parser.add_argument("--log-level", default="WARNING", type=str.upper, choices=LOG_LEVELS)
    sub = parser.add_subparsers(dest="command", required=True)
    plan = sub.add_parser("plan", help="activate a vendor here and print its capture plan and patch status, or "
                                       "fit capture sizes to recorded stats (--from-stats)")
    plan.add_argument("--vendor", choices=VENDORS, default=None, help="default ascend")
    plan.add_argument("--max-batches", default=None, help="lmdeploy's max_batch_size (default 256)",
                      type=count_type("--max-batches", "lmdeploy's max_batch_size is at least 1", 256,
                                       high=MAX_BATCHES_LIMIT, why_high=MAX_BATCHES_WHY))
    plan.add_argument("--capture-sizes", nargs="+", default=None, action=OnceAction,
                      type=count_type("--capture-sizes", "a graph holds at least 1 sequence"),
                      help="explicit cudagraph_capture_batch_sizes, as given to lmdeploy; with --from-stats: "
                           "sizes the plan must hold")
    plan.add_argument("--from-stats", nargs="+", default=None, metavar="FILE",
                      help="fit capture sizes to the decode steps recorded in these stats files "
                           "(VENDOR_GRAPH_STATS_FILE); activates nothing")
    plan.add_argument("--max-graphs", default=None,
                      type=count_type("--max-graphs", "at least one graph (max_batch_size) is captured"),
                      help="with --from-stats: the most sizes to capture (default: as many as the recorded run)")
    plan.add_argument("--json", action="store_true",
                      help="with --from-stats: print the plan as one JSON object (a VENDOR_GRAPH_CAPTURE_SIZES file)")
    plan.set_defaults(handler=commands.cmd_plan)
    paths = sub.add_parser("paths", help="print the torch_npu release -> seq-len update path table (markdown)")
    paths.set_defaults(handler=commands.cmd_paths)
    doctor = sub.add_parser("doctor", help="check this environment: runtimes, versions, patch owners, settings")
    doctor.add_argument("--vendor", choices=VENDORS, default=None,
                        help="also activate this vendor here and show who owns CudaGraphMixin then")
    doctor.set_defaults(handler=commands.cmd_doctor)
    run = sub.add_parser("run", help="run an lmdeploy command with the vendor active in it and its workers")
    run.add_argument("--vendor", choices=VENDORS, required=True)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command, e.g. lmdeploy serve api_server ...")
    run.set_defaults(handler=commands.cmd_run)
    _add_plugin_commands(sub)
    return parser


BROKEN_PIPE_STATUS = 128 + getattr(signal, "SIGPIPE", 13)  # what a shell reports for a writer killed by SIGPIPE


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush raises nothing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def _one_line(message: str) -> str:
    """A message of several lines (a list of problems) as one: items after a colon, then ``; ``-separated."""
    parts = [line.strip() for line in message.splitlines() if line.strip()]
    text = parts[0] if parts else ""
    for part in parts[1:]:
        text += (" " if text.endswith(":") else "; ") + part
    return text


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = "vendor-graph"
    try:
        # Every command that needs a vendor active activates it itself; the others only read vendors' facts.
        args = build_parser().parse_args(argv)
        args.argv = argv
        prog = f"vendor-graph {args.command}"
        logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s")
        status = args.handler(args)
        sys.stdout.flush()
        return status
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader went away (`vendor-graph paths | head`): stop quietly, as `cat` does
        _quiet_stdout()
        return BROKEN_PIPE_STATUS
    except Exception as exc:
        if not isinstance(exc, _user_errors()):
            raise
        where = exc.prog if isinstance(exc, UsageError) and exc.prog else prog
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _quiet_stdout()
        print(f"{where}: error: {_one_line(str(exc))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
