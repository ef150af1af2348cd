"""The status server of a running StreamingContext: a live page, the same data as JSON, Prometheus metrics.

``StreamingContext.start()`` starts one (:class:`StatusServer`, on by default, port 4050: see
``spark.dstreams.ui.*`` in :mod:`dstreams.config`) and ``stop()`` stops it; ``ssc.uiWebUrl`` is its URL.
:mod:`.model` builds the JSON documents from the listener bus and the running context's public parts,
:mod:`.metrics` the context's own Prometheus registry, :mod:`.server` serves them; the page is
``static/`` (no network access at run time). The endpoints and metrics are
listed in docs/guide/monitoring.md and docs/reference/metrics.md.
"""

from __future__ import annotations

from .model import BatchHistory, StatusModel, StatusSources
from .server import StatusServer

__all__ = ["BatchHistory", "StatusModel", "StatusServer", "StatusSources"]
