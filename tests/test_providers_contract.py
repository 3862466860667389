"""The provider contract (``compute/base.py``), checked the same way for every provider.

Structure for all seven; the whole lifecycle, run generically, against the real local
market. (Each cloud's lifecycle against its contract fixtures is in its own test file;
ssh's against a real sshd in test_provider_ssh.py.)
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from jupyter_portable.compute.base import STATES, Allocation, Provider, Reservation
from jupyter_portable.compute.registry import PROVIDERS
from jupyter_portable.core.errors import NotSupported, PortableError
from jupyter_portable.core.offers import Offer

REQUIRED = ("offers", "check_permission", "check_capacity", "launch", "status", "terminate")


@pytest.mark.parametrize("key", sorted(PROVIDERS))
def test_every_provider_implements_the_whole_interface(key: str) -> None:
    module, name = PROVIDERS[key]
    cls = getattr(importlib.import_module(module), name)
    assert issubclass(cls, Provider)
    assert cls.name == key, "the registry key is the provider's name"
    for method in REQUIRED:
        assert getattr(cls, method) is not getattr(Provider, method), f"{name} does not implement {method}"
        assert (getattr(cls, method).__doc__ or getattr(Provider, method).__doc__), method


def _lifecycle(provider: Provider, offer: Offer) -> None:
    assert offer.provider == provider.name
    assert provider.check_permission(offer) is None
    capacity = provider.check_capacity(offer)
    assert capacity is None or capacity > 0
    alloc = provider.launch(offer, allocation_id="al-contract-1")
    try:
        assert isinstance(alloc, Allocation)
        assert (alloc.allocation_id, alloc.provider, alloc.offer_id) == ("al-contract-1", provider.name, offer.id)
        assert provider.status(alloc).state in STATES
    finally:
        provider.terminate(alloc)
    provider.terminate(alloc)  # terminating one already gone is not an error
    assert provider.status(alloc).state == "terminated"
    try:
        booked = provider.reserve(offer, start="2030-01-01T10:00Z", hours=2)
        assert isinstance(booked, Reservation) and booked.guarantee in ("provider", "capacity-checked", "best-effort")
    except NotSupported as exc:
        assert exc.provider == provider.name


def test_the_local_market_keeps_the_contract(tmp_path: Path) -> None:
    from jupyter_portable.demo.catalog import default_catalog_path
    from jupyter_portable.demo.market import LocalMarket

    market = LocalMarket(default_catalog_path(), tmp_path / "market")
    offers = market.offers()
    assert offers and len({o.key for o in offers}) == len(offers)
    open_offer = next(o for o in offers if o.capacity and o.launch_failure_rate == 0 and not o.reservable)
    _lifecycle(market, open_offer)
    sold_out = next(o for o in offers if o.capacity == 0)
    with pytest.raises(PortableError):
        market.check_capacity(sold_out)
