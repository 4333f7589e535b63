"""Receive a round's replies one at a time, as they arrive.

Flower's ``Grid.send_and_receive`` returns only when every reply has come (or the timeout has
passed), holding all of them in memory, and the deployment grid polls the SuperLink every
3 s. :func:`stream_replies` pushes the messages and yields each reply as soon as it is pulled,
so a strategy can fold it in (add it to a running average, turn it into teacher logits) and
drop it while slower clients are still training; it polls every ``poll_interval`` seconds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from flwr.app import Message
from flwr.serverapp import Grid


def stream_replies(
    grid: Grid, messages: Iterable[Message], timeout: float, poll_interval: float = 0.2
) -> Iterator[Message]:
    """Push ``messages``; yield their replies in arrival order until all came or ``timeout``."""
    own = getattr(grid, "stream", None)
    if own is not None:  # the in-process grid serves the nodes itself
        yield from own(messages, timeout=timeout)
        return
    pending = set(grid.push_messages(messages))
    deadline = time.monotonic() + timeout
    while pending:
        for reply in grid.pull_messages(pending):
            pending.discard(reply.metadata.reply_to_message_id)
            yield reply
        if not pending:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(poll_interval, left))
