"""The Redis server the tests use (scripts/services.sh): the project's own, durable, with Redis Streams,
and its data kept across a restart of the server process."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import redis

from ..support import REDIS_URL, redis_is_external, service_unavailable

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "scripts" / "services.sh"
REDIS_DATA = ROOT / ".redis" / "data"


def _config(client: redis.Redis, name: str) -> str:
    return client.config_get(name)[name]


def _require_project_server(client: redis.Redis) -> None:
    """Skip for an external server (DSTREAMS_TEST_REDIS_URL); fail or skip when the server on the default
    port is not the one scripts/services.sh started (its data directory is .redis/data)."""
    if redis_is_external():
        pytest.skip(f"DSTREAMS_TEST_REDIS_URL={REDIS_URL}: not the project's server, not restarted by the tests")
    data_dir = _config(client, "dir")
    if Path(data_dir).resolve() != REDIS_DATA.resolve():
        service_unavailable(f"the Redis server at {REDIS_URL} was not started by scripts/services.sh (its dir is "
                            f"{data_dir}, not {REDIS_DATA}); stop it or set DSTREAMS_TEST_REDIS_PORT")


def test_the_server_is_durable_and_on_loopback(redis_client: redis.Redis) -> None:
    assert _config(redis_client, "appendonly") == "yes"
    assert _config(redis_client, "appendfsync") in ("everysec", "always")
    _require_project_server(redis_client)
    assert _config(redis_client, "bind").split() == ["127.0.0.1"]
    assert _config(redis_client, "protected-mode") == "yes"
    assert (REDIS_DATA / "appendonlydir").is_dir()


def test_redis_streams_answer_xadd_and_xrange(redis_client: redis.Redis, redis_prefix: str) -> None:
    major = int(str(redis_client.info("server")["redis_version"]).split(".")[0])
    assert major >= 7
    key = f"{redis_prefix}stream"
    ids = [redis_client.xadd(key, {"n": str(i), "k": key}) for i in range(5)]
    assert redis_client.xlen(key) == 5
    entries = redis_client.xrange(key)
    assert [entry_id for entry_id, _ in entries] == ids
    assert [fields for _, fields in entries] == [{"n": str(i), "k": key} for i in range(5)]
    # Exclusive start and a count: how a source reads the range after the last entry it handed out.
    assert [entry_id for entry_id, _ in redis_client.xrange(key, min=f"({ids[1]}", max="+", count=2)] == ids[2:4]


@pytest.mark.serial  # the shared server restarts
@pytest.mark.timeout(60)
def test_entries_survive_a_restart_of_the_server(redis_client: redis.Redis, redis_url: str, redis_prefix: str) -> None:
    _require_project_server(redis_client)
    key = f"{redis_prefix}durable"
    ids = [redis_client.xadd(key, {"n": str(i)}) for i in range(20)]
    run_id = redis_client.info("server")["run_id"]
    redis_client.close()

    done = subprocess.run(["bash", str(SERVICES), "restart", "redis"], capture_output=True, text=True, timeout=45,
                          env=os.environ.copy(), cwd=ROOT)
    assert done.returncode == 0, f"services.sh restart redis failed:\n{done.stdout}\n{done.stderr}"
    assert "stopped redis-server" in done.stderr, done.stderr  # it really stopped the process
    assert done.stdout.strip().splitlines()[-1].startswith(f"redis: {REDIS_URL} (appendonly; start took"), done.stdout

    after = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5, socket_connect_timeout=2)
    try:
        assert after.info("server")["run_id"] != run_id  # a new server process
        entries = after.xrange(key)
    finally:
        after.close()
    assert [entry_id for entry_id, _ in entries] == ids
    assert [fields["n"] for _, fields in entries] == [str(i) for i in range(20)]
