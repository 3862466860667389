"""The settings that were the environment's alone are traits now (issue 46 item 4): a bad value is
refused with the trait's name and its variable's, never swallowed into the default."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from jupyter_portable.compute.config import PortableLocal, provider_kwargs
from jupyter_portable.core.envconfig import PortableKernel, PortableWorker
from jupyter_portable.core.errors import UsageError


@pytest.mark.parametrize(("cls", "var", "trait", "bad"), [
    (PortableKernel, "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "autosnapshot_minutes", "ten"),
    (PortableKernel, "JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES", "autosnapshot_minutes", "-1"),
    (PortableKernel, "JUPYTER_PORTABLE_FULL_WALK_MINUTES", "full_walk_minutes", "hourly"),
    (PortableKernel, "JUPYTER_PORTABLE_FULL_WALK_MINUTES", "full_walk_minutes", "-5"),
    (PortableKernel, "JUPYTER_PORTABLE_SCRUB_MB", "scrub_mb", "inf"),
    (PortableWorker, "JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS", "gpu_sample_seconds", "0.1"),
    (PortableWorker, "JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS", "gpu_sample_seconds", "often"),
    (PortableLocal, "JUPYTER_PORTABLE_MARKET_SEED", "seed", "a\x1b[2Jb"),
])
def test_a_bad_value_of_its_variable_is_refused_naming_the_trait(cls: type, var: str, trait: str, bad: str) -> None:
    with pytest.raises(UsageError) as refused:
        cls(environ={var: bad})
    assert f"{var} (c.{cls.__name__}.{trait})" in str(refused.value)


def test_a_bad_value_in_the_configuration_is_refused_naming_the_trait() -> None:
    with pytest.raises(UsageError, match=r"^c\.PortableKernel\.full_walk_minutes must be 0 \(off\) or more"):
        PortableKernel(config=Config({"PortableKernel": {"full_walk_minutes": -1.0}}), environ={})


def test_the_values_are_taken_and_the_defaults_hold_without_them() -> None:
    kernel = PortableKernel(environ={"JUPYTER_PORTABLE_AUTOSNAPSHOT_MINUTES": "0",
                                     "JUPYTER_PORTABLE_FULL_WALK_MINUTES": "0.5"})
    assert (kernel.autosnapshot_minutes, kernel.full_walk_minutes, kernel.scrub_mb) == (0.0, 0.5, 64.0)
    assert PortableWorker(environ={}).gpu_sample_seconds == 10.0
    assert PortableWorker(environ={"JUPYTER_PORTABLE_GPU_SAMPLE_SECONDS": "0.5"}).gpu_sample_seconds == 0.5


def test_the_kernel_and_the_market_read_them_through_the_traits(monkeypatch: pytest.MonkeyPatch) -> None:
    from jupyter_portable.engine.scrub import DEFAULT_BUDGET
    from jupyter_portable.interfaces.kernel import autosnapshot

    monkeypatch.setenv("JUPYTER_PORTABLE_FULL_WALK_MINUTES", "soon")
    with pytest.raises(UsageError, match="JUPYTER_PORTABLE_FULL_WALK_MINUTES"):
        autosnapshot.full_walk_minutes()  # it used to become 60 without a word
    monkeypatch.delenv("JUPYTER_PORTABLE_FULL_WALK_MINUTES")
    monkeypatch.delenv("JUPYTER_PORTABLE_SCRUB_MB", raising=False)
    assert autosnapshot.scrub_least_bytes() == DEFAULT_BUDGET
    monkeypatch.setenv("JUPYTER_PORTABLE_MARKET_SEED", "7")
    assert provider_kwargs("local")["seed"] == "7"


def test_the_uploaders_pool_is_an_option_and_the_store_says_where_it_is() -> None:
    from jupyter_portable.engine.snapshot.options import DEFAULT, Options
    from jupyter_portable.store.s3 import s3_location

    assert (DEFAULT.upload_pool("s3://bucket/ws"), DEFAULT.upload_pool("file:///tmp/store")) == (8, 2)
    assert Options(uploads=3).upload_pool("gs://b") == 3
    assert s3_location({"AWS_REGION": "eu-west-1"}) == ("eu-west-1", "aws")
    assert s3_location({"AWS_ENDPOINT_URL": "http://127.0.0.1:9000"}) == ("us-east-1", None)
