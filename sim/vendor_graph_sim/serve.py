"""lmdeploy's own OpenAI-compatible server under vendor_graph on the simulated NPU, driven by a real ``openai`` client.

:func:`start` runs what an operator runs, as a real subprocess in its own process group::

    vendor-graph run --vendor ascend -- lmdeploy serve api_server MODEL --backend pytorch --device ascend \\
        --server-name 127.0.0.1 --server-port PORT ... [--eager-mode]

with ``VENDOR_GRAPH_SIM`` (every process of the server sees the simulated torch_npu: the api_server, and the engine
process lmdeploy spawns for it), ``VENDOR_GRAPH_DLINFER_SRC`` and ``VENDOR_GRAPH_STATS_FILE`` in its environment, on
a free loopback port, and waits until ``/v1/models`` answers (bounded; a server that exits first fails at once with
the tail of its output; lmdeploy's own start-up race, :data:`STARTUP_RACE`, starts it again, recorded).
:func:`drive` sends a workload from several concurrent clients (threads, one ``openai.OpenAI`` each): chat
completions and completions, streamed and not, greedy (``temperature`` 0, ``top_k`` 1) with ``ignore_eos`` so every
answer has the length asked for, prompts of different lengths and ``max_tokens``, so the decode batch grows,
shrinks and queues behind ``--max-batch-size``. :func:`probe_bad_requests` sends requests the
server must refuse, each followed by a good one. :meth:`Server.stop` sends SIGTERM to the server (as a service
manager does) and waits, bounded, until no process of its group is left; then the stats file the engine process
wrote at exit is read. :func:`serve` does all of it and returns a :class:`ServeRun`; :func:`compare` runs a graph
and an eager server on one checkpoint and workload.

The client side imports neither torch nor lmdeploy: only ``openai`` and ``requests``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from . import engine

HOST = "127.0.0.1"  # loopback only
VENDOR = "ascend"
MAX_BATCH_SIZE = 4
CLIENTS = 6  # more than MAX_BATCH_SIZE: requests queue in the engine
REQUESTS = 12
READY_TIMEOUT = 300.0  # seconds from the start of the process to /v1/models answering
REQUEST_TIMEOUT = 180.0  # one request, streamed or not
STOP_TIMEOUT = 60.0  # SIGTERM to no process left in the server's group
KINDS = (("chat", False), ("completion", False), ("chat", True), ("completion", True))  # (endpoint, stream)
GREEDY = {"top_k": 1, "ignore_eos": True}  # lmdeploy's own request fields (extra_body); temperature 0 besides
TOO_LONG = engine.SESSION_LEN + 88  # prompt words (one token each) of the too-long probe
STATS_KEYS = ("format", "reason", "pid", "captures", "replays", "decode_steps", "batch_histogram", "eager_steps",
              "buckets", "capture_sizes", "max_batches", "runner")


# lmdeploy 0.16 to 0.18's ZMQMPEngine._start_mp_proc leaves its `with mp.Manager()` block, shutting the manager down,
# as soon as the engine process has published its RPC port inside `with condition:`; when the shutdown wins over the
# engine process's release of that condition, the engine process dies at start (EOFError in multiprocessing's
# managers.py) and the server exits with "PyTorch ZMQ engine process is not alive". A race of lmdeploy's own, more
# likely on a busy machine: :func:`start` starts the server again when its log shows it, and records that it did.
STARTUP_RACE = ("Process mp_engine_proc:", "multiprocessing/managers.py", "EOFError")
START_ATTEMPTS = 3


def startup_race(log: str) -> bool:
    """Whether ``log`` (a server's output) shows lmdeploy's engine-process start race (:data:`STARTUP_RACE`)."""
    return all(mark in log for mark in STARTUP_RACE)


class ServerError(RuntimeError):
    """The server did not start, answer or stop as it should (the message holds the tail of its output)."""


# -- the server -----------------------------------------------------------------------------------------------


def free_port() -> int:
    """A loopback TCP port nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _script(name: str) -> str:
    """The console script ``name`` of this interpreter's environment (else from PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"{name!r} is neither beside {sys.executable} nor on PATH: install it in this environment")
    return found


def lmdeploy_takes(flag: str) -> bool:
    """Whether the installed lmdeploy's CLI defines ``flag`` (read from its source: lmdeploy is not imported)."""
    spec = importlib.util.find_spec("lmdeploy")
    if spec is None or spec.origin is None:
        return False
    source = Path(spec.origin).parent / "cli" / "utils.py"
    return source.is_file() and f"'{flag}'" in source.read_text(encoding="utf-8")


def cache_flags() -> list[str]:
    """A fixed KV cache: ``--num-gpu-blocks`` where lmdeploy has it (0.18); before, a fraction of the simulated
    device's free memory that lmdeploy sizes the blocks from (:data:`engine.AUTO_CACHE_FRACTION`)."""
    if lmdeploy_takes("--num-gpu-blocks"):
        return ["--num-gpu-blocks", str(engine.FIXED_BLOCKS)]
    return ["--cache-max-entry-count", str(engine.AUTO_CACHE_FRACTION)]


def server_command(model_dir: Path, port: int, *, graph: bool, model_name: str,
                   max_batch_size: int = MAX_BATCH_SIZE, vendor: str = VENDOR) -> list[str]:
    """``vendor-graph run --vendor <vendor> -- lmdeploy serve api_server ... --device <vendor>`` with the engine
    settings of :mod:`vendor_graph_sim.engine` (block size, session length, a fixed cache)."""
    command = [_script("vendor-graph"), "run", "--vendor", vendor, "--",
               _script("lmdeploy"), "serve", "api_server", str(model_dir), "--backend", "pytorch", "--device", vendor,
               "--server-name", HOST, "--server-port", str(port), "--model-name", model_name,
               "--max-batch-size", str(max_batch_size), "--session-len", str(engine.SESSION_LEN),
               "--cache-block-seq-len", str(engine.BLOCK_SIZE), *cache_flags(), "--log-level", "ERROR"]
    if not graph:
        command.append("--eager-mode")
    return command


def vendor_of(switch: str) -> str:
    """The vendor whose simulated device the switch value ``switch`` names (``camb``, ``maca``; else Ascend's NPU)."""
    from .boot import CUDA_STYLE

    return switch.lower() if switch.lower() in CUDA_STYLE else VENDOR


def server_environment(*, generation: str, stats_file: Path, dlinfer_src: str | None = None,
                       environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: this process's) with the simulator switch, the dlinfer source and the stats file set;
    ``VENDOR_GRAPH_VENDOR`` is left to ``vendor-graph run``, and this environment's scripts come first on PATH."""
    env = dict(os.environ if environ is None else environ)
    env.pop("VENDOR_GRAPH_VENDOR", None)
    env["VENDOR_GRAPH_SIM"] = generation
    env["VENDOR_GRAPH_STATS_FILE"] = str(stats_file)
    if dlinfer_src is not None:
        env["VENDOR_GRAPH_DLINFER_SRC"] = str(dlinfer_src)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PATH"] = os.pathsep.join(p for p in (str(Path(sys.executable).parent), env.get("PATH")) if p)
    env["NO_PROXY"] = env["no_proxy"] = HOST  # the clients talk to the loopback server directly
    return env


@dataclasses.dataclass
class Shutdown:
    """What SIGTERM to the server did."""

    seconds: float  # SIGTERM to no process left in the group (or to giving up)
    returncode: int | None  # the server's exit status (None: it did not exit within the bound)
    strays: list[str]  # the processes of its group still running at the bound (pid and command line), then killed
    forced: bool  # SIGKILL was needed


def group_members(pgid: int) -> list[str]:
    """The live processes (not zombies) of process group ``pgid``: ``"pid command line"`` each."""
    found = []
    proc = Path("/proc")
    if not proc.is_dir():  # no /proc: only whether the group still exists
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [f"group {pgid}"]
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state, ppid, pgrp, ...
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue
        found.append(f"{entry.name} {cmdline[:300]}")
    return sorted(found)


@dataclasses.dataclass
class Server:
    """A running ``lmdeploy serve api_server`` under ``vendor-graph run``."""

    process: subprocess.Popen
    command: list[str]
    port: int
    model: str  # the served model name
    graph: bool
    stats_file: Path
    stdout: Path
    stderr: Path
    started: float  # time.monotonic() at the start of the process
    ready_seconds: float = 0.0
    restarts: list[str] = dataclasses.field(default_factory=list)  # why earlier attempts were started again

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's stderr, after the end of its stdout (lmdeploy logs its errors to stdout)."""
        tails = []
        for stream in (self.stdout, self.stderr):
            with contextlib.suppress(OSError):
                text = stream.read_text(errors="replace").strip()
                if text:
                    tails.append(f"[{stream.name}]\n{text[-chars:]}")
        return "\n".join(tails)

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> None:
        """Until ``/v1/models`` answers 200 with this server's model; :class:`ServerError` when the process exits
        first or ``timeout`` seconds pass."""
        deadline = self.started + timeout
        while True:
            if not self.alive():
                raise ServerError(f"the server exited with status {self.process.returncode} before it was ready; "
                                  f"its output ends:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/v1/models", timeout=5) as answer:
                    models = [m.get("id") for m in json.load(answer).get("data", [])]
                if self.model in models:
                    self.ready_seconds = round(time.monotonic() - self.started, 2)
                    return
            except (OSError, ValueError, urllib.error.URLError):
                pass
            if time.monotonic() > deadline:
                raise ServerError(f"the server did not answer /v1/models within {timeout:.0f} s; its output ends:\n"
                                  f"{self.log_tail()}")
            time.sleep(0.5)

    def stop(self, timeout: float = STOP_TIMEOUT) -> Shutdown:
        """SIGTERM to the server process, then wait until it and every process of its group are gone; what is
        left after ``timeout`` seconds is recorded and killed (SIGKILL to the group)."""
        pgid = self.process.pid
        start = time.monotonic()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
        deadline = start + timeout
        returncode = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            returncode = self.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        members = group_members(pgid)
        while members and time.monotonic() < deadline:
            time.sleep(0.2)
            members = group_members(pgid)
        seconds = round(time.monotonic() - start, 2)
        forced = bool(members) or returncode is None
        if forced:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=10)
            gone = time.monotonic() + 10  # a killed process stays in /proc until the kernel has torn it down
            while group_members(pgid) and time.monotonic() < gone:
                time.sleep(0.1)
        return Shutdown(seconds=seconds, returncode=returncode, strays=members, forced=forced)


def start(model_dir: Path, workdir: Path, *, graph: bool, generation: str = "G5", model_name: str | None = None,
          max_batch_size: int = MAX_BATCH_SIZE, dlinfer_src: str | None = None,
          environ: Mapping[str, str] | None = None, ready_timeout: float = READY_TIMEOUT) -> Server:
    """Start the server (its own process group, on a free loopback port) and wait until it is ready. Its stdout,
    stderr and stats file go to ``workdir``."""
    mode = "graph" if graph else "eager"
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    stats_file = workdir / f"stats-{mode}.json"
    env = server_environment(generation=generation, stats_file=stats_file, dlinfer_src=dlinfer_src, environ=environ)
    name = model_name or Path(model_dir).name
    restarts: list[str] = []
    for attempt in range(1, START_ATTEMPTS + 1):
        stats_file.unlink(missing_ok=True)  # what is read after SIGTERM is this server's, written as it exited
        port = free_port()
        command = server_command(Path(model_dir), port, graph=graph, model_name=name, max_batch_size=max_batch_size,
                                 vendor=vendor_of(generation))
        out, err = workdir / f"server-{mode}.out", workdir / f"server-{mode}.err"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env,
                                       cwd=str(workdir), start_new_session=True)
        server = Server(process, command, port, name, graph, stats_file, out, err, time.monotonic(),
                        restarts=restarts)
        try:
            server.wait_ready(ready_timeout)
            return server
        except ServerError:
            server.stop(timeout=15)
            log = server.log_tail(1 << 20)
            if "address already in use" in log.lower():  # another process took the free port first
                why = f"port {port} taken before the server bound it"
            elif startup_race(log):
                why = "lmdeploy's engine process died at start (its mp.Manager start race, STARTUP_RACE)"
            else:
                raise
            if attempt == START_ATTEMPTS:
                raise
            restarts.append(f"attempt {attempt}: {why}")
            for path in (out, err):  # kept beside the next attempt's
                path.rename(path.with_name(f"{path.stem}.attempt{attempt}{path.suffix}"))
    raise AssertionError("unreachable")


# -- the clients --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """One request of the workload."""

    index: int
    endpoint: str  # "chat" or "completion"
    stream: bool
    prompt: str
    max_tokens: int


def workload(seed: int = 0, requests: int = REQUESTS) -> list[Call]:
    """``requests`` calls over :func:`engine.workload`'s prompts (3 to 37 words) and lengths (8, 11, 14 ... new
    tokens), cycling through chat and completions, streamed and not."""
    return [Call(i, *KINDS[i % len(KINDS)], r.prompt, r.max_new_tokens)
            for i, r in enumerate(engine.workload(seed, requests=requests))]


@dataclasses.dataclass
class Answer:
    """What the server answered one :class:`Call`."""

    index: int
    endpoint: str
    stream: bool
    max_tokens: int
    prompt_words: int
    client: int
    status: int | None = None  # HTTP status: 200, or the error's
    error: str | None = None
    text: str = ""
    token_ids: list[int] | None = None  # chat completions (lmdeploy's return_token_ids); completions give none
    finish_reason: str | None = None
    completion_tokens: int | None = None  # the usage the server reported
    started: float = 0.0  # seconds since the workload started
    finished: float = 0.0

    @property
    def seconds(self) -> float:
        return round(self.finished - self.started, 3)


def _client(url: str, timeout: float) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{url}/v1", api_key="vendor-graph-sim", timeout=timeout, max_retries=0)


def _ask(client: Any, model: str, call: Call, answer: Answer) -> None:
    """Send ``call`` with the openai client and fill ``answer``."""
    common = dict(model=model, max_tokens=call.max_tokens, temperature=0.0)
    if call.endpoint == "chat":
        messages = [{"role": "user", "content": call.prompt}]
        extra = {**GREEDY, "return_token_ids": True}
        if not call.stream:
            reply = client.chat.completions.create(messages=messages, extra_body=extra, **common)
            choice = reply.choices[0]
            answer.text, answer.finish_reason = choice.message.content or "", choice.finish_reason
            answer.token_ids = list(getattr(choice, "output_ids", None) or [])
            answer.completion_tokens = reply.usage.completion_tokens if reply.usage else None
            return
        chunks = client.chat.completions.create(messages=messages, stream=True, extra_body=extra,
                                                stream_options={"include_usage": True}, **common)
        text, ids = [], []
        for chunk in chunks:
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                ids.extend(getattr(choice, "output_ids", None) or [])
                answer.finish_reason = choice.finish_reason or answer.finish_reason
            if chunk.usage is not None:
                answer.completion_tokens = chunk.usage.completion_tokens
        answer.text, answer.token_ids = "".join(text), ids
        return
    if not call.stream:
        reply = client.completions.create(prompt=call.prompt, extra_body=GREEDY, **common)
        answer.text, answer.finish_reason = reply.choices[0].text, reply.choices[0].finish_reason
        answer.completion_tokens = reply.usage.completion_tokens if reply.usage else None
        return
    chunks = client.completions.create(prompt=call.prompt, stream=True, extra_body=GREEDY,
                                       stream_options={"include_usage": True}, **common)
    text = []
    for chunk in chunks:
        for choice in chunk.choices:
            text.append(choice.text or "")
            answer.finish_reason = choice.finish_reason or answer.finish_reason
        if chunk.usage is not None:
            answer.completion_tokens = chunk.usage.completion_tokens
    answer.text = "".join(text)


def drive(server: Server, calls: Sequence[Call], clients: int = CLIENTS,
          timeout: float = REQUEST_TIMEOUT) -> list[Answer]:
    """``calls`` from ``clients`` concurrent clients (threads; client ``c`` sends calls ``c``, ``c + clients`` ...
    one after another), every request bounded by ``timeout`` seconds. Answers in the order of ``calls``."""
    import openai

    answers = {c.index: Answer(c.index, c.endpoint, c.stream, c.max_tokens, len(c.prompt.split()), i % clients)
               for i, c in enumerate(calls)}
    origin = time.monotonic()

    def run(mine: Sequence[Call]) -> None:
        client = _client(server.url, timeout)
        for call in mine:
            answer = answers[call.index]
            answer.started = round(time.monotonic() - origin, 3)
            try:
                _ask(client, server.model, call, answer)
                answer.status = 200
            except openai.APIStatusError as exc:
                answer.status, answer.error = exc.status_code, str(exc)[:500]
            except Exception as exc:  # noqa: BLE001 - recorded: what the server did is the finding
                answer.error = f"{type(exc).__name__}: {exc}"[:500]
            answer.finished = round(time.monotonic() - origin, 3)

    threads = [threading.Thread(target=run, args=(list(calls[c::clients]),), name=f"client-{c}", daemon=True)
               for c in range(min(clients, len(calls)))]
    for t in threads:
        t.start()
    deadline = origin + timeout * max(1, -(-len(calls) // max(1, clients))) + 30
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    for answer in answers.values():
        if answer.status is None and answer.error is None:
            answer.error = "no answer within the workload's bound"
    return [answers[c.index] for c in calls]


def most_concurrent(answers: Sequence[Answer]) -> int:
    """The most requests that were in flight at once."""
    events = sorted([(a.started, 1) for a in answers] + [(a.finished, -1) for a in answers])  # an end first
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


# -- requests the server must refuse ------------------------------------------------------------------------


@dataclasses.dataclass
class Probe:
    """One bad request, and the good request sent right after it."""

    case: str
    endpoint: str
    status: int | None  # the HTTP status of the bad request
    message: str
    alive: bool  # the server process still ran after it
    after_status: int | None  # the good request's
    after_tokens: int | None
    after_error: str | None = None


PROBE_CASES = ("unknown model", "max_tokens 0", "max_tokens negative", "prompt longer than the session",
               "malformed JSON")


def _bad_request(server: Server, case: str, endpoint: str, timeout: float) -> tuple[int | None, str]:
    import openai
    import requests

    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    if case == "malformed JSON":  # what no client library sends: raw bytes
        key = '"messages": [{"role": "user", "content": "bako"}' if endpoint == "chat" else '"prompt": "bako"'
        body = json.dumps({"model": server.model, "max_tokens": 4})[:-1] + ", " + key  # no closing brace
        reply = requests.post(server.url + path, data=body, headers={"Content-Type": "application/json"},
                              timeout=timeout)
        return reply.status_code, reply.text[:300]
    model, max_tokens, prompt = server.model, 4, "bako bami"
    if case == "unknown model":
        model = "no-such-model"
    elif case == "max_tokens 0":
        max_tokens = 0
    elif case == "max_tokens negative":
        max_tokens = -3
    elif case == "prompt longer than the session":
        prompt = " ".join(engine.vocabulary(64)[len(engine.SPECIAL):][i % 60] for i in range(TOO_LONG))
    else:
        raise ValueError(case)
    client = _client(server.url, timeout)
    try:
        if endpoint == "chat":
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=max_tokens, temperature=0.0, extra_body=GREEDY)
        else:
            client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
                                      extra_body=GREEDY)
    except openai.APIStatusError as exc:
        return exc.status_code, str(exc)[:300]
    except Exception as exc:  # noqa: BLE001 - no HTTP answer at all is the finding
        return None, f"{type(exc).__name__}: {exc}"[:300]
    return 200, "accepted"


def probe_bad_requests(server: Server, timeout: float = REQUEST_TIMEOUT,
                       endpoints: Sequence[str] = ("chat", "completion")) -> list[Probe]:
    """Each case of :data:`PROBE_CASES` on each endpoint, each followed by a good greedy request (4 tokens)."""
    import openai

    probes = []
    good = Call(-1, "chat", False, "bako bami", 4)
    for case in PROBE_CASES:
        for endpoint in endpoints:
            status, message = _bad_request(server, case, endpoint, timeout)
            alive = server.alive()
            after = Answer(-1, "chat", False, 4, 2, 0)
            try:
                _ask(_client(server.url, timeout), server.model, good, after)
                after.status = 200
            except openai.APIStatusError as exc:
                after.status, after.error = exc.status_code, str(exc)[:300]
            except Exception as exc:  # noqa: BLE001
                after.error = f"{type(exc).__name__}: {exc}"[:300]
            probes.append(Probe(case, endpoint, status, message, alive, after.status,
                                after.completion_tokens, after.error))
    return probes


# -- a whole run ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ServeRun:
    """One server's life: started, ready, the workload, the probes, SIGTERM, its stats file."""

    mode: str  # "graph" or "eager"
    generation: str
    lmdeploy: str
    command: list[str]
    clients: int
    port: int = 0
    restarts: list[str] = dataclasses.field(default_factory=list)  # :attr:`Server.restarts`
    answers: list[Answer] = dataclasses.field(default_factory=list)
    probes: list[Probe] = dataclasses.field(default_factory=list)
    ready_seconds: float = 0.0
    workload_seconds: float = 0.0
    most_concurrent: int = 0
    shutdown: Shutdown | None = None
    stats: dict[str, Any] | None = None  # the stats file after SIGTERM
    stats_problem: str | None = None  # why it is None, or incomplete
    wall_seconds: float = 0.0
    log_tail: str = ""

    @property
    def ok(self) -> list[Answer]:
        return [a for a in self.answers if a.status == 200]

    @property
    def token_count(self) -> int:
        return sum(a.completion_tokens or 0 for a in self.answers)


def read_stats(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The stats file and, if any, what is wrong with it (missing, not JSON, keys missing)."""
    if not path.is_file():
        return None, f"no stats file at {path}"
    try:
        document = json.loads(path.read_text())
    except ValueError as exc:
        return None, f"{path} is not valid JSON: {exc}"
    missing = [k for k in STATS_KEYS if k not in document]
    return document, (f"{path} lacks {', '.join(missing)}" if missing else None)


def serve(model_dir: Path, workdir: Path, calls: Sequence[Call], *, graph: bool, generation: str = "G5",
          clients: int = CLIENTS, probes: bool = False, model_name: str | None = None,
          max_batch_size: int = MAX_BATCH_SIZE, dlinfer_src: str | None = None,
          environ: Mapping[str, str] | None = None, ready_timeout: float = READY_TIMEOUT,
          request_timeout: float = REQUEST_TIMEOUT, stop_timeout: float = STOP_TIMEOUT) -> ServeRun:
    """Start a server, send ``calls`` (and the bad requests, ``probes``), stop it with SIGTERM, read its stats."""
    from importlib import metadata

    begin = time.monotonic()
    record = ServeRun(mode="graph" if graph else "eager", generation=generation,
                      lmdeploy=metadata.version("lmdeploy"), command=[], clients=clients)
    server = start(model_dir, workdir, graph=graph, generation=generation, model_name=model_name,
                   max_batch_size=max_batch_size, dlinfer_src=dlinfer_src, environ=environ,
                   ready_timeout=ready_timeout)
    record.command, record.port, record.ready_seconds = server.command, server.port, server.ready_seconds
    record.restarts = list(server.restarts)
    try:
        origin = time.monotonic()
        record.answers = drive(server, calls, clients, request_timeout)
        record.workload_seconds = round(time.monotonic() - origin, 2)
        record.most_concurrent = most_concurrent(record.answers)
        if probes:
            record.probes = probe_bad_requests(server, request_timeout)
    finally:
        record.shutdown = server.stop(stop_timeout)
        record.log_tail = server.log_tail(3000)
    record.stats, record.stats_problem = read_stats(server.stats_file)
    record.wall_seconds = round(time.monotonic() - begin, 2)
    return record


@dataclasses.dataclass
class Pair:
    """A graph-mode and an eager server on one checkpoint and workload."""

    graph: ServeRun
    eager: ServeRun

    def differences(self) -> list[str]:
        """Where the answers differ (text, token ids, finish reason, length, status)."""
        out = []
        for g, e in zip(self.graph.answers, self.eager.answers, strict=True):
            for field in ("status", "text", "token_ids", "finish_reason", "completion_tokens"):
                if getattr(g, field) != getattr(e, field):
                    out.append(f"request {g.index} ({g.endpoint}{', stream' if g.stream else ''}): {field} "
                               f"graph {str(getattr(g, field))[:80]!r}, eager {str(getattr(e, field))[:80]!r}")
                    break
        return out

    @property
    def equal(self) -> bool:
        return not self.differences() and len(self.graph.ok) == len(self.graph.answers) > 0


def compare(model: str = engine.MODELS[0], *, workdir: Path | None = None, seed: int = 0, requests: int = REQUESTS,
            clients: int = CLIENTS, generation: str = "G5", probes: bool = False,
            environ: Mapping[str, str] | None = None, dlinfer_src: str | None = None) -> Pair:
    """A graph-mode server (with the bad requests, ``probes``), then an eager one (``--eager-mode``), each sent
    the same workload, on one checkpoint of ``model`` (:func:`engine.write_model`)."""
    with contextlib.ExitStack() as stack:
        root = Path(workdir) if workdir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="vendor-graph-serve-")))
        checkpoint = engine.write_model(model, root / model, seed)
        calls = workload(seed, requests)
        kwargs = dict(generation=generation, clients=clients, model_name=model, environ=environ,
                      dlinfer_src=dlinfer_src)
        graph = serve(checkpoint, root / "graph", calls, graph=True, probes=probes, **kwargs)
        eager = serve(checkpoint, root / "eager", calls, graph=False, **kwargs)
    return Pair(graph, eager)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vendor_graph_sim.serve OUT.json [--model M] [--generation G] [--requests N] [--clients N]
    [--probes]``: :func:`compare`, written to OUT.json."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vendor_graph_sim.serve")
    parser.add_argument("out", type=Path)
    parser.add_argument("--model", choices=engine.MODELS, default=engine.MODELS[0])
    parser.add_argument("--generation", default="G5")
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--clients", type=int, default=CLIENTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--probes", action="store_true", help="also send the bad requests to the graph server")
    parser.add_argument("--workdir", type=Path, default=None, help="keep the servers' logs and stats there")
    args = parser.parse_args(argv)
    pair = compare(args.model, workdir=args.workdir, seed=args.seed, requests=args.requests, clients=args.clients,
                   generation=args.generation, probes=args.probes)
    args.out.write_text(json.dumps({"graph": dataclasses.asdict(pair.graph), "eager": dataclasses.asdict(pair.eager),
                                    "equal": pair.equal, "differences": pair.differences()}, indent=1))
    print(f"wrote {args.out}: answers {'equal' if pair.equal else 'DIFFERENT'}", file=sys.stderr)
    return 0 if pair.equal else 1


if __name__ == "__main__":
    sys.exit(main())
