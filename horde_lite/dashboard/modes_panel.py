"""The dashboard's modes panel: the horde's modes this process applies, who may switch each, and
the latest switches. Its form posts to `/dashboard/modes` (routes.py), which switches through the
same rules as PUT /api/v2/status/modes (operators/mode_rights.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from horde_lite.core.context import Horde
from horde_lite.operators import horde_modes

RECENT = 10  # switches listed


@dataclass(frozen=True, slots=True)
class ModeRow:
    mode: str  # maintenance | invite_only | raid
    title: str
    on: bool
    effect: str
    who: str  # who may switch it


ROWS = (
    ("maintenance", "Maintenance", "no new requests on either face; queued work still drains",
     "an admin ([moderation] admins)"),
    ("invite_only", "Worker invite-only", "a new worker only within its owner's worker_invited",
     "a moderator"),
    ("raid", "Raid", "untrusted users' new workers need an invitation; open registration needs a code",
     "a moderator"),
)  # fmt: skip


async def context(horde: Horde) -> dict[str, Any]:
    modes = horde.modes  # read once: one version throughout the panel
    rows = [ModeRow(mode, title, getattr(modes, mode), effect, who) for mode, title, effect, who in ROWS]
    return {
        "rows": rows,
        "version": modes.version,
        "changes": await horde_modes.history(horde, RECENT),
        "admins": horde.settings.moderation.admins,
        "reload_seconds": horde.settings.policies.reload_seconds,
        "now": horde.clock.now(),
    }
