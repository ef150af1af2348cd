"""Fixtures of the fault tests: ``host_cluster``, the three-host standalone cluster (:mod:`.cluster_support`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster_support import SharedCluster


@pytest.fixture(scope="module")
def host_cluster() -> Iterator[SharedCluster]:
    """One :class:`SharedCluster` per test module that asks for it, started by its first test
    (:meth:`SharedCluster.master_listening`; the start is the tests' slowest step) and stopped when the module
    ends. Tests that use it must not run concurrently with another module's cluster (the same loopback hosts)."""
    shared = SharedCluster()
    try:
        yield shared
    finally:
        shared.close()
