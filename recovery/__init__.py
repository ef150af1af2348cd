"""Recovery: checkpoint stores, the retry policy and fault injection used by the tests.

Installed as ``dstreams.recovery``. The store layer lives in :mod:`dstreams.recovery.store`
(``open_store``) and the single retry policy in :mod:`dstreams.recovery.retry`.
"""
