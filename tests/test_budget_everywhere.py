"""One budget, the same everywhere (issue 30, item 2): what is left is the total less what was spent
and what bookings hold back, and `spend`, `settings`, `routes` and a booking's refusal all say the
same figure. Driven through the CLI on the local market, as a user would."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
from test_market import CATALOG, _workspace, market_env  # noqa: F401 - market_env is a fixture

from jupyter_portable.core.calendar import Booking

NOW = "2027-03-01T09:20:00Z"  # the CLI's calendar (c.Portable.now): bookings are dated by it
SLOT = "2027-03-02T09:00Z"


def _ran(ws, allocation_id: str, spend: float, **extra) -> None:
    """A machine that served the workspace and was released, with what it cost."""
    ws.record_allocation({"allocation_id": allocation_id, "provider": "local", "offer": "cheap-far",
                          "started": "2027-02-28T09:00:00Z", "stopped": "2027-02-28T10:00:00Z",
                          "state": "released", "spend": spend, "spend_source": "estimate", "currency": "USD",
                          **extra})


def test_spend_settings_routes_and_a_refusal_say_the_same_left(cli, market_env, tmp_path: Path) -> None:  # noqa: F811
    assert "cheap-far" in CATALOG
    env = {**market_env, "JUPYTER_PORTABLE_NOW": NOW}
    ws = _workspace(tmp_path, 0)
    cli("settings", "--budget", "10", cwd=ws.root, extra_env=env)
    _ran(ws, "al-earlier", 0.07)
    # $1.00/h for 7 h: $7.00 held back for a slot tomorrow
    booked = cli.json("reserve", "local/cheap-far", "--start", SLOT, "--hours", "7", cwd=ws.root, extra_env=env)
    assert booked["price"] == 7.0
    # 10 - 0.07 spent - 7.00 committed = 2.93, in every view
    spend = cli.json("spend", cwd=ws.root, extra_env=env)
    assert (spend["spent"], spend["committed"], spend["left"]) == (0.07, 7.0, 2.93)
    text = cli("spend", cwd=ws.root, extra_env=env).stdout
    assert text.startswith("$2.93 left of the $10.00 budget: $0.07 spent, $7.00 committed to bookings")
    shown = cli.json("settings", cwd=ws.root, extra_env=env)
    assert (shown["spent"], shown["committed"], shown["left"]) == (0.07, 7.0, 2.93)
    # and `state`, beside the machine (issue 43, item 4)
    state = cli.json("state", cwd=ws.root, extra_env=env)["budget"]
    assert (state["spent"], state["committed"], state["left"]) == (0.07, 7.0, 2.93)
    assert "budget: $2.93 left of the $10.00 budget: $0.07 spent" in cli("state", cwd=ws.root, extra_env=env).stdout
    # a route of 8 h at $1/h ($8 and more) is over what is left, in the same figure
    routes = cli.json("routes", "--hours", "8", cwd=ws.root, extra_env=env)["routes"]
    blocked = [r["blocked"] for r in routes if (r["provider"], r["offer"]) == ("local", "cheap-far")]
    assert blocked and "over the $2.93 left of the budget" in blocked[0]
    # a booking of 3 h ($3.00) is refused with it too; 2 h ($2.00) fits
    proc = cli("reserve", "local/cheap-far", "--start", "2027-03-03T09:00Z", "--hours", "3", cwd=ws.root,
               extra_env=env, check=False)
    assert proc.returncode != 0 and "$3.00 total for 3 h is over the $2.93 left of the budget" in proc.stderr
    cli.json("reserve", "local/cheap-far", "--start", "2027-03-03T09:00Z", "--hours", "2", cwd=ws.root,
             extra_env=env)
    assert cli.json("spend", cwd=ws.root, extra_env=env)["left"] == 0.93
    # once the first slot has started, the machine running in it records its own spend: the booking
    # holds nothing back from then on (the calendar a day later)
    later = {**env, "JUPYTER_PORTABLE_NOW": "2027-03-02T10:00:00Z"}
    assert cli.json("spend", cwd=ws.root, extra_env=later)["committed"] == 2.0


def test_a_capacity_block_and_the_machine_launched_into_it_count_once(market_env, tmp_path: Path) -> None:  # noqa: F811
    from jupyter_portable.orchestration.budget import budget_report
    from jupyter_portable.orchestration.settings import update_settings

    ws = _workspace(tmp_path, 0)
    update_settings(ws, budget_total=10.0)
    created = datetime(2027, 3, 1, 9, tzinfo=timezone.utc)
    block = Booking.new("cr-0123456789abcdef0", "aws/p5.48xlarge@us-east-1a",
                        datetime(2027, 3, 2, 9, tzinfo=timezone.utc), 24, charge="now", guarantee="provider",
                        price=7.16, created=created)
    ws.store.update_doc(ws.workspace_id, "reservations", lambda current: [block.to_json()])
    before = budget_report(ws, providers={}, calendar_now=created)
    assert (before["spent"], before["committed"], before["left"]) == (0.0, 7.16, 2.84)
    # an instance in the block recorded $3.00 at the block's rate: spent, and no longer committed
    _ran(ws, "al-in-block", 3.0, reservation_id=block.reservation_id)
    during = budget_report(ws, providers={}, calendar_now=datetime(2027, 3, 2, 12, tzinfo=timezone.utc))
    assert (during["spent"], during["committed"], during["left"]) == (3.0, pytest.approx(4.16), 2.84)
    # a machine outside the block is money of its own
    _ran(ws, "al-elsewhere", 0.5)
    assert budget_report(ws, providers={}, calendar_now=created)["left"] == 2.34
