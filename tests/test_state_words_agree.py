"""Issue 43 item 5: words from one table (core/state_words.py) for every state and transition, the
CLI and the sidebar reading the same version. Real parts: the CLI in a subprocess, the local market's
workers, the store; the sidebar's side is what the server sends (StateView's state answer, checked
against state.json) and the TypeScript the sidebar is built from reads those fields."""

# ruff: noqa: F811 - the fixtures imported from jupyter_e2e are taken as arguments of the same name
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from jupyter_e2e import env, make_workspace  # noqa: F401 - fixtures

from jupyter_portable.core import lifecycle as L
from jupyter_portable.core import state_words

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[1]
SCHEMAS = ROOT / "jupyter_portable" / "interfaces" / "serverext" / "schemas"


def _sidebar(root: Path) -> dict[str, Any]:
    """The state answer the sidebar reads, as the server builds it, held to its schema."""
    from jupyter_portable import Workspace
    from jupyter_portable.orchestration.orchestrator import Orchestrator
    from jupyter_portable.orchestration.state_view import StateView

    ws = Workspace.find(root)
    orch = Orchestrator(ws)
    state = StateView(ws, lambda: orch).state(continuing=False, conflicts=[])
    from referencing import Registry, Resource

    registry = Registry().with_resources(  # type: ignore[call-arg]
        (p.name, Resource.from_contents(json.loads(p.read_text()))) for p in SCHEMAS.glob("*.json"))
    jsonschema.validate(state, json.loads((SCHEMAS / "state.json").read_text()), registry=registry)
    return state


def test_every_state_has_its_words_and_the_move_has_two(tmp_path: Path) -> None:
    table = state_words.table()
    assert set(table) == set(L.STATES)
    for state, w in table.items():
        line = state_words.state_line(state, 4)
        assert line == f"{state} at version 4: {w['meaning']}"
    assert state_words.first_start([L.IDLE, L.ROUTING, L.ACQUIRING]) is True
    assert state_words.first_start([L.IDLE, L.ROUTING, L.ACQUIRING, L.PROBING, L.MATERIALIZING, L.VERIFYING,
                                    L.READY, L.ACTIVE, L.LOST, L.ROUTING]) is False, "a Continue after a loss"
    # a lifecycle that forgot its early events still knows from the machines' history
    assert state_words.first_start([L.ROUTING], [{"allocation_id": "al-a", "state": "lost"}], "al-b") is False
    assert state_words.first_start([L.ROUTING], [{"allocation_id": "al-a", "state": "failed"}], "al-b") is True
    assert state_words.safe_version(2, 4) == 4 and state_words.safe_version(3, None) == 3
    assert state_words.safe_version(None, None) is None


def test_the_cli_and_the_sidebar_say_the_same_state_at_the_same_version(
        tmp_path: Path, env: dict[str, Path], cli: Any) -> None:
    from jupyter_portable import Workspace
    from jupyter_portable.demo.market import lose_allocation

    root = tmp_path / "ws"
    make_workspace(root, env["store"])
    # IDLE: no machine yet
    said = cli.json("state", cwd=root)
    side = _sidebar(root)
    assert said["line"] == side["lifecycle"]["line"] and said["safe_version"] == side["lifecycle"]["safe_version"]
    assert side["lifecycle"]["move"] == "Starting the first machine"

    # ACTIVE, then the machine publishes a version past the one the lifecycle recorded
    first = cli.json("continue", cwd=root)["allocation_id"]
    worker = Workspace.find(env["market"] / "allocations" / first / "work")
    (worker.root / "results.txt").write_text("loss 0.1\n")
    published = worker.snapshot("on the machine", progress=None).version
    said = cli.json("state", cwd=root)
    side = _sidebar(root)
    assert said["state"] == "ACTIVE" and said["safe_version"] == published == side["lifecycle"]["safe_version"]
    assert said["line"] == side["lifecycle"]["line"] == state_words.state_line("ACTIVE", published)
    # `machines` never says "no machines" for a provider that cannot list them while one runs there
    machines = cli("machines", cwd=root).stdout
    assert first in cli("market", "list", cwd=root).stdout
    assert "local: cannot list its machines here; `jupyter portable market list` shows" in machines, machines
    assert machines.startswith("no enabled provider lists its machines here\n"), machines

    # LOST: "LOST at version N" in both, N the newest published, and a move is now a Continue
    lose_allocation(env["market"], first)
    text = cli("state", cwd=root).stdout
    side = _sidebar(root)
    assert side["lifecycle"]["state"] == "LOST"
    assert text.startswith(side["lifecycle"]["line"]), (text, side["lifecycle"]["line"])
    ws = Workspace.find(root)
    head = ws.store.read_head(ws.workspace_id)[0].version  # the loss itself is recorded in a version too
    assert head > published and text.startswith(f"LOST at version {head}: "), text
    assert side["lifecycle"]["move"] == "Continuing"
    # the words of each state are the table's, which the server sends with the state
    assert side["states"] == state_words.table()
    # `status` in normal use: the user's side publishes through the machines, it is not "FENCED"
    status = cli("status", cwd=root).stdout
    assert "FENCED" not in status and "publishing: by the machines a Continue rents" in status


def test_the_sidebar_reads_the_servers_figures_not_its_own() -> None:
    # the TypeScript the sidebar is built from takes the server's safe version and move words (the
    # fallbacks are for an older server), and holds no copy of the state table
    panel = (ROOT / "labextension" / "src" / "components" / "WorkspacePanel.tsx").read_text()
    cont = (ROOT / "labextension" / "src" / "components" / "ContinuePanel.tsx").read_text()
    types = (ROOT / "labextension" / "src" / "types.ts").read_text()
    assert "state.lifecycle.safe_version ??" in panel
    assert "state.lifecycle.move ??" in cont and "{moveWords(props.state)} on" in cont
    assert re.search(r"safe_version\?: number \| null;", types) and re.search(r"move\?: string;", types)
    for w in state_words.WORDS.values():
        assert w.meaning not in panel + cont, "the meanings come from the server"
