"""Applications built on dstreams, no part of the library: they use its public surface only.

Installed as ``dstreams.examples`` (the folder is ``examples/`` in the checkout, as ``api/`` installs as
``dstreams.api``), so that ``python -m dstreams.examples.demo`` runs from an installed wheel too.

* :mod:`dstreams.examples.demo`: the main job, a streaming word count (``bash scripts/demo.sh``).
"""
