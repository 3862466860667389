"""What the worker agent and its client agree on, without the agent's server: the line the
agent prints once it listens, and the phases its ``/status`` reports."""

from __future__ import annotations

READY_PREFIX = "PORTABLE-AGENT "
PHASES = ("starting", "materializing", "verifying", "ready", "failed", "sealing", "sealed")
