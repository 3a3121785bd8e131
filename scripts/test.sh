#!/usr/bin/env bash
# The README's test command: sets up the test environments and runs lint and the whole test suite against
# every supported lmdeploy release (0.16.0, 0.17.0, 0.18.0), ending on 0.18.0, each in its own environment
# (.venvs/test-lmdeploy-<version> over a shared .venvs/test-base, scripts/setup-test-env.sh; the demo's .venv is
# never touched), then the oldest-torch leg (torch 2.1.0 + lmdeploy 0.16.0, scripts/test-oldest-torch.sh;
# VENDOR_GRAPH_SKIP_OLDEST_TORCH=1 leaves it out). Prints one total line over all runs.
# The real-stack leg (tests/realstack: lmdeploy's models over the real dlinfer, and lmdeploy's own engine and
# pipeline on the simulated NPU, one process per torch_npu generation) runs every generation on the last release
# (after the host suites, or G4 G5 after the sim suites where the mutation checks run on the last release: the two
# cores balanced) and G1 + G5 plus its other tests (MoE path, multi-token gate, demo) on the others (all of it
# after the sim suites where the mutation checks run); VENDOR_GRAPH_DLINFER_SRC names the dlinfer it runs (unset
# and no dlinfer installed: it skips).
# The mutation checks (tests/mutations, the suite testing itself) run once, on 0.17.0, where every vendor is
# supported (VENDOR_GRAPH_MUTATIONS_ON names another release; one not in the list: the last).
# The fuzz suite (tests/fuzz: generated command lines, settings and files) runs once, beside the torch_npu contract
# on the last release, VENDOR_GRAPH_FUZZ_EXAMPLES examples per test (default 80; more on demand).
# The random schedules / property examples run 100/20 on the last release and 60/10 on the others (220 seeded
# schedules a run; tools/soak.py runs any number), and the decode parity matrix runs every torch_npu generation
# on the last release and G1 G5 (one per seq-len update path) on the others: they exercise the runners, whose
# lmdeploy-facing parts every release's other suites cover.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
cd "$root"

status=0
# real_stack PART GENERATIONS all|matrix [pytest args]: part of the real-stack leg, its own log and report
real_stack() {
  local part=$1 gens=$2 which=$3 begin=$SECONDS rc=0
  shift 3
  local select=(); [ "$which" = matrix ] && select=(-k "lmdeploy_models_decode or engine_serves or engine_doctor or engine_dlinfers or engine_workers")
  VENDOR_GRAPH_REAL_STACK_GENERATIONS="$gens" "$py" -m pytest -q -p no:cacheprovider -rs "${select[@]}" \
    --junitxml="$reports/$version-real-$part.xml" tests/realstack "$@" > "$reports/$version-real-$part.log" 2>&1 \
    || rc=$?
  echo "--- real stack, $part core ($gens; $which): $((SECONDS - begin)) s" >> "$reports/$version-real-$part.log"
  return $rc
}
# Tiny tensors: intra-op threads only add overhead (and contend with the other pytest process).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# torch_npu wheels the contract test re-extracts: downloaded once per run, not once per lmdeploy.
export VENDOR_GRAPH_WHEEL_CACHE=$reports/wheels
versions=${VENDOR_GRAPH_LMDEPLOY_VERSIONS:-0.16.0 0.17.0 0.18.0}
mutations_on=${VENDOR_GRAPH_MUTATIONS_ON:-0.17.0}
case " $versions " in *" $mutations_on "*) ;; *) mutations_on=${versions##* } ;; esac
if [ -n "${VENDOR_GRAPH_DLINFER_SRC:-}" ]; then  # absolute: tests run children in other folders
  if [ ! -f "$VENDOR_GRAPH_DLINFER_SRC/dlinfer/__init__.py" ]; then
    echo "VENDOR_GRAPH_DLINFER_SRC=$VENDOR_GRAPH_DLINFER_SRC holds no dlinfer/__init__.py: point it at a dlinfer" \
         "checkout's root, or unset it (the real-stack leg then skips)" >&2
    exit 2
  fi
  VENDOR_GRAPH_DLINFER_SRC=$(cd "$VENDOR_GRAPH_DLINFER_SRC" && pwd)
  export VENDOR_GRAPH_DLINFER_SRC
fi
# The oldest-torch environment is mostly a download (about 2.5 GB on a fresh machine): made in the background
# while the legs before it run.
oldest_setup=
if [ "${VENDOR_GRAPH_SKIP_OLDEST_TORCH:-0}" != 1 ]; then
  "$root/scripts/setup-oldest-torch.sh" > "$reports/oldest-setup.log" 2>&1 &
  oldest_setup=$!
  trap 'kill "$oldest_setup" 2>/dev/null || true; rm -rf "$reports"' EXIT  # (a failing trap command sets the exit status)
fi
for version in $versions; do
  py=$("$root/scripts/setup-test-env.sh" "$version")
  echo "=== lmdeploy $version"
  start=$SECONDS
  # The torch_npu contract does not depend on lmdeploy: checked once, with the last release. So is the fuzz suite
  # (generated command lines, settings and files against the CLI and the readers; VENDOR_GRAPH_FUZZ_EXAMPLES per
  # test, default 80: about a minute on one core).
  contract=; fuzz=; [ "$version" = "${versions##* }" ] && contract=tests/contract fuzz=tests/fuzz
  # The mutation checks test the suite itself (each runs its guards in a child pytest): once per run, on the
  # release every vendor supports (the last one if that release is not in the list).
  mutations=; [ "$version" = "$mutations_on" ] && mutations=tests/mutations
  # Real-stack generations after the host suites / after the sim suites (balancing the two cores), and
  # where its other tests (MoE path, multi-token gate, demo) run.
  if [ "$version" = "${versions##* }" ]; then
    if [ -n "$mutations" ]; then  # the host suites carry the mutation checks: G4 G5 go to the other core
      real_host=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-G0 G1 G2a G2b G2c G3a G3b} real_sim=G4\ G5 real_rest=
    else
      real_host=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-G0 G1 G2a G2b G2c G3a G3b G4 G5} real_sim= real_rest=
    fi
    schedules=${VENDOR_GRAPH_RANDOM_SCHEDULES:-100} examples=${VENDOR_GRAPH_PROPERTY_EXAMPLES:-20}
    generations=${VENDOR_GRAPH_CONFORMANCE_GENERATIONS:-}
  elif [ -n "$mutations" ]; then  # the host suites carry the mutation checks: the real-stack leg to the sim core
    real_host=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-} real_sim="G1 G5" real_rest=sim
    schedules=${VENDOR_GRAPH_RANDOM_SCHEDULES:-60} examples=${VENDOR_GRAPH_PROPERTY_EXAMPLES:-10}
    generations=${VENDOR_GRAPH_CONFORMANCE_GENERATIONS:-G1 G5}
  else
    real_host=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-G1} real_sim=G5 real_rest=host
    schedules=${VENDOR_GRAPH_RANDOM_SCHEDULES:-60} examples=${VENDOR_GRAPH_PROPERTY_EXAMPLES:-10}
    generations=${VENDOR_GRAPH_CONFORMANCE_GENERATIONS:-G1 G5}
  fi
  [ -n "${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-}" ] && real_sim= real_rest=host
  # The simulator renames torch's PrivateUse1 backend for its whole process: its suites run in their own
  # process, beside the host suites (one core each; each pytest is single-threaded).
  ( "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-host.xml" tests/unit tests/lmdeploy \
      $mutations $contract $fuzz "$@" > "$reports/$version-host.log" 2>&1 && host_rc=0 || host_rc=$?
    rc=0
    if [ -n "$real_host" ]; then
      real_stack host "$real_host" "$([ "$real_rest" = host ] && echo all || echo matrix)" "$@" || rc=$?
    fi
    [ "$host_rc" = 0 ] && exit "$rc" || exit "$host_rc" ) &
  host=$!
  VENDOR_GRAPH_RANDOM_SCHEDULES=$schedules VENDOR_GRAPH_PROPERTY_EXAMPLES=$examples \
    VENDOR_GRAPH_CONFORMANCE_GENERATIONS=$generations "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-sim.xml" tests/sim tests/conformance "$@" \
    || status=1
  if [ -n "$real_sim" ]; then
    real_stack sim "$real_sim" "$([ "$real_rest" = sim ] && echo all || echo matrix)" "$@" || status=1
  fi
  wait "$host" || status=1
  echo "--- host suites (tests/unit tests/lmdeploy $mutations $contract $fuzz):"
  cat "$reports/$version-host.log"
  echo "--- real-stack leg (tests/realstack, dlinfer ${VENDOR_GRAPH_DLINFER_SRC:-installed or none}):"
  cat "$reports/$version"-real-*.log
  echo "=== lmdeploy $version: $((SECONDS - start)) s"
done
if [ "${VENDOR_GRAPH_SKIP_OLDEST_TORCH:-0}" != 1 ]; then
  echo "=== oldest torch"
  start=$SECONDS
  wait "$oldest_setup" || { cat "$reports/oldest-setup.log"; echo "the oldest-torch environment failed to set up" >&2; }
  "$root/scripts/test-oldest-torch.sh" --junitxml="$reports/oldest-torch.xml" "$@" || status=1
  echo "=== oldest torch: $((SECONDS - start)) s (environment included)"
fi
"$py" -m ruff check vendor_graph sim tests tools benchmarks || status=1

"$py" - "$reports" <<'PY'
import sys, pathlib, xml.etree.ElementTree as ET
totals = dict(tests=0, failures=0, errors=0, skipped=0)
for report in sorted(pathlib.Path(sys.argv[1]).glob("*.xml")):
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    for key in totals:
        totals[key] += int(suite.get(key, 0))
failed = totals["failures"] + totals["errors"]
passed = totals["tests"] - failed - totals["skipped"]
print(f"total: {passed} passed, {failed} failed, {totals['skipped']} skipped")
PY
exit $status
