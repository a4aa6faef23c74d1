"""/workers/messages: list (a user its own, a moderator any), send (a user to its own workers, a
moderator to any or to all), read one (anyone, by id) and delete (the sender or a moderator); and the
messages' shapes in a pop's answer. Upstream's routes, fields and codes; its dates are RFC 822."""

from __future__ import annotations

from email.utils import formatdate
from typing import Annotated

from litestar import delete, get, post
from litestar.params import FromPath, FromQuery, JSONBody, Parameter
from msgspec import UNSET

from horde_lite.accounts import worker_messages
from horde_lite.accounts.worker_messages import MessageRecord, Validity
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ResponseModelMessage,
    ResponseModelMessagePop,
    SimpleResponse,
    WorkerMessageInput,
)
from horde_lite.inputs import INT32_MAX


def rfc822(epoch: float) -> str:
    """Upstream's date format for messages: "Mon, 01 Jan 2024 12:00:00 -0000"."""
    return formatdate(epoch)


def pop_message(found: MessageRecord) -> ResponseModelMessagePop:
    return ResponseModelMessagePop(
        id=found.id, message=found.message, origin=found.origin, expiry=rfc822(found.expires_at)
    )


def message_details(found: MessageRecord) -> ResponseModelMessage:
    return ResponseModelMessage(
        id=found.id, message=found.message, origin=found.origin, expiry=rfc822(found.expires_at),
        user_id=str(found.user_id), created=rfc822(found.created_at),
        worker_id=found.worker_id if found.worker_id is not None else UNSET,
    )  # fmt: skip


@get("/workers/messages")
async def list_messages(
    horde: HordeDep,
    caller: CallerDep,
    user_id: Annotated[
        int | None, Parameter(ge=0, le=INT32_MAX, description="a user's id (the number of name#id)")
    ] = None,
    worker_id: Annotated[str | None, Parameter(max_length=100, description="a worker's id")] = None,
    validity: FromQuery[Validity] = "active",
    page: FromQuery[int] = 1,
) -> list[ResponseModelMessage]:
    """50 a page, newest first: a user sees what it sent, what was sent to its workers and what was
    sent to every worker; a moderator sees everything, or what concerns `user_id`."""
    found = await worker_messages.listing(
        horde, caller, user_id=user_id, worker_id=worker_id, validity=validity, page=page
    )
    return [message_details(m) for m in found]


@post("/workers/messages", status_code=200)
async def send_message(
    data: JSONBody[WorkerMessageInput], horde: HordeDep, caller: CallerDep
) -> ResponseModelMessage:
    """A moderator to any worker, or with no `worker_id` to every worker; a user to its own."""
    return message_details(await worker_messages.send(horde, caller, data))


@get("/workers/messages/{message_id:str}")
async def show_message(horde: HordeDep, message_id: FromPath[str]) -> ResponseModelMessage:
    return message_details(await worker_messages.show(horde, message_id))


@delete("/workers/messages/{message_id:str}", status_code=200)
async def delete_message(horde: HordeDep, caller: CallerDep, message_id: FromPath[str]) -> SimpleResponse:
    await worker_messages.remove(horde, caller, message_id)
    return SimpleResponse(message="OK")


HANDLERS = [list_messages, send_message, show_message, delete_message]
