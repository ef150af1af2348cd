"""The test cluster's process groups (tests/standalone_cluster.py): a group id the cluster recorded is signalled only
while its leader is the process the cluster started; once that id belongs to a later process (pids are reused, and a
killed host's id stays recorded until the host is healed), the cluster treats the host as gone and signals nothing.
A group whose only process is a zombie (exited, not yet reaped by this process) is not alive: stopping a cluster waits
for its daemons to exit, not for the grace period to end."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.standalone_cluster import StandaloneCluster, _group_alive, _start_time


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)


def test_a_group_whose_leader_is_a_later_process_is_not_the_hosts(tmp_path):
    proc = _sleeper()
    try:
        cluster = StandaloneCluster(tmp_path)
        name = cluster._name(0)
        cluster._pgids[name] = proc.pid
        cluster._starts[name] = _start_time(proc.pid)
        assert cluster.host_pids(0) == [proc.pid]
        assert cluster.host_state(0) == "running"
        cluster._starts[name] -= 1  # as if the recorded leader had started earlier: the id is another group's now
        assert cluster.host_pids(0) == []
        assert cluster.host_state(0) == "gone"
        assert cluster.freeze_host(0) == [] and proc.poll() is None
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_a_dead_leader_has_no_start_time():
    proc = _sleeper()
    assert _start_time(proc.pid) is not None
    proc.kill()
    proc.wait(timeout=30)
    assert _start_time(proc.pid) is None


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_a_group_whose_leader_exited_unreaped_is_not_alive():
    proc = _sleeper()
    try:
        assert _group_alive(proc.pid)
        proc.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 30
        while _state(proc.pid) != "Z":  # exited; a zombie until proc.wait() reaps it
            assert time.monotonic() < deadline, _state(proc.pid)
            time.sleep(0.01)
        assert not _group_alive(proc.pid)
    finally:
        proc.kill()
        proc.wait(timeout=30)
