#!/usr/bin/env bash
# The oldest-torch leg: the runtime's tests on the minimum torch of pyproject.toml ([tool.vendor_graph]
# min-torch, 2.1.0) with the oldest supported lmdeploy (0.16.0): tests/contract/test_runtime_imports.py,
# tests/unit and tests/lmdeploy, less what needs the simulator (vendor_graph_sim needs a current
# torch). Sets its venv up first (idempotent; scripts/setup-oldest-torch.sh). Extra arguments go to pytest.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=${VENDOR_GRAPH_OLDEST_TORCH:-2.1.0}
venv=${VENDOR_GRAPH_OLDEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vendor_graph/venv-oldest-torch-$torch_version}
cd "$root"
start=$SECONDS
"$root/scripts/setup-oldest-torch.sh"
echo "=== oldest torch: environment ready in $((SECONDS - start)) s"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} VENDOR_GRAPH_OLDEST_TORCH_LEG=1
# Left out, each for a reason that is not vendor_graph's runtime:
#  - test files that import vendor_graph_sim (the simulator and its emulated Ascend operators need
#    torch.library.register_fake, torch >= 2.4): found below, and named when the leg runs;
#  - the demo test, which runs the simulator in a child process;
#  - three ascend cases of test_vendor_buffers.py that run lmdeploy 0.16's own AscendOpsBackend
#    .update_step_context, whose block_offsets.gather(1, int32 index) torch 2.1 rejects on the CPU
#    ("gather(): Expected dtype int64 for index"); on an NPU that call is torch_npu's.
deselect=(
  "tests/lmdeploy/test_cli_operator.py::test_demo_runs_the_simulator_in_a_child_when_a_real_torch_npu_is_installed"
  "tests/lmdeploy/test_vendor_buffers.py::test_metadata_from_lmdeploys_update_step_context_is_padded_and_bound[ascend]"
  "tests/lmdeploy/test_vendor_buffers.py::test_batch_3_after_7_leaves_no_stale_row_in_what_attention_reads[ascend]"
  "tests/lmdeploy/test_vendor_buffers.py::test_default_lmdeploy_methods_are_not_used[ascend]"
)
ignore=()
for file in $(grep -lE "^\s*(from|import) vendor_graph_sim" tests/unit/*.py tests/lmdeploy/*.py || true); do
  echo "=== oldest torch: leaving out $file (imports vendor_graph_sim)"
  ignore+=("--ignore=$file")
done
# Two pytest processes, one per core like the other legs (tests/lmdeploy alone takes about as long as the
# rest); a --junitxml=FILE argument becomes FILE's name + -<part>.xml for each.
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
part() {  # part NAME PATHS...: one pytest process, in the background, its output into $logs/NAME.log
  local name=$1; shift
  local args=() a
  for a in "${extra[@]}"; do
    [[ $a == --junitxml=* ]] && a="${a%.xml}-$name.xml"
    args+=("$a")
  done
  "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" "${ignore[@]}" "${deselect[@]/#/--deselect=}" \
    ${args[@]+"${args[@]}"} > "$logs/$name.log" 2>&1 &
}
extra=("$@")
part lmdeploy tests/lmdeploy
lmdeploy=$!
part unit tests/contract/test_runtime_imports.py tests/unit
unit=$!
status=0
wait "$unit" || status=1
wait "$lmdeploy" || status=1
echo "--- tests/contract/test_runtime_imports.py tests/unit:"; cat "$logs/unit.log"
echo "--- tests/lmdeploy:"; cat "$logs/lmdeploy.log"
exit $status
