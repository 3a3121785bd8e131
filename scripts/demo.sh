#!/usr/bin/env bash
# The README's main job: sets up the environment and runs the demo: lmdeploy's own pipeline() on the simulated
# Ascend NPU (simulated torch_npu G5) over the real dlinfer, eager and in graph mode with vendor_graph.ascend.
# The dlinfer is VENDOR_GRAPH_DLINFER_SRC, or, unset, the snapshot beside the clone (../shared/third_party/dlinfer)
# where it exists, as .ci/run does for the tests; with neither, the demo says how to provide one
# (`bash scripts/demo.sh --model tiny` needs none).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup-env.sh" >&2
if [ -z "${VENDOR_GRAPH_DLINFER_SRC:-}" ] && [ -d "$root/../shared/third_party/dlinfer" ]; then
  VENDOR_GRAPH_DLINFER_SRC=$(cd "$root/../shared/third_party/dlinfer" && pwd)
  export VENDOR_GRAPH_DLINFER_SRC
fi
# Tiny tensors: intra-op threads only add overhead (on a busy 2-core machine, several times the run time).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "${VENDOR_GRAPH_VENV:-$root/.venv}/bin/python" -m vendor_graph demo "$@"
