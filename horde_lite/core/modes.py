"""The horde's modes (upstream's maintenance, worker invite-only and raid modes) as a server process
applies them, and what each one refuses.

The modes in force live in the database (operators/horde_modes.py); each server process applies a
copy, `horde.modes`, replaced whole when the database's version changes, so a call that read it
once judges by one set of modes. The refusals are here, one function per thing a mode stops:

- maintenance: no new request on either face, dry runs included; what is queued is still popped,
  generated and submitted, and status polls answer, so the queue drains;
- invite-only: a user brings a new worker online only while its live workers are fewer than the
  `worker_invited` a moderator granted it (PUT /users/{id}); workers that exist keep working;
- raid: an untrusted user's new worker needs that invitation too, and open registration needs an
  invite code. The refusals say nothing of a raid: upstream hides it from all but moderators.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc

if TYPE_CHECKING:
    from horde_lite.db.models import User

Registration = Literal["closed", "invite", "open"]

# Seconds a client refused by maintenance is told to wait before it tries again (upstream's).
MAINTENANCE_RETRY_SECONDS = 60


@dataclass(frozen=True, slots=True)
class HordeModes:
    """The modes one process applies, and the database version they came from (0: none yet)."""

    maintenance: bool = False
    invite_only: bool = False
    raid: bool = False
    version: int = 0


MODES_OFF = HordeModes()


def refuse_new_requests(modes: HordeModes) -> None:
    """Before a request is judged (both faces, dry runs too)."""
    if modes.maintenance:
        raise HordeError(
            Rc.MaintenanceMode,
            "This horde is in maintenance mode: it takes no new requests for now (the ones already "
            "queued are still served). Please try again later.",
            retry_after=MAINTENANCE_RETRY_SECONDS,
        )


def _needs_invitation(modes: HordeModes, owner: User) -> bool:
    return modes.invite_only or (modes.raid and not (owner.trusted or owner.moderator))


def refuse_new_worker(modes: HordeModes, owner: User, count: int) -> None:
    """Before a pop creates a worker for `owner`, who holds `count` live workers: under invite-only
    (and, for an untrusted user, in raid mode) only within the moderator's `worker_invited`."""
    if not _needs_invitation(modes, owner) or count < owner.worker_invited:
        return
    if modes.invite_only:
        held = f" and this user already has {count} workers" if count else ""
        raise HordeError(
            Rc.WorkerInviteOnly,
            f"This horde has been switched to worker invite-only mode{held}. Ask a moderator to "
            "invite more of your workers (worker_invited) before a new name can pop.",
        )
    raise HordeError(
        Rc.NotTrusted,
        "Only trusted users may bring a new worker online at the moment. Ask a moderator to invite "
        "your worker (worker_invited), or to trust your account.",
    )


def registration_mode(modes: HordeModes, configured: Registration) -> Registration:
    """Who may register now: in raid mode open registration needs an invite code (a moderator's
    vouching, as upstream lets only accounts vouched for by an OAuth provider register then)."""
    if modes.raid and configured == "open":
        return "invite"
    return configured
