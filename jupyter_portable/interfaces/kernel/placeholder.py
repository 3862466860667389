"""The kernel a notebook has while its workspace has no machine (LOST, RELEASED, FAILED, or no
machine yet). Each cell's error says the workspace's state as it is when the cell runs, in the
words of ``core/state_words.py``.

The provisioner (``orchestration/provisioner.py``) starts it locally in place of the portable
kernel. It never runs code: every cell gets, at once, the error "No GPU machine: press Continue
in the portable sidebar" with the route a Continue would take. A cell sent while a Continue is
under way is held (the notebook shows it queued) until the kernel moves; the notebook then runs
it again on the new machine. ``JUPYTER_PORTABLE_NO_MACHINE`` (JSON: state, reason, route, first)
says what to tell (``ask``: the server's notebooks ask before renting, c.Portable.first_machine).

No machine yet, or released (``first``: the states whose words say ``ask``): where a notebook
has said it will ask the user (the control message ``portable_first_machine_request`` with
``asker``), the first cell is held while the user
answers: Start begins a Continue and the cell is held until the kernel moves; Cancel (the same
message with ``answer: cancel``), an interrupt, a failed start (``answer: failed`` with its
reason) or a Continue that ends FAILED ends the cell at once with an error saying what happened
and how to start. With no notebook to ask, the cell gets that error at once; and a notebook that
does not say it asks (``asking``) within ``ASK_WAIT_S`` of the cell (a page closed, a question
that was never shown) ends it too, saying so: nothing hangs. The route each outcome names is the
one the notebook's question named (``route``, sent as it asks and again with the answer), not the one
of the kernel's start (after a stop, the provisioner names the stopped machine's own route first).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from typing import Any

from ipykernel.kernelbase import Kernel

NO_MACHINE_ENV = "JUPYTER_PORTABLE_NO_MACHINE"
WORKSPACE_ENV = "JUPYTER_PORTABLE_WORKSPACE"
SERVER_PID_ENV = "JUPYTER_PORTABLE_SERVER_PID"  # the server that started it: it ends with that one
ERROR_NAME = "NoGPUMachine"
FIRST_MACHINE_MSG = "portable_first_machine_request"  # a control message: {asker} or {answer, reason}
START_HINT = "To start one, run a cell again and press Start, or press Continue in the portable sidebar."
NO_ROUTE_HINT = ("To open a route, raise the budget or the $/h cap (the portable settings, or `jupyter portable "
                 "settings`), then run the cell again.")
ASK_WAIT_S = 10.0  # a held first cell waits this long for the notebook to say it asks the user


def route_text(route: dict[str, Any] | None, known: bool = True) -> str:
    """The route a Continue would take, in words ("1x NVIDIA L4 on local/l4 (local-a) at $0.40/h");
    ``known``: whether ``route`` is as it stands now (else only the sidebar can say)."""
    if not route:
        if not known:
            return "see the routes in the portable sidebar"
        return "no route is open now: see the portable sidebar's routes"
    return (f"{route.get('gpu_count', 1)}x {route.get('gpu')} on {route.get('provider')}/{route.get('offer')} "
            f"({route.get('region')}) at ${float(route.get('price_per_hour') or 0):.2f}/h")


ROUTE_KEYS = ("id", "gpu", "gpu_count", "provider", "offer", "region", "price_per_hour")


def state_text(state: str, reason: str = "", version: int | None = None) -> str:
    """The workspace's state in the words every view uses (core/state_words.py), and why."""
    from jupyter_portable.core import state_words

    if state not in state_words.WORDS:
        return "The workspace has no machine" + (f": {reason}" if reason else "") + "."
    return f"The workspace is {state_words.state_line(state, version)}" + (f" ({reason})" if reason else "") + "."


def no_machine_message(facts: dict[str, Any], now: tuple[str, str, int | None] | None = None) -> tuple[str, str]:
    """(evalue, traceback text) of the error every cell gets; ``now``: the lifecycle file's
    (state, reason, version) when it could be read, which wins over what the kernel was started with."""
    state, reason, version = now if now and now[0] else (str(facts.get("state") or ""),
                                                       str(facts.get("reason") or ""), None)
    if state == facts.get("state") and facts.get("reason"):
        reason = str(facts["reason"])  # the server's words for the state the kernel was started in
    head = "No GPU machine: press Continue in the portable sidebar"
    if facts.get("first") and state in ("", "IDLE"):
        head = ("No GPU machine yet, and nothing was rented: press Continue in the portable sidebar "
                "(or run `jupyter portable continue`) to rent one")
    lines = [head, state_text(state, reason, version),
             f"Continue would take: {route_text(facts.get('route'))}"]
    return head, "\n".join(lines)


def first_machine_outcome(facts: dict[str, Any], answer: str, reason: str = "", state: str = "") -> tuple[str, str]:
    """(evalue, traceback text) of a first cell (or the first after a release) whose start was
    cancelled or failed; ``state``: the workspace's state now, where known."""
    state = state or str(facts.get("state") or "IDLE")
    # the route the question named (its answer carries it), else the last the notebook read
    known = facts.get("route_told", True) is not False
    route = facts.get("route") if known else None
    if answer == "cancel":
        # the question was answered before anything was rented: no machine exists to be cancelled
        asked = f" to rent {route_text(route)}" if route else ""
        head = f"Nothing was rented: the question{asked} was cancelled, and the workspace stays {state}"
    elif answer == "continue-cancelled":
        head = f"The Continue was cancelled before the kernel moved to a machine, and the workspace stays {state}"
    elif answer == "starting":
        head = "Not run here: the first machine is starting, and the notebook runs this cell there once it is ready"
    elif answer == "unasked":
        head = "No machine was started: the notebook did not ask whether to rent one (is its page open?)"
    else:
        head = "No machine was started" + (f": {reason}" if reason else "")
    # a Continue that ended FAILED leaves the workspace so: the notebook asks again only while IDLE
    hint = ("Press Continue in the portable sidebar to choose a route (each blocked one says why)."
            if answer == "continue-failed" else NO_ROUTE_HINT if reason.startswith("no route is open")
            else START_HINT)
    lines = [head, hint, f"Continue would take: {route_text(route, known)}"]
    return head, "\n".join(lines)


def _lifecycle() -> tuple[str, str]:
    """The workspace's state now and the reason of its last move, from its lifecycle file."""
    state, reason, _ = _lifecycle_now()
    return state, reason


def _lifecycle_now() -> tuple[str, str, int | None]:
    """The workspace's state, the reason of its last move and its version, from its lifecycle file."""
    from jupyter_portable.core.errors import PortableError
    from jupyter_portable.engine.workspace import Workspace
    from jupyter_portable.workdir import lifecycle_file

    try:
        ws = Workspace.find(os.environ.get(WORKSPACE_ENV) or os.getcwd())
        lc = lifecycle_file.load(ws.copy)
    except PortableError:
        return "", "", None
    from jupyter_portable.orchestration.idle import no_machine_hint

    idle = no_machine_hint(lc)  # released as idle: why, and how to continue on the same route
    reason = idle[0] if idle is not None else str(lc.events[-1].reason or "") if lc.events else ""
    return lc.state, reason, lc.version


def _asks(state: str) -> bool:
    """A cell run in ``state`` asks before renting (no machine yet, or released): state_words' ``ask``."""
    from jupyter_portable.core import state_words

    return state == "" or (state in state_words.WORDS and state_words.WORDS[state].ask)


def _continuing() -> bool:
    """Whether a Continue of this workspace is under way now (its lifecycle file says so)."""
    from jupyter_portable.core import lifecycle as L

    return _lifecycle()[0] in L.CONTINUE_STATES


class PlaceholderKernel(Kernel):  # type: ignore[misc]
    """Answers every cell with the no-machine error; holds cells sent during a Continue."""

    implementation = "portable-placeholder"
    implementation_version = "1"
    banner = "jupyter-portable: this workspace has no GPU machine now"
    language_info = {"name": "python", "mimetype": "text/x-python", "file_extension": ".py",
                     "codemirror_mode": {"name": "ipython", "version": 3}, "pygments_lexer": "ipython3",
                     "nbconvert_exporter": "python"}

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            self.facts: dict[str, Any] = json.loads(os.environ.get(NO_MACHINE_ENV) or "{}")
        except ValueError:
            self.facts = {}
        self.asker = False  # a notebook asks the user before the first machine is rented
        self.asking = False  # the notebook says its question is open (or the routes are being read for it)
        self.answer: dict[str, str] | None = None
        self.answered_at = 0.0  # time.monotonic() of the answer: one that came just before its cell counts
        if not self.facts.get("route"):
            self.facts["route_told"] = False  # none was open at the start: only the notebook can say now
        self.control_handlers[FIRST_MACHINE_MSG] = self._first_machine_request

    def pre_handler_hook(self) -> None:
        # the notebook's stop button (a SIGINT here) ends a held first cell; ipykernel's default would
        # raise KeyboardInterrupt into the event loop instead
        self.saved_sigint_handler = signal.signal(signal.SIGINT, self._on_interrupt)

    def post_handler_hook(self) -> None:
        signal.signal(signal.SIGINT, self.saved_sigint_handler)

    def _on_interrupt(self, signum: int, frame: Any) -> None:
        self.answer = {"answer": "interrupt"}
        self.answered_at = time.monotonic()

    async def _first_machine_request(self, stream: Any, ident: Any, parent: dict[str, Any]) -> None:
        content = parent.get("content") or {}
        if content.get("asker"):
            self.asker = True
        if content.get("asking"):  # a new question: an answer left from an earlier one is not its answer
            self.asking = True
            self.answer = None
        if "route" in content:
            # the route as the notebook read it now (None: none is open); with an answer, the route of
            # the question answered: the outcome names that one, whatever the kernel's start or a later read
            route = content["route"]
            self.facts["route"] = ({k: route[k] for k in ROUTE_KEYS if k in route}
                                   if isinstance(route, dict) else None)
            self.facts["route_told"] = True
        if content.get("answer") in ("cancel", "failed"):
            self.asking = False
            self.answer = {"answer": str(content["answer"]), "reason": str(content.get("reason") or "")[:500]}
            self.answered_at = time.monotonic()
        if self.session is not None:
            self.session.send(stream, "portable_first_machine_reply", {"status": "ok", "asker": self.asker},
                              parent, ident=ident)

    async def _hold_first(self) -> tuple[str, str]:
        """Hold the first cell while the user answers; (answer, reason) once it is not to run here.

        A Continue begun by Start holds it until the kernel moves (the restart ends this process)."""
        from jupyter_portable.core import lifecycle as L

        # an answer that came while this cell was on its way (a start refused at once, before this
        # kernel got to the cell) is this cell's; an older one was for a cell that ended already
        if self.answer is not None and time.monotonic() - self.answered_at > ASK_WAIT_S:
            self.answer = None
        wait = self.facts.get("ask_wait_s")
        wait_s = float(wait) if isinstance(wait, (int, float)) and wait > 0 else ASK_WAIT_S
        started = False
        loop = asyncio.get_running_loop()
        # the notebook says it asks well before this (``ask_wait_s`` in the facts: the tests' shorter wait)
        unasked_at = loop.time() + wait_s
        while True:
            state, reason = await asyncio.to_thread(_lifecycle)
            moving = state in L.CONTINUE_STATES or state == L.ACTIVE
            started = started or moving
            if self.answer is not None:
                answer, reason = self.answer["answer"], self.answer.get("reason", "")
                self.answer = None  # taken: the next cell waits for its own
                if answer == "interrupt":
                    answer = "starting" if moving else "cancel"
                return answer, reason
            if _asks(state):
                if started and state:
                    # a Continue began and the workspace is back where a cell asks: it did not go on (one
                    # cancelled in the sidebar ends FAILED, below); the question's Cancel is another answer.
                    # An unreadable lifecycle file ("") is no such end: the next look tells
                    return "continue-cancelled", ""
                if not self.asking and loop.time() > unasked_at:
                    return "unasked", ""  # nobody will answer: never a silent [*]
            elif not moving:  # FAILED: however fast it got there
                return "continue-failed", reason or f"the workspace is {state}"
            await asyncio.sleep(0.25)

    async def do_execute(self, code: str, silent: bool, store_history: bool = True,
                         user_expressions: dict[str, Any] | None = None, allow_stdin: bool = False,
                         **_: Any) -> dict[str, Any]:
        if not code.strip():
            return {"status": "ok", "execution_count": self.execution_count, "payload": [],
                    "user_expressions": {}}
        now = await asyncio.to_thread(_lifecycle_now)
        state = now[0]
        # no machine yet, or released since this kernel started (it may have started while the
        # machine was being sealed): ask, as for the first machine (``ask``: the notebooks ask first)
        first = bool(self.facts.get("first") or (self.facts.get("ask") and state and _asks(state)))
        if first and (not _asks(state) or self.asker):
            # asked, or a start already under way (or over): the cell waits for how it ends
            answer, reason = await self._hold_first()
            evalue, text = first_machine_outcome(self.facts, answer, reason, (await asyncio.to_thread(_lifecycle))[0])
        elif first:
            evalue, text = no_machine_message(self.facts, now)  # no notebook to ask: at once
        else:
            # held while a Continue runs: the kernel moves, and the notebook runs the cell there
            while await asyncio.to_thread(_continuing):
                await asyncio.sleep(0.25)
            evalue, text = no_machine_message(self.facts, await asyncio.to_thread(_lifecycle_now))
        traceback = [f"\x1b[0;31m{ERROR_NAME}\x1b[0m: {text}"]
        if not silent:
            self.send_response(self.iopub_socket, "error",
                               {"ename": ERROR_NAME, "evalue": evalue, "traceback": traceback})
        return {"status": "error", "execution_count": self.execution_count, "ename": ERROR_NAME,
                "evalue": evalue, "traceback": traceback}

    async def do_complete(self, code: str, cursor_pos: int) -> dict[str, Any]:
        return {"status": "ok", "matches": [], "cursor_start": cursor_pos, "cursor_end": cursor_pos, "metadata": {}}

    async def do_is_complete(self, code: str) -> dict[str, Any]:
        return {"status": "complete"}


def main() -> None:
    from ipykernel.kernelapp import IPKernelApp

    from jupyter_portable.engine.process_lifetime import die_with

    server = os.environ.get(SERVER_PID_ENV, "")
    if server.isdigit():
        # never outlives its server, however that one ends (a server that stopped while the
        # kernel moved here has nobody left to stop it)
        die_with(int(server))
    IPKernelApp.launch_instance(kernel_class=PlaceholderKernel)


if __name__ == "__main__":
    main()
