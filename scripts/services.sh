#!/usr/bin/env bash
# Local services for the tests: a real Ceph RADOS Gateway on 127.0.0.1:7480 (DSTREAMS_TEST_RGW_PORT; its monitor on
# 3300/6789, DSTREAMS_TEST_CEPH_MON_PORT and +1 when set; user AKTEST/SKTEST, data under .ceph/cluster, kept across
# restarts), a moto server on 127.0.0.1:5055 (DSTREAMS_TEST_MOTO_PORT; in memory) and a Redis
# server (Debian's redis-server) on 127.0.0.1:6390 (DSTREAMS_TEST_REDIS_PORT), the project's own process
# with its own configuration and data under .redis/ (append-only file on, kept across restarts).
# A PostgreSQL server (Debian's postgresql) on 127.0.0.1:5440 (DSTREAMS_TEST_POSTGRES_PORT): the project's own
# cluster under .postgres/data (initdb, trust authentication on loopback, user and database `dstreams`), run by
# pg_ctl as the `postgres` system user when this script runs as root (root cannot run postgres; when that user
# cannot enter the checkout, e.g. one under a `mktemp -d` folder, the cluster lives in /tmp/dstreams-postgres-<hash>).
# A single-node Apache Kafka broker (KRaft: broker and controller in one JVM) on 127.0.0.1:9192
# (DSTREAMS_TEST_KAFKA_PORT; its controller on 9193, DSTREAMS_TEST_KAFKA_CONTROLLER_PORT): Kafka 4.1's jars from
# Maven Central gathered by Maven from scripts/kafka/pom.xml into .kafka/jars (cached), data under .kafka/data (kept
# across restarts: `restart kafka` is a broker restart the tests use as a fault), needs Java 17+ and mvn (Debian's
# openjdk-17-jre-headless and maven, installed with apt-get when missing).
# usage: scripts/services.sh start|stop|status|restart [ceph|moto|redis|postgres|kafka|chromium ...]
# With no service named, start/stop/status act on all of them; `restart redis` stops and starts Redis only.
# `chromium` is not a server: Debian's chromium and chromium-driver (apt-get), which the status page's
# browser test (tests/integration/test_status_browser.py) drives headless; the test starts and stops the browser itself.
#
# By default not fatal: when a service cannot be installed or started (no root, no apt, port taken) it
# prints a WARNING and exits 0, and the tests that need that service skip with a clear reason.
# Required mode (CI=true or DSTREAMS_REQUIRE_SERVICES=1; DSTREAMS_REQUIRE_SERVICES=0 turns it off): a
# service that does not start makes `start` exit 1 with an ERROR naming the service and its log, and the
# tests fail instead of skipping (tests/support.py). Every wait is a bounded polling loop. Nothing is
# exported: tests read DSTREAMS_TEST_RGW_ENDPOINT, DSTREAMS_TEST_MOTO_ENDPOINT, DSTREAMS_TEST_REDIS_URL,
# DSTREAMS_TEST_POSTGRES_DSN and DSTREAMS_TEST_KAFKA_BOOTSTRAP,
# whose defaults are the endpoints below; when one is set to another address, that server is checked, not
# started or stopped here.
set -u
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BASE="$ROOT/.ceph"
D="$BASE/cluster"
C="$D/ceph.conf"
RGW_HOST=127.0.0.1
RGW_PORT="${DSTREAMS_TEST_RGW_PORT:-7480}"
# The monitor's msgr2 and msgr1 ports: 3300 and 6789 by default, DSTREAMS_TEST_CEPH_MON_PORT and the next port
# when set (two checkouts' clusters side by side need distinct ones); written into the cluster when it is made.
if [ -n "${DSTREAMS_TEST_CEPH_MON_PORT:-}" ]; then
  MON_V2_PORT="$DSTREAMS_TEST_CEPH_MON_PORT"; MON_V1_PORT=$((DSTREAMS_TEST_CEPH_MON_PORT + 1))
else
  MON_V2_PORT=3300; MON_V1_PORT=6789
fi
MON_ADDRS="[v2:127.0.0.1:$MON_V2_PORT,v1:127.0.0.1:$MON_V1_PORT]"
RGW_URL="http://$RGW_HOST:$RGW_PORT"
MOTO_PORT="${DSTREAMS_TEST_MOTO_PORT:-5055}"
MOTO_URL="http://127.0.0.1:$MOTO_PORT"
MOTO_PID="$BASE/moto.pid"
MOTO_LOG="$BASE/moto.log"
MOTO_FAILURE="$BASE/moto.failure"  # why moto did not start (written by start_moto, which runs in a subshell)
CEPH_FAILURE=""                     # why Ceph did not start, set by start_ceph
CEPH_PACKAGES="radosgw ceph-mon ceph-osd uuid-runtime bc curl"
REDIS_BASE="$ROOT/.redis"
REDIS_DATA="$REDIS_BASE/data"
REDIS_CONF="$REDIS_BASE/redis.conf"
REDIS_PID="$REDIS_BASE/redis.pid"
REDIS_LOG="$REDIS_BASE/redis.log"
REDIS_PORT="${DSTREAMS_TEST_REDIS_PORT:-6390}"
REDIS_URL="redis://127.0.0.1:$REDIS_PORT/0"
REDIS_PACKAGES="redis-server redis-tools"
REDIS_FAILURE=""                    # why Redis did not start, set by start_redis
# others_can_enter DIR: every folder from DIR up to / lets other users through (o+x), as the `postgres` system
# user needs when root runs the cluster (a checkout under a `mktemp -d` folder, mode 0700, does not).
others_can_enter() {
  local p="$1" mode
  while [ "$p" != "/" ] && [ -n "$p" ]; do
    mode=$(stat -c %A "$p" 2>/dev/null) || return 1
    case "${mode:9:1}" in x|t) ;; *) return 1 ;; esac
    p=$(dirname "$p")
  done
}
PG_BASE="$ROOT/.postgres"
if [ "$(id -u)" = 0 ] && ! others_can_enter "$ROOT"; then
  # The postgres user cannot reach the checkout: the cluster lives in a folder of its own under /tmp, one per
  # checkout (the same path for start, stop and status).
  PG_BASE="/tmp/dstreams-postgres-$(printf %s "$ROOT" | md5sum | cut -c1-12)"
fi
PG_DATA="$PG_BASE/data"
PG_LOG="$PG_BASE/postgres.log"
PG_PORT="${DSTREAMS_TEST_POSTGRES_PORT:-5440}"
PG_USER=dstreams
PG_DB=dstreams
PG_DSN="postgresql://$PG_USER@127.0.0.1:$PG_PORT/$PG_DB"
PG_FAILURE=""                       # why PostgreSQL did not start, set by start_postgres
KAFKA_BASE="$ROOT/.kafka"
KAFKA_DATA="$KAFKA_BASE/data"
KAFKA_JARS="$KAFKA_BASE/jars"
KAFKA_CONF="$KAFKA_BASE/server.properties"
KAFKA_PID="$KAFKA_BASE/kafka.pid"
KAFKA_LOG="$KAFKA_BASE/kafka.log"
KAFKA_FAILURE="$KAFKA_BASE/kafka.failure"  # why Kafka did not start (start_kafka may run in a subshell)
KAFKA_POM="$ROOT/scripts/kafka/pom.xml"
KAFKA_LOG4J="$ROOT/scripts/kafka/log4j2.properties"
KAFKA_PORT="${DSTREAMS_TEST_KAFKA_PORT:-9192}"
KAFKA_CONTROLLER_PORT="${DSTREAMS_TEST_KAFKA_CONTROLLER_PORT:-9193}"
KAFKA_BOOTSTRAP="127.0.0.1:$KAFKA_PORT"
CHROMIUM_PACKAGES="chromium chromium-driver"
CHROMIUM_FAILURE=""                 # why the browser is not available, set by start_chromium
T0=$(date +%s%N)

elapsed() { echo "$(( ($(date +%s%N) - T0) / 1000000 ))ms"; }
log() { echo "[services $(elapsed)] $*" >&2; }
warn() { echo "WARNING: $*" >&2; }
ceph_cli() { timeout 20 ceph -c "$C" "$@"; }

# required: whether a service that does not start is fatal (see the header).
required() {
  case "$(echo "${DSTREAMS_REQUIRE_SERVICES:-}" | tr '[:upper:]' '[:lower:]')" in
    1 | true | yes | on) return 0 ;;
    0 | false | no | off) return 1 ;;
  esac
  case "$(echo "${CI:-}" | tr '[:upper:]' '[:lower:]')" in
    1 | true | yes | on) return 0 ;;
  esac
  return 1
}

# external VAR DEFAULT_URL: prints VAR's value when it is set to an endpoint other than DEFAULT_URL.
external() {
  local v="${!1:-}"
  v="${v%/}"
  [ -n "$v" ] && [ "$v" != "$2" ] && echo "$v"
}

# http_up URL: true when something answers HTTP on URL (any status code).
http_up() {
  if command -v curl >/dev/null 2>&1; then
    curl -s -o /dev/null --max-time 2 "$1"
  else
    python3 - "$1" <<'PY' 2>/dev/null
import sys, urllib.request, urllib.error
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass
PY
  fi
}

# wait_for SECONDS COMMAND...: poll COMMAND every 0.2 s until it succeeds or SECONDS pass.
wait_for() {
  local limit=$(( $1 * 5 )) i
  shift
  for (( i = 0; i < limit; i++ )); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  return 1
}

# pid_alive PIDFILE NAME: the pid in PIDFILE is running and its command line mentions NAME
# (guards against a stale pid file whose pid was reused by another process).
pid_alive() {
  local p
  [ -f "$1" ] || return 1
  p=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] && tr '\0' ' ' <"/proc/$p/cmdline" | grep -q -- "$2"
}

# stop_pid PIDFILE NAME: TERM, wait up to 10 s, then KILL; quiet when not running.
stop_pid() {
  local p
  if pid_alive "$1" "$2"; then
    p=$(cat "$1")
    kill "$p" 2>/dev/null
    wait_for 10 bash -c "! kill -0 $p" || { kill -9 "$p" 2>/dev/null; wait_for 5 bash -c "! kill -0 $p"; }
    log "stopped $2 (pid $p)"
  fi
  rm -f "$1"
}

# apt_install LOG PROBE PACKAGES...: apt-get install PACKAGES (output in LOG), reading the package lists first
# when PROBE is unknown to apt-cache and once more after a failed attempt; bounded by timeouts.
apt_install() {
  local log_file=$1 probe=$2
  shift 2
  if ! apt-cache show "$probe" >/dev/null 2>&1; then
    timeout 300 apt-get update -qq >/dev/null 2>&1 || warn "apt-get update failed"
  fi
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "$@" >"$log_file" 2>&1 && return 0
  timeout 300 apt-get update -qq >/dev/null 2>&1
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "$@" >"$log_file" 2>&1
}

# ---------------------------------------------------------------- Ceph RADOS Gateway

ceph_installed() {
  command -v radosgw >/dev/null && command -v ceph-mon >/dev/null && command -v ceph-osd >/dev/null &&
    command -v uuidgen >/dev/null && command -v curl >/dev/null
}

install_ceph() {
  ceph_installed && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ -n "${DSTREAMS_NO_APT:-}" ]; then
    warn "Ceph is not installed and cannot be installed here (needs root and apt-get, DSTREAMS_NO_APT unset)."
    warn "Install it with: apt-get install --no-install-recommends $CEPH_PACKAGES"
    CEPH_FAILURE="Ceph is not installed and cannot be installed here (needs root and apt-get; no log)"
    return 1
  fi
  log "installing $CEPH_PACKAGES (apt-get)"
  # shellcheck disable=SC2086
  apt_install "$BASE/apt.log" radosgw $CEPH_PACKAGES || {
    warn "apt-get install failed, see $BASE/apt.log"
    CEPH_FAILURE="installing Ceph with apt-get failed (log: $BASE/apt.log)"
    return 1
  }
  ceph_installed || {
    warn "Ceph packages installed but radosgw/ceph-mon/ceph-osd not on PATH"
    CEPH_FAILURE="Ceph packages installed but radosgw/ceph-mon/ceph-osd are not on PATH (log: $BASE/apt.log)"
    return 1
  }
  log "Ceph installed"
}

write_ceph_conf() {
  local fsid=$1
  cat >"$C" <<EOF
[global]
fsid = $fsid
mon host = $MON_ADDRS
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
auth allow insecure global id reclaim = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
osd crush chooseleaf type = 0
run dir = $D/run
admin socket = $D/run/\$name.asok
log file = $D/log/\$name.log
pid file = $D/run/\$name.pid
keyring = $D/keyring
mon data = $D/mon.\$id
osd data = $D/osd.\$id
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 4294967296
bluestore fsck on mount = false
bluestore cache size = 134217728
osd memory target = 939524096
osd op num shards = 1
osd op num threads per shard = 2
ms bind ipv4 = true
ms bind ipv6 = false
# Without the crc modes the gateway hangs at start.
ms mon client mode = crc
ms client mode = crc
ms cluster mode = crc
ms service mode = crc
[client.rgw.a]
rgw frontends = beast endpoint=$RGW_HOST:$RGW_PORT tcp_nodelay=1
rgw data = $D/rgw
rgw thread pool size = 64
rgw dns name = localhost
EOF
}

# ceph_daemons MODE: MODE=init creates the monitor, OSD and user; MODE=start reuses them.
ceph_daemons() {
  local mode=$1 fsid
  if [ "$mode" = init ]; then
    rm -rf "$D"
    mkdir -p "$D/run" "$D/log" "$D/mon.a" "$D/osd.0" "$D/rgw"
    fsid=$(uuidgen)
    write_ceph_conf "$fsid"
    ceph-authtool --create-keyring "$D/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null || return 1
    monmaptool --create --addv a "$MON_ADDRS" --fsid "$fsid" "$D/monmap" \
      >/dev/null || return 1
    timeout 60 ceph-mon -c "$C" --mkfs -i a --monmap "$D/monmap" >"$D/log/mon-mkfs.out" 2>&1 || return 1
  fi
  pid_alive "$D/run/mon.a.pid" ceph-mon || timeout 30 ceph-mon -c "$C" -i a >>"$D/log/daemons.out" 2>&1 || return 1
  wait_for 30 ceph_cli mon stat || { warn "ceph-mon did not answer within 30 s"; return 1; }
  log "ceph-mon up"
  if [ "$mode" = init ]; then
    ceph_cli osd create >/dev/null || return 1
    timeout 120 ceph-osd -c "$C" -i 0 --mkfs --osd-uuid "$(uuidgen)" >"$D/log/osd-mkfs.out" 2>&1 || {
      tail -5 "$D/log/osd-mkfs.out" >&2
      return 1
    }
  fi
  pid_alive "$D/run/osd.0.pid" ceph-osd || timeout 60 ceph-osd -c "$C" -i 0 >>"$D/log/daemons.out" 2>&1 || return 1
  wait_for 60 bash -c "timeout 20 ceph -c '$C' osd stat 2>/dev/null | grep -q '1 up'" ||
    { warn "ceph-osd did not come up within 60 s"; return 1; }
  log "ceph-osd up"
  # Keep an older cluster's gateway line current: without tcp_nodelay, every response with a body
  # (GET, LIST) waits ~40 ms for the client's delayed ACK (Nagle).
  sed -i "s|^rgw frontends = .*|rgw frontends = beast endpoint=$RGW_HOST:$RGW_PORT tcp_nodelay=1|" "$C"
  pid_alive "$D/run/client.rgw.a.pid" radosgw || timeout 120 radosgw -c "$C" -n client.rgw.a \
    >>"$D/log/daemons.out" 2>&1 || return 1
  wait_for 90 http_up "$RGW_URL/" || { warn "radosgw did not answer HTTP within 90 s"; return 1; }
  log "radosgw answers on $RGW_URL"
  if [ "$mode" = init ]; then
    timeout 60 radosgw-admin -c "$C" user create --uid=test --display-name=test \
      --access-key=AKTEST --secret=SKTEST >"$D/user.json" 2>&1 || { cat "$D/user.json" >&2; return 1; }
    touch "$D/.initialised"
    log "user AKTEST created"
  fi
}

stop_ceph() {
  stop_pid "$D/run/client.rgw.a.pid" radosgw
  stop_pid "$D/run/osd.0.pid" ceph-osd
  stop_pid "$D/run/mon.a.pid" ceph-mon
}

rgw_ours() { pid_alive "$D/run/client.rgw.a.pid" radosgw; }

start_ceph() {
  local ext
  if ext=$(external DSTREAMS_TEST_RGW_ENDPOINT "$RGW_URL"); then
    if http_up "$ext/"; then
      echo "ceph-rgw: using $ext (DSTREAMS_TEST_RGW_ENDPOINT; not started or stopped here)"
      return 0
    fi
    warn "DSTREAMS_TEST_RGW_ENDPOINT=$ext does not answer (a server there is not started by this script)."
    CEPH_FAILURE="nothing answers at DSTREAMS_TEST_RGW_ENDPOINT=$ext (not started here; no log)"
    echo "ceph-rgw: NOT AVAILABLE at $ext"
    return 1
  fi
  if rgw_ours && http_up "$RGW_URL/"; then
    echo "ceph-rgw: running at $RGW_URL (access key AKTEST, secret SKTEST)"
    return 0
  fi
  if http_up "$RGW_URL/"; then
    warn "something that is not this project's radosgw already answers on $RGW_URL; Ceph not started."
    echo "ceph-rgw: $RGW_URL (answered by another process: not started or stopped here)"
    return 0
  fi
  if ! install_ceph; then
    echo "ceph-rgw: NOT AVAILABLE"
    return 1
  fi
  local mode=init t
  t=$(date +%s%N)
  # A cluster made with other monitor ports (DSTREAMS_TEST_CEPH_MON_PORT changed) is made again.
  [ -f "$D/.initialised" ] && [ -f "$C" ] && grep -qxF "mon host = $MON_ADDRS" "$C" && mode=start
  log "ceph: $mode in $D"
  if ! ceph_daemons "$mode"; then
    stop_ceph
    if [ "$mode" = start ]; then
      warn "restarting the existing Ceph data failed (logs in $D/log); re-initialising it (test data is lost)"
      ceph_daemons init || { stop_ceph; mode=failed; }
    else
      mode=failed
    fi
  fi
  if [ "$mode" = failed ]; then
    warn "Ceph RADOS Gateway could not be started; logs in $D/log."
    CEPH_FAILURE="the Ceph RADOS Gateway did not start (logs: $D/log, daemons' output in $D/log/daemons.out)"
    echo "ceph-rgw: NOT STARTED (see $D/log)"
    return 1
  fi
  echo "ceph-rgw: $RGW_URL (access key AKTEST, secret SKTEST; $mode took $(( ($(date +%s%N) - t) / 1000000 ))ms)"
}

# ---------------------------------------------------------------- moto server

# The project's .venv python if it can run moto's server, else python3.
moto_python() {
  local py
  for py in "$ROOT/.venv/bin/python" python3; do
    if command -v "$py" >/dev/null 2>&1 && "$py" -c "import importlib.util as u; exit(not (u.find_spec('moto') and u.find_spec('flask')))" \
      >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

# moto_failed REASON: records why moto did not start (start_moto runs in a background subshell).
moto_failed() { echo "$1" >"$MOTO_FAILURE"; }

start_moto() {
  local py t ext
  rm -f "$MOTO_FAILURE"
  if ext=$(external DSTREAMS_TEST_MOTO_ENDPOINT "$MOTO_URL"); then
    if http_up "$ext/"; then
      echo "moto: using $ext (DSTREAMS_TEST_MOTO_ENDPOINT; not started or stopped here)"
      return 0
    fi
    warn "DSTREAMS_TEST_MOTO_ENDPOINT=$ext does not answer (a server there is not started by this script)."
    moto_failed "nothing answers at DSTREAMS_TEST_MOTO_ENDPOINT=$ext (not started here; no log)"
    echo "moto: NOT AVAILABLE at $ext"
    return 1
  fi
  if pid_alive "$MOTO_PID" moto.server && http_up "$MOTO_URL/"; then
    echo "moto: running at $MOTO_URL"
    return 0
  fi
  if http_up "$MOTO_URL/"; then
    warn "something that is not this project's moto server already answers on $MOTO_URL; moto not started."
    echo "moto: $MOTO_URL (answered by another process: not started or stopped here)"
    return 0
  fi
  if ! py=$(moto_python); then
    warn "neither .venv/bin/python nor python3 can import moto.server: install the test extras (pip install -e '.[test]')."
    moto_failed "moto.server cannot be imported by .venv/bin/python or python3 (pip install -e '.[test]'; no log)"
    echo "moto: NOT AVAILABLE"
    return 1
  fi
  t=$(date +%s%N)
  setsid nohup "$py" -m moto.server -H 127.0.0.1 -p "$MOTO_PORT" >"$MOTO_LOG" 2>&1 </dev/null &
  echo $! >"$MOTO_PID"
  if ! wait_for 20 http_up "$MOTO_URL/"; then
    stop_pid "$MOTO_PID" moto.server
    warn "moto server did not answer within 20 s; see $MOTO_LOG"
    moto_failed "the moto server did not answer on $MOTO_URL within 20 s (log: $MOTO_LOG)"
    echo "moto: NOT STARTED (see $MOTO_LOG)"
    return 1
  fi
  echo "moto: $MOTO_URL (started in $(( ($(date +%s%N) - t) / 1000000 ))ms)"
}

# ---------------------------------------------------------------- Redis server

redis_installed() { command -v redis-server >/dev/null && command -v redis-cli >/dev/null; }

# apt_install_redis: one apt-get install attempt, its output in .redis/apt.log.
apt_install_redis() {
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -qq --no-install-recommends \
    $REDIS_PACKAGES >"$REDIS_BASE/apt.log" 2>&1
}

install_redis() {
  redis_installed && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ -n "${DSTREAMS_NO_APT:-}" ]; then
    warn "redis-server is not installed and cannot be installed here (needs root and apt-get, DSTREAMS_NO_APT unset)."
    warn "Install it with: apt-get install --no-install-recommends $REDIS_PACKAGES"
    REDIS_FAILURE="redis-server is not installed and cannot be installed here (needs root and apt-get; no log)"
    return 1
  fi
  log "installing $REDIS_PACKAGES (apt-get)"
  if ! apt-cache show redis-server >/dev/null 2>&1; then
    timeout 300 apt-get update -qq >/dev/null 2>&1 || warn "apt-get update failed"
  fi
  if ! apt_install_redis; then
    timeout 300 apt-get update -qq >/dev/null 2>&1
    apt_install_redis || {
      warn "apt-get install failed, see $REDIS_BASE/apt.log"
      REDIS_FAILURE="installing redis-server with apt-get failed (log: $REDIS_BASE/apt.log)"
      return 1
    }
  fi
  redis_installed || {
    warn "Redis packages installed but redis-server/redis-cli not on PATH"
    REDIS_FAILURE="Redis packages installed but redis-server/redis-cli are not on PATH (log: $REDIS_BASE/apt.log)"
    return 1
  }
  log "redis-server installed ($(redis-server --version 2>/dev/null | awk '{sub("v=", "", $3); print $3}'))"
}

# redis_ping URL: true when a Redis server at URL answers PING with PONG (within a few seconds).
redis_ping() {
  if command -v redis-cli >/dev/null 2>&1; then
    [ "$(timeout 3 redis-cli --no-auth-warning -u "$1" ping 2>/dev/null)" = PONG ]
  elif [ -x "$ROOT/.venv/bin/python" ]; then
    timeout 5 "$ROOT/.venv/bin/python" -c 'import sys, redis
redis.Redis.from_url(sys.argv[1], socket_timeout=2, socket_connect_timeout=2).ping()' "$1" >/dev/null 2>&1
  else
    return 1
  fi
}

# redis_ours: the server on REDIS_PORT is this project's (its data directory is .redis/data).
redis_ours() {
  local dir
  [ -d "$REDIS_DATA" ] || return 1
  dir=$(timeout 3 redis-cli -u "$REDIS_URL" config get dir 2>/dev/null | sed -n 2p) || return 1
  [ -n "$dir" ] && [ "$dir" = "$(cd "$REDIS_DATA" && pwd -P)" ]
}

# pid_exited PID: PID is not running (gone, or a zombie not yet reaped).
pid_exited() { [ ! -r "/proc/$1/stat" ] || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]; }

redis_ready() { redis_ping "$REDIS_URL" && redis_ours; }

# port_open PORT: something accepts TCP connections on 127.0.0.1:PORT.
port_open() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" >/dev/null 2>&1; }
port_closed() { ! port_open "$1"; }

# Rewritten at every start, so that a changed port or setting applies; the data in .redis/data is kept.
write_redis_conf() {
  cat >"$REDIS_CONF" <<EOF
# Written by scripts/services.sh at every start: the dstreams tests' own Redis server (not the system
# service). Loopback only, no password, durable: every write goes to the append-only file.
bind 127.0.0.1
port $REDIS_PORT
protected-mode yes
daemonize yes
supervised no
pidfile "$REDIS_PID"
logfile "$REDIS_LOG"
loglevel notice
dir "$REDIS_DATA"
appendonly yes
appendfsync everysec
save ""
EOF
}

start_redis() {
  local ext t
  REDIS_FAILURE=""
  if ext=$(external DSTREAMS_TEST_REDIS_URL "$REDIS_URL"); then
    if redis_ping "$ext"; then
      echo "redis: using $ext (DSTREAMS_TEST_REDIS_URL; not started or stopped here)"
      return 0
    fi
    warn "DSTREAMS_TEST_REDIS_URL=$ext does not answer PING (a server there is not started by this script)."
    REDIS_FAILURE="nothing answers PING at DSTREAMS_TEST_REDIS_URL=$ext (not started here; no log)"
    echo "redis: NOT AVAILABLE at $ext"
    return 1
  fi
  case "$REDIS_PORT" in
    '' | *[!0-9]*)
      REDIS_FAILURE="DSTREAMS_TEST_REDIS_PORT=$REDIS_PORT is not a port number"
      echo "redis: NOT STARTED ($REDIS_FAILURE)"
      return 1
      ;;
  esac
  if ! install_redis; then
    echo "redis: NOT AVAILABLE"
    return 1
  fi
  # Ours on this port but not answering yet (loading a big append-only file): wait for it.
  if redis_ready || { pid_alive "$REDIS_PID" "redis-server.*:$REDIS_PORT" && wait_for 30 redis_ready; }; then
    echo "redis: running at $REDIS_URL (appendonly; pid $(cat "$REDIS_PID" 2>/dev/null || echo '?'))"
    return 0
  fi
  if pid_alive "$REDIS_PID" redis-server; then  # a second server must not share .redis/data
    warn "this project's redis-server (pid $(cat "$REDIS_PID")) runs on another port or does not answer."
    REDIS_FAILURE="this project's redis-server (pid $(cat "$REDIS_PID"), data in $REDIS_DATA) does not answer on $REDIS_URL (another DSTREAMS_TEST_REDIS_PORT?): stop it first with \`bash scripts/services.sh stop redis\` (log: $REDIS_LOG)"
    echo "redis: NOT STARTED (the project's redis-server runs but not on $REDIS_URL)"
    return 1
  fi
  if port_open "$REDIS_PORT"; then
    warn "something that is not this project's redis-server listens on 127.0.0.1:$REDIS_PORT; Redis not started."
    REDIS_FAILURE="127.0.0.1:$REDIS_PORT is taken by another process, not this project's redis-server (set DSTREAMS_TEST_REDIS_PORT to a free port, or DSTREAMS_TEST_REDIS_URL to use that server)"
    echo "redis: NOT STARTED (127.0.0.1:$REDIS_PORT is taken)"
    return 1
  fi
  mkdir -p "$REDIS_DATA"
  write_redis_conf
  t=$(date +%s%N)
  # daemonize: redis-server forks and returns at once; it answers PING once the append-only file is loaded.
  if ! timeout 30 redis-server "$REDIS_CONF" >>"$REDIS_LOG" 2>&1 || ! wait_for 30 redis_ready; then
    stop_pid "$REDIS_PID" redis-server
    tail -5 "$REDIS_LOG" >&2 2>/dev/null
    warn "redis-server did not answer on $REDIS_URL within 30 s; see $REDIS_LOG"
    REDIS_FAILURE="redis-server did not answer on $REDIS_URL within 30 s (log: $REDIS_LOG)"
    echo "redis: NOT STARTED (see $REDIS_LOG)"
    return 1
  fi
  echo "redis: $REDIS_URL (appendonly; start took $(( ($(date +%s%N) - t) / 1000000 )) ms)"
}

# stop_redis: SIGTERM (Redis shuts down cleanly: the append-only file is flushed), bounded as stop_pid.
stop_redis() {
  if external DSTREAMS_TEST_REDIS_URL "$REDIS_URL" >/dev/null; then
    log "redis: DSTREAMS_TEST_REDIS_URL is set: that server is not stopped here"
    return 0
  fi
  local p
  if pid_alive "$REDIS_PID" redis-server; then
    p=$(cat "$REDIS_PID")
    kill "$p" 2>/dev/null
    # An exited daemon stays a zombie until init reaps it (over a second here): exited is enough.
    wait_for 10 pid_exited "$p" || { kill -9 "$p" 2>/dev/null; wait_for 5 pid_exited "$p"; }
    rm -f "$REDIS_PID"
    log "stopped redis-server (pid $p)"
  elif command -v redis-cli >/dev/null 2>&1 && redis_ours; then  # ours, but its pid file is gone
    timeout 15 redis-cli -u "$REDIS_URL" shutdown >/dev/null 2>&1
    wait_for 10 bash -c "! (exec 3<>/dev/tcp/127.0.0.1/$REDIS_PORT)" 2>/dev/null
    log "stopped redis-server on port $REDIS_PORT (SHUTDOWN)"
  fi
}

redis_status() {
  local ext
  if ext=$(external DSTREAMS_TEST_REDIS_URL "$REDIS_URL"); then
    if redis_ping "$ext"; then echo "redis: using $ext (DSTREAMS_TEST_REDIS_URL)"
    else echo "redis: NOT answering at $ext (DSTREAMS_TEST_REDIS_URL)"; fi
  elif command -v redis-cli >/dev/null 2>&1 && redis_ready; then
    echo "redis: running at $REDIS_URL (pid $(cat "$REDIS_PID" 2>/dev/null || echo '?')," \
      "appendonly $(timeout 3 redis-cli -u "$REDIS_URL" config get appendonly 2>/dev/null | sed -n 2p))"
  else
    echo "redis: stopped"
  fi
}

# ---------------------------------------------------------------- PostgreSQL (the SQL sink's tests)

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }
pg_installed() { [ -n "$(pg_bin)" ] && [ -x "$(pg_bin)/pg_ctl" ]; }

# as_pg CMD...: run CMD as the owner of the cluster (the `postgres` system user when we are root).
as_pg() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_ready() { timeout 5 "$(pg_bin)/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB"; }

start_postgres() {
  local t ext
  t=$(date +%s%N)
  PG_FAILURE=""
  if ext=$(external DSTREAMS_TEST_POSTGRES_DSN "$PG_DSN"); then
    echo "postgres: using $ext (DSTREAMS_TEST_POSTGRES_DSN; not started or stopped here)"
    return 0
  fi
  if ! pg_installed; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ -n "${DSTREAMS_NO_APT:-}" ]; then
      PG_FAILURE="postgresql is not installed and cannot be installed here (needs root and apt-get; no log)"
      echo "postgres: NOT AVAILABLE ($PG_FAILURE)"
      return 1
    fi
    log "installing postgresql (apt-get)"
    apt_install "$PG_BASE/apt.log" postgresql postgresql || {
      PG_FAILURE="installing postgresql with apt-get failed (log: $PG_BASE/apt.log)"
      echo "postgres: NOT AVAILABLE"
      return 1
    }
  fi
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$PG_BASE" --shell /usr/sbin/nologin postgres
    touch "$PG_LOG"
    chown -R postgres: "$PG_BASE"
  fi
  if pg_ready; then
    echo "postgres: running at $PG_DSN"
    return 0
  fi
  if port_open "$PG_PORT"; then
    PG_FAILURE="127.0.0.1:$PG_PORT is taken by a process that is not this project's PostgreSQL (set DSTREAMS_TEST_POSTGRES_PORT)"
    echo "postgres: NOT STARTED ($PG_FAILURE)"
    return 1
  fi
  if [ ! -f "$PG_DATA/PG_VERSION" ]; then
    log "postgres: initdb $PG_DATA"
    if ! as_pg timeout 120 "$(pg_bin)/initdb" -D "$PG_DATA" -U "$PG_USER" --auth=trust -E UTF8 --no-locale \
        >>"$PG_LOG" 2>&1; then
      PG_FAILURE="initdb failed (log: $PG_LOG)"
      echo "postgres: NOT STARTED ($PG_FAILURE)"
      return 1
    fi
  fi
  # -w: pg_ctl waits (at most -t seconds) until the server accepts connections.
  if ! as_pg timeout 90 "$(pg_bin)/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 \
      -o "-p $PG_PORT -k $PG_BASE -c listen_addresses=127.0.0.1" start >/dev/null 2>&1 || ! wait_for 30 pg_ready; then
    tail -5 "$PG_LOG" >&2 2>/dev/null
    PG_FAILURE="PostgreSQL did not accept connections on 127.0.0.1:$PG_PORT within 60 s (log: $PG_LOG)"
    echo "postgres: NOT STARTED (see $PG_LOG)"
    return 1
  fi
  if ! timeout 30 psql -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$PG_DB'" | grep -q 1; then
    timeout 30 psql -q -h 127.0.0.1 -p "$PG_PORT" -U "$PG_USER" -d postgres -c "CREATE DATABASE $PG_DB" >>"$PG_LOG" 2>&1
  fi
  echo "postgres: $PG_DSN (start took $(( ($(date +%s%N) - t) / 1000000 )) ms)"
}

# stop_postgres: a fast shutdown (connections closed, everything committed is on disk), bounded.
stop_postgres() {
  if external DSTREAMS_TEST_POSTGRES_DSN "$PG_DSN" >/dev/null; then
    log "postgres: DSTREAMS_TEST_POSTGRES_DSN is set: that server is not stopped here"
    return 0
  fi
  if pg_installed && [ -f "$PG_DATA/postmaster.pid" ]; then
    as_pg timeout 60 "$(pg_bin)/pg_ctl" -D "$PG_DATA" -m fast -w -t 30 stop >/dev/null 2>&1 && log "stopped postgres"
  fi
}

postgres_status() {
  local ext
  if ext=$(external DSTREAMS_TEST_POSTGRES_DSN "$PG_DSN"); then echo "postgres: using $ext (DSTREAMS_TEST_POSTGRES_DSN)"
  elif pg_installed && pg_ready; then echo "postgres: running at $PG_DSN"
  else echo "postgres: stopped"; fi
}

# ---------------------------------------------------------------- Kafka broker (the Kafka source's and sink's tests)

# kafka_java: the java that runs the broker (JAVA_HOME's when set, as scripts/env.sh picks it).
kafka_java() { echo "${JAVA_HOME:+$JAVA_HOME/bin/}java"; }

# java_major: the major version of kafka_java, 0 when there is none (as scripts/env.sh reads it).
java_major() {
  local v
  command -v "$(kafka_java)" >/dev/null 2>&1 || { echo 0; return; }
  v=$("$(kafka_java)" -version 2>&1 | awk -F'"' '/version/ {split($2, v, "."); print (v[1] == "1" ? v[2] : v[1]); exit}')
  case "$v" in '' | *[!0-9]*) echo 0 ;; *) echo "$v" ;; esac
}

# kafka_python: a python that can import confluent_kafka (the project's .venv first), for the readiness check.
kafka_python() {
  local py
  for py in "$ROOT/.venv/bin/python" python3; do
    if command -v "$py" >/dev/null 2>&1 &&
      "$py" -c "import importlib.util as u; exit(not u.find_spec('confluent_kafka'))" >/dev/null 2>&1; then
      echo "$py"
      return 0
    fi
  done
  return 1
}

# kafka_metadata BOOTSTRAP: a broker at BOOTSTRAP answers a metadata request (an admin client lists its topics)
# within a few seconds. Without confluent_kafka: only that its first host:port accepts TCP connections.
kafka_metadata() {
  local py hostport
  if py=$(kafka_python); then
    timeout 10 "$py" - "$1" <<'PY' >/dev/null 2>&1
import sys
from confluent_kafka.admin import AdminClient
md = AdminClient({"bootstrap.servers": sys.argv[1], "socket.connection.setup.timeout.ms": 2000}).list_topics(timeout=4)
sys.exit(0 if md.brokers else 1)
PY
  else
    hostport="${1%%,*}"
    timeout 3 bash -c "exec 3<>/dev/tcp/${hostport%:*}/${hostport##*:}" >/dev/null 2>&1
  fi
}

# kafka_ours: this project's broker (its pid file names a running kafka.Kafka with .kafka/server.properties).
kafka_ours() { pid_alive "$KAFKA_PID" "kafka.Kafka $KAFKA_CONF"; }

# kafka_ready: our broker runs, logged that it started, and answers on KAFKA_BOOTSTRAP.
kafka_ready() {
  kafka_ours && grep -q "Kafka Server started" "$KAFKA_LOG" 2>/dev/null && port_open "$KAFKA_PORT" &&
    kafka_metadata "$KAFKA_BOOTSTRAP"
}

kafka_failed() { echo "$1" >"$KAFKA_FAILURE"; }

# install_kafka_tools: Java 17+ and Maven (Debian's openjdk-17-jre-headless and maven) when missing.
install_kafka_tools() {
  local need=()
  [ "$(java_major)" -ge 17 ] 2>/dev/null || need+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || need+=(maven)
  [ "${#need[@]}" = 0 ] && return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ -n "${DSTREAMS_NO_APT:-}" ]; then
    warn "the Kafka broker needs Java 17+ and Maven, which cannot be installed here (needs root and apt-get, DSTREAMS_NO_APT unset)."
    warn "Install them with: apt-get install --no-install-recommends ${need[*]}"
    kafka_failed "${need[*]} missing and cannot be installed here (needs root and apt-get; no log)"
    return 1
  fi
  log "installing ${need[*]} (apt-get)"
  apt_install "$KAFKA_BASE/apt.log" "${need[-1]}" "${need[@]}" || {
    warn "apt-get install failed, see $KAFKA_BASE/apt.log"
    kafka_failed "installing ${need[*]} with apt-get failed (log: $KAFKA_BASE/apt.log)"
    return 1
  }
  if [ "$(java_major)" -lt 17 ] 2>/dev/null || ! command -v mvn >/dev/null 2>&1; then
    kafka_failed "${need[*]} installed but java 17+ or mvn is still not on PATH (JAVA_HOME=${JAVA_HOME:-}; log: $KAFKA_BASE/apt.log)"
    return 1
  fi
}

# kafka_jars: the broker's classpath in .kafka/jars, gathered by Maven from scripts/kafka/pom.xml; skipped when the
# folder is complete for this pom (a stamp named by its md5). Maven's ~/.m2 caches the downloads too.
kafka_jars() {
  local stamp t
  stamp="$KAFKA_JARS/.complete-$(md5sum <"$KAFKA_POM" | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  t=$(date +%s%N)
  log "kafka: gathering the broker's jars with Maven (first run downloads ~45 MB; log: $KAFKA_BASE/mvn.log)"
  rm -rf "$KAFKA_JARS" "$KAFKA_JARS.tmp"
  if ! timeout 900 mvn -B -q -Dstyle.color=never -f "$KAFKA_POM" dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$KAFKA_JARS.tmp" >"$KAFKA_BASE/mvn.log" 2>&1; then
    tail -5 "$KAFKA_BASE/mvn.log" >&2
    rm -rf "$KAFKA_JARS.tmp"
    kafka_failed "Maven could not gather the broker's jars from $KAFKA_POM (log: $KAFKA_BASE/mvn.log)"
    return 1
  fi
  mv "$KAFKA_JARS.tmp" "$KAFKA_JARS" && touch "$stamp"
  log "kafka: $(ls "$KAFKA_JARS" | wc -l) jars in $KAFKA_JARS ($(( ($(date +%s%N) - t) / 1000000 ))ms)"
}

# Rewritten at every start, so that a changed port or setting applies; the data in .kafka/data is kept.
write_kafka_conf() {
  cat >"$KAFKA_CONF" <<CONF
# Written by scripts/services.sh at every start: the dstreams tests' own single-node Kafka broker (KRaft: broker
# and controller in one JVM). Loopback only, no authentication; data in $KAFKA_DATA, kept across restarts.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$KAFKA_DATA
num.partitions=1
default.replication.factor=1
min.insync.replicas=1
auto.create.topics.enable=false
# One broker: the internal topics with one replica, and one partition each (the default 50 makes the first group
# commit or init_transactions wait for 50 partitions to be created and loaded).
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
share.coordinator.state.topic.num.partitions=1
group.initial.rebalance.delay.ms=0
# A transaction of a dead producer is aborted within 5 s of its transaction.timeout.ms (default check: every 10 s).
transaction.abort.timed.out.transaction.cleanup.interval.ms=5000
# The log cleaner (compacted internal topics) allocates this on the heap: 32 MB instead of 128 MB.
log.cleaner.dedupe.buffer.size=33554432
# After a kill, the restarted broker waits for its old registration's session to expire before it serves: 6 s
# instead of 9 s (heartbeats every second instead of 2 s, so a stall of up to ~5 s does not fence it).
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
CONF
}

# kafka_cluster_id: the id this broker's storage is formatted with (kept in .kafka/cluster.id; read back from the
# data when that file is gone; else a new one: 16 random bytes, URL-safe base64 without padding, no leading '-').
kafka_cluster_id() {
  local id
  id=$(cat "$KAFKA_BASE/cluster.id" 2>/dev/null)
  [ -n "$id" ] || id=$(sed -n 's/^cluster\.id=//p' "$KAFKA_DATA/meta.properties" 2>/dev/null)
  while [ -z "$id" ] || [ "${id:0:1}" = - ]; do
    id=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
  done
  echo "$id" >"$KAFKA_BASE/cluster.id"
  echo "$id"
}

# kafka_wait SECONDS: poll until the broker answers (kafka_ready), giving up early when its JVM exited.
kafka_wait() {
  local limit=$(( $1 * 5 )) i p
  for (( i = 0; i < limit; i++ )); do
    if ! kafka_ours; then
      # Just launched, the process may not be java yet (the forked shell, then setsid/nohup exec it): only a
      # process that is gone, or one that never became the broker within 10 s, is a failed start.
      p=$(cat "$KAFKA_PID" 2>/dev/null)
      if [ -n "$p" ] && ! pid_exited "$p" && (( i < 50 )); then
        sleep 0.2
        continue
      fi
      return 1
    fi
    # The metadata check (a python start-up) only once the log said it started and the port is open.
    if grep -q "Kafka Server started" "$KAFKA_LOG" 2>/dev/null && port_open "$KAFKA_PORT"; then
      kafka_metadata "$KAFKA_BOOTSTRAP" && return 0
    fi
    sleep 0.2
  done
  return 1
}

start_kafka() {
  local ext t t_format p
  rm -f "$KAFKA_FAILURE"
  if ext=$(external DSTREAMS_TEST_KAFKA_BOOTSTRAP "$KAFKA_BOOTSTRAP"); then
    if kafka_metadata "$ext"; then
      echo "kafka: using $ext (DSTREAMS_TEST_KAFKA_BOOTSTRAP; not started or stopped here)"
      return 0
    fi
    warn "DSTREAMS_TEST_KAFKA_BOOTSTRAP=$ext does not answer (a broker there is not started by this script)."
    kafka_failed "no broker answers at DSTREAMS_TEST_KAFKA_BOOTSTRAP=$ext (not started here; no log)"
    echo "kafka: NOT AVAILABLE at $ext"
    return 1
  fi
  case "$KAFKA_PORT" in
    '' | *[!0-9]*)
      kafka_failed "DSTREAMS_TEST_KAFKA_PORT=$KAFKA_PORT is not a port number"
      echo "kafka: NOT STARTED (DSTREAMS_TEST_KAFKA_PORT=$KAFKA_PORT is not a port number)"
      return 1
      ;;
  esac
  # Ours on this port and running, perhaps still starting (recovering its logs after a kill): wait for it.
  if kafka_ours && grep -qx "advertised.listeners=PLAINTEXT://$KAFKA_BOOTSTRAP" "$KAFKA_CONF" && kafka_wait 90; then
    echo "kafka: running at $KAFKA_BOOTSTRAP (pid $(cat "$KAFKA_PID"), data in $KAFKA_DATA)"
    return 0
  fi
  if kafka_ours; then  # a second broker must not share .kafka/data
    warn "this project's Kafka broker (pid $(cat "$KAFKA_PID")) runs but does not answer on $KAFKA_BOOTSTRAP."
    kafka_failed "this project's Kafka broker (pid $(cat "$KAFKA_PID"), data in $KAFKA_DATA) does not answer on $KAFKA_BOOTSTRAP (another DSTREAMS_TEST_KAFKA_PORT?): stop it first with \`bash scripts/services.sh stop kafka\` (log: $KAFKA_LOG)"
    echo "kafka: NOT STARTED (the project's broker runs but does not answer on $KAFKA_BOOTSTRAP)"
    return 1
  fi
  for p in "$KAFKA_PORT" "$KAFKA_CONTROLLER_PORT"; do
    # A broker of ours that was just stopped may still hold its ports while its JVM exits (a busy or stalled
    # machine): give it 30 s before calling the port taken.
    if port_open "$p" && ! wait_for 30 port_closed "$p"; then
      warn "something that is not this project's Kafka broker listens on 127.0.0.1:$p; Kafka not started."
      kafka_failed "127.0.0.1:$p is taken by another process, not this project's Kafka broker (set DSTREAMS_TEST_KAFKA_PORT and DSTREAMS_TEST_KAFKA_CONTROLLER_PORT to free ports, or DSTREAMS_TEST_KAFKA_BOOTSTRAP to use that broker)"
      echo "kafka: NOT STARTED (127.0.0.1:$p is taken)"
      return 1
    fi
  done
  if ! install_kafka_tools || ! kafka_jars; then
    echo "kafka: NOT AVAILABLE ($(cat "$KAFKA_FAILURE" 2>/dev/null))"
    return 1
  fi
  mkdir -p "$KAFKA_DATA"
  write_kafka_conf
  if [ ! -f "$KAFKA_DATA/meta.properties" ]; then
    t_format=$(date +%s%N)
    if ! timeout 120 "$(kafka_java)" -Xmx256m -Dlog4j2.configurationFile="$KAFKA_LOG4J" -cp "$KAFKA_JARS/*" \
        kafka.tools.StorageTool format --ignore-formatted -t "$(kafka_cluster_id)" -c "$KAFKA_CONF" \
        >"$KAFKA_BASE/format.log" 2>&1; then
      tail -5 "$KAFKA_BASE/format.log" >&2
      kafka_failed "formatting the broker's storage in $KAFKA_DATA failed (log: $KAFKA_BASE/format.log)"
      echo "kafka: NOT STARTED (see $KAFKA_BASE/format.log)"
      return 1
    fi
    log "kafka: storage formatted in $KAFKA_DATA (cluster $(cat "$KAFKA_BASE/cluster.id"); $(( ($(date +%s%N) - t_format) / 1000000 ))ms)"
  fi
  [ -f "$KAFKA_LOG" ] && mv -f "$KAFKA_LOG" "$KAFKA_LOG.1"  # the previous run's log; this run's starts empty
  t=$(date +%s%N)
  # The JVM options of Kafka's own kafka-run-class.sh (G1, short pauses), with a small heap.
  setsid nohup "$(kafka_java)" -Xmx512m -Xms256m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_LOG4J" -Dkafka.logs.dir="$KAFKA_BASE" -cp "$KAFKA_JARS/*" \
    kafka.Kafka "$KAFKA_CONF" >"$KAFKA_LOG" 2>&1 </dev/null &
  echo $! >"$KAFKA_PID"
  if ! kafka_wait 90; then
    stop_kafka_pid
    tail -5 "$KAFKA_LOG" >&2 2>/dev/null
    warn "the Kafka broker did not answer on $KAFKA_BOOTSTRAP within 90 s; see $KAFKA_LOG"
    kafka_failed "the Kafka broker did not answer on $KAFKA_BOOTSTRAP within 90 s (log: $KAFKA_LOG)"
    echo "kafka: NOT STARTED (see $KAFKA_LOG)"
    return 1
  fi
  echo "kafka: $KAFKA_BOOTSTRAP (KRaft, data in $KAFKA_DATA; start took $(( ($(date +%s%N) - t) / 1000000 )) ms)"
}

# stop_kafka_pid: SIGTERM (a controlled shutdown: logs flushed, no recovery at the next start), up to 30 s, then
# KILL (the data survives: the next start recovers the logs).
stop_kafka_pid() {
  local p
  if kafka_ours; then
    p=$(cat "$KAFKA_PID")
    kill "$p" 2>/dev/null
    wait_for 30 pid_exited "$p" || {
      warn "the Kafka broker (pid $p) did not exit within 30 s of SIGTERM: killing it"
      kill -9 "$p" 2>/dev/null
      wait_for 5 pid_exited "$p"
    }
    log "stopped kafka (pid $p)"
  fi
  rm -f "$KAFKA_PID"
}

stop_kafka() {
  if external DSTREAMS_TEST_KAFKA_BOOTSTRAP "$KAFKA_BOOTSTRAP" >/dev/null; then
    log "kafka: DSTREAMS_TEST_KAFKA_BOOTSTRAP is set: that broker is not stopped here"
    return 0
  fi
  stop_kafka_pid
}

kafka_status() {
  local ext
  if ext=$(external DSTREAMS_TEST_KAFKA_BOOTSTRAP "$KAFKA_BOOTSTRAP"); then
    if kafka_metadata "$ext"; then echo "kafka: using $ext (DSTREAMS_TEST_KAFKA_BOOTSTRAP)"
    else echo "kafka: NOT answering at $ext (DSTREAMS_TEST_KAFKA_BOOTSTRAP)"; fi
  elif kafka_ready; then
    echo "kafka: running at $KAFKA_BOOTSTRAP (pid $(cat "$KAFKA_PID"), data in $KAFKA_DATA)"
  elif kafka_ours; then
    echo "kafka: starting or not answering at $KAFKA_BOOTSTRAP (pid $(cat "$KAFKA_PID"), log $KAFKA_LOG)"
  else
    echo "kafka: stopped"
  fi
}

# ---------------------------------------------------------------- Chromium (headless browser for the page test)

chromium_installed() { command -v chromium >/dev/null && command -v chromedriver >/dev/null; }

start_chromium() {
  CHROMIUM_FAILURE=""
  if ! chromium_installed; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1 || [ -n "${DSTREAMS_NO_APT:-}" ]; then
      warn "chromium/chromedriver are not installed and cannot be installed here (needs root and apt-get, DSTREAMS_NO_APT unset)."
      warn "Install them with: apt-get install --no-install-recommends $CHROMIUM_PACKAGES"
      CHROMIUM_FAILURE="chromium and chromium-driver are not installed and cannot be installed here (needs root and apt-get; no log)"
      echo "chromium: NOT AVAILABLE"
      return 1
    fi
    log "installing $CHROMIUM_PACKAGES (apt-get)"
    # shellcheck disable=SC2086
    apt_install "$BASE/chromium-apt.log" chromium-driver $CHROMIUM_PACKAGES || {
      warn "apt-get install failed, see $BASE/chromium-apt.log"
      CHROMIUM_FAILURE="installing chromium and chromium-driver with apt-get failed (log: $BASE/chromium-apt.log)"
      echo "chromium: NOT AVAILABLE"
      return 1
    }
  fi
  if ! timeout 30 chromedriver --version >/dev/null 2>&1; then
    CHROMIUM_FAILURE="chromedriver is installed but does not run (chromedriver --version failed)"
    echo "chromium: NOT AVAILABLE ($CHROMIUM_FAILURE)"
    return 1
  fi
  echo "chromium: $(timeout 30 chromedriver --version 2>/dev/null | awk '{print $1, $2}') with $(command -v chromium)"
}

chromium_status() {
  if chromium_installed; then echo "chromium: installed ($(timeout 30 chromedriver --version 2>/dev/null | awk '{print $2}'))"
  else echo "chromium: not installed"; fi
}

# ---------------------------------------------------------------- main

usage() {
  echo "usage: $0 start|stop|status [ceph|moto|redis|postgres|kafka|chromium ...]   (no service named: all of them)" >&2
  echo "       $0 restart ceph|moto|redis|postgres|kafka ...                (stops, then starts, only those named)" >&2
}

# selected SERVICE: SERVICE was named on the command line, or none was.
SELECTED=()
selected() {
  local s
  [ "${#SELECTED[@]}" = 0 ] && return 0
  for s in "${SELECTED[@]}"; do [ "$s" = "$1" ] && return 0; done
  return 1
}

status() {
  if selected ceph; then
    if rgw_ours && http_up "$RGW_URL/"; then echo "ceph-rgw: running at $RGW_URL"
    else echo "ceph-rgw: stopped"; fi
  fi
  if selected moto; then
    if pid_alive "$MOTO_PID" moto.server && http_up "$MOTO_URL/"; then echo "moto: running at $MOTO_URL"
    else echo "moto: stopped"; fi
  fi
  if selected redis; then redis_status; fi
  if selected postgres; then postgres_status; fi
  if selected kafka; then kafka_status; fi
  if selected chromium; then chromium_status; fi
}

start_services() {
  local moto_job="" kafka_job="" ceph_rc=0 moto_rc=0 redis_rc=0 postgres_rc=0 kafka_rc=0 chromium_rc=0 failed=() f
  if selected moto; then
    start_moto &  # moto needs 1-3 s to import: start it while Ceph comes up
    moto_job=$!
  fi
  if selected kafka && [ "$(java_major)" -ge 17 ] 2>/dev/null && command -v mvn >/dev/null 2>&1; then
    start_kafka &  # the broker's JVM needs ~10 s to answer: start it while Ceph comes up (no apt-get needed)
    kafka_job=$!
  fi
  if selected ceph; then
    start_ceph
    ceph_rc=$?
  fi
  if selected redis; then  # after Ceph: both may need apt-get, which cannot run twice at once
    start_redis
    redis_rc=$?
  fi
  if selected postgres; then  # after Redis: apt-get cannot run twice at once
    start_postgres
    postgres_rc=$?
  fi
  if selected chromium; then  # after PostgreSQL: apt-get cannot run twice at once
    start_chromium
    chromium_rc=$?
  fi
  if selected kafka && [ -z "$kafka_job" ]; then  # after Chromium: it installs Java or Maven with apt-get first
    start_kafka
    kafka_rc=$?
  fi
  if [ -n "$moto_job" ]; then
    wait "$moto_job"
    moto_rc=$?
  fi
  if [ -n "$kafka_job" ]; then
    wait "$kafka_job"
    kafka_rc=$?
  fi
  [ "$ceph_rc" = 0 ] || failed+=("ceph-rgw: ${CEPH_FAILURE:-the Ceph RADOS Gateway did not start (logs: $D/log)}")
  [ "$moto_rc" = 0 ] || failed+=("moto: $(cat "$MOTO_FAILURE" 2>/dev/null || echo "the moto server did not start (log: $MOTO_LOG)")")
  [ "$redis_rc" = 0 ] || failed+=("redis: ${REDIS_FAILURE:-the Redis server did not start (log: $REDIS_LOG)}")
  [ "$postgres_rc" = 0 ] || failed+=("postgres: ${PG_FAILURE:-PostgreSQL did not start (log: $PG_LOG)}")
  [ "$kafka_rc" = 0 ] || failed+=("kafka: $(cat "$KAFKA_FAILURE" 2>/dev/null || echo "the Kafka broker did not start (log: $KAFKA_LOG)")")
  [ "$chromium_rc" = 0 ] || failed+=("chromium: ${CHROMIUM_FAILURE:-chromium and chromium-driver are not available}")
  if [ "${#failed[@]}" -gt 0 ]; then
    if required; then
      echo "ERROR: ${#failed[@]} service(s) the tests need did not start, and services are required" \
        "(CI=${CI:-} DSTREAMS_REQUIRE_SERVICES=${DSTREAMS_REQUIRE_SERVICES:-}):" >&2
      for f in "${failed[@]}"; do echo "ERROR:   $f" >&2; done
      exit 1
    fi
    for f in "${failed[@]}"; do warn "not started: $f"; done
    warn "the tests that need these services will skip (CI=true or DSTREAMS_REQUIRE_SERVICES=1 makes this fatal)"
  fi
}

stop_services() {
  # In parallel: each daemon takes 1-2 s to exit after SIGTERM.
  if selected moto; then stop_pid "$MOTO_PID" moto.server & fi
  if selected redis; then stop_redis & fi
  if selected postgres; then stop_postgres & fi
  if selected kafka; then stop_kafka & fi
  if selected ceph; then stop_ceph; fi
  wait
  if [ "${#SELECTED[@]}" = 0 ]; then echo "services stopped"; else echo "stopped: ${SELECTED[*]}"; fi
}

mkdir -p "$BASE" "$REDIS_BASE" "$PG_BASE" "$KAFKA_BASE"
[ -f "$REDIS_BASE/.gitignore" ] || echo '*' >"$REDIS_BASE/.gitignore"  # .redis/ is local state, never committed
[ -f "$PG_BASE/.gitignore" ] || echo '*' >"$PG_BASE/.gitignore"  # .postgres/ too
[ -f "$KAFKA_BASE/.gitignore" ] || echo '*' >"$KAFKA_BASE/.gitignore"  # .kafka/ too
cmd="${1:-}"
[ "$#" = 0 ] || shift
for s in "$@"; do
  case "$s" in
    ceph | moto | redis | postgres | kafka | chromium) SELECTED+=("$s") ;;
    *) echo "unknown service: $s" >&2; usage; exit 2 ;;
  esac
done
case "$cmd" in
  start) start_services ;;
  stop) stop_services ;;
  status) status ;;
  restart)
    if [ "${#SELECTED[@]}" = 0 ]; then
      echo "restart needs the services to restart named (ceph, moto, redis, postgres, kafka, chromium)" >&2
      usage
      exit 2
    fi
    stop_services
    start_services
    ;;
  *)
    usage
    exit 2
    ;;
esac
exit 0
