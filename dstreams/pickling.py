"""Pickling what the engine stores: data checkpoints, executor state store values, ``saveToStore``'s pickle files.

Contract of :func:`dumps`: the bytes of the standard ``pickle`` when it can pickle the value (the common case, and
the fastest), else those of PySpark's ``cloudpickle``, which pickles by value what the standard pickle can only
refer to by name: classes and functions of a script's ``__main__``, local classes, lambdas. PySpark ships records
between processes with cloudpickle, so a state of a class defined in the driver's script works in a batch; a
checkpoint of it must work too. Both are read back by :func:`pickle.loads` (cloudpickle's output needs only
``pyspark`` importable, as it is wherever dstreams runs).
"""

from __future__ import annotations

import pickle
from typing import Any


def dumps(obj: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> bytes:
    """``obj``'s bytes (module docstring)."""
    try:
        return pickle.dumps(obj, protocol)
    except (pickle.PicklingError, TypeError, AttributeError):
        from pyspark import cloudpickle

        return cloudpickle.dumps(obj, protocol)
