#!/usr/bin/env bash
# Installs what the tests need, starts the services they use, runs ruff and the whole test suite.
# Extra arguments go to pytest. Exit code 5 (no tests collected) is a failure.
# Under CI=true (unless DSTREAMS_REQUIRE_SERVICES is set) it exports DSTREAMS_REQUIRE_SERVICES=1: a service
# that does not start fails scripts/services.sh, and the tests that need one fail instead of skipping.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" test
case "$(echo "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
  1 | true | yes | on) export DSTREAMS_REQUIRE_SERVICES="${DSTREAMS_REQUIRE_SERVICES:-1}" ;;
esac
export DSTREAMS_TEST_TMP="${DSTREAMS_TEST_TMP:-$(mktemp -d -t dstreams-tests.XXXXXX)}"
cleanup() {
  if [ -f scripts/services.sh ]; then bash scripts/services.sh stop >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
if [ -f scripts/services.sh ]; then bash scripts/services.sh start; fi
"$VENV_PY" -m ruff check .
# The driver JVM's class-data-sharing archive: every driver the tests start maps it (each starts ~3 s sooner);
# a build that fails is reported by tests/test_jvm_cds.py, which builds it again.
"$VENV_PY" -m dstreams.spark.jvm_cds || echo "WARNING: no class-data-sharing archive (tests/test_jvm_cds.py says why)" >&2
set +e
"$VENV_PY" -m pytest -q -ra --durations=25 "$@"  # the 25 slowest: where CI time goes
rc=$?
set -e
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit "$rc"
