"""The address timeouts panel's actions: time out an address or network, lift a timeout. Shut on
open pages (`ACTIONS`), form posts checked like the sign-in's (`same_origin`), each calling the
entry point the API's `/operations/ipaddr` routes call (operators/ip_timeouts.py) as the
signed-in moderator, and answered with a page saying what was done or refused."""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, Router, post
from litestar.response import Template

from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import viewer_of
from horde_lite.core.errors import HordeError
from horde_lite.dashboard.routes import ACTED, PATH, action_page, same_origin
from horde_lite.operators import ip_timeouts
from horde_lite.operators.ip_rule import MOST_DAYS, MOST_HOURS, shown


def _done(message: str, status: int = 200) -> Template:
    return action_page(message, status=status, panel="timeouts")


def _whole(value: object) -> int | None:
    """The form's hours or days: ASCII digits, at most four (the rule bounds the number itself)."""
    text = str(value or "").strip()
    return int(text) if re.fullmatch(r"[0-9]{1,4}", text) else None


async def _ipaddr(request: Request[Any, Any, Any]) -> tuple[str, Any]:
    form = await request.form()
    return str(form.get("ipaddr") or "").strip(), form


@post("/", **ACTED)
async def add_timeout(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    if not same_origin(request):
        return _done("A timeout must come from this site's own dashboard.", status=403)
    ipaddr, form = await _ipaddr(request)
    hours = _whole(form.get("hours"))
    if hours is None:
        return _done(f"Hours must be a whole number from 1 to {MOST_HOURS}.", status=400)
    try:
        network = await ip_timeouts.add(horde, ipaddr, hours, by=viewer_of(request).user_id)
    except HordeError as exc:
        return _done(exc.message, status=exc.rc.status)
    return _done(f"{shown(network)} is in timeout for {hours} hour(s).")


@post("/lift", **ACTED)
async def lift_timeout(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    if not same_origin(request):
        return _done("A lift must come from this site's own dashboard.", status=403)
    ipaddr, _ = await _ipaddr(request)
    try:
        lifted = await ip_timeouts.lift(horde, ipaddr)
    except HordeError as exc:
        return _done(exc.message, status=exc.rc.status)
    return _done(f"The timeout of {ipaddr} is lifted." if lifted else f"{ipaddr} had no timeout.")


@post("/block_worker", **ACTED)
async def block_worker(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    """A worker's last address in timeout for some days, as PUT /operations/block_worker_ipaddr."""
    if not same_origin(request):
        return _done("A block must come from this site's own dashboard.", status=403)
    form = await request.form()
    worker_id = str(form.get("worker_id") or "").strip()
    days = _whole(form.get("days"))
    if days is None:
        return _done(f"Days must be a whole number from 1 to {MOST_DAYS}.", status=400)
    try:
        network = await ip_timeouts.block_worker(horde, worker_id, days, by=viewer_of(request).user_id)
    except HordeError as exc:
        return _done(exc.message, status=exc.rc.status)
    return _done(f"The address of worker {worker_id}, {shown(network)}, is in timeout for {days} day(s).")


router = Router(
    path=f"{PATH}/ip_timeouts",
    route_handlers=[add_timeout, lift_timeout, block_worker],
    include_in_schema=False,
)
