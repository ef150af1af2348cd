#!/usr/bin/env bash
# Installs what the tests need, starts the services they use, runs ruff, mypy (scripts/typecheck.py) and the whole
# test suite.
# Extra arguments go to pytest. Exit code 5 (no tests collected) is a failure.
# --fast (anywhere among the arguments): ruff and mypy, then the inner loop's tier (pytest -m "$FAST_TIER"): the
# tests of every folder (mostly tests/unit and tests/property; tests/README.md) not marked slow, fault, or needing
# a server (s3, ceph, redis, postgres, kafka); it starts no service and stops none, and builds no class-data-sharing
# archive (it uses one that exists).
# CI (.ci/run) runs the whole suite, without --fast: in two parts, the tests not marked serial on
# DSTREAMS_TEST_WORKERS pytest-xdist workers (default 2; `--dist loadgroup`, each worker with its own SparkContext;
# the fault tests one after another on one worker, the rest beside them: tests/conftest.py), then the tests
# marked serial (they take a shared service down or compare timings) alone, one after another. Each part prints
# its own slowest tests. DSTREAMS_TEST_WORKERS=1 runs everything in one pytest process, serial tests included.
# Under CI=true (unless DSTREAMS_REQUIRE_SERVICES is set) it exports DSTREAMS_REQUIRE_SERVICES=1: a service
# that does not start fails scripts/services.sh, and the tests that need one fail instead of skipping.
set -euo pipefail
FAST_TIER="not slow and not fault and not s3 and not ceph and not redis and not postgres and not kafka"
fast=0
args=()
for arg in "$@"; do
  if [ "$arg" = --fast ]; then fast=1; else args+=("$arg"); fi
done
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" test
case "$(echo "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
  1 | true | yes | on) export DSTREAMS_REQUIRE_SERVICES="${DSTREAMS_REQUIRE_SERVICES:-1}" ;;
esac
export DSTREAMS_TEST_TMP="${DSTREAMS_TEST_TMP:-$(mktemp -d -t dstreams-tests.XXXXXX)}"
cleanup() {
  if [ -f scripts/services.sh ]; then bash scripts/services.sh stop >/dev/null 2>&1 || true; fi
}
if [ "$fast" = 1 ]; then
  # No server: the services others' runs may be using are neither started nor stopped.
  selection=(-m "$FAST_TIER" --durations=10)
else
  trap cleanup EXIT
  if [ -f scripts/services.sh ]; then bash scripts/services.sh start; fi
  selection=(--durations=25)  # the 25 slowest: where CI time goes
fi
"$VENV_PY" -m ruff check .
"$VENV_PY" scripts/typecheck.py  # mypy over dstreams/, api/, recovery/ ([tool.mypy] in pyproject.toml)
if [ "$fast" = 0 ]; then
  # The driver JVM's class-data-sharing archive: every driver the tests start maps it (each starts ~3 s sooner);
  # a build that fails is reported by tests/integration/test_jvm_cds.py, which builds it again.
  "$VENV_PY" -m dstreams.spark.jvm_cds || echo "WARNING: no class-data-sharing archive (tests/integration/test_jvm_cds.py says why)" >&2
fi
workers="${DSTREAMS_TEST_WORKERS:-2}"
case "$workers" in ''|*[!0-9]*) echo "ERROR: DSTREAMS_TEST_WORKERS=$workers is not a number" >&2; exit 2 ;; esac
run_pytest() { "$VENV_PY" -m pytest -q -ra "$@" ${args[@]+"${args[@]}"}; }
set +e
if [ "$fast" = 1 ] || [ "$workers" -le 1 ]; then
  run_pytest "${selection[@]}"
  rc=$?
else
  echo "[test] the tests not marked serial, on $workers pytest-xdist workers" >&2
  run_pytest "${selection[@]}" -n "$workers" --dist loadgroup --serial-tests=skip
  parallel_rc=$?
  serial_rc=$parallel_rc
  case "$parallel_rc" in
    0 | 1 | 5)  # passed, failed or none selected: the serial part runs either way (2-4: interrupted or a usage error)
      echo "[test] the tests marked serial, one at a time" >&2
      run_pytest "${selection[@]}" --serial-tests=only
      serial_rc=$? ;;
  esac
  # Exit code 5 (no tests) only when neither part had any; else the first part's failure, then the second's.
  case "$parallel_rc:$serial_rc" in
    5:*) rc=$serial_rc ;;
    0:5) rc=0 ;;
    0:*) rc=$serial_rc ;;
    *) rc=$parallel_rc ;;
  esac
fi
set -e
if [ "$rc" = 5 ]; then echo "ERROR: pytest collected no tests" >&2; exit 1; fi
exit "$rc"
