"""dstreams.config: every engine setting in one place (conf key, then environment, then default)."""

from __future__ import annotations

import ast
import math
import re
import sys
import types
from pathlib import Path

import pytest

from dstreams import config, faults

ROOT = Path(__file__).resolve().parents[2]
NO_ENV: dict[str, str] = {}


def test_defaults_when_nothing_is_set():
    assert config.get(config.JVM_MODE, None, NO_ENV) == "compiled"
    assert config.get(config.STORE_RETRY_SECONDS, {}, NO_ENV) == 30.0
    assert config.get(config.STORE_OUTAGE_SECONDS, None, NO_ENV) == 900.0
    assert config.get(config.SPARK_LOG_LEVEL, None, NO_ENV) == "WARN"
    assert config.get(config.SPARK_LOCAL_DIR, None, NO_ENV) is None
    assert config.get(config.LISTENER_BUS_CAPACITY, None, NO_ENV) == 10000
    assert config.get(config.LISTENER_BUS_CAPACITY, {"spark.scheduler.listenerbus.eventqueue.capacity": "500"},
                      NO_ENV) == 500  # Spark's own key counts when dstreams' is unset


def test_the_conf_key_comes_first_then_the_environment_then_the_default():
    s = config.STORE_OUTAGE_SECONDS
    env = {s.env: "60"}
    assert config.get(s, {s.key: "5"}, env) == 5.0
    assert config.get(s, {}, env) == 60.0
    assert config.get(s, {s.key: "  "}, env) == 60.0  # blank counts as unset
    assert config.get(s, None, {s.env: ""}) == s.default
    assert config.lookup(s, {s.key: "5"}, env) == (s.key, "5")
    assert config.lookup(s, None, env) == (s.env, "60")
    assert config.lookup(s, None, NO_ENV) is None


def test_the_environment_is_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("DSTREAMS_SPARK_LOG_LEVEL", "error")
    assert config.get(config.SPARK_LOG_LEVEL) == "ERROR"
    monkeypatch.delenv("DSTREAMS_SPARK_LOG_LEVEL")
    assert config.get(config.SPARK_LOG_LEVEL) == "WARN"


def test_a_sparkconf_is_read_with_get():
    from pyspark import SparkConf

    conf = SparkConf(loadDefaults=False).set("spark.dstreams.jvm.mode", "off")
    assert config.get(config.JVM_MODE, conf, {"DSTREAMS_LEAN_JVM": "compiled"}) == "off"
    assert config.get(config.JVM_MODE, SparkConf(loadDefaults=False), {"DSTREAMS_LEAN_JVM": "0"}) == "off"


@pytest.mark.parametrize(("raw", "mode"), [("compiled", "compiled"), ("1", "compiled"), (" COMPILED ", "compiled"),
                                           ("0", "off"), ("off", "off"), ("Off", "off")])
def test_jvm_modes(raw, mode):
    assert config.get(config.JVM_MODE, None, {"DSTREAMS_LEAN_JVM": raw}) == mode
    assert config.get(config.JVM_MODE, {"spark.dstreams.jvm.mode": raw}, NO_ENV) == mode


@pytest.mark.parametrize(
    ("setting", "raw", "accepts"),
    [
        (config.JVM_MODE, "calls", r"one of compiled \(or 1\) and off \(or 0\)"),
        (config.JVM_MODE, "true", r"one of compiled \(or 1\) and off \(or 0\)"),
        (config.STORE_RETRY_SECONDS, "soon", "a number of seconds >= 0"),
        (config.STORE_RETRY_SECONDS, "-1", "a number of seconds >= 0"),
        (config.STORE_OUTAGE_SECONDS, "nan", "a number of seconds >= 0"),
        (config.SPARK_LOG_LEVEL, "LOUD", r"a Spark log level \(ALL, DEBUG, .*WARN\)"),
    ],
)
def test_invalid_values_name_their_source_what_is_accepted_and_an_example(setting, raw, accepts):
    with pytest.raises(ValueError, match=rf"^{re.escape(setting.env)}={re.escape(repr(raw))} is not {accepts}: "
                                         rf"set it to e\.g\. {re.escape(setting.env)}={re.escape(setting.example)}"):
        config.get(setting, None, {setting.env: raw})
    with pytest.raises(ValueError, match=rf"^{re.escape(setting.key)}={re.escape(repr(raw))} is not {accepts}") as e:
        config.get(setting, {setting.key: raw}, NO_ENV)
    assert setting.env in str(e.value)  # both names are in the message
    assert setting.parse(setting.example) is not None  # the example is valid


def test_seconds_accept_zero_and_infinity():
    assert config.get(config.STORE_RETRY_SECONDS, {"spark.dstreams.store.retrySeconds": "0"}) == 0.0
    assert math.isinf(config.get(config.STORE_OUTAGE_SECONDS, None, {"DSTREAMS_STORE_OUTAGE_SECONDS": "inf"}))


def test_every_setting_is_a_spark_dstreams_key_with_a_dstreams_variable_and_a_doc():
    keys = [s.key for s in config.SETTINGS]
    envs = [s.env for s in config.SETTINGS]
    assert len(set(keys)) == len(keys) and len(set(envs)) == len(envs)
    for s in config.SETTINGS:
        assert s.key.startswith("spark.dstreams.") and s.env.startswith("DSTREAMS_") and s.doc
        if s.default is not None:
            assert config.get(s, None, {s.env: str(s.default)}) == s.default


def test_the_settings_page_is_generated_from_this_table():
    """docs/reference/settings.md holds a marker that the site's build hook (scripts/docs_hooks.py) replaces with
    :func:`config.markdown_table`, so the page cannot drift from the code; tests/integration/test_docs.py builds the
    site."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = (ROOT / "docs" / "reference" / "settings.md").read_text()
    assert hooks.SETTINGS_MARKER in page, "docs/reference/settings.md lost its generated-table marker"
    rendered = hooks.render_generated(page)
    assert config.markdown_table() in rendered
    for s in config.SETTINGS:
        assert f"`{s.key}` | `{s.env}`" in rendered, s.key


def _library_sources() -> list[Path]:
    return [p for folder in ("dstreams", "api", "recovery") for p in (ROOT / folder).rglob("*.py")]


def test_every_dstreams_variable_the_library_reads_is_in_the_table():
    """The test-only fault variables are no settings: only dstreams/faults.py names them (its FaultPlan.from_mapping
    parses a test app's environment; tests/unit/test_faults.py checks that the library never reads them)."""
    known = {s.env for s in config.SETTINGS} | {v.env for v in (*config.INTERNAL, *config.ENVIRONMENT_ONLY)}
    found = {}
    for path in _library_sources():
        if path == ROOT / "dstreams" / "faults.py":
            continue
        for name in re.findall(r"\bDSTREAMS_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            found.setdefault(name, path.relative_to(ROOT).as_posix())
    unknown = {name: where for name, where in found.items() if name not in known}
    assert not unknown, f"DSTREAMS_* variables missing from dstreams/config.py: {unknown}"
    named = set(re.findall(r"\bDSTREAMS_[A-Z0-9_]*[A-Z0-9]\b", (ROOT / "dstreams" / "faults.py").read_text()))
    assert named == set(faults.VARIABLES) and all(n.startswith("DSTREAMS_FAULT_") for n in named)


#: How the library reads a variable: ``os.environ.get("X")``, ``os.environ["X"]``, ``"X" in os.environ``,
#: ``os.environ.setdefault("X", ...)``, ``os.getenv("X")``, or a module constant ``..._ENV = "X"`` (or a tuple).
_READS = (
    re.compile(r'os\.environ(?:\.get|\.setdefault)?\(\s*"([A-Z][A-Z0-9_]*)"'),
    re.compile(r'os\.environ\[\s*"([A-Z][A-Z0-9_]*)"\s*\]'),
    re.compile(r'"([A-Z][A-Z0-9_]*)"\s+(?:not\s+)?in\s+os\.environ'),
    re.compile(r'getenv\(\s*"([A-Z][A-Z0-9_]*)"'),
)
_ENV_CONSTANT = re.compile(r"^_?[A-Z0-9_]*ENV[A-Z0-9_]*\s*=\s*(.+)$", re.MULTILINE)


def test_every_environment_variable_the_library_reads_is_in_the_table():
    """Not only dstreams' own: Spark's, AWS's, XDG's... too (a user must find every variable that changes what the
    library does in the README's table)."""
    listed = {s.env for s in config.SETTINGS} | {v.env for v in (*config.ENVIRONMENT_ONLY, *config.INTERNAL,
                                                                *config.STANDARD)}
    found: dict[str, str] = {}
    for path in _library_sources():
        text = path.read_text()
        names = [n for pattern in _READS for n in pattern.findall(text)]
        names += [n for value in _ENV_CONSTANT.findall(text) for n in re.findall(r'"([A-Z][A-Z0-9_]*)"', value)]
        for name in names:
            found.setdefault(name, path.relative_to(ROOT).as_posix())
    assert {"AWS_ENDPOINT_URL_S3", "SPARK_LOCAL_IP", "XDG_CACHE_HOME", "DSTREAMS_WORKER_PRELOAD"} <= set(found)
    unknown = {name: where for name, where in found.items() if name not in listed}
    assert not unknown, f"environment variables read by the library but missing from dstreams/config.py: {unknown}"


def test_the_module_imports_the_standard_library_only():
    tree = ast.parse((ROOT / "dstreams" / "config.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "no relative imports: config knows no other dstreams module"
            imported.add((node.module or "").split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_active_conf_is_the_running_contexts_and_never_imports_pyspark(monkeypatch):
    conf = {"spark.dstreams.store.outageSeconds": "7"}
    running = types.SimpleNamespace(_jsc=object(), _conf=conf)
    module = types.ModuleType("pyspark.core.context")
    module.SparkContext = types.SimpleNamespace(_active_spark_context=running)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pyspark.core.context", module)
    assert config.active_conf() is conf
    stopped = types.SimpleNamespace(_jsc=None, _conf=conf)
    module.SparkContext = types.SimpleNamespace(_active_spark_context=stopped)  # type: ignore[attr-defined]
    assert config.active_conf() is None
    monkeypatch.delitem(sys.modules, "pyspark.core.context")
    monkeypatch.delitem(sys.modules, "pyspark.context", raising=False)
    assert config.active_conf() is None


# ----------------------------------------------------------------- the readers that go through dstreams.config


def test_store_outage_and_retry_bounds_read_through_config(monkeypatch):
    from dstreams.recovery.journal import outage_seconds_from_env
    from dstreams.recovery.retry import RetryPolicy

    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "120")
    monkeypatch.setenv("DSTREAMS_STORE_RETRY_SECONDS", "4")
    assert outage_seconds_from_env({"spark.dstreams.store.outageSeconds": "60"}) == 60.0
    assert RetryPolicy.from_env(conf={"spark.dstreams.store.retrySeconds": "2"}).total_seconds == 2.0
    assert RetryPolicy.from_env(9, conf={"spark.dstreams.store.retrySeconds": "2"}).total_seconds == 9.0
    monkeypatch.setattr(config, "active_conf", lambda: None)  # an executor: no SparkConf, the environment
    assert outage_seconds_from_env() == 120.0
    assert RetryPolicy.from_env().total_seconds == 4.0
    monkeypatch.setattr(config, "active_conf", lambda: {"spark.dstreams.store.outageSeconds": "30"})  # the driver
    assert outage_seconds_from_env() == 30.0
    monkeypatch.setenv("DSTREAMS_STORE_OUTAGE_SECONDS", "-5")
    monkeypatch.setattr(config, "active_conf", lambda: None)
    with pytest.raises(ValueError, match=r"DSTREAMS_STORE_OUTAGE_SECONDS='-5' is not a number of seconds >= 0"):
        outage_seconds_from_env()
