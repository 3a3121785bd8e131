"""The conformance kit: drive the tiny decoder through eager and graph runners side by side, step by
step, on the simulator, and check every step (tests/conformance and tools/soak.py use it)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import random
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from vendor_graph import vendors
from vendor_graph.upstream import compat

from . import kernels
from . import tiny_model as tm


def schedule(num_seqs: int, steps: int, seed: int, change_every: int = 3) -> list[list[int]]:
    """Active sequence sets: a new random batch size every few steps, sweeping across buckets."""
    rng = random.Random(seed)
    plan, active = [], list(range(num_seqs))
    for step in range(steps):
        if step % change_every == 0:
            size = rng.randint(1, num_seqs)
            active = sorted(rng.sample(range(num_seqs), size))
        plan.append(active)
    return plan


def retirements(num_seqs: int, steps: int, seed: int, every: int = 8) -> dict[int, tuple[int, list[int]]]:
    """step -> (sequence slot that finishes, the new prompt admitted in its place, reusing its blocks)."""
    rng = random.Random(seed + 1000)
    return {step: (rng.randrange(num_seqs), [rng.randrange(1, 256) for _ in range(rng.randint(3, 30))])
            for step in range(every - 1, steps, every)}


def prompts(num_seqs: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 256) for _ in range(rng.randint(3, 30))] for _ in range(num_seqs)]


@dataclass
class Configs:
    model_config: SimpleNamespace
    cache_config: SimpleNamespace
    backend_config: SimpleNamespace


def lmdeploy_configs(vendor: str, model: tm.TinyDecoder, max_batches: int, capture_sizes=None,
                     query_len: int = 1) -> Configs:
    """lmdeploy's model/cache/backend configs for the tiny model. The KV head dims are the model's
    (an MLA variant's differ, so lmdeploy's Ascend builder passes ``is_mla=True``); ``query_len`` > 1
    marks a speculative-decoding engine (``model_paradigm="ar_spec"``)."""
    c = model.config
    _, k_head_dim, v_head_dim = model.kv_cache_dims()
    model_config = SimpleNamespace(
        vocab_size=c.vocab_size, model_paradigm="ar_spec" if query_len > 1 else "ar", use_flash_mla=False,
        use_mla_fp8_cache=False, mla_index_topk=None, states_shapes=[], use_mrope=False, block_size=c.block_size,
        k_head_dim=k_head_dim, v_head_dim=v_head_dim, dtype=c.dtype, num_layers=c.num_layers)
    cache_config = SimpleNamespace(max_batches=max_batches, num_gpu_blocks=c.max_blocks_per_seq,
                                   cudagraph_capture_batch_sizes=capture_sizes, block_size=c.block_size,
                                   max_prefill_token_num=4096)
    backend_config = SimpleNamespace(eager_mode=False, device_type=vendor, piecewise_cudagraph_max_tokens=None)
    return Configs(model_config, cache_config, backend_config)


@dataclass
class SideBySide:
    """Two sessions over the same model and prompts: one eager, one through ``runner``."""

    model: tm.TinyDecoder
    runner: object
    eager: tm.DecodeSession
    graph: tm.DecodeSession
    steps: int = 0
    mismatches: list[str] = field(default_factory=list)
    counters: object = None  # the simulator's device-op counters over the schedule
    # None: bitwise (the simulator). On a real device, (rtol, atol) for hidden states and KV bytes;
    # greedy tokens must still be equal.
    tolerance: tuple[float, float] | None = None
    max_abs_diff: float = 0.0  # largest hidden-state difference seen (0.0: bitwise on every step)
    step_seconds: dict = field(default_factory=dict)  # "eager" / "graph" -> host seconds of each step's forward

    embeds_next: bool = False  # the next step feeds inputs_embeds (a multimodal step), in both sessions
    _embeds: bool = False

    def _kwargs(self, model, ctx) -> dict:
        kwargs = tm.forward_kwargs(ctx)
        if self._embeds:
            # What a VLM step passes: embeddings in place of the token ids' own (here the tokens' scaled by
            # 0.5), so a graph that ignores them computes another answer than eager.
            embeds = model._embed(ctx.input_ids.reshape(-1), None) * 0.5
            kwargs["inputs_embeds"] = embeds.reshape(1, -1, embeds.shape[-1])
        return kwargs

    def eager_run(self, model, ctx):
        with torch.inference_mode():
            return model(**self._kwargs(model, ctx))

    def graph_step(self, model, ctx):
        ctx.enable_microbatch = False
        model.ctx_mgr.set_context(ctx)
        out = self.runner(**self._kwargs(model, ctx))
        return out["hidden_states"]

    def step(self, active: list[int]) -> None:
        hidden = {}

        def keep(name, run):
            def wrapped(model, ctx):
                start = time.perf_counter()
                hidden[name] = run(model, ctx)
                self.step_seconds.setdefault(name, []).append(time.perf_counter() - start)
                return hidden[name]
            return wrapped

        self._embeds, self.embeds_next = self.embeds_next, False
        eager_tokens = self.eager.step(active, run=keep("eager", self.eager_run))
        eager_before = self._eager_steps()
        graph_tokens = self.graph.step(active, run=keep("graph", self.graph_step))
        ran_eager = self._eager_steps() > eager_before  # the graph's buffers were not filled for this step
        self._check(len(active), hidden["graph"], hidden["eager"], graph_tokens, eager_tokens, padding=not ran_eager)

    def overlapped_steps(self, first: list[int], second: list[int]) -> None:
        """Two decode steps issued back to back before anything syncs, as an engine that keeps the next step's
        input on the device does: step N's replay may still be queued when step N+1 fills the buffers and
        refreshes the captured tasks' host lengths, so a refresh not ordered after the replay shows up as step
        N reading step N+1's lengths. The eager side runs first; its tokens feed both sessions (one token per
        sequence: single-token decode on the simulator only)."""
        from . import device as sim

        if self.eager.query_len != 1:
            raise ValueError("overlapped steps feed one token per sequence")
        model = self.model
        self._embeds = False
        eager_out, eager_tokens = [], []
        for active in (first, second):
            out = self.eager_run(model, self.eager.decode_context(active)).clone()
            chosen = [int(t) for t in model.get_logits(out.reshape(-1, model.config.hidden_size)[: len(active)])
                      .argmax(-1).tolist()]
            for i, tok in zip(active, chosen, strict=True):
                self.eager.tokens[i].append(tok)
            eager_out.append(out)
            eager_tokens.append(chosen)
        eager_before = self._eager_steps()
        ctx_n = self.graph.decode_context(first)
        for i, tok in zip(first, eager_tokens[0], strict=True):
            self.graph.tokens[i].append(tok)
        ctx_n1 = self.graph.decode_context(second)
        for i, tok in zip(second, eager_tokens[1], strict=True):
            self.graph.tokens[i].append(tok)
        with sim.configured(eager_drain=False):
            out_n = self.graph_step(model, ctx_n).clone()
            out_n1 = self.graph_step(model, ctx_n1).clone()
            (torch.npu if model.vendor == "ascend" else torch.cuda).synchronize()
        ran_eager = self._eager_steps() > eager_before
        for active, got, want, tokens, last in ((first, out_n, eager_out[0], eager_tokens[0], False),
                                                (second, out_n1, eager_out[1], eager_tokens[1], True)):
            got_tokens = [int(t) for t in model.get_logits(got.reshape(-1, model.config.hidden_size)[: len(active)])
                          .argmax(-1).tolist()]
            # step N's buffers were refilled by step N+1: only the second has its padding to check
            self._check(len(active), got, want, got_tokens, tokens, padding=last and not ran_eager)

    def _check(self, n: int, got, want, graph_tokens, eager_tokens, padding: bool) -> None:
        rows = n * self.eager.query_len  # every query token of every live sequence
        if got.shape != want.shape or got.dtype != want.dtype:  # what lmdeploy's sampler receives, not padded
            self.mismatches.append(f"step {self.steps} batch {n}: the runner returned {tuple(got.shape)} {got.dtype}, "
                                   f"eager {tuple(want.shape)} {want.dtype}")
        e = want.reshape(-1, want.shape[-1])[:rows].cpu()
        g = got.reshape(-1, got.shape[-1])[:rows].cpu()
        if not torch.equal(e, g):
            diff = float((e - g).abs().max())
            self.max_abs_diff = max(self.max_abs_diff, diff)
            if not self._close(e, g):
                self.mismatches.append(f"step {self.steps} batch {n}: hidden states differ (max abs {diff:.3g})")
        if eager_tokens != graph_tokens:
            self.mismatches.append(f"step {self.steps}: tokens {graph_tokens} != eager {eager_tokens}")
        if padding:
            self.check_padding(n)
        # MLA graphs pad their KV writes with distinct slots of reserved block 0 (a negative index is not
        # supported by its scatter): block 0 is theirs to write, every other block must match eager.
        first = 1 if getattr(self.model, "is_mla", False) else 0
        for layer, (pair_e, pair_g) in enumerate(zip(self.eager.kv_caches, self.graph.kv_caches, strict=True)):
            for which, te, tg in zip("kv", pair_e, pair_g, strict=True):
                te, tg = te.cpu()[first:], tg.cpu()[first:]
                if not torch.equal(te, tg) and not self._close(te, tg):
                    far = ~torch.isclose(te, tg, *self._rtol_atol(), equal_nan=True)
                    diff = (far.reshape(te.shape[0], -1).any(-1).nonzero().view(-1) + first).tolist()
                    self.mismatches.append(f"step {self.steps}: layer {layer} {which}-cache differs in blocks {diff}")
                if not first and not torch.equal(te[0], tg[0]):  # even within tolerance: padding must not write there
                    self.mismatches.append(f"step {self.steps}: layer {layer} {which}-cache reserved block 0 "
                                           f"was written")
        self.steps += 1

    def _eager_steps(self) -> int:
        stats = getattr(self.runner, "stats", None)
        return sum(stats.eager_steps.values()) if stats is not None else 0

    def _rtol_atol(self) -> tuple[float, float]:
        return self.tolerance if self.tolerance is not None else (0.0, 0.0)

    def _close(self, a: torch.Tensor, b: torch.Tensor) -> bool:
        """Bitwise on the simulator; within the stated tolerance (NaN matching NaN) on a device. A
        padding row writing a KV slot it must not touch changes it by far more than the tolerance."""
        if self.tolerance is None:
            return torch.equal(a, b)
        rtol, atol = self.tolerance
        return bool(torch.isclose(a, b, rtol=rtol, atol=atol, equal_nan=True).all())

    def graph_meta(self, batch: int):
        """The CudaGraphMeta of the graph that served a batch of ``batch`` (None if it ran eager)."""
        from vendor_graph.sizing.buckets import pad_to_bucket

        sizes = self.runner.get_capture_batch_sizes()
        if batch > sizes[-1]:  # ran eager
            return None
        return graphs_by_batch(self.runner).get(pad_to_bucket(sizes, batch))

    def check_padding(self, batch: int) -> None:
        """Nothing the attention reads may hold a row of an earlier, larger step: every row past the
        live batch of every bound buffer holds its padding (kv_start_indices: -1, write nothing; MLA: block-0 slots)."""
        from vendor_graph.buffers import BATCH, BATCH_PLUS_ONE, TOKENS

        meta = self.graph_meta(batch)
        if meta is None:
            return
        spec = vendors.profile(self.model.vendor).spec  # the vendor this pair activated
        live = {BATCH: batch, TOKENS: batch * meta.decode_query_len, BATCH_PLUS_ONE: batch + 1}
        for f in spec.fields:
            tensor = meta.input_buffers.get(f.name)
            if tensor is None or f.is_static:
                continue
            start = live[f.shape[f.row_dim]]
            count = tensor.shape[f.row_dim] - start
            tail = tensor.narrow(f.row_dim, start, count)
            if not torch.equal(tail.cpu(), spec.padding(meta, f.name).narrow(f.row_dim, start, count).cpu()):
                self.mismatches.append(f"step {self.steps} batch {batch}: {f.name} holds stale rows past the batch")
            inert = INERT_PADDING.get(f.name)
            if inert is not None and count and not inert(tail.cpu(), meta):
                self.mismatches.append(f"step {self.steps} batch {batch}: {f.name} padding rows "
                                       f"{tail.cpu().reshape(-1)[:8].tolist()}... are not inert ({inert.__doc__})")

    def replace(self, slot: int, prompt: list[int]) -> None:
        """Sequence ``slot`` finishes; a new one takes its place and its freed KV blocks (as lmdeploy's
        block manager reuses them), in both sessions alike."""
        for session in (self.eager, self.graph):
            session.allocator.free.extend(reversed(session.block_tables[slot]))
            table = session.allocator.ensure([], len(prompt))
            hidden = tm.prefill(self.model, session.kv_caches, [table], [prompt])
            session.block_tables[slot] = table
            session.tokens[slot] = list(prompt) + [int(self.model.get_logits(hidden).argmax(-1)[0])]

    def reallocate_kv(self) -> None:
        """The graph session's KV caches move to fresh memory with the same bytes (a wake-up, or a cache
        engine rebuilt): a graph captured on the old caches is stale and must not be replayed."""
        self.graph.kv_caches = [tuple(t.clone() for t in layer) for layer in self.graph.kv_caches]

    def update_weights(self, *, moved: bool) -> None:
        """New weights for both sessions (they share the model). ``moved``: new parameter tensors in place
        of the old ones and the runner reset, as lmdeploy's ``update_params`` does; otherwise the values
        are copied into the same tensors, which a captured graph reads at its next replay."""
        for module in self.model.modules():
            for name, param in list(module._parameters.items()):
                if param is None:
                    continue
                scaled = param * 1.0625
                if moved:
                    module._parameters[name] = torch.nn.Parameter(scaled, requires_grad=False)
                else:
                    param.copy_(scaled)
        if moved:
            self.runner.reset()

    def run(self, plan: list[list[int]], replacements: dict[int, tuple[int, list[int]]],
            events: dict[int, tuple[str, ...]] | None = None) -> None:
        """Step through ``plan``; after step ``i``, ``replacements[i]`` (a sequence finishes, a new one
        joins in its slot) and ``events[i]``: ``"realloc_kv"``, ``"weights_moved"``, ``"weights_in_place"``,
        ``"embeds_next"`` (the next step feeds ``inputs_embeds``, as a multimodal step does: a graph captured
        without them must refuse the step, which then runs eager), ``"overlap_next"`` (the next two steps are
        issued back to back before anything syncs: :meth:`overlapped_steps`)."""
        actions = {"realloc_kv": self.reallocate_kv,
                   "embeds_next": lambda: setattr(self, "embeds_next", True),
                   "weights_moved": lambda: self.update_weights(moved=True),
                   "weights_in_place": lambda: self.update_weights(moved=False)}
        overlap = False
        actions["overlap_next"] = lambda: None  # read below: the next two steps run back to back
        step = 0
        while step < len(plan):
            if overlap and step + 1 < len(plan) and not (events or {}).get(step) and step not in replacements:
                self.overlapped_steps(plan[step], plan[step + 1])
                done = (step, step + 1)
            else:
                self.step(plan[step])
                done = (step,)
            overlap = False
            for i in done:
                if i in replacements:
                    self.replace(*replacements[i])
                for event in (events or {}).get(i, ()):
                    actions[event]()
                    overlap |= event == "overlap_next"
            step = done[-1] + 1


def _reads_block_zero_only(rows: torch.Tensor, meta) -> bool:
    """padding rows of the block table address only lmdeploy's reserved block 0"""
    return bool((rows == 0).all())


def _no_kv_length(rows: torch.Tensor, meta) -> bool:
    """a padding row's KV length (host or device) is 0: it reads no KV"""
    return bool((rows == 0).all())


def _writes_no_live_slot(rows: torch.Tensor, meta) -> bool:
    """a padding token's KV slot is -1 (written nowhere) or, for MLA caches, a distinct-as-possible slot of
    reserved block 0"""
    if not getattr(meta, "kv_is_mla", False):
        return bool((rows == -1).all())
    block_size = int(getattr(meta, "kv_block_size", 0) or 1)
    return bool(((rows >= 0) & (rows < block_size)).all())


# What padding rows must hold, stated apart from the buffer specs (a spec whose padding changes would
# otherwise check its fills against itself): the documented safe values of DESIGN.md section 2 and
# docs/ascend_kernel_facts.md, the same as dlinfer's own Ascend graph runner writes.
INERT_PADDING = {
    "block_offsets": _reads_block_zero_only,
    "kv_seqlens": _no_kv_length,
    "kv_seqlens_device": _no_kv_length,
    "kv_start_indices": _writes_no_live_slot,
}


def graphs_by_batch(runner) -> dict[int, object]:
    """The CudaGraphMeta of every graph ``runner`` holds, by its padded batch: the Ascend runner's, or
    lmdeploy's CUDAGraphRunner's, adopted or not (its map was renamed in 0.18)."""
    from vendor_graph.vendors.ascend.runner import AscendGraphRunner

    if isinstance(runner, AscendGraphRunner):
        return {k.padded_batch: g.meta for k, g in runner.graphs().items()}
    return {k[0]: r.meta for k, r in compat.cuda_runner_graphs(runner).items()}


@contextlib.contextmanager
def step_manager(vendor: str, model_config, query_len: int = 1):
    """lmdeploy's StepContextManager as the engine sets it up (AR strategy), for the block;
    ``query_len`` > 1: a speculative-decoding engine's ``build_ctx.num_spec_tokens = query_len - 1``."""
    from lmdeploy.pytorch.model_inputs import get_step_ctx_manager
    from lmdeploy.pytorch.strategies.ar import ARStrategyFactory

    with tm.lmdeploy_step_env(vendor):
        mgr = get_step_ctx_manager()
        mgr.build_ctx.strategy_factory = ARStrategyFactory(model_config)
        mgr.build_ctx.num_spec_tokens = query_len - 1
        yield mgr


def _build_runner(vendor: str, model: tm.TinyDecoder, configs: Configs, mgr, device: str = "npu"):
    """The runner lmdeploy's ModelAgent would get: the vendor op backend's (patched) builder."""
    op_backend = importlib.import_module(f"lmdeploy.pytorch.backends.dlinfer.{vendor}.op_backend")
    backend = getattr(op_backend, f"{vendor.capitalize()}OpsBackend")
    model.ctx_mgr = mgr
    return backend.build_graph_runner(model, configs.model_config, configs.cache_config, configs.backend_config,
                                      torch.device(device))


# Real devices: where graphs run, and the tolerance graph vs eager is held to there. The tiny model
# accumulates in float64 and rounds once to float32, so a row does not depend on its batch; the
# tolerance covers library kernels that pick another reduction order for another batch size.
# "cuda": Camb/MACA specs on lmdeploy's CUDA runner (an NVIDIA GPU stands in for their CUDA-style graph
# API; run on the H200). "maca": the same path on MetaX, whose torch build presents itself as CUDA.
# "mlu": the same path on Cambricon, torch.cuda mapped to torch.mlu by torch_mlu's GPU migration.
# "npu": Ascend on the installed torch_npu's NPUGraph and real attention ops. The emulated kernels run
# on the device; maca, mlu and npu are defined for the hardware workflows and have never run.
REAL_BACKENDS = {"cuda": "cuda", "maca": "cuda", "mlu": "mlu", "npu": "npu"}  # --graph-backend -> torch device
CUDA_STYLE_BACKENDS = ("cuda", "maca", "mlu")
REAL_TOLERANCE = (1e-5, 1e-6)  # (rtol, atol) on float32 hidden states and KV bytes


def run(vendor: str, seed: int, *, generation: str | None = None, attention: str = "fia", steps: int = 64,
        num_seqs: int = 20, max_batches: int | None = None, query_len: int = 1,
        backend: str = "sim", capture_sizes: list[int] | None = None, plan: list[list[int]] | None = None,
        replacements: dict[int, tuple[int, list[int]]] | None = None,
        events: dict[int, tuple[str, ...]] | None = None, num_blocks: int | None = None) -> SideBySide:
    """One seeded schedule of ``steps`` decode steps, eager and graph side by side.

    ``backend="sim"``: Ascend runs on the simulated torch_npu of ``generation``; Camb and MACA run
    lmdeploy's own CUDA graph runner on the simulator's CUDA-style graph API; every check is bitwise.
    ``backend="cuda"``: Camb and MACA buffer specs on lmdeploy's CUDA graph runner with real CUDA graphs
    (an NVIDIA GPU stands in for the vendors' CUDA-style graph API); ``"maca"`` / ``"mlu"`` the same on
    those devices; ``"npu"``: Ascend on the installed torch_npu. Real devices: hidden states and KV
    within :data:`REAL_TOLERANCE`, greedy tokens equal. Inspect ``.mismatches`` afterwards.
    ``query_len`` > 1 (Ascend): every step feeds that many tokens per sequence (speculative decoding,
    see :class:`~vendor_graph_sim.tiny_model.DecodeSession`), so graphs are keyed and sized by it.
    ``capture_sizes``: lmdeploy's ``cudagraph_capture_batch_sizes``. ``plan`` (the live sequences of
    every step), ``replacements`` and ``events`` (see :meth:`SideBySide.run`) replace the seeded
    :func:`schedule` and :func:`retirements`. ``num_blocks``: KV blocks per cache (default the tiny
    model's 128; a few hundred live sequences need more).
    """
    import vendor_graph

    from . import device as sim

    if backend != "sim" and (backend not in REAL_BACKENDS or (vendor == "ascend") != (backend == "npu")):
        raise ValueError(f"{vendor} on backend {backend!r}: real devices run Camb/MACA specs on "
                         f"{', '.join(CUDA_STYLE_BACKENDS)} and Ascend on 'npu'")
    vendor_graph.uninstall()  # one vendor per process: this schedule's
    importlib.import_module(f"vendor_graph.{vendor}").activate()
    device = "npu" if backend == "sim" else REAL_BACKENDS[backend]
    device_api = real_device(backend) if backend != "sim" else None
    if backend == "sim":
        device_api = sim.use_torch_npu(generation) if vendor == "ascend" else sim.cuda_graph_api()
    with device_api, torch.inference_mode():
        streams = torch.npu if vendor == "ascend" else torch.cuda
        with streams.stream(streams.Stream()):  # lmdeploy's agent runs its forward on a side stream
            config = tm.TinyConfig()
            config = config if num_blocks is None else dataclasses.replace(config, num_blocks=num_blocks)
            model = tm.TinyDecoder(vendor, config, ascend_attention=attention, device=device)
            configs = lmdeploy_configs(vendor, model, max_batches or num_seqs, capture_sizes, query_len=query_len)
            with step_manager(vendor, configs.model_config, query_len=query_len) as mgr:
                eager = tm.DecodeSession(model, prompts(num_seqs, seed), device=device, seed=seed,
                                         query_len=query_len)
                pair = SideBySide(model=model, runner=_build_runner(vendor, model, configs, mgr, device),
                                  eager=eager, graph=eager.twin(),
                                  tolerance=None if backend == "sim" else REAL_TOLERANCE)
                if backend == "sim":
                    sim.reset_counters()
                pair.run(schedule(num_seqs, steps, seed) if plan is None else plan,
                         retirements(num_seqs, steps, seed) if replacements is None else replacements, events)
                if backend == "sim":
                    pair.counters = sim.counters.snapshot()
    return pair


def real_device(backend: str):
    """Prepare a real device backend (import its torch extension, run the emulated kernels on it)."""
    if backend == "npu":
        import torch_npu  # noqa: F401  (registers torch.npu)

        kernels.register_for("PrivateUse1")
    elif backend == "mlu":
        import torch_mlu  # noqa: F401  (registers torch.mlu)
        import torch_mlu.utils.gpu_migration  # noqa: F401  (torch.cuda.* -> torch.mlu.*, as lmdeploy's runner calls it)

        kernels.register_for("PrivateUse1")
    return contextlib.nullcontext()


@contextlib.contextmanager
def ascend_pair(generation: str = "G5", *, num_seqs: int = 6, seed: int = 0, attention: str = "fia",
                max_batches: int | None = None):
    """A side-by-side pair (not yet stepped) whose runner is built by lmdeploy's patched Ascend builder
    on the simulated torch_npu of ``generation``: for tests that step it themselves."""
    import vendor_graph

    from . import device as sim

    vendor_graph.uninstall()
    importlib.import_module("vendor_graph.ascend").activate()
    with sim.use_torch_npu(generation), torch.inference_mode(), torch.npu.stream(torch.npu.Stream()):
        model = tm.TinyDecoder("ascend", ascend_attention=attention, device="npu")
        configs = lmdeploy_configs("ascend", model, max_batches or num_seqs)
        with step_manager("ascend", configs.model_config) as mgr:
            eager = tm.DecodeSession(model, prompts(num_seqs, seed), device="npu", seed=seed)
            yield SideBySide(model=model, runner=_build_runner("ascend", model, configs, mgr),
                             eager=eager, graph=eager.twin())


@contextlib.contextmanager
def cuda_style_pair(vendor: str = "camb", backend: str = "sim", *, num_seqs: int = 6, seed: int = 0,
                    max_batches: int | None = None):
    """A side-by-side pair (not yet stepped) on lmdeploy's CUDA runner as the vendor's patched builder
    adopts it, for Camb or MACA, on the simulator's CUDA-style graph API or real CUDA graphs."""
    import vendor_graph

    from . import device as sim

    vendor_graph.uninstall()
    importlib.import_module(f"vendor_graph.{vendor}").activate()
    device = "npu" if backend == "sim" else REAL_BACKENDS[backend]
    device_api = sim.cuda_graph_api() if backend == "sim" else real_device(backend)
    with device_api, torch.inference_mode(), torch.cuda.stream(torch.cuda.Stream()):
        model = tm.TinyDecoder(vendor, device=device)
        configs = lmdeploy_configs(vendor, model, max_batches or num_seqs)
        with step_manager(vendor, configs.model_config) as mgr:
            eager = tm.DecodeSession(model, prompts(num_seqs, seed), device=device, seed=seed)
            yield SideBySide(model=model, runner=_build_runner(vendor, model, configs, mgr, device),
                             eager=eager, graph=eager.twin(),
                             tolerance=None if backend == "sim" else REAL_TOLERANCE)
