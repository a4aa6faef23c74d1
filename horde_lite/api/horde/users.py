"""/find_user, /users (records; a moderator's create, change and delete) and /sharedkeys."""

from __future__ import annotations

import time
from typing import TypeVar

import msgspec
from litestar import delete, get, patch, post, put, route
from litestar.params import FromPath, FromQuery, JSONBody
from msgspec import UNSET, UnsetType

from horde_lite.accounts import limits, profiles, sharedkeys
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ContributionsDetails,
    CreatedUser,
    DeletedUserAnswer,
    ModifyUser,
    MonthlyKudos,
    SharedKeyDetails,
    SharedKeyInput,
    SharedKeyPatch,
    SimpleResponse,
    UserAmountRecords,
    UserCreate,
    UserDetails,
    UserKudosDetails,
    UserRecords,
    UserThingRecords,
    UserUpdate,
)
from horde_lite.settings import Settings

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
            accumulated=d["accumulated"], gifted=d["gifted"], admin=d["admin"], received=d["received"],
            awarded=d["awarded"],
        ),
        contributions=ContributionsDetails(fulfillments=found.jobs_fulfilled, tokens=found.tokens_generated),
        records=UserRecords(
            usage=UserThingRecords(tokens=found.usage.usage_tokens),
            contribution=UserThingRecords(tokens=found.usage.contributed_tokens),
            fulfillment=UserAmountRecords(text=found.usage.fulfilled),
            request=UserAmountRecords(text=found.usage.requests),
        ),
        worker_ids=unset_none(found.worker_ids), sharedkey_ids=unset_none(found.sharedkey_ids),
        worker_invited=found.user.worker_invited, contact=unset_none(found.contact),
        admin_comment=unset_none(found.admin_comment), flagged=unset_none(found.flagged),
    )  # fmt: skip


def with_limits(details: UserDetails, found: profiles.UserRecord, settings: Settings) -> UserDetails:
    """The user's limits in force, shown to the user itself and to moderators."""
    if not found.privileged:
        return details
    user = found.user
    received = user.monthly_kudos_last_received
    when = None if received is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(received))
    own = limits.user_limits(user, settings)
    return msgspec.structs.replace(
        details,
        concurrency=limits.user_concurrency(user, settings),
        monthly_kudos=MonthlyKudos(amount=user.monthly_kudos, last_received=when),
        allowed_models=limits.user_allowed_models(user, settings),
        requests_per_minute=own.requests_per_minute,
        tokens_per_day=own.tokens_per_day,
    )


@get("/find_user")
async def find_user(horde: HordeDep, caller: CallerDep) -> UserDetails:
    """The caller's own record (no key: the anonymous user, `Anonymous#0`)."""
    found = await profiles.find_user(horde, caller)
    return with_limits(user_details(found), found, horde.settings)


@get("/users")
async def list_users(
    horde: HordeDep, page: FromQuery[int] = 1, sort: FromQuery[str] = "kudos"
) -> list[UserDetails]:
    """25 public records a page, `sort` kudos (highest first) or age (oldest first)."""
    return [user_details(u) for u in await profiles.list_users(horde, page=page, sort=sort)]


@get("/users/{user_id:str}")
async def show_user(horde: HordeDep, caller: CallerDep, user_id: FromPath[str]) -> UserDetails:
    found = await profiles.user_by_id(horde, caller, user_id)
    return with_limits(user_details(found), found, horde.settings)


@post("/users", status_code=200)
async def create_user(data: JSONBody[UserCreate], horde: HordeDep, caller: CallerDep) -> CreatedUser:
    """A moderator creates a user (horde_lite's own route); the key is in this answer only."""
    made = await profiles.create(horde, caller, data)
    return CreatedUser(id=made.user.id, username=made.name, api_key=made.api_key)


@put("/users/{user_id:str}")
async def change_user(
    data: JSONBody[UserUpdate], horde: HordeDep, caller: CallerDep, user_id: FromPath[str]
) -> ModifyUser:
    found = await profiles.modify_user(horde, caller, user_id, data)
    changed = found.limits_changed or limits.UserLimitsChanged()
    return ModifyUser(
        new_kudos=unset_none(found.new_kudos),
        trusted=unset_none(found.trusted),
        moderator=unset_none(found.moderator),
        username=unset_none(found.username),
        contact=unset_none(found.contact),
        admin_comment=unset_none(found.admin_comment),
        public_workers=unset_none(found.public_workers),
        worker_invited=unset_none(found.worker_invited),
        flagged=unset_none(found.flagged),
        concurrency=unset_none(changed.concurrency),
        monthly_kudos=unset_none(changed.monthly_kudos),
        allowed_models=unset_none(changed.allowed_models),
        requests_per_minute=unset_none(changed.requests_per_minute),
        tokens_per_day=unset_none(changed.tokens_per_day),
    )


@delete("/users/{user_id:str}", status_code=200)
async def delete_user(horde: HordeDep, caller: CallerDep, user_id: FromPath[str]) -> DeletedUserAnswer:
    """The user themselves or a moderator; refused (423 Locked) while the user has work in flight."""
    gone = await profiles.delete(horde, caller, user_id)
    return DeletedUserAnswer(
        message="OK", deleted_username=gone.name, kudos=round(gone.kudos, 2),
        workers_deleted=gone.workers, sharedkeys_removed=gone.shared_keys,
    )  # fmt: skip


def shared_key_details(found: sharedkeys.SharedKeyRecord) -> SharedKeyDetails:
    k = found.key
    return SharedKeyDetails(
        id=found.id, username=found.owner, name=k.name, kudos=k.kudos, utilized=round(k.utilized, 2),
        expiry=k.expiry, max_text_tokens=k.max_text_tokens, allowed_models=list(k.allowed_models),
        concurrency=k.concurrency, requests_per_minute=k.requests_per_minute, tokens_per_day=k.tokens_per_day,
        monthly_kudos=k.monthly_kudos,
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
    find_user, list_users, show_user, create_user, change_user, delete_user,
    create_shared_key, show_shared_key, change_shared_key, delete_shared_key,
]  # fmt: skip
