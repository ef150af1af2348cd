"""``StreamingContext``: the entry point, with PySpark's ``pyspark.streaming.StreamingContext`` surface.

Lifecycle: INITIALIZED (define inputs, transformations, outputs) -> ACTIVE (``start()``) ->
STOPPED (``stop()``). A stopped context cannot be restarted: create a new one. At most one
context is active per process (``getActive()``).

The Python driver owns the stream graph and builds every batch's RDDs itself: no Py4J callback
server, no JVM DStreams. Batches are generated on an injected clock (``SystemClock`` by default;
tests pass a ``ManualClock``).
"""

from __future__ import annotations

import logging
import os
import threading
import time as _time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from pyspark import RDD, SparkConf, SparkContext, StorageLevel

from dstreams import config
from dstreams.clock import Clock, SystemClock
from dstreams.errors import DStreamsError
from dstreams.files.source import FileInputNode
from dstreams.graph import DStreamGraph, not_started_message
from dstreams.listener import BatchInfo
from dstreams.listener_bus import ListenerBus
from dstreams.nodes.generator import GeneratorInputNode, RecordFunc
from dstreams.nodes.input import QueueInputNode
from dstreams.nodes.socket import SocketInputNode
from dstreams.nodes.transformed import TransformedNode, require_same_slide
from dstreams.nodes.union import UnionNode
from dstreams.recovery.checkpointer import StoreCheckpointer
from dstreams.recovery.graph_store import StoredGraph, load_graph, read_graph
from dstreams.recovery.metadata import MetadataLog
from dstreams.recovery.runtime import CheckpointInUseError, DriverRuntime, RuntimeSettings
from dstreams.recovery.store import is_store_url, local_path
from dstreams.recovery.storespec import StoreSpec
from dstreams.redis.source import RedisStreamsInputNode
from dstreams.scheduler import JobScheduler
from dstreams.spark import jvm_cds
from dstreams.spark.sparkconf import create_spark_context, tune_running_context
from dstreams.time import BatchTime, Duration, DurationLike, parse_duration, to_datetime

from .driver import DriverSetup, StartedDriver
from .functions import positional_arity
from .owner import OutputEnvironment
from .shutdown import SignalStop

if TYPE_CHECKING:
    from dstreams.kafka.records import KafkaRecord

    from .kafka import KafkaDStream
from .stream import DStream

log = logging.getLogger(__name__)

T = TypeVar("T")


class StreamingContextStateError(DStreamsError, RuntimeError):
    """An operation that the context's lifecycle state does not allow (e.g. restarting a stopped one)."""


class StreamingContext:
    """Main entry point: ``StreamingContext(sparkContext, batchDuration)`` as in PySpark.

    :param sparkContext: the SparkContext to run on (see :meth:`local` to create a tuned one).
    :param batchDuration: the batch interval, in seconds (a number, as in PySpark) or a string
        such as ``"500ms"``, ``"1s"``, ``"2min"``.
    :param clock: the clock batches are generated on (``dstreams.ManualClock`` in tests).
    :param concurrentBatches: how many batches may run at once (timestep pipelining); default 1,
        or ``spark.streaming.concurrentJobs`` when set.

    Besides PySpark's surface, the context implements :class:`~dstreams.api.owner.GraphOwner`, what its streams
    use of it (``check_not_started``, ``output_environment``, ``on_graph_thread``, ``concurrent_batches``):
    engine-facing members in snake_case, not PySpark API.
    """

    INITIALIZED: ClassVar[str] = "INITIALIZED"
    ACTIVE: ClassVar[str] = "ACTIVE"
    STOPPED: ClassVar[str] = "STOPPED"

    _activeContext: ClassVar[StreamingContext | None] = None
    _class_lock: ClassVar[threading.RLock] = threading.RLock()

    def __init__(self, sparkContext: SparkContext, batchDuration: DurationLike | None = None,
                 jssc: Any = None, *, clock: Clock | None = None, concurrentBatches: int | None = None) -> None:
        if jssc is not None:
            raise ValueError("dstreams does not wrap a JVM StreamingContext (jssc); pass a SparkContext")
        if not isinstance(sparkContext, SparkContext):
            raise TypeError(f"StreamingContext needs a SparkContext, got {type(sparkContext).__name__}")
        tune_running_context(sparkContext)  # a user-made context: the low-latency settings Spark still reads
        self._sc = sparkContext
        batch = parse_duration(batchDuration, "batchDuration") if batchDuration is not None else None
        self._graph = DStreamGraph(sparkContext, batch)
        self._clock: Clock = clock or SystemClock()
        if concurrentBatches is None:
            concurrentBatches = int(sparkContext.getConf().get("spark.streaming.concurrentJobs", "1"))
        self._concurrent = concurrentBatches
        self._bus = ListenerBus(config.get(config.LISTENER_BUS_CAPACITY, sparkContext.getConf()))
        #: Everything a started context runs (api/driver.py); None before start().
        self._driver: StartedDriver | None = None
        self._stopped_by_failure = False
        self._state = self.INITIALIZED
        self._lock = threading.RLock()
        self._stopped = threading.Event()
        #: Whether the main thread called ``awaitTermination*`` (then a signal's stop lets it return).
        self._main_awaited = False
        self._checkpoint_dir: str | None = None
        self._store_options: dict[str, Any] = {}
        self._resume = False

    # The runtime's parts, for tests and tools (None before start()).
    @property
    def _runtime(self) -> DriverRuntime | None:
        return self._driver.runtime if self._driver is not None else None

    @property
    def _signals(self) -> SignalStop | None:
        return self._driver.signals if self._driver is not None else None

    @property
    def _scheduler(self) -> JobScheduler | None:
        return self._runtime.scheduler if self._runtime is not None else None

    @property
    def _checkpointer(self) -> StoreCheckpointer | None:
        return self._runtime.checkpointer if self._runtime is not None else None

    @property
    def _metadata(self) -> MetadataLog | None:
        return self._runtime.metadata if self._runtime is not None else None

    # ------------------------------------------------------------------ construction helpers
    @classmethod
    def local(cls, batchInterval: DurationLike = "1s", master: str = "local[*]", appName: str = "dstreams",
              conf: SparkConf | dict[str, str] | None = None, **kwargs: Any) -> StreamingContext:
        """Create a SparkContext tuned for low per-batch latency and a StreamingContext on it.

        Settings in ``conf`` win over dstreams' defaults (``dstreams.spark.sparkconf``).
        """
        sc = create_spark_context(master, appName, conf)
        return cls(sc, batchInterval, **kwargs)

    @property
    def sparkContext(self) -> SparkContext:
        """The SparkContext this streaming context runs on."""
        return self._sc

    @property
    def batchDuration(self) -> Duration | None:
        return self._graph.batch_duration

    @property
    def clock(self) -> Clock:
        return self._clock

    def getState(self) -> str:
        """``"INITIALIZED"``, ``"ACTIVE"`` or ``"STOPPED"``."""
        return self._state

    @property
    def concurrent_batches(self) -> int:
        """How many batches may run at once (``concurrentBatches``; :class:`~dstreams.api.owner.GraphOwner`)."""
        return self._concurrent

    def check_not_started(self, what: str) -> None:
        """Raise ``StreamingContextStateError`` naming ``what`` unless the context is INITIALIZED
        (:class:`~dstreams.api.owner.GraphOwner`)."""
        if self._state == self.ACTIVE:
            raise StreamingContextStateError(not_started_message(what))
        if self._state == self.STOPPED:
            raise StreamingContextStateError(
                f"cannot {what}: this StreamingContext has been stopped; create a new one"
            )

    # ------------------------------------------------------------------ class-level accessors
    @classmethod
    def getActive(cls) -> StreamingContext | None:
        """The currently active (started, not stopped) StreamingContext, or None."""
        with cls._class_lock:
            return cls._activeContext

    @classmethod
    def getActiveOrCreate(cls, checkpointPath: str | None, setupFunc: Callable[[], StreamingContext]
                          ) -> StreamingContext:
        """The active context, else ``getOrCreate(checkpointPath, setupFunc)`` (or ``setupFunc()``)."""
        if setupFunc is None:
            raise ValueError("setupFunc cannot be None")
        active = cls.getActive()
        if active is not None:
            return active
        if checkpointPath is not None:
            return cls.getOrCreate(checkpointPath, setupFunc)
        return setupFunc()

    @classmethod
    def getOrCreate(cls, checkpointPath: str, setupFunc: Callable[[], StreamingContext], *,
                    rebuildGraph: bool = False, clock: Clock | None = None, **storeOptions: Any) -> StreamingContext:
        """Recreate a context from the checkpoint at ``checkpointPath``, or create one with ``setupFunc``.

        PySpark's contract: when the location holds a checkpoint, the stream graph stored there (its
        streams and your functions) is restored and ``setupFunc`` is **not** called; the active SparkContext
        is reused, or one is created from the checkpointed Spark configuration. ``start()`` then restores
        the state and replays the batches that were pending or missed. Without a checkpoint, ``setupFunc()``
        creates the context and its checkpoint directory is set to ``checkpointPath``.

        Added on top of PySpark: ``storeOptions`` for an ``s3://`` location (as for :meth:`checkpoint`;
        credentials are never stored in the checkpoint), ``clock`` for the restored context (tests), and
        ``rebuildGraph=True``, which calls ``setupFunc`` even when a graph is stored and checks that the
        rebuilt graph has the stored one's topology: for a graph that cannot be loaded any more (e.g. a
        module was renamed), or to change a source's options on restart (``redisStream(...,
        onTrimmed="skip")`` after a ``TrimmedEntriesError``, another ``maxRatePerPartition``). A graph with a
        ``queueStream`` is not stored: ``setupFunc`` rebuilds it.
        """
        if not checkpointPath:
            raise ValueError("checkpointPath must be a non-empty path or URL")
        stored = None if rebuildGraph else _stored_graph(checkpointPath, storeOptions)
        if stored is not None:
            sc = SparkContext._active_spark_context
            if sc is None:
                conf = stored.spark_conf()
                jvm_cds.apply(conf)  # the class-data-sharing archive, when one was built (a faster restart)
                sc = SparkContext(conf=conf)
            ssc = cls(sc, Duration(stored.batch_ms), clock=clock)
            ssc._graph = load_graph(stored, {"ssc": ssc})
            ssc._graph.bind(sc)
            log.info("restored the stream graph from the checkpoint at %s (setupFunc not called)", checkpointPath)
        else:
            ssc = setupFunc()
            if not isinstance(ssc, StreamingContext):
                raise TypeError(f"setupFunc must return a dstreams StreamingContext, got {type(ssc).__name__}")
            if not storeOptions and ssc._checkpoint_dir == checkpointPath:
                storeOptions = ssc._store_options
        ssc.checkpoint(checkpointPath, **storeOptions)
        # start() resumes from the metadata log there, if any: state from the newest valid data
        # checkpoints, then the pending and missed batches, then the clock.
        ssc._resume = True
        return ssc

    # ------------------------------------------------------------------ configuration
    def remember(self, duration: DurationLike) -> None:
        """Keep each stream's RDDs for at least ``duration`` (seconds or a duration string)."""
        self.check_not_started("call remember()")
        self._graph.remember(parse_duration(duration, "remember duration"))

    def checkpoint(self, directory: str, **storeOptions: Any) -> None:
        """Set where stateful streams write their checkpoints: a local folder or a store URL.

        ``s3://bucket/prefix`` writes to an S3-compatible store through boto3: the endpoint and
        credentials come from boto3's standard chain (``AWS_ENDPOINT_URL_S3``,
        ``AWS_ACCESS_KEY_ID``, ...) or from ``storeOptions`` (``endpoint_url``, ``access_key``,
        ``secret_key``, ``region``, ``path_style``).
        """
        if not directory:
            raise ValueError("the checkpoint directory must be a non-empty path")
        if str(directory).startswith("memory://"):
            raise ValueError(
                "memory:// stores live in one process and executors write checkpoints from their own "
                "processes: use a local folder or an s3:// URL"
            )
        self.check_not_started("set the checkpoint directory")
        local = local_path(directory)
        if local is not None:
            # As Spark's StreamingContext.checkpoint (fs.mkdirs): a local folder exists once it is set.
            os.makedirs(local, exist_ok=True)
        self._checkpoint_dir = directory
        self._store_options = dict(storeOptions)

    @property
    def checkpointDirectory(self) -> str | None:
        return self._checkpoint_dir

    def addStreamingListener(self, streamingListener: Any) -> None:
        """Register a listener (a ``pyspark.streaming.StreamingListener`` or any object with its callbacks)."""
        self._bus.add(streamingListener)

    def removeStreamingListener(self, streamingListener: Any) -> None:
        self._bus.remove(streamingListener)

    # ------------------------------------------------------------------ sources
    def _check_can_add_input(self) -> None:
        self.check_not_started("add an input stream")
        self._graph.require_batch_duration()

    def queueStream(self, rdds: Iterable[RDD[T] | Iterable[T]], oneAtATime: bool = True,
                    default: RDD[T] | Iterable[T] | None = None) -> DStream[T]:
        """A stream from a queue of RDDs (or lists), one per batch unless ``oneAtATime=False``.

        An exhausted queue yields ``default`` (an RDD or list) when given, else an empty batch.
        Not replayable after a driver failure: use it for tests.
        """
        self._check_can_add_input()
        items = list(rdds)
        converted = [r if isinstance(r, RDD) else self._sc.parallelize(list(r)) for r in items]
        if default is not None and not isinstance(default, RDD):
            default = self._sc.parallelize(list(default))
        return DStream(QueueInputNode(self._graph, converted, oneAtATime, default), self)

    def socketTextStream(self, hostname: str, port: int,
                         storageLevel: StorageLevel = StorageLevel.MEMORY_AND_DISK_2) -> DStream[str]:
        """Lines of text read from a TCP server at ``hostname:port`` (UTF-8, one record per line).

        ``storageLevel`` is accepted for compatibility; dstreams keeps received lines in the driver until
        their batch is built, and in the write-ahead log when a checkpoint location is set, so it is not
        used (a different level than the default is logged).
        """
        self._check_can_add_input()
        if storageLevel != StorageLevel.MEMORY_AND_DISK_2:
            log.warning("socketTextStream: storageLevel %s is not used: received lines stay in the driver until "
                        "their batch is built (and in the write-ahead log when a checkpoint location is set)",
                        storageLevel)
        return DStream(SocketInputNode(self._graph, hostname, port), self)

    def textFileStream(self, directory: str, *, maxFilesPerBatch: int | None = None,
                       **storeOptions: Any) -> DStream[str]:
        """Lines of the new text files that appear in ``directory`` (each file in exactly one batch).

        ``directory`` is a local folder or an ``s3://bucket/prefix/`` URL (new objects under the prefix;
        ``storeOptions`` as for :meth:`checkpoint`). Replayable after a driver restart: the files of
        each batch are recorded in the metadata log before it runs. ``maxFilesPerBatch``: at most that
        many new files per batch, the others in later batches (default: ``spark.dstreams.files.maxFilesPerBatch``,
        else no limit).
        """
        self._check_can_add_input()
        return DStream(FileInputNode(self._graph, directory, None, _store_location(directory, storeOptions),
                                     maxFilesPerBatch), self)

    def binaryRecordsStream(self, directory: str, recordLength: int, *, maxFilesPerBatch: int | None = None,
                            **storeOptions: Any) -> DStream[bytes]:
        """Fixed-length binary records (``bytes``) of the new files that appear in ``directory``
        (``maxFilesPerBatch`` as for :meth:`textFileStream`)."""
        self._check_can_add_input()
        return DStream(FileInputNode(self._graph, directory, recordLength, _store_location(directory, storeOptions),
                                     maxFilesPerBatch), self)

    def generatorStream(self, recordsPerPartition: int, numPartitions: int | None = None, seed: int = 0,
                        recordFunc: RecordFunc | None = None) -> DStream[Any]:
        """Deterministic records made inside the executors: ``recordsPerPartition`` per partition per batch.

        ``recordFunc(seed, batch_time_ms, partition, n) -> iterable`` makes the records (default:
        100-byte text lines of common words). Replayable from ``(seed, batch time)``.
        """
        self._check_can_add_input()
        n = numPartitions if numPartitions is not None else self._sc.defaultParallelism
        return DStream(GeneratorInputNode(self._graph, recordsPerPartition, n, seed, recordFunc), self)

    def redisStream(self, keys: str | Sequence[str], url: str = "redis://127.0.0.1:6379/0",
                    startFrom: str | dict[str, str] = "earliest", decoder: Callable[[str, str, dict[str, str]], Any]
                    | None = None, maxRatePerPartition: float | None = None, onTrimmed: str = "fail",
                    missingKeys: str = "fail", commitToGroup: str | None = None,
                    eventTimeFromIds: str | None = None) -> DStream[Any]:
        """The entries of one or more Redis stream keys, each key a partition, read directly (no receiver).

        Each batch holds, per key, the entries added since the previous batch (at most
        ``maxRatePerPartition`` per second of batch interval per key when set), fixed in the metadata log
        before the batch runs, so recovery and failover read exactly the same entries. Records are
        ``(key, entry_id, fields)`` tuples (``fields`` a dict of str) or ``decoder(key, entry_id, fields)``.
        ``startFrom``: ``"earliest"``, ``"latest"`` or ``{key: id}`` (the entries after that id). See
        :mod:`dstreams.redis.source` for trimmed entries (``onTrimmed``), missing keys
        (``missingKeys``) and an unreachable server. ``commitToGroup``: a consumer group whose position follows
        the completed batches, for monitoring tools (``XINFO GROUPS``; not what the stream resumes from).
        ``eventTimeFromIds``: ``"explicit"`` (producers use the event time in ms as the entry id) or
        ``"auto"`` (``XADD *``: the append time is the event time) makes the source declare a low watermark
        for ``withEventTime`` from how far each key was read, so that a lagging key holds the watermark back
        instead of having its entries dropped as late (the stream's ``withEventTime`` must extract the id's
        time). Needs redis-py (``pip install 'dstreams[redis]'``).
        """
        self._check_can_add_input()
        node = RedisStreamsInputNode(self._graph, url, [keys] if isinstance(keys, str) else list(keys), startFrom,
                                     decoder, maxRatePerPartition, onTrimmed, missingKeys, commitToGroup,
                                     eventTimeFromIds)
        return DStream(node, self)

    def kafkaStream(self, topics: str | Sequence[str] | None = None, kafkaParams: dict[str, Any] | None = None,
                    pattern: str | None = None, bootstrapServers: str | None = None,
                    startingOffsets: str | dict[Any, int] = "latest",
                    decoder: Callable[[KafkaRecord], Any] | None = None, maxRatePerPartition: float | None = None,
                    failOnDataLoss: bool = True, minPartitions: int | None = None,
                    commitToGroup: str | None = None, onDecodeError: str = "fail") -> KafkaDStream:
        """The records of Kafka topics, read directly (no receiver), exactly once.

        ``topics``: a name or a list of names, or ``pattern``: a regular expression matched against whole topic
        names (topics created later are read too). ``kafkaParams``: librdkafka settings (``bootstrap.servers``,
        security, ...; pyspark 2.4's ``metadata.broker.list`` is accepted), or just ``bootstrapServers``.
        Each batch holds, per topic-partition, the offsets from where the previous batch ended to the last stable
        offset (read_committed; at most ``maxRatePerPartition`` per second of batch interval when set), fixed in
        the metadata log before the batch runs, so recovery and failover read exactly the same records. Records
        are :class:`~dstreams.kafka.records.KafkaRecord` (``topic, partition, offset, timestamp, key, value,
        headers, timestampType``; for event time ``withEventTime(lambda r: r.timestamp / 1000)``, ms to seconds) or
        ``decoder(record)``.
        ``startingOffsets``: ``"latest"`` (default), ``"earliest"`` or ``{TopicAndPartition(topic, p): offset}``.
        Offsets gone from the broker fail the batch unless ``failOnDataLoss=False`` (then skipped and counted).
        ``minPartitions``: split the batch into at least this many tasks. ``commitToGroup``: a consumer group whose
        committed offsets follow the completed batches, for lag monitoring only. ``onDecodeError="deadLetter"``:
        records the decoder refuses go to ``stream.deadLetters()`` instead of failing the batch. Each RDD has
        ``offsetRanges()``. See :mod:`dstreams.kafka.source`. Needs confluent-kafka (``pip install
        'dstreams[kafka]'``).
        """
        from .kafka import kafka_stream

        self._check_can_add_input()
        params = dict(kafkaParams or {})
        if bootstrapServers is not None:
            params.setdefault("bootstrap.servers", bootstrapServers)
        return kafka_stream(self, self._graph, topics, params, pattern, startingOffsets, decoder,
                            maxRatePerPartition, failOnDataLoss, minPartitions, commitToGroup, onDecodeError)

    # ------------------------------------------------------------------ combinators
    def union(self, *dstreams: DStream[T]) -> DStream[T]:
        """The union of several streams with the same slide duration."""
        if not dstreams:
            raise ValueError("should have at least one DStream to union")
        if len(dstreams) == 1 and isinstance(dstreams[0], (list, tuple)):
            dstreams = tuple(dstreams[0])
        self.check_not_started("add a transformation")
        require_same_slide([d._node for d in dstreams], "union", "all DStreams should have the same slide duration")
        if len(dstreams) == 1:
            return dstreams[0]
        return DStream(UnionNode(self._graph, [d._node for d in dstreams]), self)

    def deadLetters(self) -> DStream[Any]:
        """Every dead letter of the context's operators, batch by batch: the union of ``stream.deadLetters()`` of
        each operator that routes them (``onError="deadLetter"``, ``spark.dstreams.onRecordError=deadLetter``,
        ``kafkaStream(..., onDecodeError="deadLetter")``), to save with any sink (exactly once, like any output).
        Records are :class:`~dstreams.dead_letters.DeadLetter` (``record, operator, error, batchTime``), and
        :class:`~dstreams.kafka.source.KafkaDeadLetter` for a Kafka decoder's. Call it after defining those
        operators (``start()`` refuses a graph with more defined after the call)."""
        self.check_not_started("add a transformation")
        nodes = list(self._graph.dead_letter_nodes)
        if not nodes:
            raise ValueError("no operator of this context routes dead letters: make one with onError='deadLetter' "
                             "(stream.map(f, onError='deadLetter')), set spark.dstreams.onRecordError=deadLetter "
                             "before defining the operators, or call ssc.deadLetters() after defining them")
        require_same_slide(nodes, "deadLetters", "the operators routing dead letters have different slide "
                           "durations: save each one's stream.deadLetters() instead")
        self._graph.dead_letters_united = len(nodes)
        return DStream(nodes[0] if len(nodes) == 1 else UnionNode(self._graph, nodes), self)

    def transform(self, dstreams: Sequence[DStream[Any]], transformFunc: Callable[..., RDD[Any]]) -> DStream[Any]:
        """A stream of ``transformFunc(rdds)`` or ``transformFunc(time, rdds)`` over several streams."""
        self.check_not_started("add a transformation")
        if not dstreams:
            raise ValueError("transform needs at least one DStream")
        n = positional_arity(transformFunc, (1, 2), "StreamingContext.transform")

        def apply(rdds: list[RDD[Any]], t: BatchTime) -> RDD[Any]:
            return transformFunc(rdds) if n == 1 else transformFunc(to_datetime(t), rdds)

        return DStream(TransformedNode(self._graph, [d._node for d in dstreams], apply, "transform"), self)

    # ------------------------------------------------------------------ lifecycle
    def on_graph_thread(self, func: Callable[[], T]) -> T:
        """Run ``func`` (which reads or builds node RDDs) on the scheduler's event loop once started, else under
        the graph's lock (:class:`~dstreams.api.owner.GraphOwner`)."""
        runtime = self._runtime
        if runtime is not None and runtime.events.running:
            return runtime.events.call(func)
        with self._graph.lock:
            return func()

    def output_environment(self) -> OutputEnvironment:
        """For sinks: the checkpoint location and the fence, a no-op before start and without one
        (:class:`~dstreams.api.owner.GraphOwner`)."""
        runtime = self._runtime
        metadata = runtime.metadata if runtime is not None else None
        return OutputEnvironment(self._checkpoint_dir, dict(self._store_options),
                                 runtime.check_owner if runtime is not None else _no_fence,
                                 metadata.head.get("epoch") if metadata is not None else None)

    def start(self) -> None:
        """Start generating and running batches on the clock."""
        with self._lock:
            if self._state == self.ACTIVE:
                log.warning("StreamingContext has already been started")
                return
            if self._state == self.STOPPED:
                raise StreamingContextStateError(
                    "StreamingContext has already been stopped: a stopped context cannot be restarted; "
                    "create a new StreamingContext (the SparkContext can be reused if it was not stopped)"
                )
            with StreamingContext._class_lock:
                active = StreamingContext._activeContext
                if active is not None and active is not self:
                    raise StreamingContextStateError(
                        "only one StreamingContext may be active in a process: stop the active one first"
                    )
                self._graph.validate()
                setup = DriverSetup(self._sc, self._graph, self._clock, self._bus,
                                    RuntimeSettings(self._checkpoint_dir, dict(self._store_options), self._resume,
                                                    self._concurrent),
                                    {id(self): "ssc"}, self, self.getState)
                driver = StartedDriver(setup)  # a bad setting raises here: the context stays INITIALIZED
                self._driver = driver  # before the first batch: sinks read the fence through it
                try:
                    driver.start()
                except BaseException as e:
                    # As Spark's StreamingContext.start: a failed start leaves the context STOPPED (the driver
                    # closed what it had started; the SparkContext keeps running, a new context can start).
                    self._state = self.STOPPED
                    self._bus.stop(timeout_s=10.0)
                    self._stopped.set()
                    if isinstance(e, CheckpointInUseError):
                        raise StreamingContextStateError(str(e)) from None
                    raise
                self._state = self.ACTIVE
                StreamingContext._activeContext = self

    def stop(self, stopSparkContext: bool = True, stopGraceFully: bool = False) -> None:
        """Stop the stream (graceful: after the queued batches ran) and, by default, the SparkContext."""
        with self._lock:
            if self._state == self.STOPPED:
                if stopSparkContext and self._stopped_by_failure:  # stopped itself, keeping the SparkContext
                    self._stopped_by_failure = False
                    self._sc.stop()
                return
            was_active = self._state == self.ACTIVE
            self._state = self.STOPPED
        try:
            driver = self._driver
            if was_active and driver is not None:
                driver.close(graceful=stopGraceFully, timeout_s=self._graceful_stop_timeout())
        finally:
            with StreamingContext._class_lock:
                if StreamingContext._activeContext is self:
                    StreamingContext._activeContext = None
            self._bus.stop(timeout_s=10.0)
            self._stopped.set()
            if stopSparkContext:
                self._sc.stop()

    def _stop_after_failure(self) -> None:
        """The scheduler stopped on an error (a batch failed for good, this driver was fenced, the store stayed
        down): stop the stream as ``stop(stopSparkContext=False)`` does; a later ``stop()`` still stops the
        SparkContext when asked to."""
        with self._lock:
            if self._state != self.ACTIVE:
                return
        log.error("the streaming context stops after an error it cannot go on from (awaitTermination raises it); "
                  "restart with StreamingContext.getOrCreate(checkpointPath, setupFunc) to run the batch again")
        self.stop(stopSparkContext=False)
        self._stopped_by_failure = True

    def _graceful_stop_timeout(self) -> float:
        """``spark.dstreams.gracefulStopTimeout`` (else Spark's key), else 10 batch intervals, at least 10 s."""
        configured = config.get(config.GRACEFUL_STOP_TIMEOUT, self._sc.getConf())
        if configured is not None:
            return float(configured)
        batch = self._graph.batch_duration
        return max(10.0, 10 * batch.seconds) if batch else 10.0

    def main_thread_awaited(self) -> bool:
        """Whether the main thread called ``awaitTermination*`` (:class:`~dstreams.api.shutdown.Stoppable`: a
        signal's stop then lets it return instead of raising ``SystemExit`` in it)."""
        return self._main_awaited

    @property
    def uiWebUrl(self) -> str | None:
        """The URL of this context's status server (its page, ``/api``, ``/metrics``) while it is active; None
        when ``spark.dstreams.ui.enabled`` is off or no port was free. ``sparkContext.uiWebUrl`` is Spark's."""
        driver = self._driver
        status = driver.status if driver is not None else None
        return status.url if status is not None else None

    def awaitTermination(self, timeout: float | None = None) -> None:
        """Wait until the context stops or a batch fails (its error is raised here), or ``timeout`` s."""
        self._await(timeout)

    def awaitTerminationOrTimeout(self, timeout: float) -> bool:
        """Like :meth:`awaitTermination`; returns True if the context stopped, False on timeout."""
        return self._await(timeout)

    def _await(self, timeout: float | None) -> bool:
        if threading.current_thread() is threading.main_thread():
            self._main_awaited = True
        deadline = None if timeout is None else _time.monotonic() + float(timeout)
        while True:
            sched = self._scheduler
            if sched is not None and sched.error is not None:
                if sched.fatal_error is not None:
                    self._stop_after_failure()
                raise sched.error
            if self._stopped.is_set():
                return True
            remaining = None if deadline is None else deadline - _time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            wait = 0.1 if remaining is None else min(0.1, remaining)
            if sched is not None:
                sched.error_event.wait(wait)
            else:
                self._stopped.wait(wait)

    # ------------------------------------------------------------------ metrics & test support
    def batchInfos(self) -> list[BatchInfo]:
        """Metrics of the most recent completed batches (oldest first)."""
        return list(self._scheduler.infos) if self._scheduler else []

    def lastCompletedBatchTime(self) -> BatchTime | None:
        return self._scheduler.last_completed if self._scheduler else None

    def awaitBatch(self, time: BatchTime | int, timeout: float = 60.0) -> BatchInfo:
        """Block until batch ``time`` (ms or BatchTime) has completed; for tests with a manual clock."""
        if self._scheduler is None:
            raise StreamingContextStateError("the context has not been started")
        t = time if isinstance(time, BatchTime) else BatchTime(int(time))
        deadline = _time.monotonic() + timeout
        info = self._scheduler.wait_for_batch(t, timeout)
        self._bus.wait_until_empty(max(0.0, deadline - _time.monotonic()))  # listeners have seen the batch too
        return info

    def awaitCheckpoints(self, timeout: float = 60.0) -> None:
        """Block until the checkpoints this started context has begun writing are written and adopted (their lineage
        cut, the older ones deleted); returns at once without a checkpoint location. For tests with a manual clock,
        with :meth:`awaitBatch`; a write that fails or takes longer than ``timeout`` seconds raises."""
        if self._scheduler is None:
            raise StreamingContextStateError("the context has not been started")
        checkpointer = self._checkpointer
        if checkpointer is not None:
            checkpointer.flush(timeout)

    @property
    def startTime(self) -> BatchTime | None:
        """Time of the first batch (set by ``start()``)."""
        return self._scheduler.start_time if self._scheduler else None


def _stored_graph(path: str, store_options: dict[str, Any]) -> StoredGraph | None:
    """The graph stored at the checkpoint location ``path``, or None (no checkpoint there, or none stored)."""
    if not is_store_url(path):
        local = local_path(path)
        if local is None or not os.path.isdir(local):
            return None
    store = StoreSpec(path, dict(store_options)).open()
    if MetadataLog.read(store) is None:
        return None
    stored = read_graph(store)
    if stored is None:
        log.info("the checkpoint at %s holds no stream graph (a queueStream, or spark.dstreams.checkpoint.graph=off): "
                 "setupFunc rebuilds it", path)
    return stored


def _no_fence() -> None:
    return None


def _store_location(directory: str, store_options: dict[str, Any]) -> StoreSpec | None:
    """The object store a file stream reads (None: a local folder, read by Spark itself)."""
    if is_store_url(directory):
        return StoreSpec(directory, dict(store_options))
    if store_options:
        raise ValueError(f"store options apply to s3:// locations only, not to the local folder {directory!r}")
    return None
