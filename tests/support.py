"""What tests of several folders share: the test services' endpoints and the rule for tests whose server (Ceph
RADOS Gateway, moto server, Redis server, PostgreSQL, Kafka broker, standalone Spark cluster) is missing, and a few
helpers (the large state's size, a state stream's node, the library's exceptions). Pipelines are driven with the
public harness, :mod:`dstreams.testing`.

Services: by default a test whose server does not answer skips with the reason (a developer's
machine). With ``CI=true``, ``DSTREAMS_REQUIRE_SERVICES=1`` or ``pytest --require-services`` it fails
instead (:func:`service_unavailable`), so that a CI run cannot pass without testing against them.
``DSTREAMS_REQUIRE_SERVICES=0`` turns that off even under ``CI=true``.
"""

from __future__ import annotations

import os
from typing import NoReturn, TypeVar

import pytest

REQUIRE_ENV = "DSTREAMS_REQUIRE_SERVICES"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")
_T = TypeVar("_T")

# The project's moto server and Ceph RADOS Gateway (scripts/services.sh starts them on these ports,
# DSTREAMS_TEST_MOTO_PORT / DSTREAMS_TEST_RGW_PORT), or external ones named by DSTREAMS_TEST_MOTO_ENDPOINT /
# DSTREAMS_TEST_RGW_ENDPOINT (then never started, stopped or restarted by the tests).
MOTO_PORT = int(os.environ.get("DSTREAMS_TEST_MOTO_PORT") or 5055)
DEFAULT_MOTO_ENDPOINT = f"http://127.0.0.1:{MOTO_PORT}"
MOTO_ENDPOINT = (os.environ.get("DSTREAMS_TEST_MOTO_ENDPOINT") or DEFAULT_MOTO_ENDPOINT).rstrip("/")
RGW_PORT = int(os.environ.get("DSTREAMS_TEST_RGW_PORT") or 7480)
DEFAULT_RGW_ENDPOINT = f"http://127.0.0.1:{RGW_PORT}"
RGW_ENDPOINT = (os.environ.get("DSTREAMS_TEST_RGW_ENDPOINT") or DEFAULT_RGW_ENDPOINT).rstrip("/")

# The project's Redis server (scripts/services.sh starts it on this port, data in .redis/data), or an
# external one named by DSTREAMS_TEST_REDIS_URL (then never started, stopped or restarted by the tests).
REDIS_PORT = int(os.environ.get("DSTREAMS_TEST_REDIS_PORT") or 6390)
DEFAULT_REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
REDIS_URL = (os.environ.get("DSTREAMS_TEST_REDIS_URL") or DEFAULT_REDIS_URL).rstrip("/")


# The project's PostgreSQL server (scripts/services.sh: its own cluster in .postgres/ on port 5440,
# DSTREAMS_TEST_POSTGRES_PORT), or another one named by DSTREAMS_TEST_POSTGRES_DSN.
POSTGRES_PORT = int(os.environ.get("DSTREAMS_TEST_POSTGRES_PORT") or 5440)
POSTGRES_DSN = os.environ.get("DSTREAMS_TEST_POSTGRES_DSN") or f"postgresql://dstreams@127.0.0.1:{POSTGRES_PORT}/dstreams"

# The project's Kafka broker (scripts/services.sh: a single KRaft node on this port, data in .kafka/data), or an
# external one named by DSTREAMS_TEST_KAFKA_BOOTSTRAP (then never started, stopped or restarted by the tests).
KAFKA_PORT = int(os.environ.get("DSTREAMS_TEST_KAFKA_PORT") or 9192)
DEFAULT_KAFKA_BOOTSTRAP = f"127.0.0.1:{KAFKA_PORT}"
KAFKA_BOOTSTRAP = os.environ.get("DSTREAMS_TEST_KAFKA_BOOTSTRAP") or DEFAULT_KAFKA_BOOTSTRAP


def redis_is_external() -> bool:
    """Whether the tests use a Redis server that scripts/services.sh does not own."""
    return REDIS_URL != DEFAULT_REDIS_URL


def kafka_is_external() -> bool:
    """Whether the tests use a Kafka broker that scripts/services.sh does not own."""
    return KAFKA_BOOTSTRAP != DEFAULT_KAFKA_BOOTSTRAP


def services_required() -> bool:
    """Whether a missing test service is a failure: ``DSTREAMS_REQUIRE_SERVICES`` if set (1/true/yes/on
    or 0/false/no/off), else whether ``CI`` is true. ``--require-services`` sets the variable."""
    flag = os.environ.get(REQUIRE_ENV, "").strip().lower()
    if flag in _TRUE:
        return True
    if flag in _FALSE:
        return False
    return os.environ.get("CI", "").strip().lower() in _TRUE


def required_by() -> str:
    """What made services required, for messages."""
    if os.environ.get(REQUIRE_ENV, "").strip().lower() in _TRUE:
        return f"{REQUIRE_ENV}={os.environ[REQUIRE_ENV]} (or --require-services)"
    return f"CI={os.environ.get('CI')}"


def service_unavailable(reason: str) -> NoReturn:
    """A test's server is not available: fail when services are required, else skip; ``reason`` says
    which server, where, and how to start it."""
    if services_required():
        pytest.fail(f"{reason} [services are required: {required_by()}]", pytrace=False)
    pytest.skip(f"{reason} [set {REQUIRE_ENV}=1 to make this a failure]")


def require_kafka() -> str:
    """The test Kafka broker's bootstrap servers, once it answered a metadata request within 5 s; otherwise the
    test skips, or fails when services are required (:func:`service_unavailable`)."""
    try:
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient
    except ImportError:
        service_unavailable("confluent-kafka is not installed: pip install -e '.[test]'")
    how = ("set DSTREAMS_TEST_KAFKA_BOOTSTRAP to a running broker" if kafka_is_external()
           else "run `bash scripts/services.sh start kafka`")
    admin = AdminClient({"bootstrap.servers": KAFKA_BOOTSTRAP, "socket.connection.setup.timeout.ms": 3000})
    try:
        metadata = admin.list_topics(timeout=5)
    except KafkaException as e:
        service_unavailable(f"Kafka broker at {KAFKA_BOOTSTRAP} is not reachable ({e}); {how}")
    if not metadata.brokers:
        service_unavailable(f"Kafka broker at {KAFKA_BOOTSTRAP} listed no brokers; {how}")
    return KAFKA_BOOTSTRAP


#: The switch of the CI scale (tests/README.md, "CI scale"): the heaviest tests run smaller under ``CI=true`` (fewer
#: batches, keys, repeated kills, a shorter outage; the same assertions), and at their full scale everywhere else.
#: ``DSTREAMS_TEST_FULL=1`` gives the full scale under ``CI=true`` too; ``DSTREAMS_TEST_FULL=0`` the CI scale without
#: it.
FULL_SCALE_ENV = "DSTREAMS_TEST_FULL"


def ci_scale() -> bool:
    """Whether the heavy tests run at their CI scale: ``DSTREAMS_TEST_FULL`` (1/true/yes/on: no; 0/false/no/off:
    yes) when set, else whether ``CI`` is true."""
    chosen = os.environ.get(FULL_SCALE_ENV, "").strip().lower()
    if chosen in _TRUE or chosen in _FALSE:
        return chosen in _FALSE
    return os.environ.get("CI", "").strip().lower() in _TRUE


def scaled(full: _T, ci: _T) -> _T:
    """``ci`` at the CI scale (:func:`ci_scale`), else ``full``: a heavy test's batches, keys or kills."""
    return ci if ci_scale() else full


#: The large state of the heaviest state-store fault tests (issue 23): 1,000,000 keys; at the CI scale
#: (:func:`ci_scale`) 210,000 (the same kills, restarts and comparison, at about a fifth of the cost);
#: ``DSTREAMS_TEST_STATE_KEYS=N`` sets it either way. The CI figure is the smallest that keeps the reload path of the
#: 1M-key state: over the two state partitions of tests/recovery_app.py (``portable_hash`` with Spark's
#: ``PYTHONHASHSEED=0``) 210,000 keys split 105,290 / 104,710, so a store reloaded from a checkpoint still loads in
#: more than one 100,000-row chunk (``PartitionStore.reload``) in every partition. The move is unchanged: ``autoKeys``
#: is half the keys, far above the 16 a batch touches, so the state still moves at its second or third batch.
FULL_STATE_KEYS, CI_STATE_KEYS = 1_000_000, 210_000


def state_keys() -> int:
    """The key count of the large-state fault tests (see :data:`FULL_STATE_KEYS`)."""
    chosen = os.environ.get("DSTREAMS_TEST_STATE_KEYS", "").strip()
    if chosen:
        return int(chosen)
    return scaled(FULL_STATE_KEYS, CI_STATE_KEYS)


def store_backed(node) -> bool:
    """Whether ``node`` is a state whose backend is (or may move into) the executor state store: ``executor``, or
    ``auto``."""
    from dstreams.nodes.auto_state import AutoPolicy
    from dstreams.nodes.store_state import ExecutorStore

    return isinstance(getattr(node, "backend", None), (ExecutorStore, AutoPolicy))


def state_node(stream):
    """The node holding a state stream's state: the stream's own node on the RDD state, the one behind its view
    when the state is picked by size or kept in the executor state store (``spark.dstreams.state.store``)."""
    from dstreams.nodes.store_state import StateViewNode

    node = stream._node
    return node.state if isinstance(node, StateViewNode) else node


def library_errors() -> dict[str, type[BaseException]]:
    """Every public exception class the library defines (``module.Name`` -> class), found by importing every module
    of ``dstreams``, ``dstreams.api`` and ``dstreams.recovery`` (not a hand-kept list)."""
    import importlib
    import inspect
    import pkgutil

    import dstreams
    import dstreams.api
    import dstreams.recovery

    found: dict[str, type[BaseException]] = {}
    for package in (dstreams, dstreams.api, dstreams.recovery):
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            for name, obj in vars(module).items():
                if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == info.name
                        and not name.startswith("_")):
                    found[f"{info.name}.{name}"] = obj
    return found
