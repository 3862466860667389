"""A loss is declared only on evidence (issue 42 item 1, invariant 12): one rule for every provider,
as a table of (the provider's answer, whether a path reached the machine, how long it has been
silent) -> the decision. Time is passed in; nothing here reads a clock."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from jupyter_portable.core import reachability as R
from jupyter_portable.core import state_words

T0 = datetime(2026, 12, 6, 14, 2, tzinfo=timezone.utc)
GRACE = 300.0

# (provider's answer, reached now, seconds silent before this look (None: it answered last time)) -> verdict
TABLE = [
    (R.RUNNING, True, None, R.ALIVE),
    (R.CANNOT_SAY, True, None, R.ALIVE),            # the provider's API down, the machine answers
    (R.RUNNING, True, 3600.0, R.ALIVE),             # an hour of silence ends: it resumes, nothing lost
    (R.GONE, True, None, R.LOST),                   # the provider's word is evidence, even mid-answer
    (R.GONE, False, None, R.LOST),
    (R.RUNNING, False, None, R.UNREACHABLE),        # a blip: shown, nothing released
    (R.CANNOT_SAY, False, None, R.UNREACHABLE),     # one SSH error, one Vast "unknown"
    (R.CANNOT_SAY, False, 90.0, R.UNREACHABLE),     # a 90 s partition
    (R.CANNOT_SAY, False, GRACE, R.UNREACHABLE),    # the grace itself is not past
    (R.CANNOT_SAY, False, GRACE + 1, R.LOST),       # silent past the grace and nobody says it runs
    (R.RUNNING, False, GRACE + 1, R.UNREACHABLE),   # the provider says it runs: never lost by silence
    (R.RUNNING, False, 86400.0, R.UNREACHABLE),
]


@pytest.mark.parametrize(("answer", "reached", "silent", "verdict"), TABLE)
def test_the_decision_table(answer: str, reached: bool, silent: float | None, verdict: str) -> None:
    now = T0 + timedelta(seconds=silent or 0.0)
    d = R.decide(answer, reached=reached, since=None if silent is None else T0, now=now, grace_s=GRACE)
    assert d.verdict == verdict, d
    if verdict == R.UNREACHABLE:
        assert d.since == T0 and d.line() == "unreachable since 14:02Z"


@pytest.mark.parametrize(("state", "answer"), [
    ("pending", R.RUNNING), ("running", R.RUNNING), ("reachable", R.RUNNING),
    ("stopped", R.GONE), ("lost", R.GONE), ("terminated", R.GONE),
    ("unknown", R.CANNOT_SAY), (None, R.CANNOT_SAY), ("something new", R.CANNOT_SAY)])
def test_every_provider_status_is_one_answer(state: str | None, answer: str) -> None:
    assert R.provider_answer(state) == answer


def test_a_silence_past_the_grace_names_when_it_began_and_the_grace() -> None:
    d = R.decide(R.CANNOT_SAY, reached=False, since=T0, now=T0 + timedelta(minutes=6), grace_s=GRACE,
                 said="ssh host does not answer")
    assert d.verdict == R.LOST
    assert "since 14:02Z" in (d.reason or "") and "5 min" in (d.reason or "") and "ssh host" in (d.reason or "")


def test_the_first_silent_look_begins_the_silence_now() -> None:
    d = R.decide(R.CANNOT_SAY, reached=False, since=None, now=T0, grace_s=0.0)
    assert (d.verdict, d.since) == (R.UNREACHABLE, T0)


def test_the_cli_and_the_views_say_unreachable_in_one_set_of_words() -> None:
    line = state_words.unreachable_line("ACTIVE", 9, R.since_text(T0))
    assert line.startswith("ACTIVE at version 9, unreachable since 14:02Z: ")
    assert state_words.UNREACHABLE_WORDS.machine  # still held, and billed


def test_an_answer_outside_the_three_is_refused() -> None:
    with pytest.raises(ValueError, match="answer must be one of"):
        R.decide("maybe", reached=False, since=None, now=T0, grace_s=GRACE)


def test_the_grace_is_a_setting_with_a_few_minutes_by_default() -> None:
    from jupyter_portable.core.envconfig import PortableRun
    from jupyter_portable.core.errors import UsageError

    assert PortableRun.current(environ={}).unreachable_grace == R.DEFAULT_GRACE_S == 300.0
    assert PortableRun.current(environ={"JUPYTER_PORTABLE_UNREACHABLE_GRACE": "600"}).unreachable_grace == 600.0
    with pytest.raises(UsageError, match="JUPYTER_PORTABLE_UNREACHABLE_GRACE must be seconds"):
        PortableRun.current(environ={"JUPYTER_PORTABLE_UNREACHABLE_GRACE": "-5"})
