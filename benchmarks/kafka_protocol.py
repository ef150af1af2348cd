"""The protocol between ``python -m benchmarks kafka`` and one engine process (:mod:`benchmarks.kafka_apps`,
:mod:`benchmarks.kafka_quix`): the process prints :data:`READY` when it consumes, stops when a line ``stop`` (or
the end of stdin) arrives, and prints :data:`RESULT` followed by its JSON figures last.

Standard library only: the Quix Streams process imports it from its own virtualenv.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

READY = "KAFKA_APP_READY"
RESULT = "KAFKA_APP_RESULT "


def on_stop_line(stop: Callable[[], None]) -> None:
    """Call ``stop`` (once, from a daemon thread) when stdin says ``stop`` or ends."""

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop()

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()
