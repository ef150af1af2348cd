"""The user-facing layer of dstreams: the StreamingContext and the fluent DStream.

It delegates every piece of engine logic to ``dstreams`` (nodes, graph, scheduler); users import
from ``dstreams`` directly (``from dstreams import StreamingContext``).
"""
