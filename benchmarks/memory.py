"""Peak memory of a benchmark child: its Python driver, the Spark JVM and the Python workers.

Contract: :class:`PeakMemory` samples, every ``period_s`` on a daemon thread, the resident set size
(``/proc/<pid>/status`` ``VmRSS``) of the driver process, of the JVM (driver and executor share it in
``local[N]`` mode) and the sum over the JVM's Python worker processes (the daemon and its forked
workers); :meth:`PeakMemory.reset` starts a new peak, :meth:`PeakMemory.peaks` returns MiB. Linux only;
elsewhere every figure is ``None``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def _rss_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class PeakMemory:
    """Sampled peak RSS of the driver, the JVM and the JVM's Python workers (MiB)."""

    def __init__(self, jvm_pid: int | None, period_s: float = 0.5) -> None:
        self.jvm_pid = jvm_pid
        self.period_s = period_s
        self._peaks = {"driver_python_mb": 0.0, "jvm_mb": 0.0, "python_workers_mb": 0.0}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-memory", daemon=True)
        self.available = Path("/proc/self/status").exists()

    def start(self) -> PeakMemory:
        if self.available:
            self._thread.start()
        return self

    def sample(self) -> None:
        me = _rss_kib(os.getpid()) or 0
        jvm = _rss_kib(self.jvm_pid) or 0 if self.jvm_pid else 0
        workers = sum(_rss_kib(p) or 0 for p in _descendants(self.jvm_pid)) if self.jvm_pid else 0
        with self._lock:
            for key, kib in (("driver_python_mb", me), ("jvm_mb", jvm), ("python_workers_mb", workers)):
                self._peaks[key] = max(self._peaks[key], kib / 1024.0)

    def _loop(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                self.sample()
            except Exception:  # a process vanished mid-scan
                pass

    def reset(self) -> None:
        with self._lock:
            for key in self._peaks:
                self._peaks[key] = 0.0

    def peaks(self) -> dict[str, float | None]:
        if not self.available:
            return dict.fromkeys(self._peaks)
        self.sample()
        with self._lock:
            return {k: round(v, 1) for k, v in self._peaks.items()}

    def stop(self) -> None:
        self._stop.set()
