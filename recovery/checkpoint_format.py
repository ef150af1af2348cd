"""The checkpoint format check: one number for everything a checkpoint location holds.

Contract: every object written to a checkpoint location carries :data:`~dstreams.contracts.FORMAT`, the one
format number of dstreams (the metadata log's head, the stored graph's header, each data checkpoint's manifest, the
header byte of every encoded part: data checkpoints, the state changelog, the write-ahead log; and the store file of
every state snapshot part). A reader meeting another number raises :class:`CheckpointFormatError`, naming the object,
both numbers and what to do, instead of interpreting the object: a restarted driver refuses the location at start (the
head is read before anything else), and no code reads another format. (The executor state store's local files carry
the number too, but they are a cache: one of another format is deleted and rebuilt from the checkpoint,
:mod:`dstreams.statestore`.)
"""

from __future__ import annotations

from dstreams.contracts import FORMAT
from dstreams.errors import DStreamsError


class CheckpointFormatError(DStreamsError, ValueError):
    """The checkpoint location (or an object in it) was written in another checkpoint format than the one this
    dstreams reads (:data:`~dstreams.contracts.FORMAT`). The message names the object and both
    formats; the way out is a new checkpoint location, or the dstreams version that wrote this one."""


def format_message(what: str, found: object) -> str:
    """The error text for ``what`` (an object or location) written in format ``found``: what failed and what to do."""
    import dstreams

    return (f"{what} was written in checkpoint format {found!r}; this dstreams ({dstreams.__version__}) reads "
            f"checkpoint format {FORMAT} only. Start from a new checkpoint location (the state and "
            "offsets in this one are not carried over), or resume this location with the dstreams version that "
            "wrote it")


def check_format(found: object, what: str) -> None:
    """Raise :class:`CheckpointFormatError` unless ``found`` (the ``format`` an object carries) is
    :data:`~dstreams.contracts.FORMAT`; ``what`` names the object in the message."""
    if type(found) is not int or found != FORMAT:
        raise CheckpointFormatError(format_message(what, found))
