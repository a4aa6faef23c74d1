"""Registration, a user's own key rotation and the moderators' invite codes (horde_lite's own
routes: upstream registers through its OAuth pages). The rules: accounts/registration.py and
accounts/invites.py."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post
from litestar.params import FromPath, JSONBody

from horde_lite.accounts import invites, registration
from horde_lite.api.address_guard import address_guard
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.guards import OPERATOR_ACTIONS, moderator_guard, viewer_of
from horde_lite.api.horde.schemas import InviteDetails, InviteInput, RegisterInput, UserKeyDetails


def user_key(found: registration.UserKey) -> UserKeyDetails:
    return UserKeyDetails(id=found.id, username=found.username, api_key=found.api_key)


def invite_details(found: invites.Invite) -> InviteDetails:
    details = InviteDetails(
        id=found.id, hint=found.hint, uses=found.uses, uses_left=found.uses_left,
        state=found.state, expires_at=found.expires_at, created_by=found.created_by,
        created_at=found.created_at, revoked_at=found.revoked_at,
    )  # fmt: skip
    if found.code is not None:
        details.code = found.code
    return details


@post("/register", status_code=200, before_request=address_guard)
async def register(data: JSONBody[RegisterInput], horde: HordeDep) -> UserKeyDetails:
    """Open to anyone when `[accounts] registration = "open"`, to holders of an invite code when
    "invite"; refused with `RegistrationClosed` when "closed" (the default). Rate limited per
    client address (`[ratelimit] register_per_hour`)."""
    return user_key(await registration.register(horde, data.username, data.invite))


@post("/find_user/rotate_key", status_code=200)
async def rotate_key(horde: HordeDep, caller: CallerDep) -> UserKeyDetails:
    """The user of the `apikey` header gets a new key, shown once; the old one stops working at
    once (its workers and dashboard sessions too)."""
    return user_key(await registration.rotate_own_key(horde, caller))


@post("/invites", status_code=200, guards=[moderator_guard], opt={"door": OPERATOR_ACTIONS})
async def create_invite(
    request: Request[Any, Any, Any], data: JSONBody[InviteInput], horde: HordeDep
) -> InviteDetails:
    """A moderator's code for registration in invite mode; `code` is shown in this answer only."""
    by = viewer_of(request).name
    return invite_details(await invites.create(horde, uses=data.uses, days=data.days, by=by))


@get("/invites", guards=[moderator_guard], opt={"door": OPERATOR_ACTIONS})
async def list_invites(horde: HordeDep) -> list[InviteDetails]:
    """The newest codes first (at most 1000), whatever their state."""
    return [invite_details(i) for i in await invites.listing(horde)]


@delete("/invites/{code:str}", status_code=200, guards=[moderator_guard], opt={"door": OPERATOR_ACTIONS})
async def revoke_invite(horde: HordeDep, code: FromPath[str]) -> InviteDetails:
    """By the code itself or the `id` a listing shows; revoking twice changes nothing."""
    return invite_details(await invites.revoke(horde, code))


HANDLERS = [register, rotate_key, create_invite, list_invites, revoke_invite]
