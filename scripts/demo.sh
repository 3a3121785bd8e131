#!/usr/bin/env bash
# The README's main job: sets up the environment and runs vendor_graph's plan for a vendor
# (default ascend, max_batch_size 256) against the real lmdeploy installed here.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup-env.sh" >&2
exec "${VENDOR_GRAPH_VENV:-$root/.venv}/bin/python" -m vendor_graph plan "$@"
