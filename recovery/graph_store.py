"""The stream graph in the checkpoint store, so that a restarted driver does not call ``setupFunc``.

Contract (pyspark's ``getOrCreate``): when a context with a checkpoint location starts, its graph (every
node and the user's functions, serialized with cloudpickle as PySpark serializes closures) is written to
``meta/graph.pkl``: a checksummed object with a JSON header (the checkpoint format,
:data:`~dstreams.contracts.FORMAT`; sha256, Python, PySpark and dstreams versions, the batch
duration, the SparkConf to recreate a SparkContext from). ``getOrCreate`` loads it instead of calling
``setupFunc``; the resumed run then restores state and replays as usual.

* A graph that cannot be serialized because of a **user function** (it captures a SparkContext, a lock, an
  open file...) fails ``start()`` at once with :class:`GraphNotSerializableError`, naming the stream and the
  function, as PySpark does.
* A graph with a source that cannot be checkpointed (``queueStream``: its RDDs live in the driver) is
  not written; a warning says that ``getOrCreate`` will call ``setupFunc`` to rebuild it.
* A stored graph that cannot be loaded (a module gone, a corrupt object, another Python) raises
  :class:`GraphLoadError` saying what failed and the two ways out; one of another checkpoint format raises
  :class:`~.checkpoint_format.CheckpointFormatError`.

The StreamingContext a user function captured is written as a reference and resolved to the restored
context (``contexts`` of :func:`serialize_graph` / :func:`load_graph`).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import platform
from dataclasses import dataclass
from typing import Any

from pyspark import SparkConf

from dstreams.contracts import FORMAT, SourceNotCheckpointableError
from dstreams.errors import DStreamsError
from dstreams.graph import DStreamGraph

from .checkpoint_format import check_format
from .store import Store

log = logging.getLogger(__name__)

GRAPH_KEY = "meta/graph.pkl"
MAGIC = b"DSTREAMS-GRAPH\n"

#: Spark settings that belong to one run, not to the application: never carried over to a recreated
#: SparkContext (as Spark's own checkpoint reloads these from the new run).
_RUN_SPECIFIC = ("spark.app.id", "spark.app.startTime", "spark.driver.host", "spark.driver.port",
                 "spark.driver.bindAddress", "spark.ui.port", "spark.app.submitTime", "spark.executor.id",
                 "spark.repl.class.uri", "spark.repl.class.outputDir", "spark.app.initial.jar.urls",
                 "spark.app.initial.file.urls", "spark.submit.pyFiles")
#: Keys that may hold secrets: never written to the checkpoint store.
_SECRET_WORDS = ("secret", "password", "token", "credential", "access.key", "accesskey")


class GraphNotSerializableError(DStreamsError, RuntimeError):
    """A user function of the graph cannot be serialized, so the graph cannot be checkpointed."""


class GraphLoadError(DStreamsError, RuntimeError):
    """The graph stored in a checkpoint cannot be loaded."""


@dataclass(frozen=True)
class StoredGraph:
    """A graph read back from the store, not yet unpickled."""

    header: dict[str, Any]
    payload: bytes

    @property
    def batch_ms(self) -> int:
        return int(self.header["batch_ms"])

    def spark_conf(self) -> SparkConf:
        """The checkpointed Spark configuration, to create a SparkContext when none is active."""
        conf = SparkConf(loadDefaults=True)
        for key, value in self.header.get("spark_conf", []):
            if not conf.contains(key):  # settings of this run (spark-submit, defaults file) win
                conf.set(key, value)
        return conf


class _GraphPickler:
    """cloudpickle with the contexts in ``contexts`` written as references."""

    def __init__(self, contexts: dict[int, str]) -> None:
        from pyspark import cloudpickle

        base = cloudpickle.Pickler
        refs = contexts

        class Pickler(base):  # type: ignore[misc, valid-type]
            def persistent_id(self, obj: Any) -> Any:  # noqa: N802 (pickle's name)
                return refs.get(id(obj))

        self._type = Pickler

    def dumps(self, obj: Any) -> bytes:
        buf = io.BytesIO()
        self._type(buf, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)
        return buf.getvalue()


def _conf_pairs(conf: SparkConf) -> list[tuple[str, str]]:
    out = []
    for key, value in sorted(conf.getAll()):
        if key in _RUN_SPECIFIC or any(w in key.lower() for w in _SECRET_WORDS):
            continue
        out.append((key, value))
    return out


def _versions() -> dict[str, str]:
    import pyspark

    import dstreams

    return {"python": platform.python_version(), "pyspark": pyspark.__version__, "dstreams": dstreams.__version__}


def _fails(pickler: _GraphPickler, value: Any) -> BaseException | None:
    try:
        pickler.dumps(value)
    except SourceNotCheckpointableError:
        return None
    except Exception as e:
        return e
    return None


def _innermost(pickler: _GraphPickler, func: Any, depth: int = 0) -> Any:
    """The innermost function in ``func``'s closure that still fails to serialize (the user's, not a wrapper)."""
    if depth > 8:
        return func
    for cell in getattr(func, "__closure__", None) or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(inner) and _fails(pickler, inner) is not None:
            return _innermost(pickler, inner, depth + 1)
    return func


def _culprit(graph: DStreamGraph, pickler: _GraphPickler) -> str:
    """Which stream's which function cannot be serialized (for the error message)."""
    for node in graph.nodes:
        for name, value in vars(node).items():
            if name == "graph" or not callable(value):
                continue
            error = _fails(pickler, value)
            if error is not None:
                func = _innermost(pickler, value)
                qualname = getattr(func, "__qualname__", type(func).__name__)
                where = getattr(func, "__module__", None)
                return f"function {qualname!r}{f' in {where}' if where else ''} used by stream {node.name}"
    return "a function of the graph"


def serialize_graph(graph: DStreamGraph, conf: SparkConf, contexts: dict[int, str]) -> bytes | None:
    """The stored form of ``graph`` (header + payload), or None when a source cannot be checkpointed.

    Raises :class:`GraphNotSerializableError` when a user function cannot be serialized.
    """
    assert graph.batch_duration is not None
    pickler = _GraphPickler(contexts)
    try:
        payload = pickler.dumps(graph)
    except SourceNotCheckpointableError as e:
        log.warning("the stream graph is not checkpointed (%s): after a driver restart getOrCreate calls "
                    "setupFunc to rebuild it", e)
        return None
    except Exception as e:
        raise GraphNotSerializableError(
            f"the stream graph cannot be checkpointed: {_culprit(graph, pickler)}. With a checkpoint location "
            "every function given to a stream is serialized (as PySpark does) so that a restarted driver can "
            "rebuild the graph without calling setupFunc: do not capture the SparkContext, the StreamingContext's "
            f"SparkContext, locks or open connections in them; create such objects inside the function. ({e})"
        ) from e
    header = {
        "format": FORMAT,
        "sha256": hashlib.sha256(payload).hexdigest(),
        "batch_ms": graph.batch_duration.ms,
        "spark_conf": _conf_pairs(conf),
        "fingerprint": graph.fingerprint(),
        **_versions(),
    }
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def write_graph(store: Store, data: bytes) -> None:
    store.put(GRAPH_KEY, data)


def read_graph(store: Store) -> StoredGraph | None:
    """The stored graph, or None when the location holds none. Raises GraphLoadError when it is corrupt and
    :class:`~.checkpoint_format.CheckpointFormatError` when it was written in another checkpoint format."""
    try:
        raw = store.get(GRAPH_KEY)
    except FileNotFoundError:
        return None
    if not raw.startswith(MAGIC):
        raise GraphLoadError(f"{GRAPH_KEY} in the checkpoint is not a dstreams graph (bad magic)")
    head, sep, payload = raw[len(MAGIC):].partition(b"\n")
    try:
        header = json.loads(head) if sep else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or "format" not in header:
        raise GraphLoadError(f"{GRAPH_KEY} in the checkpoint is corrupt (its header is not a JSON object with a "
                             "format): start from a new checkpoint location")
    check_format(header["format"], f"the stream graph stored in the checkpoint ({GRAPH_KEY})")
    if hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        raise GraphLoadError(f"{GRAPH_KEY} in the checkpoint is corrupt (checksum mismatch)")
    return StoredGraph(header, payload)


def load_graph(stored: StoredGraph, contexts: dict[str, Any]) -> DStreamGraph:
    """Unpickle the stored graph, resolving context references from ``contexts``."""
    refs = contexts

    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:  # noqa: N802 (pickle's name)
            try:
                return refs[pid]
            except KeyError:
                raise pickle.UnpicklingError(f"unknown reference {pid!r} in the stored graph") from None

    try:
        graph = Unpickler(io.BytesIO(stored.payload)).load()
    except Exception as e:
        versions = {k: stored.header.get(k) for k in ("python", "pyspark", "dstreams")}
        raise GraphLoadError(
            f"the stream graph stored in the checkpoint cannot be loaded ({type(e).__name__}: {e}); it was written "
            f"by {versions}, this is {_versions()}. A module or function it uses may be gone or changed. Either "
            "resume with an empty checkpoint location (the state is lost), or rebuild the graph from setupFunc "
            "with StreamingContext.getOrCreate(path, setupFunc, rebuildGraph=True): the rebuilt graph must "
            "match the stored one's topology (checked)."
        ) from e
    if not isinstance(graph, DStreamGraph):
        raise GraphLoadError(f"{GRAPH_KEY} in the checkpoint holds a {type(graph).__name__}, not a stream graph")
    return graph
