"""The CLI's verbs are one table (interfaces/cli/commands.VERBS), as the server's routes are: every
verb the parser takes has its row, and every row a verb the parser takes (issue 46 item 1)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from jupyter_portable.interfaces.cli.commands import VERBS, main
from jupyter_portable.interfaces.cli.parser import build_parser


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_verb_the_parser_takes_has_one_row_and_no_row_is_left_over() -> None:
    subs = _subparsers(build_parser())
    assert set(subs) == set(VERBS)
    # a verb acting on a workspace finds it from -C: its parser takes one
    for name, verb in VERBS.items():
        if verb.workspace:
            assert "dir" in {a.dest for a in subs[name]._actions}, name


def test_a_workspace_verb_outside_a_workspace_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "-C", str(tmp_path)]) != 0
    assert "error:" in capsys.readouterr().err
