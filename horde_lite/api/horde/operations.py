"""/operations: moderators' address timeouts (upstream's `OperationsIP`, `OperationsIPSingle` and
`OperationsBlockWorkerIP`). The rules: operators/ip_timeouts.py (what a timeout covers:
operators/ip_rule.py).

Every route needs a moderator's own key, open operator pages or not: the addresses are personal
data, and the changes shut callers out (`OPERATOR_ACTIONS`)."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post, put
from litestar.params import FromPath, JSONBody

from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import OPERATOR_ACTIONS, moderator_guard, viewer_of
from horde_lite.api.horde.schemas import IPTimeout, SimpleResponse
from horde_lite.inputs import IpTimeoutInput, IpTimeoutLift, WorkerTimeoutInput
from horde_lite.operators import ip_timeouts

MODERATORS: dict[str, Any] = {"guards": [moderator_guard], "opt": {"door": OPERATOR_ACTIONS}}
OK = SimpleResponse(message="OK")


def _listed(found: list[ip_timeouts.Timeout]) -> list[IPTimeout]:
    return [IPTimeout(ipaddr=t.ipaddr, seconds=t.seconds) for t in found]


@get("/operations/ipaddr", **MODERATORS)
async def list_ip_timeouts(horde: HordeDep) -> list[IPTimeout]:
    """Every live timeout, the newest first (upstream lists its CIDR blocks only; here a single
    address is a network too)."""
    return _listed(await ip_timeouts.live(horde))


@post("/operations/ipaddr", status_code=200, **MODERATORS)
async def add_ip_timeout(
    request: Request[Any, Any, Any], data: JSONBody[IpTimeoutInput], horde: HordeDep
) -> SimpleResponse:
    """Time out an address or CIDR for `hours` (1 to 720) from now, replacing the timeout it has. A
    single IPv6 address times out its /64; a network wider than an IPv4 /8 or an IPv6 /32 is refused."""
    await ip_timeouts.add(horde, data.ipaddr, data.hours, by=viewer_of(request).user_id)
    return OK


@delete("/operations/ipaddr", status_code=200, **MODERATORS)
async def lift_ip_timeout(data: JSONBody[IpTimeoutLift], horde: HordeDep) -> SimpleResponse:
    """Lift the timeout an address or CIDR was given (`OK` also when it had none, as upstream)."""
    await ip_timeouts.lift(horde, data.ipaddr)
    return OK


@get("/operations/ipaddr/{ipaddr:path}", **MODERATORS)
async def ip_timeouts_matching(horde: HordeDep, ipaddr: FromPath[str]) -> list[IPTimeout]:
    """The live timeouts covering an address, or overlapping a network (`203.0.113.0/24`: its slash
    may be sent as is or encoded)."""
    return _listed(await ip_timeouts.matching(horde, ipaddr.lstrip("/")))


@put("/operations/block_worker_ipaddr/{worker_id:str}", status_code=200, **MODERATORS)
async def block_worker_ip(
    request: Request[Any, Any, Any],
    data: JSONBody[WorkerTimeoutInput],
    horde: HordeDep,
    worker_id: FromPath[str],
) -> SimpleResponse:
    """Time out the address the worker last popped from (an IPv6 address's /64) for `days` (1 to 30)."""
    await ip_timeouts.block_worker(horde, worker_id, data.days, by=viewer_of(request).user_id)
    return OK


@delete("/operations/block_worker_ipaddr/{worker_id:str}", status_code=200, **MODERATORS)
async def unblock_worker_ip(horde: HordeDep, worker_id: FromPath[str]) -> SimpleResponse:
    """Lift the worker's blocks and the timeout of its last address."""
    await ip_timeouts.unblock_worker(horde, worker_id)
    return OK


HANDLERS = [
    list_ip_timeouts,
    add_ip_timeout,
    lift_ip_timeout,
    ip_timeouts_matching,
    block_worker_ip,
    unblock_worker_ip,
]
