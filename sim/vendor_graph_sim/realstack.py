"""The real stack on the simulated NPU: lmdeploy's own model classes and Ascend op backend over the real dlinfer.

A tiny random-weight checkpoint (a Llama with grouped-query attention, or a DeepSeek-V2 MLA model) is written
to a temporary directory and built by lmdeploy itself (``ModelConfig.from_pretrained``, ``build_patched_model``,
``load_model_weights``). Each step goes the way lmdeploy's model agent runs one (``model_forward``): a
``ModelInputs`` becomes a ``StepContext`` through the step manager (``AscendOpsBackend.update_step_context``
builds the attention metadata), then the runner's ``prepare_inputs_for_generation`` and call. The runner is
what ``AscendOpsBackend.build_graph_runner`` returns: with vendor_graph active, vendor_graph's; the attention,
norms, rotary embedding and KV writes are lmdeploy's dlinfer kernels calling ``dlinfer.ops``, down to the
emulated torch_npu / ATB kernels.

One level below lmdeploy's ``Engine``: the scheduler, the engine loop and the executor's worker are not
driven (:func:`forward` stands where ``model_forward`` is called; the request mix is :func:`schedule`).

dlinfer comes from ``VENDOR_GRAPH_DLINFER_SRC`` (a source checkout, laid out as its build lays it out) or an
installed ``dlinfer``, with the labelled stand-ins for what no CPU build provides, as the simulator switch
serves them (:mod:`vendor_graph_sim.boot`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import json
import random
import sys
import tempfile
import types
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from . import boot, standins
from .boot import pinned_release  # noqa: F401  (re-exported: the tests, the demo and the benchmarks name it)
from .variables import DLINFER_SRC, dlinfer_src

MODELS = ("lmdeploy-llama", "lmdeploy-mla")
# written on request only (not in the default runs): a Mixtral (grouped-query attention, a routed MoE in each layer)
EXTRA_MODELS = ("lmdeploy-mixtral",)
BLOCK_SIZE = 16
NUM_BLOCKS = 48  # block 0 stays reserved, as lmdeploy's cache engine keeps it
# (rtol, atol) for hidden states graph vs eager: the simulator replays the same kernels on the same
# inputs, so anything but bitwise equality is a finding; kept as a tolerance for real devices.
TOLERANCE = (0.0, 0.0)
MAX_SEQS = 9  # the schedule's largest batch: crosses the 8 -> 16 bucket boundary


class DlinferImportFailed(RuntimeError):
    """dlinfer itself does not import on this torch_npu (the message says where and why)."""


class DlinferUnavailable(RuntimeError):
    """No dlinfer to run: neither ``VENDOR_GRAPH_DLINFER_SRC`` nor an installed ``dlinfer``."""


HOW_TO_PROVIDE = (f"set {DLINFER_SRC.name} to a dlinfer source checkout (the folder holding "
                  f"dlinfer/__init__.py), or install dlinfer")

# -- dlinfer ------------------------------------------------------------------------------------------------


def dlinfer_origin() -> tuple[str, Path | None]:
    """(how dlinfer is provided, the source root to stage) -- ``("source", root)`` from the setting,
    ``("installed", None)``, or :class:`DlinferUnavailable`. A setting given but unusable raises
    :class:`~vendor_graph.config.settings.SettingsError` (never a skip)."""
    root = dlinfer_src()
    if root is not None:
        return "source", Path(root)
    found = importlib.util.find_spec("dlinfer")
    if found is not None and found.origin and not standins.is_standin(found.origin):
        return "installed", None
    raise DlinferUnavailable(f"no dlinfer: {HOW_TO_PROVIDE} (the tests' stand-in dlinfer runs no kernel)")


def dlinfer_description() -> str:
    """What the demo and the records name: where dlinfer came from and its version."""
    module = sys.modules.get("dlinfer")
    version = getattr(module, "__version__", "?")
    origin, root = dlinfer_origin()
    return f"dlinfer {version} ({'source ' + str(root) if origin == 'source' else 'installed'})"


def import_dlinfer() -> types.ModuleType:
    """Import the real dlinfer (inside :func:`vendor_graph_sim.device.use_torch_npu`, or with the simulator
    switch on), laid out as its build lays it out and with the labelled stand-ins beside it
    (:func:`vendor_graph_sim.boot.serve_upstream`); returns the ``dlinfer`` module."""
    dlinfer_origin()
    boot.serve_upstream()
    import dlinfer  # noqa: F401
    import dlinfer.ops  # noqa: F401
    import dlinfer.vendor.ascend  # noqa: F401

    _backend().init()  # what lmdeploy's engine runs first: transfer_to_npu, dlinfer's lmdeploy device patches
    return sys.modules["dlinfer"]


# -- checkpoints --------------------------------------------------------------------------------------------

LLAMA_CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=256, intermediate_size=384,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=384,
    max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
    tie_word_embeddings=False, torch_dtype="float16", bos_token_id=1, eos_token_id=2, pad_token_id=0,
)
MLA_CONFIG = dict(
    architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2", hidden_size=256, intermediate_size=384,
    moe_intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
    kv_lora_rank=64, q_lora_rank=None, qk_nope_head_dim=64, qk_rope_head_dim=64, v_head_dim=64,
    n_routed_experts=2, n_shared_experts=1, first_k_dense_replace=2, moe_layer_freq=1,
    vocab_size=384, max_position_embeddings=1024, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
    tie_word_embeddings=False, torch_dtype="float16", bos_token_id=1, eos_token_id=2, pad_token_id=0,
    topk_method="greedy",
    n_group=1, topk_group=1, num_experts_per_tok=1, routed_scaling_factor=1.0, scoring_func="softmax",
    norm_topk_prob=False, aux_loss_alpha=0.001, seq_aux=True, rope_scaling=None, attention_bias=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
)


MIXTRAL_CONFIG = dict(
    architectures=["MixtralForCausalLM"], model_type="mixtral", hidden_size=256, intermediate_size=192,
    num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=128, vocab_size=384,
    num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=1024, rms_norm_eps=1e-6,
    rope_theta=10000.0, hidden_act="silu", sliding_window=None, tie_word_embeddings=False, torch_dtype="float16",
    bos_token_id=1, eos_token_id=2, pad_token_id=0,
)


def _mixtral_weights(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    shapes = {k: v for k, v in _llama_weights(c).items() if ".mlp." not in k}
    h, inter = c["hidden_size"], c["intermediate_size"]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}.block_sparse_moe."
        shapes[p + "gate.weight"] = (c["num_local_experts"], h)
        for e in range(c["num_local_experts"]):
            shapes.update({f"{p}experts.{e}.w1.weight": (inter, h), f"{p}experts.{e}.w3.weight": (inter, h),
                           f"{p}experts.{e}.w2.weight": (h, inter)})
    return shapes


def _llama_weights(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, d, kv = c["hidden_size"], c["head_dim"], c["num_key_value_heads"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (c["num_attention_heads"] * d, h),
            p + "self_attn.k_proj.weight": (kv * d, h), p + "self_attn.v_proj.weight": (kv * d, h),
            p + "self_attn.o_proj.weight": (h, c["num_attention_heads"] * d),
            p + "mlp.gate_proj.weight": (c["intermediate_size"], h),
            p + "mlp.up_proj.weight": (c["intermediate_size"], h),
            p + "mlp.down_proj.weight": (h, c["intermediate_size"]),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
    return shapes


def _mla_weights(c: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    h, heads = c["hidden_size"], c["num_attention_heads"]
    nope, rope, v, rank = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,),
              "lm_head.weight": (c["vocab_size"], h)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes.update({
            p + "self_attn.q_proj.weight": (heads * (nope + rope), h),
            p + "self_attn.kv_a_proj_with_mqa.weight": (rank + rope, h),
            p + "self_attn.kv_a_layernorm.weight": (rank,),
            p + "self_attn.kv_b_proj.weight": (heads * (nope + v), rank),
            p + "self_attn.o_proj.weight": (h, heads * v),
            p + "mlp.gate_proj.weight": (c["intermediate_size"], h),
            p + "mlp.up_proj.weight": (c["intermediate_size"], h),
            p + "mlp.down_proj.weight": (h, c["intermediate_size"]),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        })
    return shapes


def write_checkpoint(model: str, directory: Path, seed: int = 0) -> Path:
    """A random-weight HF checkpoint (``config.json`` + ``model.safetensors``) of ``model`` in ``directory``."""
    from safetensors.torch import save_file

    configs = {"lmdeploy-llama": (LLAMA_CONFIG, _llama_weights), "lmdeploy-mla": (MLA_CONFIG, _mla_weights),
               "lmdeploy-mixtral": (MIXTRAL_CONFIG, _mixtral_weights)}
    if model not in configs:
        raise ValueError(f"model must be one of {(*MODELS, *EXTRA_MODELS)}, got {model!r}")
    config, weights = configs[model]
    shapes = weights(config)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in shapes.items():
        if len(shape) == 1:  # norm weights: near one
            value = 1 + 0.1 * torch.randn(shape, generator=generator)
        else:
            value = torch.randn(shape, generator=generator) / shape[-1] ** 0.5
        tensors[name] = value.to(torch.float16).contiguous()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=1))
    save_file(tensors, str(directory / "model.safetensors"))
    return directory


# -- building through lmdeploy ------------------------------------------------------------------------------


def _backend():
    from . import tiny_model  # imports lmdeploy: only once a model is built

    return tiny_model.backend_class("ascend")


@contextlib.contextmanager
def ascend_context() -> Iterator[None]:
    """lmdeploy's device context for ``device_type='ascend'`` and a single-rank step environment."""
    from lmdeploy.pytorch.devices import DeviceContext, get_device_manager

    from . import tiny_model

    backend = _backend()
    saved = backend.dist_meta
    backend.dist_meta = tiny_model._single_rank_dist_meta()
    try:
        with get_device_manager().context(DeviceContext(device_type="ascend")):
            yield
    finally:
        backend.dist_meta = saved
        backend.total_slots = None


@dataclasses.dataclass
class Built:
    """One lmdeploy-built model and what its steps need."""

    name: str
    checkpoint: Path
    model_config: Any
    cache_config: Any
    model: torch.nn.Module
    ctx_mgr: Any
    device: torch.device

    @property
    def is_mla(self) -> bool:
        return self.model_config.k_head_dim != self.model_config.v_head_dim

    def kv_caches(self, seed: int) -> list[list[torch.Tensor]]:
        """Per-layer (key, value) caches in lmdeploy's Ascend block shape, filled with seeded noise so an
        untouched byte is recognisable."""
        backend, c = _backend(), self.model_config
        k_shape = backend.get_k_block_shape(BLOCK_SIZE, c.num_key_value_heads, c.k_head_dim, c.dtype)
        v_shape = backend.get_v_block_shape(BLOCK_SIZE, c.num_key_value_heads, c.v_head_dim, c.dtype)
        generator = torch.Generator().manual_seed(seed)
        caches = []
        for _ in range(c.num_layers):
            k = torch.randn((NUM_BLOCKS, *k_shape), generator=generator).to(c.dtype)
            v = torch.randn((NUM_BLOCKS, *v_shape), generator=generator).to(c.dtype)
            caches.append([k.to(self.device), v.to(self.device)])
        return caches

    def runner(self, eager: bool) -> Any:
        """What lmdeploy's model agent gets from ``AscendOpsBackend.build_graph_runner`` for this engine."""
        from lmdeploy.pytorch.config import BackendConfig

        backend_config = BackendConfig(eager_mode=eager, device_type="ascend")
        return _backend().build_graph_runner(self.model, self.model_config, self.cache_config, backend_config,
                                             self.device)


DLINFER_RUNNER = "dlinfer.framework.lmdeploy_ext.cudagraph.ascend_cudagraph.AscendGraphRunner"


def dlinfer_graph_runner(built: Built, eager: bool) -> tuple[Any, str | None]:
    """dlinfer's own Ascend graph runner (:data:`DLINFER_RUNNER`, what real dlinfer serves when vendor_graph
    is not active) for this engine, and why lmdeploy's ``AscendOpsBackend.build_graph_runner`` could not
    build it (None when it could).

    lmdeploy 0.17/0.18's builder passes ``is_mla=`` to it; a dlinfer whose runner does not take that keyword
    raises TypeError there. Then the runner is built with the builder's other arguments and its side effects
    (``AscendOpsBackend.enable_graph`` / ``max_batches``). Refuses to run with vendor_graph active (it
    replaces the builder and dlinfer's buffer methods)."""
    from lmdeploy.pytorch.config import BackendConfig

    import vendor_graph

    if vendor_graph.active_vendor() is not None:
        raise RuntimeError(f"vendor_graph.{vendor_graph.active_vendor()} is active: dlinfer's runner is not what "
                           "lmdeploy would run; use a process without vendor_graph activated")
    module_name, _, class_name = DLINFER_RUNNER.rpartition(".")
    cls = getattr(importlib.import_module(module_name), class_name)
    backend = _backend()
    backend_config = BackendConfig(eager_mode=eager, device_type="ascend")
    args = (built.model, built.model_config, built.cache_config, backend_config, built.device)
    try:
        runner = backend.build_graph_runner(*args)
    except TypeError as exc:
        if "is_mla" not in str(exc):
            raise
        backend.enable_graph = not eager
        backend.max_batches = built.cache_config.max_batches
        return cls(*args), f"AscendOpsBackend.build_graph_runner: TypeError: {exc}"
    if not isinstance(runner, cls):
        raise RuntimeError(f"AscendOpsBackend.build_graph_runner built {type(runner).__module__}."
                           f"{type(runner).__qualname__}, not {DLINFER_RUNNER}")
    return runner, None


def build(name: str, directory: Path, *, max_batches: int, seed: int = 0, device: str = "npu") -> Built:
    """Write ``name``'s checkpoint into ``directory`` and build it the way lmdeploy's model agent does."""
    from lmdeploy.pytorch.config import CacheConfig, ModelConfig
    from lmdeploy.pytorch.model_inputs import BuildModelContext, StepContextManager
    from lmdeploy.pytorch.models.patch import build_patched_model
    from lmdeploy.pytorch.weight_loader.model_weight_loader import load_model_weights

    checkpoint = write_checkpoint(name, directory / name, seed)
    model_config = ModelConfig.from_pretrained(str(checkpoint), dtype="float16")
    cache_config = CacheConfig(max_batches=max_batches, block_size=BLOCK_SIZE, num_cpu_blocks=0,
                               num_gpu_blocks=NUM_BLOCKS, device_type="ascend")
    dev = torch.device(device)
    build_ctx = BuildModelContext(max_batch_size=max_batches) if _has_field(BuildModelContext, "max_batch_size") \
        else BuildModelContext()
    model = build_patched_model(model_config, device=dev, build_model_ctx=build_ctx)
    load_model_weights(model, str(checkpoint), device=dev)
    model.eval()
    ctx_mgr = StepContextManager(build_ctx)
    model.ctx_mgr = ctx_mgr
    return Built(name, checkpoint, model_config, cache_config, model, ctx_mgr, dev)


def _has_field(cls: type, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(cls))


def prefill_mismatch() -> str | None:
    """Why the installed lmdeploy's dlinfer prefill call does not fit the dlinfer ops its kernel calls, or None.

    lmdeploy 0.18 passes ``actual_seq_lengths_cpu=`` to ``prefill_attention`` and two length arguments fewer to
    ``paged_prefill_attention`` than dlinfer main (a50184e) takes: every prefill raises TypeError, unless
    vendor_graph's ``prefill-attention`` bridge (:mod:`vendor_graph.install.bridges`) stands between them.
    Where they do not fit, prompts are fed by decode steps instead.
    """
    import inspect

    from lmdeploy.pytorch.kernels.dlinfer import pagedattention

    wants = "actual_seq_lengths_cpu" in inspect.getsource(pagedattention)
    takes = "actual_seq_lengths_cpu" in inspect.signature(pagedattention.ext_ops.prefill_attention).parameters
    if wants and not takes:
        return ("lmdeploy's dlinfer prefill kernel passes actual_seq_lengths_cpu=, which this dlinfer's "
                "prefill_attention does not take (prefill raises TypeError)")
    return None


# -- steps ----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Sequence_:
    tokens: list[int]
    blocks: list[int]
    cached: int = 0  # tokens whose KV is in the cache


class BlockPool:
    """Blocks 1 .. NUM_BLOCKS-1 (block 0 reserved), handed out in a seeded order and taken back."""

    def __init__(self, seed: int) -> None:
        self.free = list(range(1, NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)

    def grow(self, seq: Sequence_, length: int) -> None:
        while len(seq.blocks) * BLOCK_SIZE < length:
            if not self.free:
                raise RuntimeError("the simulated KV cache is full: fewer or shorter sequences")
            seq.blocks.append(self.free.pop())

    def release(self, seq: Sequence_) -> None:
        self.free.extend(seq.blocks)
        seq.blocks = []


def model_inputs(seqs: Sequence[Sequence_], decoding: bool, device: torch.device) -> Any:
    """lmdeploy's ``ModelInputs`` for a prefill (every uncached token) or decode (the last token) step."""
    from lmdeploy.pytorch.model_inputs import ModelInputs

    if decoding:  # one token each: the first not yet in the cache
        q = [1] * len(seqs)
        ids = [s.tokens[s.cached] for s in seqs]
    else:
        q = [len(s.tokens) - s.cached for s in seqs]
        ids = [t for s in seqs for t in s.tokens[s.cached:]]
    history = [s.cached for s in seqs]
    kv = [h + n for h, n in zip(history, q, strict=True)]
    width = max(len(s.blocks) for s in seqs)
    table = [s.blocks + [0] * (width - len(s.blocks)) for s in seqs]
    return ModelInputs(
        input_ids=torch.tensor([ids], dtype=torch.long, device=device),
        seq_length=torch.tensor(q, dtype=torch.long, device=device),
        history_lengths=torch.tensor(history, dtype=torch.long, device=device),
        block_offsets=torch.tensor(table, dtype=torch.long, device=device),
        is_decoding=decoding,
        num_ignored_history=torch.zeros(len(seqs), dtype=torch.long, device=device),
        max_q_seqlen=max(q), max_kv_seqlen=max(kv), sum_kv_seqlen=sum(kv),
    )


def forward(built: Built, runner: Any, inputs: Any, kv_caches: list) -> torch.Tensor:
    """One step the way lmdeploy's ``model_forward`` runs it: hidden states ``(1, tokens, hidden)``."""
    from lmdeploy.pytorch.model_inputs import step_ctx_manager

    ctx_mgr = built.ctx_mgr
    with step_ctx_manager(ctx_mgr):
        context = ctx_mgr.build_context(inputs=inputs, model_config=built.model_config,
                                        cache_config=built.cache_config, kv_caches=kv_caches)
        with ctx_mgr.context(context):
            runner.update_model_metas(past_key_values=kv_caches, context=context)
            input_dict = runner.prepare_inputs_for_generation(past_key_values=kv_caches, context=context)
            output = runner(**input_dict)
    return output if isinstance(output, torch.Tensor) else output["hidden_states"]


def last_rows(hidden: torch.Tensor, q_lens: Sequence[int]) -> torch.Tensor:
    ends = torch.tensor(q_lens).cumsum(0) - 1
    return hidden[0, ends.to(hidden.device)]


def live_slots(seqs: Sequence[Sequence_]) -> list[int]:
    return [b * BLOCK_SIZE + i % BLOCK_SIZE for s in seqs for i, b in
            ((i, s.blocks[i // BLOCK_SIZE]) for i in range(s.cached))]


BATCH_SIZES = (1, 2, 3, 5, 7, 3, 4, 8, 9, 6, 2, 1, 5)


def plan(seed: int, *, steps: int, max_seqs: int, longest_prompt: int = BLOCK_SIZE + 4,
         sizes: Sequence[int] = BATCH_SIZES) -> list[dict[str, Any]]:
    """A decode schedule that grows, shrinks (a batch of 3 right after 7) and crosses bucket boundaries
    (8 -> 9). Each step names its batch size and the prompt lengths of the sequences that join before it
    (their prefill step); the oldest running sequences finish when the batch shrinks. ``sizes``: the batch
    sizes cycled through (default :data:`BATCH_SIZES`)."""
    rng = random.Random(seed)
    out, running = [], 0
    for step in range(steps):
        size = min(max_seqs, sizes[step % len(sizes)])
        join = max(0, size - running)
        out.append({"size": size, "join": [rng.randint(3, longest_prompt) for _ in range(join)]})
        running = size
    return out


@dataclasses.dataclass
class Side:
    """One engine's view: its runner, its KV caches and its sequences."""

    runner: Any
    caches: list[list[torch.Tensor]]
    pool: BlockPool
    running: list[Sequence_] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Record:
    """What one conformance run found (the demo's and the tests' verdict)."""

    model: str
    generation: str
    steps: int = 0
    tokens: int = 0
    mismatches: list[str] = dataclasses.field(default_factory=list)
    graph_replays: int = 0
    captures: int = 0
    eager_steps: int = 0
    eager_reasons: dict[str, int] = dataclasses.field(default_factory=dict)
    seqlen_paths: list[str] = dataclasses.field(default_factory=list)
    prefill: str = "prefill"  # or why prompts were fed by decode steps

    @property
    def parity(self) -> bool:
        return not self.mismatches


class Conformance:
    """lmdeploy eager (``eager_mode=True``) and graph mode side by side over one schedule, step by step."""

    def __init__(self, built: Built, generation: str, *, seed: int = 0,
                 runner_factory: Callable[[bool], Any] | None = None) -> None:
        """``runner_factory(eager)`` builds each side's runner (default :meth:`Built.runner`, what
        ``AscendOpsBackend.build_graph_runner`` returns)."""
        self.built, self.seed = built, seed
        self.record = Record(built.name, generation)
        make = built.runner if runner_factory is None else runner_factory
        self.eager = Side(make(True), built.kv_caches(seed), BlockPool(seed))
        self.graph = Side(make(False), built.kv_caches(seed), BlockPool(seed))
        self.initial = [[t.clone() for t in layer] for layer in built.kv_caches(seed)]
        self.written: set[int] = set()
        self.prompt_rng = random.Random(seed + 1)
        problem = prefill_mismatch()
        if problem is not None:
            self.record.prefill = f"by decode steps: {problem}"

    def _step(self, side: Side, seqs: list[Sequence_], decoding: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The runner's whole output (what lmdeploy receives) and each sequence's last row."""
        inputs = model_inputs(seqs, decoding, self.built.device)
        hidden = forward(self.built, side.runner, inputs, side.caches)
        q = [1] * len(seqs) if decoding else [len(s.tokens) - s.cached for s in seqs]
        rows = last_rows(hidden, q)
        for s, n in zip(seqs, q, strict=True):
            s.cached += n
        return hidden, rows

    def _ingest_by_decode(self, eager_seqs: list[Sequence_], graph_seqs: list[Sequence_], what: str) -> None:
        """Prompts fed one token per decode step, all but their last token (which the next decode feeds)."""
        step = 0
        while True:
            rows = [i for i, s in enumerate(eager_seqs) if s.cached < len(s.tokens) - 1]
            if not rows:
                return
            self._both([eager_seqs[i] for i in rows], [graph_seqs[i] for i in rows], decoding=True,
                       what=f"{what} (prompt token {step}, by decode)", generate=False)
            step += 1

    def _both(self, eager_seqs: list[Sequence_], graph_seqs: list[Sequence_], decoding: bool, what: str,
              generate: bool = True) -> None:
        with torch.inference_mode():
            whole_a, a = self._step(self.eager, eager_seqs, decoding)
            whole_b, b = self._step(self.graph, graph_seqs, decoding)
            logits_a = self.eager.runner.get_logits(a.unsqueeze(0))[0].float()
            logits_b = self.graph.runner.get_logits(b.unsqueeze(0))[0].float()
        self.written.update(live_slots(eager_seqs))
        if whole_b.shape != whole_a.shape or whole_b.dtype != whole_a.dtype:  # not padded: what lmdeploy receives
            self.record.mismatches.append(f"{what}: the runner returned {tuple(whole_b.shape)} {whole_b.dtype}, "
                                          f"eager {tuple(whole_a.shape)} {whole_a.dtype}")
        rtol, atol = TOLERANCE
        if not torch.allclose(a.cpu().float(), b.cpu().float(), rtol=rtol, atol=atol):
            diff = (a.cpu().float() - b.cpu().float()).abs().max().item()
            self.record.mismatches.append(f"{what}: hidden states differ (max |diff| {diff:.3g})")
        next_a, next_b = logits_a.argmax(-1).tolist(), logits_b.argmax(-1).tolist()
        if not generate:
            return
        if next_a != next_b:
            self.record.mismatches.append(f"{what}: greedy tokens {next_b} (graph) != {next_a} (eager)")
        for s, t in zip(eager_seqs, next_a, strict=True):
            s.tokens.append(t)
        for s, t in zip(graph_seqs, next_a, strict=True):  # both sides go on from eager's tokens
            s.tokens.append(t)
        self.record.tokens += len(next_a)

    def _check_kv(self, what: str) -> None:
        mla = self.built.is_mla
        written = torch.zeros(NUM_BLOCKS * BLOCK_SIZE, dtype=torch.bool)
        if self.written:
            written[torch.tensor(sorted(self.written))] = True
        for layer, (eager, graph, initial) in enumerate(zip(self.eager.caches, self.graph.caches, self.initial,
                                                            strict=True)):
            for name, e, g, i in zip("kv", eager, graph, initial, strict=True):
                e, g, i = (t.cpu().reshape(NUM_BLOCKS * BLOCK_SIZE, -1) for t in (e, g, i))
                untouched = ~written
                if mla:  # the MLA padding rows write distinct slots of reserved block 0
                    untouched[:BLOCK_SIZE] = False
                if not torch.equal(g[untouched], i[untouched]):
                    bad = (g != i).any(-1) & untouched
                    self.record.mismatches.append(
                        f"{what}: graph mode wrote {int(bad.sum())} {name}-cache slot(s) of layer {layer} outside the "
                        f"live tokens (first: slot {int(bad.nonzero()[0])})")
                if not torch.equal(e[~written], i[~written]):
                    self.record.mismatches.append(f"{what}: eager wrote {name}-cache slots of layer {layer} outside "
                                                  f"the live tokens")
                if not torch.equal(g[written], e[written]):
                    self.record.mismatches.append(f"{what}: layer {layer} {name}-cache live slots differ")

    def run(self, steps: int, max_seqs: int, sizes: Sequence[int] = BATCH_SIZES) -> Record:
        # Prompts fed by decode steps cost a step per token: shorter ones (the KV still crosses blocks as they decode).
        longest = BLOCK_SIZE + 4 if self.record.prefill == "prefill" else BLOCK_SIZE // 2
        for index, entry in enumerate(plan(self.seed, steps=steps, max_seqs=max_seqs, longest_prompt=longest,
                                           sizes=sizes)):
            size = entry["size"]
            for side in (self.eager, self.graph):
                while len(side.running) > size:  # the oldest finish
                    side.pool.release(side.running.pop(0))
            if entry["join"]:
                prompts = [[self.prompt_rng.randrange(3, LLAMA_CONFIG["vocab_size"]) for _ in range(n)]
                           for n in entry["join"]]
                new = {}
                for name, side in (("eager", self.eager), ("graph", self.graph)):
                    new[name] = [Sequence_(list(p), []) for p in prompts]
                    for s in new[name]:
                        side.pool.grow(s, len(s.tokens))
                    side.running.extend(new[name])
                if self.record.prefill == "prefill":
                    self._both(new["eager"], new["graph"], decoding=False, what=f"step {index} prefill")
                else:
                    self._ingest_by_decode(new["eager"], new["graph"], what=f"step {index} prefill")
            for side in (self.eager, self.graph):
                for s in side.running:
                    side.pool.grow(s, len(s.tokens))
            self._both(self.eager.running, self.graph.running, decoding=True,
                       what=f"step {index} decode of {size}")
            self.record.steps += 1
            self._check_kv(f"step {index}")
        return self.finish()

    def finish(self) -> Record:
        stats = getattr(self.graph.runner, "stats", None)
        r = self.record
        if stats is not None:
            r.graph_replays, r.captures = stats.replays, stats.captures
            r.eager_reasons = dict(stats.eager_steps)
            r.eager_steps = sum(stats.eager_steps.values())
        graphs = getattr(self.graph.runner, "graphs", None)
        if graphs is not None:
            r.seqlen_paths = sorted({p for g in graphs().values() for p in g.paths})
        return r


def run(model: str, generation: str, **kwargs: Any) -> Record:
    """:func:`run_all` for one model."""
    return run_all([model], generation, **kwargs)[0]


def run_all(models: Sequence[str], generation: str, *, steps: int = 14, max_seqs: int = MAX_SEQS, seed: int = 0,
            workdir: Path | None = None) -> list[Record]:
    """Conformance runs of ``models`` on the simulated torch_npu of ``generation`` (its release inside
    dlinfer's pins, or a release string) with vendor_graph's Ascend runner active. Once per process:
    dlinfer patches lmdeploy process-wide and keeps the torch_npu it first imported."""
    import vendor_graph
    from vendor_graph import vendors

    from . import device as sim

    sim.install()
    release = pinned_release(generation)
    label = f"{sim.resolve(release)[1]} ({release})"
    records = []
    with sim.use_torch_npu(release):
        try:
            import_dlinfer()
        except (AttributeError, ImportError) as exc:
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            raise DlinferImportFailed(f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno}) on "
                                      f"torch_npu {release}") from exc
        vendor_graph.uninstall()
        vendors.activate("ascend")
        for model in models:
            with ascend_context(), tempfile.TemporaryDirectory(dir=workdir) as tmp:
                stream = torch.npu.Stream()
                with torch.npu.stream(stream):  # lmdeploy's agent runs its forward on a side stream
                    built = build(model, Path(tmp), max_batches=max_seqs, seed=seed)
                    records.append(Conformance(built, label, seed=seed).run(steps, max_seqs))
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vendor_graph_sim.realstack GENERATION OUT.json [MODEL ...]``: every model on one
    generation, in this process (the real-stack tests run one process per generation)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m vendor_graph_sim.realstack")
    parser.add_argument("generation")
    parser.add_argument("out", type=Path)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--steps", type=int, default=14)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        records = [{**dataclasses.asdict(r), "parity": r.parity}
                   for r in run_all(args.models, args.generation, steps=args.steps, seed=args.seed)]
    except DlinferImportFailed as exc:
        args.out.write_text(json.dumps({"dlinfer": None, "dlinfer_import_error": str(exc), "records": []}))
        return 0
    args.out.write_text(json.dumps({"dlinfer": dlinfer_description(), "records": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
