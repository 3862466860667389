"""Issue 43 item 6: the extension's default keyboard shortcuts are checked against the keys the
major browsers take (labextension/reserved-shortcuts.json, each list with its source) and against
JupyterLab's own defaults (read from its installed schemas). The extension sets none: the
palette and Settings are the way, and the README says so."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESERVED = json.loads((ROOT / "labextension" / "reserved-shortcuts.json").read_text())
SCHEMAS = sorted((ROOT / "labextension" / "schema").glob("*.json"))
LAB_SCHEMAS = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas"
MODIFIERS = ("Ctrl", "Cmd", "Alt", "Shift")


def chord(keys: str) -> tuple[str, ...]:
    """One key chord, its modifiers in one order: "Shift Ctrl o" -> ("Ctrl", "Shift", "O")."""
    parts = ["Alt" if p == "Option" else p for p in keys.split()]
    mods = tuple(m for m in MODIFIERS if m in parts)
    rest = [p.upper() if len(p) == 1 else p for p in parts if p not in MODIFIERS]
    return (*mods, *rest)


def on_platforms(keys: str) -> list[tuple[str, ...]]:
    """A binding's first chord as Windows/Linux (Accel = Ctrl) and macOS (Accel = Cmd) read it."""
    return [chord(keys.replace("Accel", accel)) for accel in ("Ctrl", "Cmd")]


def taken_by(keys: str) -> list[str]:
    """Which browsers take the first chord of ``keys`` on some platform."""
    wanted = set(on_platforms(keys))
    return sorted(name for name, b in RESERVED["browsers"].items() if wanted & {chord(k) for k in b["keys"]})


def lab_defaults() -> dict[tuple[str, ...], list[str]]:
    """JupyterLab's own default shortcuts: first chord -> the commands bound to it."""
    found: dict[tuple[str, ...], list[str]] = {}
    for path in LAB_SCHEMAS.rglob("*.json"):
        try:
            schema = json.loads(path.read_text())
        except ValueError:
            continue
        for s in schema.get("jupyter.lab.shortcuts", []) if isinstance(schema, dict) else []:
            if not s.get("keys") or not s["keys"][0] or s.get("disabled"):
                continue
            for platform in on_platforms(s["keys"][0]):
                found.setdefault(platform, []).append(s["command"])
    return found


def our_defaults() -> list[dict[str, Any]]:
    return [s for path in SCHEMAS for s in json.loads(path.read_text()).get("jupyter.lab.shortcuts", [])]


def test_every_list_names_its_source_and_the_keys_the_issue_found() -> None:
    assert set(RESERVED["browsers"]) == {"chrome", "firefox", "edge", "safari"}
    for name, browser in RESERVED["browsers"].items():
        assert browser["source"].strip() and len(browser["keys"]) > 20, name
        for k in browser["keys"]:
            assert re.fullmatch(r"((Ctrl|Cmd|Alt|Option|Shift) )*\S+", k), (name, k)
    # the old defaults are caught: Chrome's bookmarks manager and tab search, Firefox's library,
    # add-ons and downloads (issue 43 item 6)
    assert {"chrome", "firefox"} <= set(taken_by("Accel Shift O"))
    assert {"chrome", "firefox"} <= set(taken_by("Accel Shift A"))
    assert "firefox" in taken_by("Accel Shift Y")
    assert ("Ctrl", "Shift", "U") in lab_defaults(), "JupyterLab's own schemas were read"


def test_no_default_shortcut_of_the_extension_is_taken_by_a_browser_or_jupyterlab() -> None:
    lab = lab_defaults()
    for s in our_defaults():
        assert taken_by(s["keys"][0]) == [], s
        chords = on_platforms(s["keys"][0])
        assert not any(p in lab for p in chords), (s, [lab.get(p) for p in chords])


@pytest.mark.parametrize("keys", ["Accel Shift O", "Accel Shift Y", "Accel Shift A", "Accel Shift U"])
def test_the_check_refuses_the_keys_that_clash(keys: str) -> None:
    assert taken_by(keys) or any(p in lab_defaults() for p in on_platforms(keys))


def test_the_extension_sets_none_and_the_readme_says_the_palette_and_settings_are_the_way() -> None:
    assert our_defaults() == []
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Keyboard shortcuts", 1)[1].split("\n## ", 1)[0]
    for old in ("Ctrl/Cmd+Shift+O", "Ctrl/Cmd+Shift+Y", "Ctrl/Cmd+Shift+A"):
        assert f"({old})" not in section, "the README lists no shortcut the extension does not set"
    assert "command palette" in section and "Keyboard Shortcuts" in section
    assert "docs/shortcuts.md" in section or "shortcuts.md" in section
