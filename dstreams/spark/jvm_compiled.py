"""A small JVM class, compiled in the driver's JVM at start-up, that builds a batch's RDDs in one call each.

Building one Python RDD through Py4J takes four round trips (the parent's Scala RDD, the Python
function object, the ``PythonRDD``, its Java view), a persisted one five, a shuffle nine; each round
trip costs 0.1-1 ms on a busy driver. :data:`SOURCE` does those steps inside the JVM: the Python
side makes one call per RDD it builds.

The class is compiled from source by Janino (the runtime compiler Spark SQL ships for its generated
code, on every PySpark classpath), so no jar and no JDK are needed. When that is not possible (a
Spark without Janino, a changed constructor) :func:`compile_builder` raises and the caller
(:meth:`dstreams.spark.jvm.Bridge.builder`) falls back to PySpark's own calls.

Contract of the compiled ``BatchBuilder`` (one per SparkContext):

* ``setContext(env, includes, pythonExec, pythonVer, broadcasts, accumulator)`` fixes what every
  Python function it builds carries (PySpark's ``SimplePythonFunction`` arguments besides the command);
* ``pipe(parent, command, preservesPartitioning, barrier, level)`` is PySpark's ``PipelinedRDD._jrdd``:
  ``PythonRDD(parent.rdd(), function(command), ...).asJavaRDD()``, persisted at ``level`` unless null;
* ``shuffle(parent, command, barrier, partitioner)`` is the JVM half of PySpark's ``partitionBy``:
  the bucketing ``PythonRDD`` over ``parent``, a ``PairwiseRDD``, ``partitionBy(partitioner)`` and
  ``PythonRDD.valueOfPair``;
* ``union(a, b, ..., h)`` is ``JavaSparkContext.union`` of the leading non-null arguments (one flat
  union: partition-aware when they share a partitioner, as Spark decides);
* ``numPartitions(rdd)`` is ``rdd.getNumPartitions()``.
"""

from __future__ import annotations

import threading
from typing import Any

CLASS_NAME = "dstreams.jvm.BatchBuilder"

# Raw types only: Janino parses type arguments but does not check them.
SOURCE = """
package dstreams.jvm;

import java.util.List;
import java.util.Map;
import org.apache.spark.Partitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.python.PairwiseRDD;
import org.apache.spark.api.python.PythonRDD;
import org.apache.spark.api.python.SimplePythonFunction;
import org.apache.spark.storage.StorageLevel;
import org.apache.spark.util.CollectionAccumulator;

public class BatchBuilder {
    private Map env;
    private List includes;
    private String pythonExec;
    private String pythonVer;
    private List broadcasts;
    private CollectionAccumulator accumulator;

    public void setContext(Map env, List includes, String pythonExec, String pythonVer, List broadcasts,
                           CollectionAccumulator accumulator) {
        this.env = env;
        this.includes = includes;
        this.pythonExec = pythonExec;
        this.pythonVer = pythonVer;
        this.broadcasts = broadcasts;
        this.accumulator = accumulator;
    }

    private PythonRDD python(JavaRDD parent, byte[] command, boolean preserves, boolean barrier) {
        SimplePythonFunction function = new SimplePythonFunction(
            command, env, includes, pythonExec, pythonVer, broadcasts, accumulator);
        return new PythonRDD(parent.rdd(), function, preserves, barrier);
    }

    public JavaRDD pipe(JavaRDD parent, byte[] command, boolean preserves, boolean barrier, StorageLevel level) {
        JavaRDD out = python(parent, command, preserves, barrier).asJavaRDD();
        if (level != null) {
            out.persist(level);
        }
        return out;
    }

    public JavaRDD shuffle(JavaRDD parent, byte[] command, boolean barrier, Partitioner partitioner) {
        PythonRDD keyed = python(parent, command, true, barrier);
        JavaPairRDD pairs = new PairwiseRDD(keyed).asJavaPairRDD();
        return PythonRDD.valueOfPair(pairs.partitionBy(partitioner));
    }

    public JavaRDD union(JavaRDD a, JavaRDD b, JavaRDD c, JavaRDD d, JavaRDD e, JavaRDD f, JavaRDD g, JavaRDD h) {
        JavaRDD[] given = new JavaRDD[] {a, b, c, d, e, f, g, h};
        int n = 0;
        while (n < given.length && given[n] != null) {
            n++;
        }
        JavaRDD[] rdds = new JavaRDD[n];
        System.arraycopy(given, 0, rdds, 0, n);
        return JavaSparkContext.fromSparkContext(a.context()).union(rdds);
    }

    public int numPartitions(JavaRDD rdd) {
        return rdd.getNumPartitions();
    }
}
"""


#: The classes compiled so far, per JVM (its Py4J gateway client) and class name.
_compiled: dict[tuple[int, str], tuple[Any, Any]] = {}
_compiled_lock = threading.Lock()


def compiled_class(jvm: Any, anchor: Any, source: str, class_name: str) -> Any:
    """The ``java.lang.Class`` named ``class_name`` compiled from ``source`` by Janino, its class loader a
    child of ``anchor``'s (a Spark object); compiled once per JVM and reused by every later SparkContext.

    Once per JVM matters: Py4J caches the reflected methods it calls by class *name*, so a second class of
    the same name (compiled again for a second SparkContext in one Python process, as a notebook makes)
    would be called through the first one's methods and fail ("object is not an instance of declaring
    class"). Raises ``Py4JError`` when Janino is missing or the source does not compile."""
    client = getattr(jvm, "_gateway_client", None)
    key = (id(client), class_name)
    with _compiled_lock:
        known = _compiled.get(key)
        if known is not None and known[0] is client:
            return known[1]
        compiler = jvm.org.codehaus.janino.SimpleCompiler()
        compiler.setParentClassLoader(anchor.getClass().getClassLoader())
        compiler.cook(source)
        cls = compiler.getClassLoader().loadClass(class_name)
        _compiled[key] = (client, cls)  # the client is kept, so its id is not reused by another
        return cls


def compile_builder(jvm: Any, anchor: Any) -> Any:
    """A new ``BatchBuilder`` in the JVM behind ``jvm`` (its class: :func:`compiled_class`). Raises
    ``Py4JError`` when Janino is missing or the source does not compile against this Spark."""
    return compiled_class(jvm, anchor, SOURCE, CLASS_NAME).newInstance()
