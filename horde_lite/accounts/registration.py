"""Accounts made and keys rotated by the people themselves, without the operator's shell: the API's
`POST /api/v2/register` and `POST /api/v2/find_user/rotate_key`, and the /register page's forms.

`[accounts] registration` says who may register: nobody ("closed", the CLI only), holders of an
invite code ("invite", accounts/invites.py) or anyone ("open"). A new user is an ordinary one: no
kudos, not trusted, not a moderator. Its key is shown once; only its hash is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from horde_lite.accounts import invites
from horde_lite.accounts.users import (
    authenticate,
    checked_username,
    create_user,
    display_name,
    is_anonymous_key,
    public_id,
    rotate_key,
)
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.core.modes import registration_mode
from horde_lite.rc import Rc


@dataclass(frozen=True, slots=True)
class UserKey:
    """A user and its new key, shown once."""

    id: int
    username: str  # "name#id"
    api_key: str


async def register(horde: Horde, username: str, invite: str | None) -> UserKey:
    """Create a user under the horde's registration mode (in raid mode, open registration needs a
    code: core/modes.py). In invite mode the code's use is counted in the transaction that creates
    the user: both happen, or neither."""
    mode = registration_mode(horde.modes, horde.settings.accounts.registration)
    if mode == "closed":
        raise HordeError(
            Rc.RegistrationClosed, "Registration is closed on this horde; ask its operator for an account."
        )
    username = checked_username(username)  # a bad name is refused before any invite is looked at
    now = horde.clock.now()
    async with horde.transaction() as session:
        if mode == "invite":
            await invites.claim(session, invite, now)
        user, key = await create_user(session, username, now)
        return UserKey(public_id(user), display_name(user), key)


async def rotate_own_key(horde: Horde, caller: Caller) -> UserKey:
    """The caller's own new key; its old one matches nobody from this commit on. The user's row is
    locked while it is read, so of two rotations with one key only the first succeeds."""
    if is_anonymous_key(caller.apikey):
        raise HordeError(
            Rc.AnonForbidden, "The anonymous key cannot be rotated; register for a key of your own."
        )
    async with horde.transaction() as session:
        found = await authenticate(session, caller.apikey, horde.clock.now(), lock=True)
        if found.shared_key is not None:
            raise HordeError(
                Rc.WrongCredentials,
                "A shared key cannot be rotated; use the owner's key, or delete the shared key.",
            )
        key = await rotate_key(session, found.user)
        return UserKey(public_id(found.user), display_name(found.user), key)
