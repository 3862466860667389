"""The user side's IOPub, made whole again after its SSH forward was down (issue 42).

The kernel's IOPub reaches the user side through an SSH port forward; while the forward is down
or silent (a partition), what the kernel publishes is dropped, and when the forward comes back
(``compute/sshlink.py``, each time counted in the tunnel's ``restarts``) the user side's SUB socket
connects again. The first message that comes after such a restart makes :class:`CatchUp` ask the
worker what the kernel published after the last message this side passed on
(``worker/iopub_log.py``, ``GET /kernel/iopub``) and pass on, in the kernel's order, each message
it has not passed on yet, before that one; a message that then comes live a second time is
dropped. One CatchUp follows one IOPub connection (a websocket's, a kernel client's): each
message reaches it once, in the order the kernel sent them.

The question travels the kernel's own SSH forward (``AgentClient.forward_kernel`` forwards the
worker's API with the kernel's ports), so the way to ask is back as soon as the IOPub is: a
forward of its own came back up to seconds later, and the live messages passed on meanwhile went
before the missed ones. The worker's record may not have taken in the last message passed on
here yet (its watcher hears the kernel as this side does, often a few milliseconds later); it
then answers everything it holds, and only what follows the newest message passed on here is
new (never another cell's output, or old statuses, from before this connection). (The kernel's ``iopub_welcome`` is
no such sign: its XPUB reports only the first subscription, and the worker's watcher holds one.)
"""

from __future__ import annotations

import base64
import collections
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger("jupyter_portable")

# message ids remembered as passed on: more than the worker keeps (worker/iopub_log.MAX_MESSAGES),
# so nothing the worker still holds is passed on twice
SEEN = 8192


class CatchUp:
    """Decides, message by message, what one IOPub connection passes on.

    ``fetch(msg_id)`` is the worker's ``GET /kernel/iopub?after=msg_id`` answer (``AgentClient.iopub_after``);
    ``restarts()`` counts the times the connection's forwards started again (``AgentClient.forward_restarts``)."""

    def __init__(self, fetch: Callable[[str], dict[str, Any]], restarts: Callable[[], int],
                 seen: int = SEEN) -> None:
        self._fetch = fetch
        self._restarts = restarts
        self._count = restarts()
        self._seen: set[str] = set()
        self._order: collections.deque[str] = collections.deque()
        self._limit = seen
        self.last = ""  # the msg_id of the last message passed on
        self._since = ""  # set while the worker is to be asked what came after it
        self.caught_up = 0  # how many missed messages were passed on (for tests and logs)

    def passing(self, msg_id: str) -> list[list[bytes] | None]:
        """For a message that came live, what to pass on, in the kernel's order: the frames of each
        missed message (as the kernel sent them), ``None`` where the live message itself goes; an
        empty list for a message passed on already."""
        if msg_id and msg_id in self._seen:
            return []  # passed on already, from the worker's record
        out: list[list[bytes] | None] = []
        count = self._restarts()
        if count != self._count and self.last and not self._since:
            self._since = self.last  # the last message passed on before the forward went down
        missed = self._missed() if self._since else []
        if missed is None:
            # the worker's own forward may come back later: asked again (since the same message) with
            # the next one; what it then passes on comes after the messages that went on meanwhile
            missed = []
        else:
            self._count, self._since = count, ""
        for entry in missed or []:
            mid = str(entry.get("msg_id") or "")
            if not mid or mid in self._seen:
                continue
            self._remember(mid)
            if mid == msg_id:
                out.append(None)  # the live message, in its place
            else:
                out.append([base64.b64decode(f) for f in entry.get("frames") or []])
                self.caught_up += 1
            self.last = mid
        if None not in out:
            out.append(None)
            if msg_id:
                self._remember(msg_id)
                self.last = msg_id
        return out

    def _missed(self) -> list[dict[str, Any]] | None:
        """What the worker holds after the message ``_since``; None when it could not be asked."""
        try:
            answer = self._fetch(self._since)
        except Exception as exc:  # never hold up the live messages: asked again with the next one
            log.info("jupyter-portable: the kernel's output while its connection was down not fetched yet: %s", exc)
            return None
        messages = answer.get("messages")
        kept = [m for m in messages if isinstance(m, dict)] if isinstance(messages, list) else []
        if answer.get("found"):
            return kept
        # Not found: the worker's record has not taken in that message yet (its watcher hears the kernel
        # as this side does, and is often a few milliseconds behind: a forward that came back just after
        # it was passed on asks at once), or it has moved on past it (more than it keeps). Its answer is
        # everything it holds, from before this connection's first message too (another cell's output,
        # old statuses): only what comes after the newest message passed on here is new to this side.
        ids = [str(m.get("msg_id") or "") for m in kept]
        passed = [i for i, mid in enumerate(ids) if mid in self._seen]
        if passed:
            return kept[passed[-1] + 1:]
        log.warning("jupyter-portable: the worker no longer holds the kernel's output since %s: passing on "
                    "all it holds (%d messages)", self._since, len(kept))
        return kept

    def _remember(self, msg_id: str) -> None:
        self._seen.add(msg_id)
        self._order.append(msg_id)
        while len(self._order) > self._limit:
            self._seen.discard(self._order.popleft())


__all__ = ["CatchUp"]
