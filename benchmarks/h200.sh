#!/usr/bin/env bash
# The H200 runs, in priority order, each task writing its JSON into $OUT as it finishes (a GPU session
# has ~30 minutes and each command at most 10). Run from the repository root on the GPU machine:
#
#   bash benchmarks/h200.sh part1    # lmdeploy 0.17: conformance --graph-backend cuda, latency, replay, capture
#   bash benchmarks/h200.sh part2    # lmdeploy 0.18: the engine, vendor_graph.cuda vs lmdeploy's own graph mode
#   bash benchmarks/h200.sh dry      # on a CPU box: every part1 task on the simulator, small sizes
#
# It expects .h200/ (ignored by git) beside it: pkgs017/ and pkgs018/ (the lmdeploy wheels unzipped,
# turbomind binaries removed), whl/ (the few wheels lmdeploy's engine imports that the machine lacks)
# and stubs/xgrammar; see BENCHMARKS.md for how they are made. The machine's own torch, triton and
# transformers are used.
set -u
part=${1:?part1, part2 or dry}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
py=${PYTHON:-python3}

if [ "$part" = dry ]; then
  OUT=${OUT:-$(mktemp -d)}
  [ -x "$root/.venv/bin/python" ] && py=${PYTHON:-$root/.venv/bin/python}
  echo "dry run into $OUT"
  for task in latency replay capture; do
    "$py" benchmarks/decode_bench.py "$task" --device sim --dry-run --out "$OUT/dry_$task.json" > "$OUT/dry_$task.log" 2>&1
    echo "dry $task: rc=$?"
  done
  exit 0
fi

OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
site=$(mktemp -d)/site
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .h200/whl/*.whl || exit 1
lmdeploy_path() { echo "$site:$root/.h200/pkgs$1:$root/.h200/stubs:$root:$root/sim:$root/sim/vendor_graph_sim/data/standins"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1

logs=$(mktemp -d)  # logs travel back as one archive ($OUT returns at most 8 files), refreshed per task
mv "$OUT/gpu.txt" "$logs/"
step() {  # step NAME TIMEOUT CMD...: one task; its log and exit status into the archive
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  echo "$name: rc=$? in $((SECONDS - start)) s" | tee -a "$logs/steps.txt"
  tar czf "$OUT/logs_$part.tgz" -C "$logs" .
}

if [ "$part" = part1 ]; then
  export PYTHONPATH=$(lmdeploy_path 017)
  step conformance 140 "$py" -m pytest -q -p no:cacheprovider tests/conformance --graph-backend cuda \
    --junitxml="$logs/conformance.xml"
  step demo_cuda 60 "$py" -m vendor_graph demo --vendor camb --backend cuda --steps 32 --seqs 16
  step latency 200 "$py" benchmarks/decode_bench.py latency --out "$OUT/latency.json"
  step replay 90 "$py" benchmarks/decode_bench.py replay --out "$OUT/replay.json"
  step capture 100 "$py" benchmarks/decode_bench.py capture --out "$OUT/capture.json"
elif [ "$part" = part2 ]; then
  export PYTHONPATH=$(lmdeploy_path 018)
  model=$(mktemp -d)/llama
  step gen_model 100 "$py" benchmarks/engine_tpot.py gen "$model"
  # Two rounds, modes alternating: run-to-run spread on this machine is as large as the difference sought.
  for round in 1 2; do
    for mode in vendor lmdeploy; do
      step "engine_${mode}_r$round" 120 "$py" benchmarks/engine_tpot.py run "$mode" "$model" \
        "$OUT/engine_${mode}_r$round.json"
    done
  done
else
  echo "unknown part $part" >&2
  exit 2
fi
