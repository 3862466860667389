"""The workspace's settings (requirements, budget, planned hours, auto-snapshot), a document
kept with the workspace in its store, so every copy and every machine sees the same one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from jupyter_portable.core.errors import UsageError
from jupyter_portable.core.offers import Requirements
from jupyter_portable.core.spend import Budget
from jupyter_portable.engine.workspace import Workspace

DEFAULT_HOURS = 8.0


@dataclass
class Settings:
    """What this workspace needs and may spend, kept with it."""

    requirements: Requirements = field(default_factory=Requirements)
    budget: Budget = field(default_factory=Budget)
    hours: float = DEFAULT_HOURS
    # the kernel's auto-snapshot on the worker, in minutes (0: off); None: the machine's default
    autosnapshot_minutes: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"requirements": self.requirements.to_json(), "budget": self.budget.to_json(), "hours": self.hours,
                "autosnapshot_minutes": self.autosnapshot_minutes}

    @classmethod
    def from_json(cls, obj: Any) -> "Settings":
        if obj is None:
            return cls()
        if not isinstance(obj, dict) or set(obj) - {"requirements", "budget", "hours", "autosnapshot_minutes"}:
            raise UsageError("the workspace settings document is malformed")
        b = obj.get("budget") or {}
        try:
            budget = Budget(max_price_per_hour=b.get("max_price_per_hour"), total=b.get("total"),
                            warn_fraction=b.get("warn_fraction", 0.8))
            hours = float(obj.get("hours", DEFAULT_HOURS))
            auto = obj.get("autosnapshot_minutes")
            auto = None if auto is None else float(auto)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"the workspace settings are malformed: {exc}") from exc
        if auto is not None and not (auto >= 0 and math.isfinite(auto)):
            raise UsageError(f"autosnapshot_minutes must be 0 (off) or more, got {auto}")
        return cls(Requirements.from_json(obj.get("requirements")), budget, hours, auto)


def load_settings(ws: Workspace) -> Settings:
    return Settings.from_json(ws.store.read_doc(ws.workspace_id, "settings"))


def update_settings(ws: Workspace, **changes: Any) -> Settings:
    """Change requirement and budget fields (None leaves a field as it is; "" clears it)."""
    req_fields = {"gpus", "gpu_count", "min_gpu_memory_gb", "driver", "min_cuda", "image", "max_price_per_hour",
                  "regions"}
    budget_fields = {"budget_max_price_per_hour": "max_price_per_hour", "budget_total": "total",
                     "budget_warn_fraction": "warn_fraction"}
    unknown = set(changes) - req_fields - set(budget_fields) - {"hours", "autosnapshot_minutes"}
    if unknown:
        raise UsageError(f"unknown setting(s): {', '.join(sorted(unknown))}")

    def change(current: Any) -> Any:
        s = Settings.from_json(current).to_json()
        for key, value in changes.items():
            if value is None:
                continue
            value = None if value == "" else value
            if key in req_fields:
                s["requirements"][key] = value if value is not None else ([] if key in ("gpus", "regions") else None)
            elif key in budget_fields:
                s["budget"][budget_fields[key]] = value
            else:
                s[key] = value
        Settings.from_json(s)  # validate before it is written
        return s

    return Settings.from_json(ws.store.update_doc(ws.workspace_id, "settings", change))
