"""/find_user and /sharedkeys."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, patch, post
from litestar.params import FromPath

from horde_lite.api.common import apikey_of, decode, horde_of, transaction
from horde_lite.lifecycle import sharedkeys
from horde_lite.lifecycle.inputs import SharedKeyInput, SharedKeyPatch
from horde_lite.lifecycle.users import authenticate, authenticate_user, display_name, worker_count

Req = Request[Any, Any, Any]


@get("/find_user")
async def find_user(request: Req) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        requester = await authenticate(session, apikey_of(request), horde.clock.now())
        user = requester.user
        return {
            "username": display_name(user),
            "id": user.id,
            "kudos": round(user.kudos, 2),
            "trusted": user.trusted,
            "moderator": user.moderator,
            "worker_count": await worker_count(session, user.id),
        }


@post("/sharedkeys", status_code=200)
async def create_shared_key(request: Req) -> dict[str, Any]:
    horde = horde_of(request)
    body = await decode(request, SharedKeyInput)
    async with transaction(horde) as session:
        owner = await authenticate_user(session, apikey_of(request), horde.clock.now())
        return await sharedkeys.create(session, horde, owner, body)


@get("/sharedkeys/{key:str}")
async def show_shared_key(request: Req, key: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        return await sharedkeys.show(session, key)


@patch("/sharedkeys/{key:str}")
async def change_shared_key(request: Req, key: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    body = await decode(request, SharedKeyPatch)
    async with transaction(horde) as session:
        owner = await authenticate_user(session, apikey_of(request), horde.clock.now())
        return await sharedkeys.change(session, horde, owner, key, body)


@delete("/sharedkeys/{key:str}", status_code=200)
async def delete_shared_key(request: Req, key: FromPath[str]) -> dict[str, Any]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        owner = await authenticate_user(session, apikey_of(request), horde.clock.now())
        await sharedkeys.remove(session, owner, key)
        return {"message": "OK"}


HANDLERS = [find_user, create_shared_key, show_shared_key, change_shared_key, delete_shared_key]
