#!/usr/bin/env bash
# The README's test command: sets up the environment and runs lint and the whole test suite against
# every supported lmdeploy release (0.16.0, 0.17.0, 0.18.0; one venv, lmdeploy swapped with --no-deps),
# ending on 0.18.0, then the oldest-torch leg (torch 2.1.0 + lmdeploy 0.16.0, scripts/test-oldest-torch.sh;
# VENDOR_GRAPH_SKIP_OLDEST_TORCH=1 leaves it out). Prints one total line over all runs.
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
for version in $versions; do
  "$root/scripts/setup-env.sh" "$version"
  echo "=== lmdeploy $version"
  start=$SECONDS
  # The torch_npu contract does not depend on lmdeploy: checked once, with the last release.
  contract=; [ "$version" = "${versions##* }" ] && contract=tests/contract
  # The simulator renames torch's PrivateUse1 backend for its whole process: its suites run in their own
  # process, beside the host suites (one core each; each pytest is single-threaded).
  "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-host.xml" tests/unit tests/lmdeploy tests/mutations $contract "$@" \
    > "$reports/$version-host.log" 2>&1 &
  host=$!
  "$py" -m pytest -q -p no:cacheprovider --junitxml="$reports/$version-sim.xml" tests/sim tests/conformance "$@" \
    || status=1
  wait "$host" || status=1
  echo "--- host suites (tests/unit tests/lmdeploy tests/mutations $contract):"
  cat "$reports/$version-host.log"
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
