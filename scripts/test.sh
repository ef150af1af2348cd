#!/usr/bin/env bash
# Installs what the tests need, starts the services they use, runs ruff and the whole test suite.
# Extra arguments go to pytest. Exit code 5 (no tests collected) is a failure.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" test
export DSTREAMS_TEST_TMP="${DSTREAMS_TEST_TMP:-$(mktemp -d -t dstreams-tests.XXXXXX)}"
cleanup() {
  if [ -x scripts/services.sh ]; then bash scripts/services.sh stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
if [ -x scripts/services.sh ]; then bash scripts/services.sh start; fi
"$VENV_PY" -m ruff check .
set +e
"$VENV_PY" -m pytest -q -ra "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit "$rc"
