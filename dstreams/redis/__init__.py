"""The Redis Streams connector: everything dstreams does with Redis Streams, in one place.

* :mod:`.source`: ``ssc.redisStream`` (the direct source: each batch's ranges fixed when the batch is generated,
  stored in the metadata log and read again after a failure, so a batch holds the same entries on every run);
* :mod:`.sink`: ``saveToRedisStream`` (exactly once by idempotent, batch-derived entry ids) and its dead letters.

The connector layer sits above the streaming model and recovery (it uses the fence, the retry policy and the
fault points of :mod:`dstreams.recovery`) and below the API, which imports it; nothing of the engine or of recovery
imports it (tests/unit/test_layers.py).
"""
