#!/usr/bin/env bash
# The H200 runs, in priority order, each task writing its JSON into $OUT as it finishes (a GPU session
# has ~30 minutes and each command at most 10). Run from the repository root on the GPU machine:
#
#   bash benchmarks/h200.sh part1    # lmdeploy 0.17: conformance --graph-backend cuda, latency, replay, capture
#   bash benchmarks/h200.sh part2    # lmdeploy 0.18: the engine, vendor_graph.cuda vs lmdeploy's own graph mode
#   bash benchmarks/h200.sh part3    # "replay step at its floor" (~8.5 min): replay vs bare in rounds (0.17),
#                                    # kernel counts per fill / step for both runners (0.18), engine TPOT in
#                                    # 5 ABBA rounds of alternating processes (0.18)
#   bash benchmarks/h200.sh dry      # on a CPU box: every part1 task on the simulator, small sizes
#   bash benchmarks/h200.sh dry3     # on a CPU box: every part3 piece that runs without a GPU, and its report
#
# It expects .h200/ (ignored by git) beside it: pkgs017/ and pkgs018/ (the lmdeploy wheels unzipped,
# turbomind binaries removed), whl/ (the few wheels lmdeploy's engine imports that the machine lacks)
# and stubs/xgrammar; see BENCHMARKS.md for how they are made. The machine's own torch, triton and
# transformers are used.
set -u
part=${1:?part1, part2, part3, dry or dry3}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
py=${PYTHON:-python3}

if [ "$part" = dry ] || [ "$part" = dry3 ]; then
  OUT=${OUT:-$(mktemp -d)}
  mkdir -p "$OUT"
  [ -x "$root/.venv/bin/python" ] && py=${PYTHON:-$root/.venv/bin/python}
  # The simulator runs the Camb spec, which lmdeploy 0.17 supports: .h200/pkgs017 goes first (a PYTHONPATH
  # given by the caller, e.g. a snapshot of vendor_graph, goes before it).
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$root/.h200/pkgs017:$root/.h200/stubs"
  echo "dry run into $OUT"
  rc_all=0
  drystep() {  # drystep NAME CMD...
    local name=$1; shift
    "$@" > "$OUT/dry_$name.log" 2>&1
    local rc=$?
    echo "dry $name: rc=$rc"
    [ $rc -eq 0 ] || rc_all=1
  }
  if [ "$part" = dry ]; then
    for task in latency replay capture; do
      drystep "$task" "$py" benchmarks/decode_bench.py "$task" --device sim --dry-run --out "$OUT/dry_$task.json"
    done
    exit $rc_all
  fi
  res="$OUT/results"
  mkdir -p "$res"
  drystep replay3 "$py" benchmarks/decode_bench.py replay --device sim --dry-run --out "$res/replay3.json"
  drystep kernel_counts_selftest "$py" benchmarks/kernel_counts.py selftest
  drystep kernel_counts "$py" benchmarks/kernel_counts.py dry "$res/kernel_counts.json"
  for round in 1 2 3; do
    for mode in vendor lmdeploy; do
      drystep "engine3_${mode}_r$round" "$py" benchmarks/engine_tpot.py fake "$mode" "$res/engine3_${mode}_r$round.json" \
        --round "$round"
    done
  done
  drystep report "$py" benchmarks/report_h200.py "$res"
  bash -n "$0" && echo "dry syntax: ok"
  exit $rc_all
fi

OUT=${OUT:?set OUT to the folder the results go to}
mkdir -p "$OUT"
part_start=$SECONDS
site=$(mktemp -d)/site
"$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .h200/whl/*.whl || exit 1
lmdeploy_path() { echo "$site:$root/.h200/pkgs$1:$root/.h200/stubs:$root:$root/sim:$root/sim/vendor_graph_sim/data/standins"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>&1

logs=$(mktemp -d)  # logs travel back as one archive ($OUT returns at most 8 files), refreshed per task
mv "$OUT/gpu.txt" "$logs/"
res=""  # part3: the results folder, archived after each step like the logs
step() {  # step NAME TIMEOUT CMD...: one task; its log and exit status into the archive
  local name=$1 limit=$2; shift 2
  local start=$SECONDS
  timeout -k 10 "$limit" "$@" > "$logs/$name.log" 2>&1
  echo "$name: rc=$? in $((SECONDS - start)) s (part at $((SECONDS - part_start)) s)" | tee -a "$logs/steps.txt"
  tar czf "$OUT/logs_$part.tgz" -C "$logs" .
  if [ -n "$res" ]; then cp "$logs/steps.txt" "$res/steps_$part.txt"; tar czf "$OUT/results_$part.tgz" -C "$res" .; fi
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
elif [ "$part" = part3 ]; then
  # One GPU command of at most ~9 minutes. $OUT gets two files, refreshed after every step:
  # results_part3.tgz (replay3.json, kernel_counts.json, engine3_{vendor,lmdeploy}_r{1..5}.json, steps_part3.txt;
  # unpack into benchmarks/results/h200/ and run benchmarks/report_h200.py) and logs_part3.tgz.
  export PYTHONHASHSEED=0  # the same hash seed in every process
  budget=${PART3_BUDGET_S:-540}  # no engine round starts that could end past this (seconds into the part)
  res=$(mktemp -d)
  # (b) whole replay step vs bare replay, 0.89 B model, batch 1: 40 rounds x 25 triples (~30 s)
  step replay3 100 env PYTHONPATH="$(lmdeploy_path 017)" "$py" benchmarks/decode_bench.py replay --out "$res/replay3.json"
  export PYTHONPATH=$(lmdeploy_path 018)
  model=$(mktemp -d)/llama
  step gen_model 100 "$py" benchmarks/engine_tpot.py gen "$model"
  # (a) kernels per fill / replay step, both runners on one engine's model, batches 1, 8, 64 (~70 s)
  step kernel_counts 170 "$py" benchmarks/kernel_counts.py run "$model" "$res/kernel_counts.json"
  # (c) engine TPOT: 5 rounds, one process per mode, ABBA order (vendor first in odd rounds), ~40 s each
  rounds=5 est=45
  for round in $(seq 1 $rounds); do
    if [ $((SECONDS - part_start + 2 * est)) -gt "$budget" ]; then
      echo "engine round $round and later: skipped, the budget of $budget s would be passed" | tee -a "$logs/steps.txt"
      break
    fi
    if [ $((round % 2)) -eq 1 ]; then order="vendor lmdeploy"; else order="lmdeploy vendor"; fi
    for mode in $order; do
      s0=$SECONDS
      step "engine3_${mode}_r$round" 75 "$py" benchmarks/engine_tpot.py run "$mode" "$model" \
        "$res/engine3_${mode}_r$round.json"
      [ $((SECONDS - s0 + 3)) -gt $est ] && est=$((SECONDS - s0 + 3))
    done
  done
  cp "$logs/steps.txt" "$res/steps_$part.txt"; tar czf "$OUT/results_$part.tgz" -C "$res" .
else
  echo "unknown part $part" >&2
  exit 2
fi
