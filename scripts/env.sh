#!/usr/bin/env bash
# Shared set-up for the demo and the tests: checks Java, creates .venv and installs the project.
# Sourced by scripts/demo.sh and scripts/test.sh; idempotent and quiet when nothing changed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

java_major() {
  local java_bin="${JAVA_HOME:+$JAVA_HOME/bin/}java"
  command -v "$java_bin" >/dev/null 2>&1 || { echo 0; return; }
  local v
  v=$("$java_bin" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}')
  case "$v" in ''|*[!0-9]*) echo 0 ;; *) echo "$v" ;; esac
}

if [ "$(java_major)" -lt 17 ] 2>/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && [ "${DSTREAMS_NO_APT:-}" = "" ]; then
    echo "[setup] no Java 17+ runtime found: installing Debian's openjdk-17-jre-headless" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
  fi
  if [ "$(java_major)" -lt 17 ] 2>/dev/null; then
    echo "ERROR: dstreams needs a Java 17 (or newer) runtime for Spark 4, and none was found." >&2
    echo "       Install one (Debian/Ubuntu: 'apt-get install openjdk-17-jre-headless') or set JAVA_HOME." >&2
    exit 1
  fi
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv" >&2
  "$PY" -m venv .venv
fi
VENV_PY="$ROOT/.venv/bin/python"
stamp=".venv/.installed-$(cat pyproject.toml | md5sum | cut -c1-12)-${1:-base}"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing dstreams and its dependencies into .venv (first run: a few minutes)" >&2
  "$VENV_PY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if [ "${1:-base}" = test ]; then
    "$VENV_PY" -m pip install -q -e ".[test]"
  else
    "$VENV_PY" -m pip install -q -e .
  fi
  touch "$stamp"
fi
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PYSPARK_PYTHON="$VENV_PY"
export PYSPARK_DRIVER_PYTHON="$VENV_PY"
