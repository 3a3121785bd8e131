#!/usr/bin/env bash
# The README's test command: sets up the environment and runs lint and the whole test suite against
# every supported lmdeploy release (0.16.0, 0.17.0, 0.18.0; one venv, lmdeploy swapped with --no-deps),
# ending on 0.18.0, then the oldest-torch leg (torch 2.1.0 + lmdeploy 0.16.0, scripts/test-oldest-torch.sh;
# VENDOR_GRAPH_SKIP_OLDEST_TORCH=1 leaves it out). Prints one total line over all runs.
# The real-stack leg (tests/realstack: lmdeploy's models over the real dlinfer, one process per torch_npu
# generation) runs every generation on the last release and G1 + G5 on the others, after the host suites
# on their core; VENDOR_GRAPH_DLINFER_SRC names the dlinfer it runs (unset and no dlinfer installed: it skips).
# The random schedules and property examples run in full on the last release and a third of them on the
# others (they exercise the runners, whose lmdeploy-facing parts every release's other suites cover).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${VENDOR_GRAPH_VENV:-$root/.venv}/bin/python
reports=$(mktemp -d)
trap 'rm -rf "$reports"' EXIT
cd "$root"

status=0
# Tiny tensors: intra-op threads only add overhead (and contend with the other pytest process).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# torch_npu wheels the contract test re-extracts: downloaded once per run, not once per lmdeploy.
export VENDOR_GRAPH_WHEEL_CACHE=$reports/wheels
versions=${VENDOR_GRAPH_LMDEPLOY_VERSIONS:-0.16.0 0.17.0 0.18.0}
if [ -n "${VENDOR_GRAPH_DLINFER_SRC:-}" ]; then  # absolute: tests run children in other folders
  if [ ! -f "$VENDOR_GRAPH_DLINFER_SRC/dlinfer/__init__.py" ]; then
    echo "VENDOR_GRAPH_DLINFER_SRC=$VENDOR_GRAPH_DLINFER_SRC holds no dlinfer/__init__.py: point it at a dlinfer" \
         "checkout's root, or unset it (the real-stack leg then skips)" >&2
    exit 2
  fi
  VENDOR_GRAPH_DLINFER_SRC=$(cd "$VENDOR_GRAPH_DLINFER_SRC" && pwd)
  export VENDOR_GRAPH_DLINFER_SRC
fi
for version in $versions; do
  "$root/scripts/setup-env.sh" "$version"
  echo "=== lmdeploy $version"
  start=$SECONDS
  # The torch_npu contract does not depend on lmdeploy: checked once, with the last release.
  contract=; [ "$version" = "${versions##* }" ] && contract=tests/contract
  if [ "$version" = "${versions##* }" ]; then
    real_gens=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-G0 G1 G2a G2b G2c G3a G3b G4 G5}
    schedules=${VENDOR_GRAPH_RANDOM_SCHEDULES:-120} examples=${VENDOR_GRAPH_PROPERTY_EXAMPLES:-30}
  else
    real_gens=${VENDOR_GRAPH_REAL_STACK_GENERATIONS:-G1 G5}
    schedules=${VENDOR_GRAPH_RANDOM_SCHEDULES:-40} examples=${VENDOR_GRAPH_PROPERTY_EXAMPLES:-10}
  fi
  # The simulator renames torch's PrivateUse1 backend for its whole process: its suites run in their own
  # process, beside the host suites (one core each; each pytest is single-threaded).
  ( "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-host.xml" tests/unit tests/lmdeploy \
      tests/mutations $contract "$@" > "$reports/$version-host.log" 2>&1 && host_rc=0 || host_rc=$?
    real_start=$SECONDS
    VENDOR_GRAPH_REAL_STACK_GENERATIONS="$real_gens" "$py" -m pytest -q -p no:cacheprovider -rs \
      --junitxml="$reports/$version-realstack.xml" tests/realstack "$@" > "$reports/$version-realstack.log" 2>&1 \
      && rc=0 || rc=$?
    echo "--- real stack ($real_gens): $((SECONDS - real_start)) s" >> "$reports/$version-realstack.log"
    [ "$host_rc" = 0 ] && exit "$rc" || exit "$host_rc" ) &
  host=$!
  VENDOR_GRAPH_RANDOM_SCHEDULES=$schedules VENDOR_GRAPH_PROPERTY_EXAMPLES=$examples \
    "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-sim.xml" tests/sim tests/conformance "$@" \
    || status=1
  wait "$host" || status=1
  echo "--- host suites (tests/unit tests/lmdeploy tests/mutations $contract):"
  cat "$reports/$version-host.log"
  echo "--- real-stack leg (tests/realstack, dlinfer ${VENDOR_GRAPH_DLINFER_SRC:-installed or none}):"
  cat "$reports/$version-realstack.log"
  echo "=== lmdeploy $version: $((SECONDS - start)) s"
done
if [ "${VENDOR_GRAPH_SKIP_OLDEST_TORCH:-0}" != 1 ]; then
  echo "=== oldest torch"
  start=$SECONDS
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
