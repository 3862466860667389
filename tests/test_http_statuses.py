"""Each of the package's errors becomes one HTTP status, from one table (core/http_status)."""

from __future__ import annotations

import inspect

import pytest

from jupyter_portable.core import errors
from jupyter_portable.core.http_status import HTTP_STATUS, status_for

ALL = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.PortableError)]


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_error_of_the_package_has_a_status_other_than_a_bare_500(cls: type[errors.PortableError]) -> None:
    exc = cls("x")
    status = status_for(exc)
    assert status is not None
    if cls is not errors.PortableError:  # only an untyped error of ours is a plain server fault
        assert status != 500, cls


@pytest.mark.parametrize(("exc", "status"), [
    (errors.UsageError("hours must be a number"), 400),
    (errors.UnsafePath("../x escapes"), 400),
    (errors.UnsupportedStore("ftp:// cannot publish atomically"), 400),
    (errors.WorkspaceNotFound("no workspace here"), 404),
    (errors.VersionNotFound("no version 9"), 404),
    (errors.ReservationNotFound("no reservation res-1"), 404),
    (errors.FencedError("epoch 3 is older than 4"), 409),
    (errors.NoCapacity("none free", provider="local"), 409),
    (errors.AdmissionRefused("driver 535 is not 550", provider="local"), 409),
    (errors.NotSupported("no reservations", provider="vastai"), 422),
    # what the server relies on answered wrongly: not the user's request, not a conflict
    (errors.AuthError("the RunPod key was refused", provider="runpod"), 502),
    (errors.IntegrityError("blob b3:.. does not hash to its name"), 502),
    (errors.ObjectMissing("objects/ab.. is gone"), 502),
    # ... or could not be reached
    (errors.ProviderUnavailable("api.vast.ai timed out", provider="vastai"), 503),
    (errors.StoreError("s3://bucket could not be listed"), 503),
])
def test_the_status_says_whose_fault_it_is(exc: errors.PortableError, status: int) -> None:
    assert status_for(exc) == status


def test_a_foreign_error_is_left_to_the_server_and_the_table_names_only_the_package_errors() -> None:
    assert status_for(KeyError("x")) is None
    assert set(HTTP_STATUS) <= set(ALL)
