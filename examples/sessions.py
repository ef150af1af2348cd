"""User sessions with ``track``: the D-Streams paper's state tracking, one state per active user.

    sessions = clicks.map(lambda c: (c.user, c)).track(start_session, add_click, timeout="3s")

``track(init, update, timeout)`` keeps a state per key: the first event of a key makes it with
``init(key, event)``, each later one updates it with ``update(key, state, event)``, and a key that gets no
event for ``timeout`` (batch time) is dropped: the session has ended, and the user's next click starts a new
one. Every batch emits ``(key, state)`` for the live keys. Here a session counts its clicks and the distinct
pages seen, from its first to its last click. The clicks come from ``generatorStream`` (deterministic):
a few hundred users, each clicking now and then.

Run it::

    python -m dstreams.examples.sessions                    # 10 s of 1 s batches, session timeout 3 s
    python -m dstreams.examples.sessions --timeout 5s --seconds 0         # until Ctrl-C

After every batch it prints the number of live sessions and the busiest ones::

    batch 1735732805000 (12:00:05): 212 live sessions; busiest: user17 5 clicks 4 pages 3.4 s, user3 4 clicks ...
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import namedtuple
from datetime import datetime

from dstreams import StreamingContext

#: A click: who, on which page, when (seconds since the epoch).
Click = namedtuple("Click", "user page ts")
#: A session's state: first and last click time, number of clicks, the pages seen.
Session = namedtuple("Session", "start end clicks pages")

PAGES = ("/", "/search", "/products", "/products/42", "/cart", "/checkout", "/help")
USERS = 300
PARTITIONS = 2


def clicks(seed: int, batch_ms: int, partition: int, n: int) -> list[Click]:
    """The ``n`` clicks of one partition of the batch at ``batch_ms`` (deterministic; users of partition ``p``
    are ``user<i>`` with ``i % PARTITIONS == p``, as if the source were partitioned by user)."""
    rng = random.Random(f"{seed}:{batch_ms}:{partition}")
    return [Click(f"user{rng.randrange(partition, USERS, PARTITIONS)}", rng.choice(PAGES),
                  round(batch_ms / 1000 - rng.random(), 3)) for _ in range(n)]


def start_session(user: str, click: Click) -> Session:
    """``track``'s ``init``: a user's first click (after a timeout: again) starts a session."""
    return Session(click.ts, click.ts, 1, frozenset([click.page]))


def add_click(user: str, s: Session, click: Click) -> Session:
    """``track``'s ``update``: each further click extends the session (return None to end it at once)."""
    return Session(min(s.start, click.ts), max(s.end, click.ts), s.clicks + 1, s.pages | {click.page})


def busiest(n: int):
    """A ``foreachRDD`` output: the number of live sessions and the ``n`` with the most clicks."""

    def show(time: datetime, rdd) -> None:  # noqa: ANN001 (an RDD)
        live = rdd.count()
        top = rdd.takeOrdered(n, key=lambda kv: (-kv[1].clicks, kv[0]))
        ms = round(time.timestamp() * 1000)
        print(f"batch {ms} ({time.astimezone():%H:%M:%S}): {live} live sessions; busiest: "
              + ", ".join(f"{user} {s.clicks} clicks {len(s.pages)} pages {s.end - s.start:.1f} s" for user, s in top),
              flush=True)

    return show


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description="User sessions with track(init, update, timeout).")
    p.add_argument("--batch", default="1s", help="batch interval (default 1s)")
    p.add_argument("--timeout", default="3s", help="a session ends after this long without a click (default 3s)")
    p.add_argument("--rate", type=int, default=100, help="clicks per batch (default 100)")
    p.add_argument("--top", type=int, default=3, help="how many sessions to show (default 3)")
    p.add_argument("--seconds", type=float, default=10, help="how long to run; 0: until Ctrl-C (default 10)")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--checkpoint", help="checkpoint folder or s3:// URL (default: a temporary folder)")
    p.add_argument("--master", default="local[*]")
    args = p.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="dstreams-sessions-") as tmp:
        ssc = StreamingContext.local(args.batch, master=args.master, appName="sessions")
        ssc.checkpoint(args.checkpoint or tmp)

        events = ssc.generatorStream(max(1, args.rate // PARTITIONS), PARTITIONS, seed=args.seed,
                                     recordFunc=clicks)
        sessions = events.map(lambda c: (c.user, c)).track(start_session, add_click, timeout=args.timeout)
        sessions.foreachRDD(busiest(args.top))

        ssc.start()
        try:
            if args.seconds > 0:
                ssc.awaitTerminationOrTimeout(args.seconds)
            else:
                ssc.awaitTermination()
        finally:
            ssc.stop(stopSparkContext=True, stopGraceFully=True)


if __name__ == "__main__":
    main()
