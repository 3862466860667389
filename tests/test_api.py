"""The public surface: what `import jupyter_portable` promises."""

from __future__ import annotations

import jupyter_portable
from jupyter_portable.core import errors


def test_all_is_exact() -> None:
    public = {n for n in dir(jupyter_portable) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(jupyter_portable.__all__)
    for name in jupyter_portable.__all__:
        assert hasattr(jupyter_portable, name), name


def test_every_error_is_in_the_one_tree() -> None:
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.PortableError)
        assert name in (errors.__doc__ or ""), f"{name} is missing from the drawn tree"
    assert issubclass(errors.FencedError, errors.ConflictError)
    assert issubclass(errors.UnsafePath, errors.ManifestError)
    assert issubclass(errors.ObjectMissing, errors.StoreError)


def test_hints_render_on_one_line() -> None:
    err = errors.ConflictError("moved on\nto 3", hint="snapshot --force")
    assert err.one_line() == "moved on to 3 (to fix: snapshot --force)"
