"""Where the simulated ``torch_npu``'s ``__file__`` points (``vendor_graph_sim.device.use_torch_npu``).

Not a package to import: the simulated torch_npu is generated in memory; this directory only holds the
files consumers reach through ``torch_npu.__file__`` (``lib/libop_plugin_atb.so``, a placeholder whose
``torch.ops.load_library`` the simulator intercepts).
"""

raise ImportError("vendor_graph_sim/data/torch_npu is the simulated torch_npu's file location, not a module: "
                  "use vendor_graph_sim.device.use_torch_npu()")
