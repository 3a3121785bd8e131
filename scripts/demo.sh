#!/usr/bin/env bash
# The README's main job: sets up the environment and runs the demo: the tiny decoder on the CPU graph
# simulator, eager and graph side by side (default: Ascend, simulated torch_npu G5, 64 steps).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup-env.sh" >&2
# Tiny tensors: intra-op threads only add overhead (on a busy 2-core machine, several times the run time).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "${VENDOR_GRAPH_VENV:-$root/.venv}/bin/python" -m vendor_graph demo "$@"
