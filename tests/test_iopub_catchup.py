"""The kernel's output while an SSH forward was down (issue 42): the worker's record of the kernel's
IOPub (``worker/iopub_log.py``, fed by the iopub watcher from a real kernel) and the user side's
catch-up (``worker/catchup.py``) that passes on what it missed, once, in order. End to end across a
real partition: tests/test_unreachable.py."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.session import Session
from test_worker_activity_watch import _state

from jupyter_portable.worker.activity import watch_kernel
from jupyter_portable.worker.catchup import CatchUp
from jupyter_portable.worker.iopub_log import IOPubLog
from jupyter_portable.worker.kernel import start_watched_kernel, stop_kernel
from jupyter_portable.worker.state import AgentState

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[AgentState]:
    state = _state(tmp_path)
    threading.Thread(target=watch_kernel, args=(state,), daemon=True).start()
    while not state.activity.watcher_running:
        time.sleep(0.01)
    yield state
    stop_kernel(state)


def test_the_worker_records_what_the_kernel_published_in_order_as_it_sent_it(watched: AgentState) -> None:
    conn = start_watched_kernel(watched, "k-log")
    kc = BlockingKernelClient()
    kc.load_connection_info(conn)
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=60)
        heard: list[dict[str, Any]] = []
        reply = kc.execute_interactive("for i in range(5): print('line', i, flush=True)", timeout=60,
                                       output_hook=heard.append)
        assert reply["content"]["status"] == "ok"
        streams = [m for m in heard if m["msg_type"] == "stream"]
        first = streams[0]["header"]["msg_id"]
        deadline = time.monotonic() + 30
        while heard[-1]["header"]["msg_id"] not in [m["msg_id"] for m in watched.iopub_log.after("")["messages"]]:
            assert time.monotonic() < deadline, "the worker never recorded the cell's last message"
            time.sleep(0.05)
        answer = watched.iopub_log.after(first)
        assert answer["found"] is True
        ids = [m["msg_id"] for m in answer["messages"]]
        heard_after = [m["header"]["msg_id"] for m in heard[heard.index(streams[0]) + 1:]]
        assert ids[:len(heard_after)] == heard_after  # the same messages, in the kernel's order
        # each as the kernel sent it: a session with the kernel's key reads it, its signature checked
        reader = Session(key=str(conn["key"]).encode(), signature_scheme="hmac-sha256")
        again = [reader.deserialize(reader.feed_identities([base64.b64decode(f) for f in m["frames"]])[1])
                 for m in answer["messages"][:len(heard_after)]]
        assert [m["content"] for m in again] == [m["content"] for m in heard[heard.index(streams[0]) + 1:]]
        # an id it does not hold: everything it holds, and it says so
        unknown = watched.iopub_log.after("no-such-id")
        assert unknown["found"] is False and len(unknown["messages"]) >= len(ids) + 1
    finally:
        kc.stop_channels()


def _log(n: int) -> IOPubLog:
    log = IOPubLog(max_messages=50)
    log.follow("k")
    for i in range(1, n + 1):
        log.add(f"m{i}", [b"kernel.stream", b"<IDS|MSG>", f"frame {i}".encode()])
    return log


def _read(out: list[list[bytes] | None], live: str) -> list[str]:
    return [live if frames is None else frames[2].decode().replace("frame ", "m") for frames in out]


def test_after_a_forward_came_back_what_was_missed_comes_first_once_and_in_order() -> None:
    log, restarts = _log(8), [0]
    catchup = CatchUp(log.after, lambda: restarts[0])
    assert _read(catchup.passing("m1"), "m1") == ["m1"]
    assert _read(catchup.passing("m2"), "m2") == ["m2"]
    restarts[0] = 1  # the forward died (m3..m5 dropped) and came back: m6 is the first to come live
    assert _read(catchup.passing("m6"), "m6") == ["m3", "m4", "m5", "m6", "m7", "m8"]
    assert catchup.caught_up == 5
    # m7 and m8, passed on from the record, come live too: dropped
    assert catchup.passing("m7") == [] and catchup.passing("m8") == []
    assert _read(catchup.passing("m9"), "m9") == ["m9"]
    assert catchup.last == "m9"


def test_no_restart_no_question_and_a_worker_not_answering_is_asked_again_with_the_next_message() -> None:
    log, restarts, asked = _log(6), [0], []

    def fetch(after: str) -> dict[str, Any]:
        asked.append(after)
        if len(asked) == 1:
            raise OSError("the worker's forward is not back yet")
        return log.after(after)

    catchup = CatchUp(fetch, lambda: restarts[0])
    assert _read(catchup.passing("m1"), "m1") == ["m1"]
    assert asked == []  # no forward restarted: the worker is not asked
    restarts[0] = 2
    assert _read(catchup.passing("m4"), "m4") == ["m4"]  # the worker did not answer: the live one goes on
    # asked again with the next message, since the same one: what was missed comes late, but comes, once
    assert _read(catchup.passing("m5"), "m5") == ["m2", "m3", "m5", "m6"]
    assert asked == ["m1", "m1"]
    assert catchup.passing("m6") == [] and catchup.passing("m4") == []
    assert _read(catchup.passing("m7"), "m7") == ["m7"] and len(asked) == 2  # no restart since: not asked


def test_a_record_behind_this_side_passes_on_nothing_from_before_what_was_passed_here() -> None:
    """The worker's watcher hears the kernel as the user side does, often a few milliseconds later: a
    forward that came back just after m5 was passed on asks since m5 before the record holds it. The
    record's answer is then all it holds (m1..m4, and before them what came before this connection):
    nothing of it is new here, and nothing is passed on again."""
    log, restarts = _log(4), [0]  # m1..m4 recorded; m5 and m6 not yet
    catchup = CatchUp(log.after, lambda: restarts[0])
    for mid in ("m3", "m4", "m5"):  # this connection began at m3: m1 and m2 came before it
        assert _read(catchup.passing(mid), mid) == [mid]
    restarts[0] = 1
    assert _read(catchup.passing("m6"), "m6") == ["m6"]  # not m1, m2 (another cell's), nor m3, m4 again
    assert catchup.caught_up == 0
    log.add("m5", [b"kernel.stream", b"<IDS|MSG>", b"frame 5"])
    log.add("m6", [b"kernel.stream", b"<IDS|MSG>", b"frame 6"])
    log.add("m7", [b"kernel.stream", b"<IDS|MSG>", b"frame 7"])  # dropped on the way here
    restarts[0] = 2
    assert _read(catchup.passing("m8"), "m8") == ["m7", "m8"]  # since m6, which the record now holds


def test_a_record_that_moved_on_past_everything_passed_here_is_passed_on_whole() -> None:
    log = IOPubLog(max_messages=3)
    log.follow("k")
    restarts = [0]
    catchup = CatchUp(log.after, lambda: restarts[0])
    log.add("m1", [b"kernel.stream", b"<IDS|MSG>", b"frame 1"])
    assert _read(catchup.passing("m1"), "m1") == ["m1"]
    for i in range(2, 7):  # m2..m6 while the forward was down; the record keeps the last three
        log.add(f"m{i}", [b"kernel.stream", b"<IDS|MSG>", f"frame {i}".encode()])
    restarts[0] = 1
    assert _read(catchup.passing("m7"), "m7") == ["m4", "m5", "m6", "m7"]


def test_the_question_goes_through_the_kernels_own_forward(tmp_path: Path) -> None:
    """AgentClient.forward_kernel forwards the worker's API with the kernel's ports, in one ssh; the
    catch-up's question and its count of restarts are that forward's (a fake link records the calls)."""
    from types import SimpleNamespace

    from jupyter_portable.worker.client import KERNEL_PORTS, AgentClient

    class Tunnel:
        def __init__(self) -> None:
            self.restarts = 0

        def close(self) -> None:
            pass

    asked: list[list[int]] = []
    tunnels: list[Tunnel] = []

    def forward_ports(target: Any, remote: list[int]) -> tuple[list[int], Any]:
        asked.append(list(remote))
        tunnels.append(Tunnel())
        return [20000 + len(asked) * 10 + i for i in range(len(remote))], tunnels[-1].close

    record = SimpleNamespace(port=8123, token="t", allocation_id="al-1",
                             allocation=SimpleNamespace(ssh=object(), provider="ssh"))
    client = AgentClient.__new__(AgentClient)
    client.record, client.provider, client._closers = record, None, []  # type: ignore[assignment]
    client._ssh, client._kernel_forward = (SimpleNamespace(forward_ports=forward_ports), None), None
    client.forward(8123)  # the worker's API, a forward of its own
    info = {p: 7000 + i for i, p in enumerate(KERNEL_PORTS)}
    local = client.forward_kernel(info)
    assert asked == [[8123], [*info.values(), 8123]]
    assert list(local.values()) == [20020, 20021, 20022, 20023, 20024]
    assert client._kernel_forward is not None and client._kernel_forward[1] == "http://127.0.0.1:20025"
    tunnels[0].restarts = 3  # the API's own forward restarting says nothing about the kernel's output
    assert client.forward_restarts() == 0
    tunnels[1].restarts = 1
    assert client.forward_restarts() == 1
