#!/usr/bin/env bash
# A Spark standalone cluster on this machine for trying dstreams on several hosts: a master on
# 127.0.0.1:7077 and three workers (1 core, 1 GiB each) on 127.0.0.2, 127.0.0.3 and 127.0.0.4, started with
# the pip pyspark install's own bin/spark-class (see tests/standalone_cluster.py, which the tests use too).
# Workers on distinct addresses are what lets Spark launch speculative copies of slow tasks. Each worker is a
# "host" with its own disk folder (Spark local dirs, worker dir, java.io.tmpdir, TMPDIR of its Python workers
# and DSTREAMS_STATE_LOCAL_DIR of its executors): $DIR/worker1, worker2, worker3.
#
# usage: scripts/cluster.sh start [--hosts N | --workers A,B] [--port N] [--cores N] [--memory 1g]
#        scripts/cluster.sh stop|status
#        scripts/cluster.sh kill-host I [--keep-disk]   # SIGKILL host I (0-based) and remove its disk folder
#        scripts/cluster.sh freeze-host I | thaw-host I # SIGSTOP / SIGCONT host I's processes
#        scripts/cluster.sh restart-host I              # start a killed host's worker again (empty disk folder)
#        scripts/cluster.sh heal                        # every killed or frozen host started again (empty disk)
# State, logs and scratch space go to $DSTREAMS_CLUSTER_DIR (default: .standalone/ in the repository).
# 'start' prints the master URL (MASTER spark://127.0.0.1:7077); every wait is bounded (--timeout, 60 s).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
cmd="${1:-}"
case "$cmd" in
  start|stop|status|heal|kill-host|freeze-host|thaw-host|restart-host) shift ;;
  *) echo "usage: $0 start|stop|status|heal|kill-host I|freeze-host I|thaw-host I|restart-host I [options]" >&2; exit 2 ;;
esac
cd "$ROOT"
exec "$PY" -m tests.standalone_cluster "$cmd" "$@" --dir "${DSTREAMS_CLUSTER_DIR:-$ROOT/.standalone}"  # a host index first
