"""Who may see and switch the horde's modes, as upstream's HordeModes routes decide: GET and PUT
/api/v2/status/modes, and the dashboard's modes panel (as a signed-in moderator).

- Anyone sees maintenance and invite-only. A caller who sends a key must be a moderator (its own
  key, not a shared key): an unknown key is InvalidAPIKey, any other NotModerator; a moderator also
  sees raid mode, which upstream hides to throw raiders off.
- Maintenance is switched by an admin (`[moderation] admins`, upstream's ADMINS), invite-only and
  raid by a moderator; the operator's CLI switches any (operators/horde_modes.py directly). The
  rights are checked in upstream's order (maintenance, invite-only, raid), all before anything is
  written, and a switch naming no mode is NoHordeModSelected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from horde_lite.accounts.profiles import SignedIn
from horde_lite.accounts.users import Requester, authenticate, display_name
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.core.modes import HordeModes
from horde_lite.db.models import User
from horde_lite.operators import horde_modes
from horde_lite.operators.horde_modes import Mode
from horde_lite.rc import Rc
from horde_lite.settings import Settings

# Who switches: a key's caller (the API) or a dashboard session.
Actor = Caller | SignedIn


@dataclass(frozen=True, slots=True)
class ModesShown:
    maintenance_mode: bool
    invite_only_mode: bool
    raid_mode: bool | None  # None: not shown (the caller sent no key)


def is_admin(settings: Settings, user: User) -> bool:
    return not user.anonymous and display_name(user) in settings.moderation.admins


async def shown(horde: Horde, caller: Caller) -> ModesShown:
    """GET /status/modes: the modes this process applies, raid mode for a moderator's key only."""
    modes = horde.modes  # read once: one version throughout the answer
    raid: bool | None = None
    if caller.apikey:
        async with horde.transaction() as session:
            viewer = await authenticate(session, caller.apikey, horde.clock.now())
        if not viewer.user.moderator or viewer.shared_key is not None:
            raise HordeError(Rc.NotModerator, "Only a moderator may ask for the horde's modes with a key.")
        raid = modes.raid
    return ModesShown(maintenance_mode=modes.maintenance, invite_only_mode=modes.invite_only, raid_mode=raid)


async def _actor(horde: Horde, who: Actor) -> tuple[User, bool]:
    """The user switching, and whether it acts through its own key or session (not a shared key)."""
    if isinstance(who, SignedIn):
        async with horde.reading() as session:
            user = await session.get(User, who.user_id)
        if user is None or user.anonymous or not user.moderator:
            raise HordeError(
                Rc.NotModerator, "This dashboard session is no longer a moderator's; sign in again."
            )
        return user, True
    async with horde.transaction() as session:  # the anonymous user's row may be made here
        found: Requester = await authenticate(session, who.apikey, horde.clock.now())
    return found.user, found.shared_key is None


def check_rights(settings: Settings, user: User, own_key: bool, changes: Mapping[Mode, bool]) -> None:
    """Refuse the first mode `user` may not switch, in upstream's order; then an empty switch."""
    name = display_name(user)
    if "maintenance" in changes and not (own_key and is_admin(settings, user)):
        raise HordeError(
            Rc.NotAdmin,
            f"{name} is not one of this horde's admins ([moderation] admins): only an admin, or the "
            "operator's `horde-lite modes set`, switches maintenance mode.",
        )
    for mode in ("invite_only", "raid"):
        if mode in changes and not (own_key and user.moderator):
            raise HordeError(Rc.NotModerator, f"Only a moderator's own key switches {mode} mode.")
    if not changes:
        raise HordeError(
            Rc.NoHordeModSelected,
            "No mode change selected: send maintenance_mode, invite_only_mode or raid_mode.",
        )


async def change(horde: Horde, who: Actor, changes: Mapping[Mode, bool], source: str) -> HordeModes:
    """PUT /status/modes and the dashboard's form: switch `changes` if `who` may, for every process
    of the horde (this one at once); returns the modes in force after it."""
    user, own_key = await _actor(horde, who)
    check_rights(horde.settings, user, own_key, changes)
    return await horde_modes.switch(horde, changes, display_name(user), source)
