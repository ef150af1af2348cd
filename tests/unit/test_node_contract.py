"""The node contract of ``dstreams/node.py`` (issue 41 item 2): a node is as small as Spark's DStream.

:class:`~dstreams.node.DStreamNode` has six members a subclass may override (:data:`OVERRIDABLE`): the three of the
model (``slide_duration``, ``dependencies``, ``compute``), ``describe_params`` (the fingerprint),
``parent_remember_duration`` (a window's) and ``checkpoint_data`` (the per-stream checkpoint-data object the
recovery layer drives). Every other method and property of the base class is ``typing.final`` (mypy rejects an
override), and no node of the library overrides one, nor replaces a data member of the base class (``must_checkpoint``,
``checkpoint_interval``...) with a property or a method. Python's own protocol (``__init__``, ``__getstate__``...) is
not part of the contract.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
import textwrap
from typing import Any

import pytest

import dstreams
from dstreams.checkpoint_data import CheckpointData
from dstreams.node import DStreamNode
from dstreams.time import BatchTime, Duration

#: The members of DStreamNode a subclass may override.
OVERRIDABLE = {"slide_duration", "dependencies", "compute", "describe_params", "parent_remember_duration",
               "checkpoint_data"}
#: Packages not imported by the walk: applications of the library, and the Spark plumbing (which imports nothing of
#: the streaming model: ``tests/unit/test_layers.py``).
SKIPPED = ("dstreams.examples", "dstreams.spark")


def _is_behaviour(value: Any) -> bool:
    return inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod))


def _behaviour(cls: type) -> dict[str, Any]:
    """The methods and properties ``cls`` itself defines (not Python's protocol: ``__init__``, ``__getstate__``...)."""
    return {n: v for n, v in vars(cls).items() if _is_behaviour(v) and not (n.startswith("__") and n.endswith("__"))}


def _is_final(value: Any) -> bool:
    func = value.fget if isinstance(value, property) else value
    return bool(getattr(func, "__final__", False))


def _base_data() -> set[str]:
    """The data members of the base class: its class attributes and what its ``__init__`` sets on ``self``."""
    names = {n for n, v in vars(DStreamNode).items() if not _is_behaviour(v) and not n.startswith("__")}
    tree = ast.parse(textwrap.dedent(inspect.getsource(DStreamNode.__init__)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and \
                isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return names


def _violations(cls: type) -> list[str]:
    """What ``cls`` overrides of the base class beyond :data:`OVERRIDABLE`."""
    base, data = _behaviour(DStreamNode), _base_data()
    out = []
    for name, value in _behaviour(cls).items():
        if name in OVERRIDABLE:
            continue
        if name in base:
            out.append(f"{cls.__module__}.{cls.__qualname__}.{name} overrides a final member of DStreamNode")
        elif name in data:
            out.append(f"{cls.__module__}.{cls.__qualname__}.{name} replaces a data member of DStreamNode with a "
                       f"{type(value).__name__}")
    return out


def _library_nodes() -> list[type]:
    """Every subclass of DStreamNode the library defines (each module of it imported first)."""
    for info in pkgutil.walk_packages(dstreams.__path__, "dstreams."):
        if not info.name.startswith(SKIPPED):
            importlib.import_module(info.name)
    found: list[type] = []
    todo = [DStreamNode]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return [c for c in found if c.__module__.startswith("dstreams.")]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.final marks functions at run time from Python 3.11")
def test_the_base_class_has_six_overridable_members_and_marks_the_rest_final():
    members = _behaviour(DStreamNode)
    overridable = {name for name, value in members.items() if not _is_final(value)}
    assert overridable == OVERRIDABLE, f"not final: {sorted(overridable - OVERRIDABLE)}; " \
                                       f"final or missing: {sorted(OVERRIDABLE - overridable)}"
    assert len(overridable) <= 6
    for name in ("get_or_compute", "clear_metadata", "remember", "slice", "is_time_valid", "adopt_checkpoint",
                 "restore_from_checkpoint", "release", "name", "key_name"):
        assert _is_final(members[name]), name


def test_no_node_of_the_library_overrides_a_member_outside_the_six():
    nodes = _library_nodes()
    names = {c.__name__ for c in nodes}
    # the walk reached every kind: sources, state backends, windows, event time, outputs
    assert {"InputNode", "KafkaInputNode", "RedisStreamsInputNode", "FileInputNode", "StateNode",
            "ReducedWindowNode", "EventTimeNode", "OutputNode", "TransformedNode",
            "StateViewNode"} <= names, sorted(names)
    violations = [v for cls in nodes for v in _violations(cls)]
    assert not violations, "\n".join(violations)


def test_the_checker_sees_an_override():
    """The walk's check is not vacuous: a node that overrides a final member, or turns a data member of the base
    class into a property, is reported."""

    class Bad(DStreamNode):
        @property
        def name(self) -> str:  # type: ignore[misc]
            return "bad"

        @property
        def must_checkpoint(self) -> bool:  # type: ignore[override]
            return True

        def compute(self, time: BatchTime) -> Any:
            return None

    found = _violations(Bad)
    assert len(found) == 2 and "Bad.name overrides a final member" in found[0] + found[1], found
    assert any("must_checkpoint replaces a data member" in v for v in found), found


def test_the_default_checkpoint_data_records_nothing_and_checkpoints_the_rdd_as_it_is():
    class Node:
        remember_duration = Duration(1000)

    data = CheckpointData(Node())  # type: ignore[arg-type]
    rdd = object()
    assert data.batch_record(BatchTime(1000)) is None and data.node_state() is None
    assert data.partitioner is None and data.reads_to_verify({}) is True
    assert data.export(1000, rdd) == (rdd, {})  # type: ignore[arg-type]
