"""The simulated torch_npu's surface outside torch_npu.npu's graph API (data/torch_npu_surface.json), and the
real dlinfer and lmdeploy Ascend backend importing on it."""

import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch
from sim_test_ops import ops
from vendor_graph_sim import device as sim
from vendor_graph_sim.device import _npu_surface

from vendor_graph.vendors.ascend.releases import GENERATIONS

ROOT = Path(__file__).resolve().parents[2]
SURFACE = _npu_surface.surface()
DISPATCH_GENERATIONS = [g for g in GENERATIONS
                        if "_GraphDispatchMode" in sim.load_manifest(sim.resolve(g)[0])["graph_api"].get("classes", {})]


def _params(fn):
    return [p.name for p in inspect.signature(fn).parameters.values()]


def _spec_params(entry):
    return [p["name"] for p in entry["params"]]


def _cuda_dict():
    return dict(torch.cuda.__dict__)


def test_find_spec_and_file_inside_the_block_only():
    real_one = importlib.util.find_spec("torch_npu") is not None
    with sim.use_torch_npu("G5") as torch_npu:
        spec = importlib.util.find_spec("torch_npu")
        assert spec is torch_npu.__spec__ and spec.name == "torch_npu" and spec.submodule_search_locations == []
        assert spec.origin == torch_npu.__file__
        assert (Path(torch_npu.__file__).parent / "lib" / "libop_plugin_atb.so").is_file()
        for name in ("torch_npu.npu", "torch_npu.version", "torch_npu.contrib", "torch_npu.utils._path_manager",
                     "torch_npu.profiler", "torch_npu._C"):
            assert importlib.util.find_spec(name).name == name
        assert importlib.util.find_spec("torch_npu.no_such_module") is None
        assert torch_npu._C is sys.modules["torch_npu._C"]  # attribute access imports the submodule
    assert not [name for name in sys.modules if name.split(".")[0] == "torch_npu"]
    assert (importlib.util.find_spec("torch_npu") is not None) == real_one


def test_transfer_to_npu_redirects_torch_cuda_until_the_block_ends():
    before = _cuda_dict()
    with sim.use_torch_npu("G5"):
        assert _cuda_dict() == before  # importing torch_npu alone does not touch torch.cuda
        from torch_npu.contrib import transfer_to_npu  # noqa: F401

        for name in ("current_stream", "stream", "Stream", "Event", "synchronize", "empty_cache", "mem_get_info",
                     "current_device", "device_count", "is_available", "set_device", "graph", "graph_pool_handle",
                     "get_device_name"):
            assert getattr(torch.cuda, name) is getattr(torch.npu, name), name
        assert not hasattr(torch.cuda, "ExternalEvent")  # only names torch.cuda has are redirected
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() == s
        x = torch.ones(2, device="npu") * 2
        torch.cuda.synchronize()
        assert x.tolist() == [2.0, 2.0]
        assert torch.cuda.mem_get_info()[0] > 0 and torch.cuda.get_device_name().startswith("Ascend910")
    after = _cuda_dict()
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)


def test_transfer_to_npu_maps_a_cuda_device_to_the_npu_until_the_block_ends():
    """What lmdeploy's startup check does (``torch.tensor(..., device='cuda')``, ``new_tensor``), and the other
    factories and methods the real transfer_to_npu maps, land on the NPU; all of it restored at the block's end."""
    owners = {torch: ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "zeros_like"),
              torch.Tensor: ("to", "new_tensor", "new_zeros", "new_empty", "cuda", "is_cuda"),
              torch.nn.Module: ("to", "cuda")}
    before = {(o, n): o.__dict__.get(n) for o, names in owners.items() for n in names}
    with sim.use_torch_npu("G5"):
        from torch_npu.contrib import transfer_to_npu  # noqa: F401

        a = torch.tensor([1, 2], device="cuda")
        b = a.new_tensor([3, 4], device="cuda")
        assert a.device.type == b.device.type == "npu" and (a + b).tolist() == [4, 6]
        assert torch.zeros(2, device=torch.device("cuda", 0)).device == torch.device("npu", 0)
        assert torch.ones(1).to("cuda").device.type == "npu" and torch.ones(1).cuda().is_cuda
        assert torch.arange(3, device="cuda:0").device.type == "npu"
        assert torch.nn.Linear(2, 2).to("cuda").weight.device.type == "npu"
        assert torch.nn.Linear(2, 2).cuda().weight.device.type == "npu"
        assert torch.ones(1).to(torch.float16).dtype == torch.float16  # other arguments pass through
    assert {(o, n): o.__dict__.get(n) for o, names in owners.items() for n in names} == before
    with pytest.raises((RuntimeError, AssertionError)):  # outside the block, cuda is cuda again (none here)
        torch.tensor([1], device="cuda")


def test_cuda_graph_api_still_works_after_a_transfer_block():
    with sim.use_torch_npu("G3a"):
        import torch_npu.contrib.transfer_to_npu  # noqa: F401
    with sim.cuda_graph_api():
        x = torch.ones(2, device="npu")
        s = torch.cuda.Stream()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle(), stream=s):
            y = x * 3
        x.fill_(2)
        g.replay()
        assert y.tolist() == [6.0, 6.0]


def test_atb_plugin_load_registers_atb_ops_and_other_paths_reach_torch(monkeypatch, tmp_path):
    from vendor_graph_sim import kernels

    registered = []
    real_register = kernels.register
    monkeypatch.setattr(kernels, "register", lambda: registered.append(1) or real_register())
    seen = []
    torch.ops.load_library = seen.append  # stands for torch's loader
    try:
        with sim.use_torch_npu("G5") as torch_npu:
            from torch_npu.utils._path_manager import PathManager

            plugin = Path(torch_npu.__file__).parent / "lib" / "libop_plugin_atb.so"
            PathManager.check_directory_path_readable(str(plugin))
            torch.ops.load_library(str(plugin))
            assert registered == [1] and seen == []
            assert hasattr(torch.ops.atb, "_npu_paged_attention") and hasattr(torch.ops.atb, "_npu_paged_attention_mla")
            assert str(plugin) in torch.ops.loaded_libraries
            other = tmp_path / "libother.so"
            torch.ops.load_library(str(other))
            assert seen == [str(other)] and registered == [1]
        assert torch.ops.load_library == seen.append  # restored
        torch.ops.load_library(str(plugin))  # after the block the plugin path is torch's again
        assert seen == [str(other), str(plugin)] and registered == [1]
    finally:
        torch.ops.__dict__.pop("load_library", None)
        torch.ops.loaded_libraries.discard(str(plugin))


def test_atb_plugin_path_is_dlopened_outside_the_block():
    with pytest.raises(OSError):  # a placeholder, not a shared object
        torch.ops.load_library(str(_npu_surface.plugin_paths()["lib/libop_plugin_atb.so"]))


def test_path_manager_rejects_missing_paths(tmp_path):
    with sim.use_torch_npu("G0"):
        from torch_npu.utils._path_manager import PathManager

        entry = SURFACE["submodules"]["torch_npu.utils._path_manager"]["classes"]["PathManager"]
        spec = entry["classmethods"]["check_directory_path_readable"]
        assert _params(PathManager.__dict__["check_directory_path_readable"].__func__) == _spec_params(spec)
        PathManager.check_directory_path_readable(tmp_path)
        with pytest.raises(RuntimeError, match="does not exist"):
            PathManager.check_directory_path_readable(tmp_path / "absent")


@pytest.mark.parametrize("generation", ["G0", "G1", "G5"])
def test_task_group_handle_type_follows_the_wheel(generation):
    manifest = sim.load_manifest(sim.resolve(generation)[0])
    with sim.use_torch_npu(generation) as torch_npu:
        has = manifest["binary_strings"]["_NPUTaskGroupHandle"]
        assert hasattr(torch_npu._C, "_NPUTaskGroupHandle") == has
        if not has:
            return
        npu = torch.npu
        s = npu.Stream()
        q = torch.ones(2, 3, device="npu")
        g = npu.NPUGraph()
        with npu.graph(g, stream=s):
            npu.graph_task_group_begin(s)
            q.mul_(2)
            handle = npu.graph_task_group_end(s)
        assert type(handle) is torch_npu._C._NPUTaskGroupHandle
        assert isinstance(handle, torch_npu._C._NPUTaskGroupHandle)


@pytest.mark.parametrize("generation", DISPATCH_GENERATIONS)
def test_dispatch_mode_has_exactly_the_manifest_methods(generation):
    manifest = sim.load_manifest(sim.resolve(generation)[0])
    methods = manifest["graph_api"]["classes"]["_GraphDispatchMode"]["methods"]
    every = set()
    for g in DISPATCH_GENERATIONS:
        every |= set(sim.load_manifest(sim.resolve(g)[0])["graph_api"]["classes"]["_GraphDispatchMode"]["methods"])
    with sim.use_torch_npu(generation):
        cls = torch.npu._GraphDispatchMode
        defined = {name for name in every if name in cls.__dict__}
        assert defined == set(methods)
        for name, info in methods.items():
            raw = cls.__dict__[name]
            fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw
            assert _params(fn) == _spec_params(info), name
            assert isinstance(raw, classmethod) == ("classmethod" in info["decorators"]), name


@pytest.mark.parametrize("generation", ["G2a", "G5"])
def test_update_schema_and_append_dispatch_record(generation):
    # G2a: with its plain-name branch matching .default, so the FIA call below is recorded
    with sim.use_torch_npu(generation), sim.configured(g2a_plain_name_matches_default=True):
        cls = torch.npu._GraphDispatchMode
        cls.update_schema("vg_simtest::op", "schema text")
        assert cls.tensor_schema_name["vg_simtest::op"] == "schema text"
        if "is_infra_mode" in cls.__dict__:
            assert cls.is_infra_mode() is True
        # the simulator's own interception records through _append_dispatch_record
        calls = []
        real = cls._append_dispatch_record
        cls._append_dispatch_record = lambda self, *a, **k: calls.append(k.get("func")) or real(self, *a, **k)
        q = torch.ones(2, 3, device="npu")
        g = torch.npu.NPUGraph()
        with torch.npu.graph(g, auto_dispatch_capture=True):
            out = ops.npu_fused_infer_attention_score(q, q, q, actual_seq_lengths_kv=[3, 5])[0]
        records = g.graph_dispatch_mode.graph_dispatch_records
        assert len(calls) == 1 and len(records) == 1
        g.update([{"actual_seq_lengths_kv": [7, 9]}])
        g.replay()
        assert out.cpu()[:, 0].tolist() == [7.0, 9.0]
        # a direct call appends a record that update() can patch by the generation's rules
        mode = torch.npu._GraphDispatchMode()
        handle, event = records[0].handle, records[0].event
        mode._append_dispatch_record(event, handle, (q, q, q), {"actual_seq_lengths_kv": [3, 5]},
                                     records[0].op, *([None] if "handler_cls" in _params(real) else []))
        assert len(mode.graph_dispatch_records) == 1
        assert mode.graph_dispatch_records[0].kwargs == {"actual_seq_lengths_kv": [3, 5]}


def test_device_identity_and_basics():
    with sim.use_torch_npu("G1") as torch_npu:
        assert torch.npu.get_device_name().startswith("Ascend910")
        assert torch.npu.get_device_name() == SURFACE["device_module"]["device_name"]
        assert 220 <= torch.npu.get_soc_version() <= 225  # an A2 part by the consumers' own test
        assert torch.npu.is_available() and torch.npu.device_count() == 1 and torch.npu.current_device() == 0
        torch.npu.set_device(0)
        torch.npu.set_device("npu:0")
        assert torch_npu.npu.get_soc_version is torch.npu.get_soc_version


def test_profiler_empty_with_format_and_fusion_attention_probe():
    with sim.use_torch_npu("G3a") as torch_npu:
        import torch_npu.profiler as profiler

        assert {a.name for a in profiler.ProfilerActivity} == set(SURFACE["submodules"]["torch_npu.profiler"]
                                                                  ["ProfilerActivity"])
        with profiler.profile(activities=[profiler.ProfilerActivity.CPU, profiler.ProfilerActivity.NPU]) as prof:
            torch.ones(2, device="npu").add_(1)
        assert prof.key_averages() is not None
        entry = SURFACE["package_functions"]["empty_with_format"]
        assert _params(torch_npu.empty_with_format) == _spec_params(entry)
        t = torch_npu.empty_with_format(size=(2, 3), dtype=torch.float16, device="npu", acl_format=29)
        assert t.shape == (2, 3) and t.dtype == torch.float16 and sim.is_device_tensor(t)
        assert hasattr(torch_npu, "npu_fusion_attention") and not hasattr(torch_npu, "no_such_name")
        from torch_npu import npu_fusion_attention

        with pytest.raises(NotImplementedError, match="not emulated"):
            npu_fusion_attention(t, t, t, 1, "BSND", keep_prob=1.0)


def test_lmdeploy_ascend_backend_reads_the_device_name():
    with sim.use_torch_npu("G5"):
        try:
            from lmdeploy.pytorch.backends.dlinfer.ascend.op_backend import AscendOpsBackend, SocVersion
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] in ("torch_npu", "lmdeploy", "dlinfer"):
                raise
            pytest.skip(f"lmdeploy's dlinfer backend needs {exc.name!r}, not installed here")
        SocVersion.device_name.cache_clear()
        SocVersion.soc_version.cache_clear()
        try:
            assert AscendOpsBackend.get_k_block_shape(16, 2, 64, torch.float32) == (16, 2, 64)
            assert AscendOpsBackend.get_v_block_shape(16, 2, 64, torch.float32) == (16, 2, 64)
            assert SocVersion.is_A2() and not SocVersion.is_Ascend310P()
        finally:
            SocVersion.device_name.cache_clear()
            SocVersion.soc_version.cache_clear()
            probe = sys.modules.get("transformers.utils.import_utils")
            if probe is not None:  # transformers caches whether torch_npu is there; it is not after the block
                probe.is_torch_npu_available.cache_clear()
