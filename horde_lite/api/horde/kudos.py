"""/kudos/transfer: a registered user gives kudos to another user or a shared key's owner;
/kudos/award: a moderator gives kudos."""

from __future__ import annotations

from litestar import post
from litestar.params import JSONBody

from horde_lite.accounts import profiles, transfers
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import KudosAwarded, KudosAwardInput, KudosTransferInput, KudosTransferred


@post("/kudos/transfer", status_code=200)
async def transfer_kudos(
    data: JSONBody[KudosTransferInput], horde: HordeDep, caller: CallerDep
) -> KudosTransferred:
    return KudosTransferred(transferred=await transfers.transfer(horde, caller, data))


@post("/kudos/award", status_code=200)
async def award_kudos(data: JSONBody[KudosAwardInput], horde: HordeDep, caller: CallerDep) -> KudosAwarded:
    """Moderators only (upstream: its privileged accounts)."""
    return KudosAwarded(awarded=await profiles.award(horde, caller, data))


HANDLERS = [transfer_kudos, award_kudos]
