"""The demo market: a provider ("local") whose machines are worker processes on this computer.

:mod:`.market` rents them out from a catalog (:mod:`.catalog`, ``demo-catalog.toml``), each with an
``nvidia-smi`` of its own (:mod:`.fake_nvidia_smi`) presenting the offer's GPU. It is the demo's
default provider and the tests' fault injector; it sits on the compute layer's interface
(:mod:`jupyter_portable.compute.base`) like any other provider, but is kept out of ``compute/`` so
that package holds only what reaches real machines.
"""
