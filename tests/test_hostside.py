"""compute/hostside.py runs on the user's own host before this package is there: the standard
library only, and as a program streamed to ``python3 -`` followed by one call."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from jupyter_portable.compute import hostside

SOURCE = Path(hostside.__file__).read_text(encoding="utf-8")


def test_it_imports_the_standard_library_only() -> None:
    names = set()
    for node in ast.walk(ast.parse(SOURCE)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    assert names <= set(sys.stdlib_module_names) | {"__future__"}, names - set(sys.stdlib_module_names)


def test_streamed_with_one_call_it_answers_on_its_last_line(tmp_path: Path) -> None:
    """As the provider runs it: the source, then ``print(json.dumps(status(json.loads(...))))``."""
    (tmp_path / "heartbeat").write_text("1234.5")
    payload = {"pid": 2**22 + 1, "allocation": "al-none", "remote_dir": str(tmp_path)}
    program = SOURCE + f"\nprint(json.dumps(status(json.loads({json.dumps(payload)!r}))))\n"
    proc = subprocess.run([sys.executable, "-"], input=program, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout.strip().splitlines()[-1])
    assert answer["alive"] is False and answer["heartbeat"] == 1234.5 and answer["stopped"] is False
