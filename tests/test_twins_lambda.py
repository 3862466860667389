"""Lambda as it really answers (issue 27, item 7): a launch names exactly one SSH key (the
document's text: "Currently, exactly one SSH key must be specified"; its schema does not say so,
the contract schema adds it, tests/contract/schemas/extract.py). The twin refuses none or two, and
the real provider, configured with several names, sends the first."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sshd import keygen, unavailable
from test_twins import BOOT_S, H100, OTHER_KEY, FakeClock
from twins import lambdalabs
from twins.lambdalabs import LambdaTwin
from twins.server import TwinOffer

from jupyter_portable.compute.lambdalabs import LambdaProvider

pytestmark = pytest.mark.skipif(unavailable() is not None or lambdalabs.unavailable() is not None,
                                reason=unavailable() or lambdalabs.unavailable() or "")


def _twin(tmp_path: Path, clock: FakeClock, **kw: object) -> LambdaTwin:
    return LambdaTwin(tmp_path / "machines", offers=[TwinOffer(**{**vars(H100), "stock": 3})], clock=clock,
                      boot_delay_s=BOOT_S, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("names", [[], ["laptop", "desk"]], ids=["none", "two"])
def test_the_lambda_twin_refuses_a_launch_without_exactly_one_key_name(tmp_path: Path, names: list[str]) -> None:
    clock = FakeClock()
    with _twin(tmp_path, clock, ssh_keys={"laptop": OTHER_KEY, "desk": OTHER_KEY}) as twin:
        body = {"region_name": H100.region, "instance_type_name": twin.type_name(twin.offers[0]),
                "ssh_key_names": names, "name": "x"}
        answer = httpx.post(f"{twin.url}/api/v1/instance-operations/launch", json=body,
                            headers={"Authorization": f"Bearer {twin.api_key}"})
        assert answer.status_code == 400
        assert answer.json()["error"]["code"] == "global/invalid-parameters"
        assert "ssh_key_names" in answer.json()["error"]["message"]
        assert twin.running() == []  # nothing was rented for it
        one = httpx.post(f"{twin.url}/api/v1/instance-operations/launch", json={**body, "ssh_key_names": ["desk"]},
                         headers={"Authorization": f"Bearer {twin.api_key}"})
        assert one.status_code == 200 and len(twin.running()) == 1


def test_a_provider_with_several_key_names_launches_with_the_first(tmp_path: Path) -> None:
    clock = FakeClock()
    key = keygen(tmp_path / "launch")
    with _twin(tmp_path, clock, ssh_keys={"laptop": OTHER_KEY, "desk": OTHER_KEY}) as twin:
        provider = LambdaProvider(**{**twin.provider_kwargs(), "ssh_key_names": ["desk", "laptop"]},
                                  sleep=clock.sleep, clock=clock)
        offer = provider.offers()[0]
        allocation = provider.launch(offer, allocation_id="al-lambda00001",
                                     ssh_public_key=key.with_suffix(".pub").read_text())
        [launched] = [r for r in twin.requests if r["op"] == "launchInstance"]
        assert launched["status"] == 200
        assert twin.rentals[allocation.ref].extra["key_names"] == ["desk"]
        provider.terminate(allocation)
        assert twin.violations == []
