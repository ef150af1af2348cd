"""dstreams.spark.sparkconf (tuned SparkConf) and dstreams.spark.worker_daemon (sys.path clean-up): behaviour only."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
from pyspark import SparkConf, SparkContext, StorageLevel

from dstreams.spark import sparkconf
from dstreams.spark.jvm import state_level
from dstreams.spark.sparkconf import LOW_LATENCY_DEFAULTS, create_spark_context, tuned_conf
from dstreams.spark.worker_daemon import redundant_archives, strip_redundant_archives

DAEMON = "spark.python.daemon.module"
UDS = "spark.python.unix.domain.socket.enabled"


# --------------------------------------------------------------------------------------------- tuned_conf


def test_defaults_fill_unset_keys():
    conf = tuned_conf("local[2]", "app")
    assert conf.get("spark.master") == "local[2]"
    assert conf.get("spark.app.name") == "app"
    for k, v in LOW_LATENCY_DEFAULTS.items():
        assert conf.get(k) == v, k
    assert LOW_LATENCY_DEFAULTS[DAEMON] == "dstreams.spark.worker_daemon"
    assert LOW_LATENCY_DEFAULTS[UDS] == "true"


@pytest.mark.parametrize("as_sparkconf", [False, True])
def test_user_keys_win(as_sparkconf):
    user = {
        DAEMON: "pyspark.daemon",
        UDS: "false",
        "spark.ui.enabled": "true",
        "spark.master": "local[3]",
        "spark.app.name": "mine",
        "spark.custom.key": "x",
    }
    if as_sparkconf:
        conf_in = SparkConf(loadDefaults=False)
        for k, v in user.items():
            conf_in.set(k, v)
    else:
        conf_in = user
    conf = tuned_conf("local[2]", "app", conf_in)
    for k, v in user.items():
        assert conf.get(k) == v, k
    # keys the user left unset still get the defaults
    assert conf.get("spark.locality.wait") == LOW_LATENCY_DEFAULTS["spark.locality.wait"]


def test_daemon_module_only_for_local_masters_running_this_python(monkeypatch):
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert tuned_conf("local-cluster[2,1,1024]").get(DAEMON) == "dstreams.spark.worker_daemon"
    assert not tuned_conf("spark://host:7077").contains(DAEMON)
    other = tuned_conf("local[2]", conf={"spark.pyspark.python": "/nonexistent/python3"})
    assert not other.contains(DAEMON)
    assert other.get(UDS) == "true"  # the socket setting does not depend on the interpreter


def test_local_dir_from_env(monkeypatch, tmp_path):
    target = tmp_path / "run-1" / "spark-local"
    monkeypatch.setenv("DSTREAMS_SPARK_LOCAL_DIR", str(target))
    assert tuned_conf("local[2]").get("spark.local.dir") == str(target)
    assert target.is_dir()
    assert tuned_conf("local[2]", conf={"spark.local.dir": "/mine"}).get("spark.local.dir") == "/mine"
    monkeypatch.delenv("DSTREAMS_SPARK_LOCAL_DIR")
    assert not tuned_conf("local[2]").contains("spark.local.dir")


def test_local_dir_from_the_conf_key_before_the_env(monkeypatch, tmp_path):
    monkeypatch.setenv("DSTREAMS_SPARK_LOCAL_DIR", str(tmp_path / "from-env"))
    conf = tuned_conf("local[2]", conf={"spark.dstreams.localDir": str(tmp_path / "from-conf")})
    assert conf.get("spark.local.dir") == str(tmp_path / "from-conf")
    assert (tmp_path / "from-conf").is_dir() and not (tmp_path / "from-env").exists()


class _Created:
    def __init__(self) -> None:
        self.levels: list[str] = []

    def setLogLevel(self, level: str) -> None:
        self.levels.append(level)


def test_log_level_of_a_created_context_conf_key_then_env(monkeypatch):
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    created = _Created()
    monkeypatch.setattr(SparkContext, "getOrCreate", staticmethod(lambda conf: created))
    monkeypatch.delenv("DSTREAMS_SPARK_LOG_LEVEL", raising=False)
    assert create_spark_context("local[2]") is created
    monkeypatch.setenv("DSTREAMS_SPARK_LOG_LEVEL", "info")
    create_spark_context("local[2]")
    create_spark_context("local[2]", conf={"spark.dstreams.logLevel": "Error"})
    assert created.levels == ["WARN", "INFO", "ERROR"]


def test_an_invalid_log_level_fails_before_a_context_is_created(monkeypatch):
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)

    def must_not_start(conf):
        raise AssertionError("a SparkContext was started")

    monkeypatch.setattr(SparkContext, "getOrCreate", staticmethod(must_not_start))
    monkeypatch.setenv("DSTREAMS_SPARK_LOG_LEVEL", "LOUD")
    with pytest.raises(ValueError, match=r"DSTREAMS_SPARK_LOG_LEVEL='LOUD' is not a Spark log level .* e\.g\. "):
        create_spark_context("local[2]")
    monkeypatch.delenv("DSTREAMS_SPARK_LOG_LEVEL")
    with pytest.raises(ValueError, match=r"spark\.dstreams\.logLevel='chatty' is not a Spark log level"):
        create_spark_context("local[2]", conf={"spark.dstreams.logLevel": "chatty"})


class _FakeContext:
    """Stands in for a user's running SparkContext: ``_conf`` is its live conf (no JVM behind it)."""

    pythonExec = sys.executable

    def __init__(self, conf: dict[str, str]):
        self._conf = SparkConf(loadDefaults=False)
        for k, v in conf.items():
            self._conf.set(k, v)

    def getConf(self):
        return self._conf


def test_reused_untuned_context_is_returned_tuned_with_one_hint(monkeypatch, caplog):
    fake = _FakeContext({"spark.master": "spark://127.0.0.1:7077", "spark.app.name": "users"})
    monkeypatch.setattr(SparkContext, "_active_spark_context", fake)
    monkeypatch.setattr(sparkconf, "_warned_contexts", set())
    with caplog.at_level(logging.WARNING, logger="dstreams.spark.sparkconf"):
        assert create_spark_context("local[4]") is fake
        assert create_spark_context("local[4]") is fake
    lines = [r.getMessage() for r in caplog.records if r.name == "dstreams.spark.sparkconf"]
    assert len(lines) == 1, lines  # said once per context
    assert f"--conf {UDS}=true" in lines[0] and "dstreams.spark.sparkconf.tuned_conf" in lines[0]
    assert fake._conf.get("spark.locality.wait") == "0"  # the driver reads it per task set: applied
    assert fake._conf.get(UDS) is None  # the executors read it at their start: only named


def test_reused_tuned_context_logs_nothing(monkeypatch, caplog):
    fake = _FakeContext(dict(tuned_conf("local[2]").getAll()))
    monkeypatch.setattr(SparkContext, "_active_spark_context", fake)
    monkeypatch.setattr(sparkconf, "_warned_contexts", set())
    with caplog.at_level(logging.INFO, logger="dstreams.spark.sparkconf"):
        assert create_spark_context() is fake
    assert not [r for r in caplog.records if r.name == "dstreams.spark.sparkconf"]


# ------------------------------------------------------------------------------- worker_daemon path clean-up


def _zip(path: Path, files: dict[str, str]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return str(path)


def _pkg_dir(root: Path, pkg: str, version: str) -> str:
    (root / pkg).mkdir(parents=True, exist_ok=True)
    (root / pkg / "__init__.py").write_text("")
    (root / pkg / "version.py").write_text(f"__version__: str = '{version}'\n")
    return str(root)


@pytest.fixture
def layout(tmp_path):
    """A worker's sys.path as the JVM builds it, over a pip-installed pyspark (same versions)."""
    site = tmp_path / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    pyspark_files = {"pyspark/__init__.py": "", "pyspark/version.py": "__version__ = '4.1.1'\n"}
    p = {
        "cwd": str(tmp_path / "cwd"),
        "user_files": str(tmp_path / "userFiles-1"),
        "pyspark_zip": _zip(lib / "pyspark.zip", pyspark_files),
        "py4j_zip": _zip(lib / "py4j-0.10.9.9-src.zip", {"py4j/__init__.py": "", "py4j/version.py": ""}),
        "spark_jar": _zip(site / "pyspark" / "jars" / "spark-core_2.13-4.1.1.jar", {"x": ""}),
        "user_zip": _zip(tmp_path / "userFiles-1" / "deps.zip", {"mylib/__init__.py": ""}),
        "user_py4j_like": _zip(tmp_path / "userFiles-1" / "mylib-1.0-src.zip", {"m.py": ""}),
        "user_jar": _zip(tmp_path / "userFiles-1" / "spark-extras.jar", {"extras/__init__.py": ""}),
        "stdlib": str(tmp_path / "lib" / "python3.11"),
        "site": str(tmp_path / "site-packages"),
    }
    _pkg_dir(Path(p["site"]), "pyspark", "4.1.1")
    _pkg_dir(Path(p["site"]), "py4j", "0.10.9.9")
    return p


def _path(p, *keys):
    return [p[k] for k in keys]


def test_strips_only_sparks_redundant_archives(layout):
    path = _path(
        layout, "cwd", "user_files", "user_zip", "pyspark_zip", "py4j_zip", "spark_jar",
        "user_py4j_like", "user_jar", "stdlib", "site",
    )  # fmt: skip
    cache = {e: object() for e in path}
    cache[os.path.join(layout["pyspark_zip"], "pyspark")] = object()
    cache[os.path.join(layout["pyspark_zip"], "pyspark", "sql")] = object()
    cache[os.path.join(layout["spark_jar"], "org")] = object()
    cache[os.path.join(layout["user_zip"], "mylib")] = object()

    removed = strip_redundant_archives(path, cache)

    assert removed == _path(layout, "pyspark_zip", "py4j_zip", "spark_jar")
    kept = ["cwd", "user_files", "user_zip", "user_py4j_like", "user_jar", "stdlib", "site"]
    assert path == _path(layout, *kept)
    assert sorted(cache) == sorted(path + [os.path.join(layout["user_zip"], "mylib")])


def test_nothing_removed_when_pyspark_only_in_the_zip(layout):
    path = _path(layout, "cwd", "pyspark_zip", "py4j_zip", "spark_jar", "stdlib")
    before = list(path)
    assert strip_redundant_archives(path, {}) == []
    assert path == before


def test_keeps_zip_whose_version_differs_from_the_directory_install(layout, tmp_path):
    other = _pkg_dir(tmp_path / "other-site", "pyspark", "4.0.0")
    path = [layout["pyspark_zip"], layout["py4j_zip"], layout["spark_jar"], other, layout["site"]]
    # pyspark.zip (4.1.1) would be replaced by 4.0.0: kept, and so is the jar; py4j matches: removed.
    assert redundant_archives(path) == [layout["py4j_zip"]]


def test_archive_already_shadowed_by_a_directory_is_removed(layout, tmp_path):
    other = _pkg_dir(tmp_path / "other-site", "pyspark", "4.0.0")
    path = [other, layout["pyspark_zip"], layout["spark_jar"]]
    assert redundant_archives(path) == [layout["pyspark_zip"], layout["spark_jar"]]


@pytest.mark.slow
def test_pyspark_imported_from_the_zip_before_the_clean_up_is_reimported_from_the_directory():
    """``python -m dstreams.spark.worker_daemon`` imports the dstreams package first, which may import pyspark."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    archives = [str(lib / "pyspark.zip"), *map(str, sorted(lib.glob("py4j-*-src.zip")))]
    if not all(map(os.path.isfile, archives)):
        pytest.skip("this pyspark install ships no pyspark.zip / py4j zip")
    code = textwrap.dedent(
        """
        import importlib, json, sys
        import pyspark  # from pyspark.zip, as PYTHONPATH puts it first
        assert ".zip" in pyspark.__file__, pyspark.__file__
        from dstreams.spark import worker_daemon as w
        w._forget_modules_from(w.strip_redundant_archives(sys.path, sys.path_importer_cache))
        import pyspark.daemon
        importlib.invalidate_caches()
        print(json.dumps({
            "files": [str(getattr(m, "__file__", "")) for m in list(sys.modules.values())],
            "cache": list(sys.path_importer_cache),
            "daemon": pyspark.daemon.__file__,
        }))
        """
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(archives))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert ".zip" not in result["daemon"]
    assert not [f for f in result["files"] if f.startswith(tuple(archives))]
    assert not [k for k in result["cache"] if k.startswith(tuple(archives))]


# ------------------------------------------------------------------------------------------- end to end

_E2E = textwrap.dedent(
    """
    import json, os, sys
    from pyspark import SparkContext
    from dstreams.spark.sparkconf import tuned_conf

    sc = SparkContext(conf=tuned_conf("local[1]", "test_sparkconf"))
    sc.setLogLevel("ERROR")
    try:
        def probe(x):
            import sys, pyspark
            return {
                "x": x,
                "argv0": sys.argv[0],
                "path": sys.path,
                "pyspark": pyspark.__file__,
                "zip_cache": [k for k in sys.path_importer_cache if ".zip" in k or ".jar" in k],
            }

        out = sc.parallelize(range(2), 2).map(probe).collect()
        local_dir = sc.getConf().get("spark.local.dir")
        listing = os.listdir(local_dir)
        print("E2E " + json.dumps({"out": out, "local_dir": local_dir, "in_local_dir": listing}))
    finally:
        sc.stop()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tuned_context_runs_python_jobs_through_the_worker_daemon(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_LOCAL_DIRS")}
    env["DSTREAMS_SPARK_LOCAL_DIR"] = str(tmp_path / "spark-local")
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    proc = subprocess.run(
        [sys.executable, "-c", _E2E], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=110
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("E2E ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][4:])

    assert [r["x"] for r in result["out"]] == [0, 1]
    for r in result["out"]:
        # Spark runs ``-m dstreams.spark.worker_daemon``
        assert r["argv0"].endswith(os.path.join("dstreams", "spark", "worker_daemon.py")), r["argv0"]
        assert not any(os.path.basename(e) == "pyspark.zip" for e in r["path"]), r["path"]
        assert not any(os.path.basename(e).startswith("py4j-") for e in r["path"]), r["path"]
        assert ".zip" not in r["pyspark"], r["pyspark"]
        assert r["zip_cache"] == [], r["zip_cache"]
    assert result["local_dir"] == str(tmp_path / "spark-local")
    assert result["in_local_dir"], "Spark wrote nothing under DSTREAMS_SPARK_LOCAL_DIR"


def test_speculation_defaults_follow_the_paper_off_local_masters():
    from dstreams.spark.sparkconf import tuned_conf

    local = tuned_conf("local[2]", "t")
    assert local.get("spark.speculation") is None
    cluster = tuned_conf("spark://127.0.0.1:7077", "t")
    assert cluster.get("spark.speculation") == "true"
    assert cluster.get("spark.speculation.multiplier") == "1.4"
    assert cluster.get("spark.speculation.quantile") == "0.5"
    mine = tuned_conf("spark://127.0.0.1:7077", "t", {"spark.speculation": "false"})
    assert mine.get("spark.speculation") == "false"  # the user's choice wins


def test_tuned_conf_exports_the_worker_interpreter_pyspark_reads_from_the_environment(monkeypatch):
    # PySpark's in-process SparkContext ignores spark.pyspark.python and runs workers with $PYSPARK_PYTHON
    # (default: whatever "python3" is on PATH). Regression: CI's PATH python3 lacked pyspark.
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    conf = tuned_conf("local[2]", "t")
    assert conf.get("spark.pyspark.python") == sys.executable
    assert os.environ["PYSPARK_PYTHON"] == sys.executable
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/other/python3")
    tuned_conf("local[2]", "t", {"spark.pyspark.python": "/mine/python3"})
    assert os.environ["PYSPARK_PYTHON"] == "/opt/other/python3"  # an explicit environment is never changed


def test_unix_sockets_move_out_of_a_java_tmpdir_too_long_for_a_socket_path():
    from dstreams.spark.sparkconf import MAX_SOCKET_DIR, UDS_DIR_KEY, tuned_conf

    long_dir = "/tmp/" + "d" * MAX_SOCKET_DIR
    conf = tuned_conf("local[2]", "t", {"spark.driver.extraJavaOptions": f"-Xss4m -Djava.io.tmpdir={long_dir}"})
    assert conf.get(UDS_DIR_KEY) == "/tmp"
    short = tuned_conf("local[2]", "t", {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=/tmp/x"})
    assert short.get(UDS_DIR_KEY) is None
    mine = tuned_conf("local[2]", "t", {"spark.executor.extraJavaOptions": f"-Djava.io.tmpdir={long_dir}",
                                        UDS_DIR_KEY: "/run/me"})
    assert mine.get(UDS_DIR_KEY) == "/run/me"  # the user's folder is left alone
    off = tuned_conf("local[2]", "t", {"spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={long_dir}",
                                       "spark.python.unix.domain.socket.enabled": "false"})
    assert off.get(UDS_DIR_KEY) is None


_LONG_TMPDIR = textwrap.dedent(
    """
    import sys
    from pyspark import SparkContext
    from dstreams.spark.sparkconf import tuned_conf

    conf = {"spark.driver.extraJavaOptions": "-Djava.io.tmpdir=" + sys.argv[1]}
    sc = SparkContext(conf=tuned_conf("local[1]", "test_sparkconf_long_tmpdir", conf))
    try:
        print("SUM", sc.parallelize(range(10), 2).map(lambda x: x * 2).sum())
    finally:
        sc.stop()
    """
)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_context_starts_and_runs_python_tasks_with_a_long_java_tmpdir(tmp_path):
    # Regression: a deep TMPDIR / java.io.tmpdir (CI's pytest folders) made the SparkContext fail with
    # "OSError: AF_UNIX path too long" when dstreams turned Unix-domain sockets on.
    long_dir = tmp_path / ("t" * 40) / ("u" * 40)
    long_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    proc = subprocess.run([sys.executable, "-c", _LONG_TMPDIR, str(long_dir)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0 and "SUM 90" in proc.stdout, proc.stderr[-3000:]


# ------------------------------------------------------------------------------ frozen-host timeouts (issue 42)


def test_frozen_host_timeouts_apply_off_local_masters_and_the_users_keys_win():
    from dstreams.spark.sparkconf import FROZEN_HOST_DEFAULTS

    assert not any(tuned_conf("local[2]").contains(k) for k in FROZEN_HOST_DEFAULTS)
    cluster = tuned_conf("spark://127.0.0.1:7077")
    assert {k: cluster.get(k) for k in FROZEN_HOST_DEFAULTS} == FROZEN_HOST_DEFAULTS
    assert tuned_conf("local-cluster[2,1,1024]").get("spark.network.timeoutInterval") == "5s"
    mine = tuned_conf("spark://127.0.0.1:7077", conf={"spark.shuffle.io.maxRetries": "5",
                                                      "spark.rpc.askTimeout": "300s"})
    assert mine.get("spark.shuffle.io.maxRetries") == "5" and mine.get("spark.rpc.askTimeout") == "300s"
    assert mine.get("spark.shuffle.io.connectionTimeout") == "10s"


def test_a_users_network_timeout_keeps_governing_the_timeouts_that_fall_back_to_it():
    conf = tuned_conf("spark://127.0.0.1:7077", conf={"spark.network.timeout": "600s"})
    for key in ("spark.storage.blockManagerHeartbeatTimeoutMs", "spark.shuffle.io.connectionTimeout",
                "spark.rpc.askTimeout"):
        assert not conf.contains(key), key
    assert conf.get("spark.executor.heartbeatInterval") == "3s"
    assert conf.get("spark.network.timeoutInterval") == "5s"
    # A timeout shorter than dstreams' intervals: Spark refuses to start with an interval above it, so they stay unset.
    short = tuned_conf("spark://127.0.0.1:7077", conf={"spark.network.timeout": "2"})  # seconds
    assert not short.contains("spark.executor.heartbeatInterval")
    assert not short.contains("spark.network.timeoutInterval")
    short = tuned_conf("spark://127.0.0.1:7077", conf={"spark.storage.blockManagerHeartbeatTimeoutMs": "4000"})
    assert not short.contains("spark.network.timeoutInterval")
    assert short.get("spark.executor.heartbeatInterval") == "3s"


@pytest.mark.parametrize(("value", "unit", "ms"), [("30s", "ms", 30_000), ("30000", "ms", 30_000),
                                                   ("120", "s", 120_000), ("2min", "s", 120_000), ("1.5s", "ms", 1500),
                                                   ("soon", "s", None)])
def test_spark_time_ms_reads_spark_time_strings(value, unit, ms):
    from dstreams.spark.sparkconf import spark_time_ms

    assert spark_time_ms(value, unit) == ms


CLUSTER_MASTERS = ("local-cluster[2,1,1024]", "spark://127.0.0.1:7077", "yarn", "k8s://https://h:6443")


def test_state_chains_are_cached_on_two_executors_off_a_single_process_master(monkeypatch):
    """``spark.dstreams.state.replicas=auto``: a lost executor or host leaves every partition of a state's cached
    RDDs readable off ``local``/``local[N]`` (a copy elsewhere); one process has no other executor to keep one."""
    monkeypatch.delenv("DSTREAMS_STATE_REPLICAS", raising=False)
    assert state_level("local") == state_level("local[2]") == state_level("local[*]") == StorageLevel.MEMORY_ONLY
    for master in CLUSTER_MASTERS:
        assert state_level(master) == StorageLevel.MEMORY_ONLY_2, master


def test_one_state_replica_by_the_conf_key_then_the_environment(monkeypatch):
    """``1``: one copy under any master (a lost partition is recomputed through lineage); the conf key wins over
    ``DSTREAMS_STATE_REPLICAS``; ``2`` under ``local[N]`` stays one copy (one process); a bad value is refused."""
    monkeypatch.setenv("DSTREAMS_STATE_REPLICAS", "1")
    for master in CLUSTER_MASTERS:
        assert state_level(master) == StorageLevel.MEMORY_ONLY, master
    conf = SparkConf(loadDefaults=False).set("spark.dstreams.state.replicas", "2")
    assert state_level("spark://h:7077", conf) == StorageLevel.MEMORY_ONLY_2
    assert state_level("local[2]", conf) == StorageLevel.MEMORY_ONLY
    monkeypatch.setenv("DSTREAMS_STATE_REPLICAS", "3")
    with pytest.raises(ValueError, match="spark.dstreams.state.replicas"):
        state_level("yarn")
