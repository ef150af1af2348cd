#!/usr/bin/env bash
# A Spark standalone cluster on this machine for trying dstreams on several executors: a master on
# 127.0.0.1:7077 and two workers (1 core, 1 GiB each) on 127.0.0.2 and 127.0.0.3, started with the pip
# pyspark install's own bin/spark-class (see tests/standalone_cluster.py, which the tests use too).
# Workers on distinct addresses are what lets Spark launch speculative copies of slow tasks.
#
# usage: scripts/cluster.sh start|stop|status [--port N] [--workers A,B] [--cores N] [--memory 1g]
# State, logs and scratch space go to $DSTREAMS_CLUSTER_DIR (default: .standalone/ in the repository).
# 'start' prints the master URL (MASTER spark://127.0.0.1:7077); every wait is bounded (--timeout, 60 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
cmd="${1:-}"
case "$cmd" in
  start|stop|status) shift ;;
  *) echo "usage: $0 start|stop|status [options]" >&2; exit 2 ;;
esac
cd "$ROOT"
exec "$PY" -m tests.standalone_cluster "$cmd" --dir "${DSTREAMS_CLUSTER_DIR:-$ROOT/.standalone}" "$@"
