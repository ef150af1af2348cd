"""The Spark plumbing: how dstreams drives PySpark, the JVM and the Python workers. No streaming concepts here.

The streaming model (``dstreams/``: time, nodes, graph, scheduler, listeners) computes each batch's RDDs
through **two named modules** of this package, its interface (enforced by ``tests/unit/test_layers.py``):

* :mod:`dstreams.spark.partitioned`: partitioning and the shuffle/combine data path (hash partitioners,
  partition-aligned RDDs, the inlined reduce-by-key ``fold``, pre-combining, segmented merges);
* :mod:`dstreams.spark.jvm`: the JVM fast path (one Py4J round trip per built RDD: persist, shuffle, union).

The other modules serve the layer that starts Spark (``api/``: context creation and the driver's set-up):

* :mod:`dstreams.spark.sparkconf`: the tuned SparkConf and ``create_spark_context``;
* :mod:`dstreams.spark.jvm_cds`: the driver JVM's class-data-sharing archive (``python -m dstreams.spark.jvm_cds``);
* :mod:`dstreams.spark.jvm_compiled`, :mod:`dstreams.spark.jvm_signals`: JVM classes compiled at start-up
  (the batch builder behind :mod:`~dstreams.spark.jvm`; the signal forwarder);
* :mod:`dstreams.spark.worker_daemon`: the PySpark worker daemon (``spark.python.daemon.module``);
* :mod:`dstreams.spark.executors`: the check that the executors can import what the engine's tasks need;
* :mod:`dstreams.spark.arrow`: ``mapInArrow``-style partition functions for the fluent API.

Rules: this package imports nothing of the streaming model beyond the two leaf modules ``dstreams.config``
(the settings table) and ``dstreams.records`` (per-record partition functions); and this ``__init__``
imports nothing at all, because the worker daemon runs as ``python -m`` before it cleans ``sys.path``
(importing pyspark here would load it from Spark's zip archives first).
"""
