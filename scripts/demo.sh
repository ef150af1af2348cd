#!/usr/bin/env bash
# The main job: a streaming word count over the deterministic generator source, local[*] Spark,
# checkpoints in a local folder. Extra arguments go to `python -m dstreams.examples.demo` (see --help).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" base
exec "$VENV_PY" -m dstreams.examples.demo "$@"
