"""One server test that fails, leaving a server whose cleanup raises, is one failure: the tests after
it on the same worker pass (tests/server_cleanup.py; pytest-jupyter's own fixture made every later
test error at teardown)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

LEFT_BEHIND = """
from jupyter_server.serverapp import ServerApp

def test_leaves_a_server_whose_cleanup_raises(jp_asyncio_loop):
    app = ServerApp.instance()
    async def refuse():  # as a kernel still starting made it: not a RuntimeError
        raise KeyError("Kernel with id not found: k-still-starting")
    app._cleanup = refuse
    raise AssertionError("the test's own failure")

def test_after_one():
    pass

def test_after_two():
    pass
"""


def test_a_failed_server_test_stays_one_failure(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                          "pytest_plugins = ['pytest_jupyter.jupyter_server']\n"
                          "from server_cleanup import jp_server_cleanup  # noqa: F401\n")
    pytester.makepyfile(test_left_behind=LEFT_BEHIND)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:playwright", "-q")
    # the failing test's teardown reports the cleanup's error (a KeyError: the plugin's fixture then kept
    # the server, and each later test errored at its teardown too); the later tests pass, no error
    result.assert_outcomes(failed=1, passed=2, errors=1)
    assert "ERROR test_left_behind.py::test_leaves_a_server_whose_cleanup_raises" in result.stdout.str()
    assert "KeyError: 'Kernel with id not found: k-still-starting'" in result.stdout.str()
