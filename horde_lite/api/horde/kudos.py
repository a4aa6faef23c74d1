"""/kudos/transfer: a registered user gives kudos to another user or a shared key's owner."""

from __future__ import annotations

from litestar import post
from litestar.params import JSONBody

from horde_lite.accounts import transfers
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import KudosTransferInput, KudosTransferred


@post("/kudos/transfer", status_code=200)
async def transfer_kudos(
    data: JSONBody[KudosTransferInput], horde: HordeDep, caller: CallerDep
) -> KudosTransferred:
    return KudosTransferred(transferred=await transfers.transfer(horde, caller, data))


HANDLERS = [transfer_kudos]
