"""Driver processes killed with SIGKILL (and a paused zombie) with checkpoints on a real S3 server.

The driver (tests/recovery_app.py) runs runningReduce + a 10 s invertible window + track on the
generator source with 1 s batches, checkpoints in Ceph's RADOS Gateway (started by
scripts/services.sh), outputs with exactly-once saveAsTextFiles. Each test kills it at a chosen
point (recovery/faults.py), restarts it, and compares every committed output, batch by batch,
with a run on a manual clock over the same batch times.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

import pytest

from dstreams.testing import run_through

from ..recovery_app import build, read_outputs
from ..support import RGW_ENDPOINT, service_unavailable, state_keys

pytestmark = [pytest.mark.slow, pytest.mark.fault, pytest.mark.s3]

RGW = RGW_ENDPOINT
APP = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recovery_app.py")  # tests/: shared

@pytest.fixture(scope="module")
def rgw_bucket():
    boto3 = pytest.importorskip("boto3")
    from botocore.config import Config

    client = boto3.client("s3", endpoint_url=RGW, aws_access_key_id="AKTEST", aws_secret_access_key="SKTEST",
                          region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1},
                                        connect_timeout=2, read_timeout=10))
    bucket = f"failover-{uuid.uuid4().hex[:8]}"
    try:
        client.create_bucket(Bucket=bucket)
    except Exception as e:  # noqa: BLE001
        service_unavailable(f"Ceph RGW at {RGW} is not reachable ({e}); run `bash scripts/services.sh start`")
    return bucket


def _env():
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               AWS_ENDPOINT_URL_S3=RGW, AWS_ACCESS_KEY_ID="AKTEST", AWS_SECRET_ACCESS_KEY="SKTEST",
               AWS_DEFAULT_REGION="us-east-1", DSTREAMS_STORE_RETRY_SECONDS="20")
    for k in ("DSTREAMS_FAULT_KILL", "DSTREAMS_FAULT_KILL_AFTER"):
        env.pop(k, None)
    return env


def _driver(ckpt: str, out: str, log_path: str, **env_extra: str) -> subprocess.Popen:
    env = _env()
    env.update(env_extra)
    log = open(log_path, "ab")  # noqa: SIM115 - closed with the process
    # Its own session, with its JVM and Python workers: see _wait_session_gone.
    return subprocess.Popen([sys.executable, APP, ckpt, out], env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=os.path.dirname(out), start_new_session=True)


def _stop(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)


def _session_pids(sid: int) -> list[int]:
    """The live processes (zombies aside) of session ``sid``."""
    pids = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _ppid, _pgrp, session = f.read().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if state != "Z" and int(session) == sid:
            pids.append(int(pid))
    return pids


def _wait_session_gone(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """After a driver died: wait for the rest of its session (its JVM, the Python worker daemon in a process group of
    its own and the workers, which notice within about a second and may write to the executors' store folder until
    then); after ``timeout``, kill them."""
    deadline = time.monotonic() + timeout
    while pids := _session_pids(proc.pid):
        if time.monotonic() > deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        time.sleep(0.1)


def _wait(cond, timeout: float, what: str, proc: subprocess.Popen | None = None, log_path: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc is not None and proc.poll() is not None and not cond():
            tail = open(log_path, errors="replace").read()[-4000:] if log_path else ""
            raise AssertionError(f"driver exited ({proc.returncode}) while waiting for {what}\n{tail}")
        time.sleep(0.2)
    tail = open(log_path, errors="replace").read()[-4000:] if log_path else ""
    raise TimeoutError(f"timed out after {timeout} s waiting for {what}\n{tail}")


def _committed_times(out: str) -> set[int]:
    """Batch times whose three outputs are all committed."""
    if not os.path.isdir(out):
        return set()
    by_name: dict[str, set[int]] = {}
    for n in os.listdir(out):
        if os.path.exists(os.path.join(out, n, "_SUCCESS")):
            name, t = n.rsplit("-", 1)
            by_name.setdefault(name, set()).add(int(t))
    if len(by_name) < 3:
        return set()
    return set.intersection(*by_name.values())


def _head(ckpt_url: str) -> dict:
    from dstreams.recovery.store import open_store

    store = open_store(ckpt_url, endpoint_url=RGW, access_key="AKTEST", secret_key="SKTEST")
    return json.loads(store.get("meta/head.json"))


def _reference(sc, tmp_path, zero_ms: int, last_ms: int) -> dict[str, list[str]]:
    out = tmp_path / "ref-out"
    run_through(lambda clock: build(sc, str(tmp_path / "ref-ckpt"), str(out), clock), last_ms, start_ms=zero_ms)
    return read_outputs(str(out))


def _check_against_reference(sc, tmp_path, ckpt_url: str, out: str) -> None:
    head = _head(ckpt_url)
    times = sorted(_committed_times(out))
    zero, last = head["zero_ms"], times[-1]
    assert times == list(range(zero + 1000, last + 1, 1000)), f"missing batches: {times}"
    expected = {k: v for k, v in _reference(sc, tmp_path, zero, last).items() if int(k.rsplit("-", 1)[1]) <= last}
    got = {k: v for k, v in read_outputs(out).items() if int(k.rsplit("-", 1)[1]) <= last}
    assert got == expected


@pytest.mark.timeout(1200)  # four driver starts and a reference run: over 300 s at a load of 15-37 (a helper's run)
def test_driver_killed_at_several_points_resumes_with_exactly_once_outputs(sc, tmp_path, rgw_bucket):
    """One application, killed with SIGKILL three times at different points, restarted each time."""
    ckpt = f"s3://{rgw_bucket}/kills-{uuid.uuid4().hex[:6]}"
    out = str(tmp_path / "out")
    log_path = str(tmp_path / "driver.log")
    # (point, how many passes through it before the kill): mid-batch on the 5th batch; during the
    # next data checkpoint write; right after a metadata commit a few batches later.
    for point, after in [("mid-batch", 5), ("checkpoint-write", 1), ("after-metadata-commit", 6)]:
        before = _committed_times(out)
        proc = _driver(ckpt, out, log_path, DSTREAMS_FAULT_KILL=point, DSTREAMS_FAULT_KILL_AFTER=str(after))
        try:
            proc.wait(timeout=240)
        finally:
            _stop(proc)
        text = open(log_path, errors="replace").read()
        assert proc.returncode == -signal.SIGKILL, text[-4000:]
        assert f"SIGKILL at {point}" in text, text[-4000:]
        assert _committed_times(out) >= before  # nothing committed was lost
    proc = _driver(ckpt, out, log_path)
    before = _committed_times(out)
    try:
        _wait(lambda: len(_committed_times(out) - before) >= 3, 240, "3 new batches after the last restart",
              proc, log_path)
    finally:
        _stop(proc)
    assert _head(ckpt)["epoch"] == 4
    _check_against_reference(sc, tmp_path, ckpt, out)


@pytest.mark.timeout(900)  # two drivers, each wait up to 240 s, and a reference run
def test_zombie_driver_is_fenced_and_outputs_stay_exactly_once(sc, tmp_path, rgw_bucket):
    ckpt = f"s3://{rgw_bucket}/zombie-{uuid.uuid4().hex[:6]}"
    out = str(tmp_path / "out")
    log_old, log_new = str(tmp_path / "old.log"), str(tmp_path / "new.log")
    old = _driver(ckpt, out, log_old)
    new = None
    try:
        _wait(lambda: len(_committed_times(out)) >= 3, 240, "3 batches from the first driver", old, log_old)
        old.send_signal(signal.SIGSTOP)  # paused: a zombie in the making
        new = _driver(ckpt, out, log_new)
        _wait(lambda: _head(ckpt)["epoch"] == 2 and len(_committed_times(out)) >= 6, 240,
              "the new driver to take over and commit", new, log_new)
        new_owner = _head(ckpt)["owner"]
        old.send_signal(signal.SIGCONT)
        _wait(lambda: old.poll() is not None or "replaced by another driver" in open(log_old, errors="replace").read(),
              120, "the zombie to notice it was fenced off")
        before = _committed_times(out)
        _wait(lambda: len(_committed_times(out) - before) >= 2, 120, "the new driver to go on", new, log_new)
        # The zombie could not commit: the head still belongs to the new driver.
        head = _head(ckpt)
        assert head["epoch"] == 2 and head["owner"] == new_owner
        text = open(log_old, errors="replace").read()
        assert "FencedError" in text or "replaced by another driver" in text, text[-4000:]
    finally:
        _stop(old)
        if new is not None:
            _stop(new)
    _check_against_reference(sc, tmp_path, ckpt, out)


MOVE_RE = re.compile(r"moves into the executor state store at batch (\d+)")


def _log_size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _moves_since(path: str, offset: int) -> list[int]:
    """The batches at which the driver writing ``path`` (from byte ``offset`` on) moved a state into the store."""
    with open(path, errors="replace") as f:
        f.seek(offset)
        return [int(m) for m in MOVE_RE.findall(f.read())]


@pytest.mark.timeout(1500)  # four drivers and a reference run of a 210,000-key state (301 s at 250,000, loaded)
def test_driver_killed_around_the_move_of_a_million_key_state_resumes_exactly_once(sc, tmp_path, rgw_bucket,
                                                                                  monkeypatch):
    """Issue 23, on the default ``spark.dstreams.state.store=auto``: the 1M-key updateStateByKey starts on the RDD
    state and moves into the executors' stores at its second or third batch (``autoKeys`` is half its keys, a batch
    touches 16). Four drivers, each on the same checkpoint location in Ceph:

    1. SIGKILLed by the test as soon as it logs the move: inside the batch that moves (before the batch commits,
       while it loads the RDD state into the stores). Its checkpoints are of the RDD state.
    2. Resumes from an RDD-state checkpoint, decides again, moves, and is SIGKILLed once a checkpoint of the store
       is committed and two batches after it.
    3. Resumes from that checkpoint with the stores kept (rolled back to it), kills itself right after a
       metadata commit.
    4. Resumes after the executors' store folder was removed (a new machine): every store is read back from the
       chain in Ceph.

    Every committed output equals a fault-free run's on the RDD state. 210,000 keys under ``CI=true``
    (:data:`CI_STATE_KEYS`: still more than one 100,000-row reload chunk in each of the two state partitions, and
    still a move at the second or third batch), ``DSTREAMS_TEST_STATE_KEYS`` to choose."""
    from ..recovery_app import STATE_KEYS_ENV

    keys = state_keys()
    local = tmp_path / "executor-state"
    ckpt = f"s3://{rgw_bucket}/auto-kills-{uuid.uuid4().hex[:6]}"
    out = str(tmp_path / "out")
    log_path = str(tmp_path / "driver.log")
    store_env = {"DSTREAMS_STATE_STORE": "auto", "DSTREAMS_STATE_AUTO_KEYS": str(keys // 2),
                 "DSTREAMS_STATE_LOCAL_DIR": str(local), "DSTREAMS_STATE_SNAPSHOT_EVERY": "2",
                 STATE_KEYS_ENV: str(keys)}
    from dstreams.recovery.checkpointer import list_checkpoints, load_manifest
    from dstreams.recovery.store import open_store

    store = open_store(ckpt, endpoint_url=RGW, access_key="AKTEST", secret_key="SKTEST")

    def moves_checkpointed() -> dict[int, int | None]:
        """Batch time -> ``switched_at`` of every committed checkpoint of the large state (None: of the RDD
        state)."""
        nodes = {k.split("/")[1] for k in store.list("checkpoints/") if "AutoUpdateStateNode" in k}
        found: dict[int, int | None] = {}
        for n in nodes:
            for t in list_checkpoints(store, n):
                try:
                    found[t] = load_manifest(store, n, t)["state"]["auto"]["switched_at"]
                except FileNotFoundError:  # deleted by the driver's deletion rule since it was listed
                    continue
        return found

    def store_checkpoint_behind_us() -> bool:
        """A checkpoint of the store is committed, and two batches after it (so a restart resumes from it)."""
        on_store = [t for t, m in moves_checkpointed().items() if m is not None]
        return bool(on_store) and max(_committed_times(out), default=0) >= min(on_store) + 2000

    def killed_by_the_test(until, what: str) -> tuple[int, set[int]]:
        """A driver SIGKILLed as soon as ``until(log offset)`` holds; returns the log offset and what it had
        committed."""
        offset = _log_size(log_path)
        proc = _driver(ckpt, out, log_path, **store_env)
        try:
            _wait(lambda: until(offset), 540, what, proc, log_path)  # 300 s was too short at load 15-25
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=60)
            return offset, _committed_times(out)
        finally:
            _stop(proc)
            _wait_session_gone(proc)

    # 1: killed inside the batch that moves.
    offset, committed = killed_by_the_test(lambda o: _moves_since(log_path, o), "the large state to move")
    (moved,) = _moves_since(log_path, offset)
    assert moved not in committed and moved > max(committed, default=0), (moved, sorted(committed))
    assert all(m is None for m in moves_checkpointed().values())
    # 2: resumed on the RDD state's checkpoint, it moves again; killed once the store has a checkpoint.
    offset, _ = killed_by_the_test(lambda o: store_checkpoint_behind_us(),
                                   "a checkpoint of the large state in the store, and two batches after it")
    assert _moves_since(log_path, offset)
    assert any(local.iterdir())  # the stores of the first runs
    # 3: resumed on the store's checkpoint, the stores kept (rolled back to it); kills itself after a commit.
    before, offset = _committed_times(out), _log_size(log_path)
    proc = _driver(ckpt, out, log_path, DSTREAMS_FAULT_KILL="after-metadata-commit", DSTREAMS_FAULT_KILL_AFTER="3",
                   **store_env)
    try:
        proc.wait(timeout=300)
    finally:
        _stop(proc)
        _wait_session_gone(proc)  # nothing writes to the stores any more (removed below, reopened by the next)
    with open(log_path, errors="replace") as f:
        text = f.read()
    assert proc.returncode == -signal.SIGKILL, text[-4000:]
    assert "SIGKILL at after-metadata-commit" in text[offset:], text[-4000:]
    assert _committed_times(out) >= before
    assert not _moves_since(log_path, offset), "resumed on the store, it does not move again"
    shutil.rmtree(local)
    # 4: a new machine.
    proc = _driver(ckpt, out, log_path, **store_env)
    before = _committed_times(out)
    try:
        _wait(lambda: len(_committed_times(out) - before) >= 3, 300, "3 new batches after the last restart",
              proc, log_path)
    finally:
        _stop(proc)
    assert _head(ckpt)["epoch"] == 4
    assert any(m is not None for m in moves_checkpointed().values())
    # The reference: the same application on the RDD state, in this process.
    monkeypatch.setenv(STATE_KEYS_ENV, str(keys))
    monkeypatch.setenv("DSTREAMS_STATE_STORE", "rdd")
    _check_against_reference(sc, tmp_path, ckpt, out)
    got = read_outputs(out)
    assert sum(len(v) for k, v in got.items() if k.startswith("big-")) > 0
