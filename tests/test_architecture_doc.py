"""docs/architecture.md's table of layers is the house as the code builds it: every module it
names lives in the layer it is named in (issue 46: a module moved or renamed must move in the
drawing too). The imports between layers are lint-imports' (pyproject.toml)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "jupyter_portable"


def _layers() -> dict[str, set[str]]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```", 2)[1].strip("\n").splitlines()
    names: dict[str, set[str]] = {}
    layer = ""
    for line in block:
        if line and not line[0].isspace():
            layer, _, line = line.partition("  ")
        column = re.split(r"\s{3,}", line.strip())[0]  # the modules, before the layer's words
        column = re.sub(r"\([^)]*\)", "", column)  # "orchestrator (continuing, sealing, ...)"
        found = {n.strip() for n in re.split(r"[,|]", column)}
        names.setdefault(layer.strip(), set()).update(n for n in found if re.fullmatch(r"[a-z_]+/?", n))
    return names


def test_every_module_the_drawing_names_is_in_its_layer() -> None:
    layers = _layers()
    assert {"interfaces", "orchestration", "worker", "engine", "demo", "store | compute", "workdir", "core"} \
        == set(layers)
    missing = []
    for layer, names in layers.items():
        folders = [PACKAGE / part.strip() for part in layer.split("|")]
        for name in sorted(names):
            stem = name.rstrip("/")
            if not any((f / f"{stem}.py").is_file() or (f / stem / "__init__.py").is_file() for f in folders):
                missing.append(f"{layer}: {name}")
    assert missing == [], "docs/architecture.md names modules its layers do not have"
    assert sum(len(n) for n in layers.values()) > 60  # the table was read


def test_no_import_contract_names_an_exemption(tmp_path: Path) -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    from jupyter_portable.core.errors import UsageError
    from jupyter_portable.workdir.outside import write_outside_copy

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert len(contracts) >= 5 and [c["name"] for c in contracts if c.get("ignore_imports")] == []
    # what the worker writes beside the copies goes through workdir.outside, never into a .portable/
    (tmp_path / "agent").mkdir()
    write_outside_copy(tmp_path / "agent" / "heartbeat", b"1\n")
    assert (tmp_path / "agent" / "heartbeat").read_bytes() == b"1\n"
    with pytest.raises(UsageError, match=r"inside a copy's \.portable/"):
        write_outside_copy(tmp_path / "ws" / ".portable" / "x.json", b"{}")
    assert not (tmp_path / "ws").exists()
