"""/find_user, /users and /sharedkeys."""

from __future__ import annotations

from typing import TypeVar

from litestar import delete, get, patch, put, route
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import UNSET, UnsetType

from horde_lite.accounts import profiles, sharedkeys
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ContributionsDetails,
    ModifyUser,
    SharedKeyDetails,
    SharedKeyInput,
    SharedKeyPatch,
    SimpleResponse,
    UserAmountRecords,
    UserDetails,
    UserKudosDetails,
    UserRecords,
    UserThingRecords,
    UserUpdate,
)

T = TypeVar("T")


def unset_none(value: T | None) -> T | UnsetType:
    """None (not set, not shown) as msgspec's UNSET: the field is left out of the answer."""
    return UNSET if value is None else value


def user_details(found: profiles.UserRecord) -> UserDetails:
    d = found.kudos_details
    return UserDetails(
        username=found.username, id=found.id, kudos=round(found.user.kudos, 2), trusted=found.user.trusted,
        moderator=found.user.moderator, worker_count=found.worker_count, account_age=found.account_age,
        kudos_details=UserKudosDetails(
            accumulated=d["accumulated"], gifted=d["gifted"], admin=d["admin"], received=d["received"]
        ),
        contributions=ContributionsDetails(fulfillments=found.jobs_fulfilled, tokens=found.tokens_generated),
        records=UserRecords(
            usage=UserThingRecords(tokens=found.usage.usage_tokens),
            contribution=UserThingRecords(tokens=found.usage.contributed_tokens),
            fulfillment=UserAmountRecords(text=found.usage.fulfilled),
            request=UserAmountRecords(text=found.usage.requests),
        ),
        worker_ids=unset_none(found.worker_ids), sharedkey_ids=unset_none(found.sharedkey_ids),
    )  # fmt: skip


@get("/find_user")
async def find_user(horde: HordeDep, caller: CallerDep) -> UserDetails:
    """The caller's own record (no key: the anonymous user, `Anonymous#0`)."""
    return user_details(await profiles.find_user(horde, caller))


@get("/users")
async def list_users(
    horde: HordeDep, page: FromQuery[int] = 1, sort: FromQuery[str] = "kudos"
) -> list[UserDetails]:
    """25 public records a page, `sort` kudos (highest first) or age (oldest first)."""
    return [user_details(u) for u in await profiles.list_users(horde, page=page, sort=sort)]


@get("/users/{user_id:str}")
async def show_user(horde: HordeDep, caller: CallerDep, user_id: FromPath[str]) -> UserDetails:
    return user_details(await profiles.user_by_id(horde, caller, user_id))


@put("/users/{user_id:str}")
async def change_user(
    data: JSONBody[UserUpdate], horde: HordeDep, caller: CallerDep, user_id: FromPath[str]
) -> ModifyUser:
    found = await profiles.modify_user(horde, caller, user_id, data)
    return ModifyUser(
        new_kudos=unset_none(found.new_kudos),
        trusted=unset_none(found.trusted),
        moderator=unset_none(found.moderator),
    )


def shared_key_details(found: sharedkeys.SharedKeyRecord) -> SharedKeyDetails:
    k = found.key
    return SharedKeyDetails(
        id=found.id, username=found.owner, name=k.name, kudos=k.kudos, utilized=round(k.utilized, 2),
        expiry=k.expiry, max_text_tokens=k.max_text_tokens,
    )  # fmt: skip


# Upstream creates with PUT; POST is horde_lite's original spelling of the same call.
@route("/sharedkeys", http_method=["POST", "PUT"], status_code=200)
async def create_shared_key(
    data: JSONBody[SharedKeyInput], horde: HordeDep, caller: CallerDep
) -> SharedKeyDetails:
    return shared_key_details(await sharedkeys.create(horde, caller, data))


@get("/sharedkeys/{key:str}")
async def show_shared_key(horde: HordeDep, key: FromPath[str]) -> SharedKeyDetails:
    return shared_key_details(await sharedkeys.show(horde, key))


@patch("/sharedkeys/{key:str}")
async def change_shared_key(
    data: JSONBody[SharedKeyPatch], horde: HordeDep, caller: CallerDep, key: FromPath[str]
) -> SharedKeyDetails:
    return shared_key_details(await sharedkeys.change(horde, caller, key, data))


@delete("/sharedkeys/{key:str}", status_code=200)
async def delete_shared_key(horde: HordeDep, caller: CallerDep, key: FromPath[str]) -> SimpleResponse:
    await sharedkeys.remove(horde, caller, key)
    return SimpleResponse(message="OK")


HANDLERS = [
    find_user, list_users, show_user, change_user,
    create_shared_key, show_shared_key, change_shared_key, delete_shared_key,
]  # fmt: skip
