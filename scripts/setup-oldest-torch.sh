#!/usr/bin/env bash
# Creates or updates the oldest-torch environment, idempotently: the oldest torch vendor_graph's
# runtime supports (2.1.0, what torch_npu 2.1.0.postN pins) with numpy < 2 (torch 2.1 was built
# against numpy 1.x), the test tools, the oldest supported lmdeploy (0.16.0, --no-deps, plus the few
# packages its imports need: transformers then runs without torch, which lmdeploy's graph-mode modules
# do not need), and vendor_graph itself (editable, --no-deps). scripts/test-oldest-torch.sh runs it.
#
# torch 2.1.0 comes from PyPI. Its x86_64 wheel is the CUDA 12.1 build: `import torch` loads
# libcublas, libcudnn, ... even on a CPU, so the nvidia-* wheels it pins are installed with it
# (about 2.5 GB to download, 4.8 GB installed; download.pytorch.org's +cpu wheels, a tenth of that,
# cannot be reached from this machine or CI: only PyPI can).
# The venv lives outside the work tree by default, so every clone on a machine (CI clones afresh each
# run) reuses it; vendor_graph is re-pointed (editable) at the calling tree on every call.
# Usage: scripts/setup-oldest-torch.sh      Env: VENDOR_GRAPH_OLDEST_VENV (default
#        ~/.cache/vendor_graph/venv-oldest-torch-<torch>),
#        VENDOR_GRAPH_OLDEST_TORCH (default 2.1.0), VENDOR_GRAPH_OLDEST_LMDEPLOY (default 0.16.0),
#        PYTHON (default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torch_version=${VENDOR_GRAPH_OLDEST_TORCH:-2.1.0}
venv=${VENDOR_GRAPH_OLDEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/vendor_graph/venv-oldest-torch-$torch_version}
lmdeploy_version=${VENDOR_GRAPH_OLDEST_LMDEPLOY:-0.16.0}

[ -x "$venv/bin/python" ] || { mkdir -p "$(dirname "$venv")" && "${PYTHON:-python3}" -m venv "$venv"; }
# The venv ignores itself, so it never shows up in git status wherever it lives.
[ -f "$venv/.gitignore" ] || echo '*' > "$venv/.gitignore"  # for a VENDOR_GRAPH_OLDEST_VENV inside a tree
py="$venv/bin/python"
pip_install() { "$py" -m pip install -q --disable-pip-version-check "$@"; }
installed() {  # installed NAME VERSION-PREFIX
  "$py" - "$1" "$2" <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(0 if m.version(sys.argv[1]).startswith(sys.argv[2]) else 1)
PY
}

installed torch "$torch_version" || pip_install "torch==$torch_version" "numpy<2"
"$py" -c 'import pytest, hypothesis, packaging, hatchling, editables' 2>/dev/null \
  || pip_install "pytest>=8" "hypothesis>=6.100" "packaging>=21" "hatchling>=1.21" editables
if ! installed lmdeploy "$lmdeploy_version"; then
  # --no-deps: its pins would replace torch 2.1 (pip's conflict warnings are expected and dropped).
  pip_install --no-deps "lmdeploy==$lmdeploy_version" 2>&1 | grep -v -e WARNING -e 'requires' -e 'incompatible' \
    -e 'dependency conflicts' -e "pip's dependency resolver" || true
  installed lmdeploy "$lmdeploy_version" || { echo "lmdeploy $lmdeploy_version failed to install" >&2; exit 1; }
  site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  find "$site/lmdeploy" \( -name '*.so' -o -name '*.a' \) -delete  # turbomind, never loaded here
fi
"$py" -c 'import transformers, mmengine, pydantic, psutil, PIL, requests, pybase64, zmq, shortuuid' 2>/dev/null \
  || pip_install -r "$root/requirements/lmdeploy-imports.txt"
# vendor_graph from this tree, with its worker hook (the venv may have served another clone before). Asked
# from / : in the clone, the clone's vendor_graph/ would answer for an install that is not there.
(cd / && "$py" - "$root/vendor_graph" <<'PY') 2>/dev/null || pip_install --no-deps --no-build-isolation -e "$root"
import sys, sysconfig, pathlib, vendor_graph
hook = pathlib.Path(sysconfig.get_paths()["purelib"]) / "vendor_graph_autoload.pth"
sys.exit(0 if vendor_graph.__file__.startswith(sys.argv[1] + "/") and hook.is_file() else 1)
PY
echo "oldest-torch environment ready: $("$py" -c 'import torch; import importlib.metadata as m; print("torch", torch.__version__, "lmdeploy", m.version("lmdeploy"))')" >&2
