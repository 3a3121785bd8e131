#!/usr/bin/env bash
# The H200 runs, in priority order, each task writing its JSON into $OUT as it finishes (a GPU session
# has ~30 minutes and each command at most 10). Run from the repository root on the GPU machine:
#
#   bash benchmarks/h200.sh part1    # lmdeploy 0.17: conformance --graph-backend cuda, latency, replay, capture
#   bash benchmarks/h200.sh part2    # lmdeploy 0.18: the engine, vendor_graph.cuda vs lmdeploy's own graph mode
#   bash benchmarks/h200.sh part3    # "replay step at its floor" (~8.5 min): replay vs bare in rounds (0.17),
#                                    # kernel counts per fill / step for both runners (0.18), engine TPOT in
#                                    # 5 ABBA rounds of alternating processes (0.18)
#   bash benchmarks/h200.sh part4    # "graphs sized to the workload and the memory" (~8.5 min, 0.18): capture
#                                    # sizes fitted to a recorded histogram vs the default ones in ABBA rounds,
#                                    # the VENDOR_GRAPH_PLAN=auto path, and graph memory kept out of the KV cache
#   bash benchmarks/h200.sh part4b   # (a) again (~8.5 min): fitted to two runs after a kernel-cache warm run
#   bash benchmarks/h200.sh part5    # lmdeploy 0.18: Camb/MACA conformance --graph-backend cuda and their demos
#   bash benchmarks/h200.sh part6    # lmdeploy 0.18: faults and resets leak nothing (graph_leaks.py, engine_leaks.py)
#   bash benchmarks/h200.sh part6-engine  # part6's engine reset cycles alone (engine_leaks.py)
#   TP=2 bash benchmarks/h200.sh part7  # lmdeploy 0.18 engine, tensor parallel (TP=1 on one GPU: the rehearsal)
#   bash benchmarks/h200.sh part8    # lmdeploy 0.18's engine with device_type maca / camb over the real dlinfer,
#                                    # real CUDA graphs, GPU stand-ins for the vendor kernels (~3 min)
#   bash benchmarks/h200.sh dry      # on a CPU box: every part1 task on the simulator, small sizes
#   bash benchmarks/h200.sh dry3     # on a CPU box: every part3 piece that runs without a GPU, and its report
#   bash benchmarks/h200.sh dry4     # on a CPU box: part4's fake results through the real plan command, the report
#
# It expects .h200/ (ignored by git) beside it: pkgs017/ and pkgs018/ (the lmdeploy wheels unzipped,
# turbomind binaries removed), whl/ (the few wheels lmdeploy's engine imports that the machine lacks)
# and stubs/xgrammar; see BENCHMARKS.md for how they are made. The machine's own torch, triton and
# transformers are used.
set -u
part=${1:?part1, part2, part3, part4, part4b, part5, part6, part6-engine, part7, part8, dry, dry3 or dry4}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
py=${PYTHON:-python3}

if [ "$part" = dry ] || [ "$part" = dry3 ] || [ "$part" = dry4 ]; then
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
  if [ "$part" = dry4 ]; then
    # part4's runs as made-up results (the same names and variables as part4); the plan comes from the real
    # plan command on the fake stats file, the reservation from the real reserve step; the report into $OUT/report.
    cap=benchmarks/capacity_engine.py
    drystep capacity_selftest "$py" "$cap" selftest
    drystep default_r1 env VENDOR_GRAPH_STATS_FILE="$res/stats_default_r1.json" VENDOR_GRAPH_GRAPH_MEMORY=off \
      "$py" "$cap" fake default "$res/default_r1.json" --label default_r1 --round 1
    drystep plan sh -c '"$1" -m vendor_graph plan --from-stats "$2" --json > "$3"' sh "$py" \
      "$res/stats_default_r1.json" "$res/plan.json"
    drystep plan_check "$py" "$cap" ensure-plan "$res/stats_default_r1.json" "$res/plan.json"
    drystep fitted_r1 env VENDOR_GRAPH_STATS_FILE="$res/stats_fitted_r1.json" VENDOR_GRAPH_CAPTURE_SIZES="$res/plan.json" \
      VENDOR_GRAPH_GRAPH_MEMORY=off "$py" "$cap" fake fitted "$res/fitted_r1.json" --label fitted_r1 --round 1
    cp "$res/stats_default_r1.json" "$res/stats_auto_r1.json"
    drystep auto_r1 env VENDOR_GRAPH_PLAN=auto VENDOR_GRAPH_STATS_FILE="$res/stats_auto_r1.json" \
      "$py" "$cap" fake default "$res/auto_r1.json" --label auto_r1 --round 1 --workload short --plan "$res/plan.json"
    drystep oom_off env VENDOR_GRAPH_STATS_FILE="$res/stats_oom_off.json" VENDOR_GRAPH_GRAPH_MEMORY=off \
      "$py" "$cap" fake oom "$res/oom_off.json" --label oom_off --variant off
    cp "$res/stats_default_r1.json" "$res/stats_oom_reserved.json"
    drystep oom_reserved env VENDOR_GRAPH_STATS_FILE="$res/stats_oom_reserved.json" \
      "$py" "$cap" fake oom "$res/oom_reserved.json" --label oom_reserved --variant reserved
    for round in 2 3; do
      drystep "default_r$round" env VENDOR_GRAPH_STATS_FILE="$res/stats_default_r$round.json" \
        VENDOR_GRAPH_GRAPH_MEMORY=off "$py" "$cap" fake default "$res/default_r$round.json" --label "default_r$round" \
        --round "$round"
      drystep "fitted_r$round" env VENDOR_GRAPH_STATS_FILE="$res/stats_fitted_r$round.json" \
        VENDOR_GRAPH_CAPTURE_SIZES="$res/plan.json" VENDOR_GRAPH_GRAPH_MEMORY=off \
        "$py" "$cap" fake fitted "$res/fitted_r$round.json" --label "fitted_r$round" --round "$round"
    done
    drystep oom_lmdeploy_own "$py" "$cap" fake oom "$res/oom_lmdeploy_own.json" --label oom_lmdeploy_own --lmdeploy-own
    drystep report "$py" benchmarks/report_capacity.py "$res" --out-dir "$OUT/report"
    bash -n "$0" && echo "dry syntax: ok"
    exit $rc_all
  fi
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
elif [ "$part" = part4 ] || [ "$part" = part4b ]; then
  # One GPU command of at most ~9 minutes each. $OUT gets results_<part>.tgz (every run's JSON and stats file,
  # plan.json, steps_<part>.txt; unpack into benchmarks/results/capacity_h200/ (part4) or capacity_refit_h200/
  # (part4b) and run benchmarks/report_capacity.py on it) and logs_<part>.tgz, both refreshed after every step.
  # Runs in priority order; none starts that could end past the budget.
  export PYTHONHASHSEED=0  # the same hash seed in every process
  budget=${PART4_BUDGET_S:-520}  # seconds into the part
  res=$(mktemp -d)
  export PYTHONPATH=$(lmdeploy_path 018)
  model=$(mktemp -d)/llama
  cap=benchmarks/capacity_engine.py
  # every engine process starts from these VENDOR_GRAPH_* unset; each run sets its own
  vg_clean=(-u VENDOR_GRAPH_STATS_FILE -u VENDOR_GRAPH_STATS_EVERY -u VENDOR_GRAPH_CAPTURE_SIZES -u VENDOR_GRAPH_PLAN
            -u VENDOR_GRAPH_PLAN_MAX_GRAPHS -u VENDOR_GRAPH_GRAPH_MEMORY)
  est=60  # seconds per engine process, raised to the longest measured (+3)
  fits() { [ $((SECONDS - part_start + $1)) -le "$budget" ]; }
  vg_run() {  # vg_run NAME MODE LIMIT [VAR=VALUE...] [-- ARGS...]: one engine process, its result in $res/NAME.json
    local name=$1 mode=$2 limit=$3 s0=$SECONDS envs=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    if ! fits "$est"; then
      echo "$name: skipped, the budget of $budget s would be passed" | tee -a "$logs/steps.txt"
      return 1
    fi
    step "$name" "$limit" env "${vg_clean[@]}" ${envs[@]+"${envs[@]}"} "$py" "$cap" run "$mode" "$model" \
      "$res/$name.json" --label "$name" "$@"
    [ $((SECONDS - s0 + 3)) -gt $est ] && est=$((SECONDS - s0 + 3))
    return 0
  }
  default_run() {  # default_run ROUND
    vg_run "default_r$1" default 150 VENDOR_GRAPH_STATS_FILE="$res/stats_default_r$1.json" \
      VENDOR_GRAPH_GRAPH_MEMORY=off -- --round "$1"
  }
  fitted_run() {  # fitted_run ROUND: the sizes of plan.json
    vg_run "fitted_r$1" fitted 150 VENDOR_GRAPH_STATS_FILE="$res/stats_fitted_r$1.json" \
      VENDOR_GRAPH_CAPTURE_SIZES="$res/plan.json" VENDOR_GRAPH_GRAPH_MEMORY=off -- --round "$1"
  }
  abba_rounds() {  # abba_rounds FIRST LAST: default and fitted, fitted first in even rounds, while two runs fit
    local round
    for round in $(seq "$1" "$2"); do
      if ! fits $((2 * est)); then
        echo "rounds $round and later: skipped, the budget of $budget s would be passed" | tee -a "$logs/steps.txt"
        break
      fi
      if [ $((round % 2)) -eq 0 ]; then fitted_run "$round"; default_run "$round"
      else default_run "$round"; fitted_run "$round"; fi
    done
  }
  # The vendor_graph under test needs the stats file, the plan command and the capacity module. The engine
  # processes import it from $site (the .h200/whl wheel) before the tree: a wheel built before those features
  # would be measured instead, so then the tree goes first. (`python -m vendor_graph`, the plan step, runs
  # from the repository root and imports the tree's copy either way.)
  if "$py" "$cap" preflight > "$logs/preflight.log" 2>&1; then
    echo "preflight: $(tail -n 1 "$logs/preflight.log")" | tee -a "$logs/steps.txt"
  else
    echo "preflight: $(tail -n 1 "$logs/preflight.log"); rebuild .h200/whl from this tree. The tree goes first" \
      | tee -a "$logs/steps.txt"
    export PYTHONPATH="$root:$PYTHONPATH"
    "$py" "$cap" preflight 2>&1 | tail -n 1 | sed 's/^/preflight, tree first: /' | tee -a "$logs/steps.txt"
  fi
  step gen_model 100 "$py" "$cap" gen "$model"
  if [ "$part" = part4 ]; then
    # (a) round 1: the default sizes record the histogram; the plan fits at most as many sizes to it
    # (--max-graphs defaults to the recorded run's graph count); the fitted run captures those.
    default_run 1
    step plan 60 sh -c '"$1" -m vendor_graph plan --from-stats "$2" --json > "$3"' sh "$py" \
      "$res/stats_default_r1.json" "$res/plan.json"
    step plan_check 30 "$py" "$cap" ensure-plan "$res/stats_default_r1.json" "$res/plan.json"
    fitted_run 1
    # VENDOR_GRAPH_PLAN=auto on a copy of round 1's stats file: the runner must fit the same sizes at start
    # (graph memory left at its default, auto: reserved from that file). The short workload: a sizes check.
    cp "$res/stats_default_r1.json" "$res/stats_auto_r1.json"
    vg_run auto_r1 default 110 VENDOR_GRAPH_PLAN=auto VENDOR_GRAPH_STATS_FILE="$res/stats_auto_r1.json" \
      -- --round 1 --workload short
    # (b) max_batch_size 256, cache_max_entry_count 0.9999, max_prefill_token_num 2048 (capacity_engine.py's
    # oom defaults): no reservation, then VENDOR_GRAPH_GRAPH_MEMORY's default, auto, from a copy of round 1's
    # stats file (its pool scaled to 256 rows, plus this plan's buffers at this cache's blocks).
    vg_run oom_off oom 150 VENDOR_GRAPH_STATS_FILE="$res/stats_oom_off.json" VENDOR_GRAPH_GRAPH_MEMORY=off
    cp "$res/stats_default_r1.json" "$res/stats_oom_reserved.json"
    vg_run oom_reserved oom 150 VENDOR_GRAPH_STATS_FILE="$res/stats_oom_reserved.json"
    abba_rounds 2 5
    # (b) last: the oom configuration under lmdeploy's own graph mode (no vendor_graph)
    vg_run oom_lmdeploy_own oom 120 -- --lmdeploy-own
  else
    # (a) again, fitted as a server restarting with VENDOR_GRAPH_PLAN=auto would be: from the histograms of two
    # earlier runs, merged, after one run that only warms lmdeploy's Triton kernel cache (part4's round 1 was
    # that cache's first run: slower steps, larger batches, a histogram unlike later runs').
    est=45
    vg_run warm default 150 VENDOR_GRAPH_STATS_FILE="$res/stats_warm.json" VENDOR_GRAPH_GRAPH_MEMORY=off
    for n in 1 2; do
      vg_run "fit$n" default 150 VENDOR_GRAPH_STATS_FILE="$res/stats_fit$n.json" VENDOR_GRAPH_GRAPH_MEMORY=off
    done
    step plan 60 sh -c '"$1" -m vendor_graph plan --from-stats "$2" "$3" --json > "$4"' sh "$py" \
      "$res/stats_fit1.json" "$res/stats_fit2.json" "$res/plan.json"
    step plan_check 30 "$py" "$cap" ensure-plan "$res/stats_fit1.json" "$res/plan.json"
    abba_rounds 1 6
  fi
  cp "$logs/steps.txt" "$res/steps_$part.txt"; tar czf "$OUT/results_$part.tgz" -C "$res" .
elif [ "$part" = part5 ]; then
  # Camb and MACA on lmdeploy 0.18 (vendor_graph's metadata fix, decode through lmdeploy's DlinferAttentionImpl)
  # on real CUDA graphs: the conformance checks that take --graph-backend, and the demo of each vendor.
  export PYTHONPATH=$(lmdeploy_path 018)
  step conformance_018 240 "$py" -m pytest -q -p no:cacheprovider -rs tests/conformance/test_camb_maca_lmdeploy_path.py \
    tests/conformance/test_cuda_runner.py tests/conformance/test_decode_parity.py -k "camb or maca" \
    --graph-backend cuda --junitxml="$logs/conformance_018.xml"
  for vendor in camb maca; do
    step "demo_${vendor}_018" 90 "$py" -m vendor_graph demo --vendor "$vendor" --backend cuda --steps 32 --seqs 16 \
      --json "$logs/demo_${vendor}_018.json"
  done
elif [ "$part" = part6 ] || [ "$part" = part6-engine ]; then
  # Faults and resets leak nothing (lmdeploy 0.18, real CUDA graphs): failed captures at every bucket, reset
  # cycles and a weight update on the Camb/MACA specs over lmdeploy's CUDA runner; batches shrinking within
  # their bucket; reset cycles inside lmdeploy's engine with vendor_graph.cuda.
  export PYTHONPATH=$(lmdeploy_path 018)
  if [ "$part" = part6 ]; then  # part6-engine: the engine's cycles alone
    step leaks_cuda 420 "$py" benchmarks/graph_leaks.py --device cuda --out "$OUT"
    step shrinking_cuda 120 "$py" -m pytest -q -p no:cacheprovider -rs tests/conformance/test_decode_parity.py \
      -k shrinking --graph-backend cuda --junitxml="$logs/shrinking_cuda.xml"
  fi
  model=$(mktemp -d)/llama
  step gen_small 100 "$py" -c "import sys; sys.path.insert(0, 'benchmarks'); from engine_tpot import save_random_llama
print(save_random_llama(sys.argv[1], hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048))" "$model"
  step engine_leaks 240 "$py" benchmarks/engine_leaks.py "$model" "$OUT/engine_leaks.json"
elif [ "$part" = part7 ]; then
  # lmdeploy 0.18's engine with tensor parallelism (TP=2 on the two-GPU kind; TP=1: the one-GPU rehearsal of
  # the same scripts, small model): vendor_graph.cuda vs lmdeploy's own graph mode vs eager. vendor_graph goes
  # into the machine's site-packages (a fresh machine each session), so its autoload hook activates it in every
  # worker lmdeploy spawns.
  tp=${TP:-1}
  "$py" -m pip install -q --no-index --no-deps .h200/whl/vendor_graph-*.whl || exit 1
  export PYTHONPATH="$site:$root/.h200/pkgs018:$root/.h200/stubs" NCCL_NVLS_ENABLE=0
  model=$(mktemp -d)/llama
  step gen_tp 300 "$py" benchmarks/engine_tp.py gen "$model" $([ "$tp" = 1 ] && echo --small)
  for mode in vendor lmdeploy eager; do
    step "tp_$mode" 300 "$py" benchmarks/engine_tp.py run "$mode" "$model" "$OUT/tp_$mode.json" --tp "$tp"
  done
  step compare 60 sh -c "'$py' benchmarks/engine_tp.py compare '$OUT/tp_vendor.json' '$OUT/tp_lmdeploy.json' \
    '$OUT/tp_eager.json' > '$OUT/tp_compare.json'"
  cp "$OUT"/tp_vendor.stats*.json "$logs/" 2>/dev/null
  tar czf "$OUT/logs_$part.tgz" -C "$logs" .
elif [ "$part" = part8 ]; then
  # Camb and MACA through lmdeploy 0.18's engine with real CUDA graphs: their lmdeploy backends over the real dlinfer
  # (.h200/dlinfer, laid out per vendor), GPU stand-ins for the vendor kernels (benchmarks/engine_vendors.py).
  export PYTHONPATH="$site:$root/.h200/pkgs018:$root/.h200/stubs" VENDOR_GRAPH_DLINFER_SRC=$root/.h200/dlinfer \
    XDG_CACHE_HOME=$(mktemp -d)
  for vendor in ${PART8_VENDORS:-maca camb}; do
    step "engine_$vendor" 280 "$py" benchmarks/engine_vendors.py "$vendor" "$OUT/engine_$vendor.json"
  done
else
  echo "unknown part $part" >&2
  exit 2
fi
