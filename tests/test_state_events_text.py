"""``jupyter portable state --events`` prints the lifecycle's events as text, one a line,
as well as in ``--json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jupyter_portable import Workspace

CATALOG = """version = 1
[store]
region = "local-a"
egress_per_gb = 0.0

[[offer]]
id = "dear"
gpu = "NVIDIA H100"
gpu_count = 1
gpu_memory_gb = 80
driver = "550.54.15"
cuda = "12.4"
price_per_hour = 9.0
region = "local-a"
capacity = 1
boot_seconds = 0
launch_failure_rate = 0
reliability = 1.0
bandwidth_mbps = 10000
"""


def test_state_events_prints_each_event_as_a_line(tmp_path: Path, cli: Any) -> None:
    (tmp_path / "catalog.toml").write_text(CATALOG)
    cli.env.update(JUPYTER_PORTABLE_CATALOG=str(tmp_path / "catalog.toml"), JUPYTER_PORTABLE_PROVIDERS="local",
                   JUPYTER_PORTABLE_MARKET_DIR=str(tmp_path / "market"))
    root = tmp_path / "ws"
    root.mkdir()
    (root / "a.txt").write_text("a")
    Workspace.init(root, f"file://{tmp_path / 'store'}").snapshot("first", progress=None)
    cli("settings", "--max-price", "1", cwd=root)
    assert cli("continue", cwd=root, check=False).returncode != 0  # the only offer is over the $/h cap
    events = cli.json("state", "--events", cwd=root)["events"]
    text = cli("state", "--events", cwd=root).stdout.splitlines()
    # the state's line and the budget's line (issue 43: `state` says the budget), then one line per event
    assert len(text) == 2 + len(events) >= 4 and text[1].startswith("budget: ")
    assert text[2].startswith(f"#{events[0]['seq']} {events[0]['at']} ")
    assert any("-> ROUTING" in line for line in text)
    failed = next(line for line in text if "-> FAILED" in line)
    assert failed.endswith(f": {events[-1]['reason']}") and "every offer is blocked" in failed
    assert len(cli("state", cwd=root).stdout.splitlines()) == 2, "without --events, the state and the budget"
