"""The address timeouts panel's actions: time out an address or network, block a worker's last
address, lift a timeout. Each runs through the dashboard's `run_action` (shut on open pages, another
origin's post refused, a refusal shown with the rule's message) and calls the entry point the API's
`/operations` routes call (operators/ip_timeouts.py) as the signed-in moderator."""

from __future__ import annotations

import re
from typing import Any

from litestar import Request, Router, post
from litestar.response import Template

from horde_lite.accounts.profiles import SignedIn
from horde_lite.api.deps import HordeDep
from horde_lite.dashboard.routes import ACTED, PATH, action_page, run_action
from horde_lite.operators import ip_timeouts
from horde_lite.operators.ip_rule import MOST_DAYS, MOST_HOURS, shown

PANEL = "timeouts"


def _done(message: str, status: int = 200) -> Template:
    return action_page(message, status=status, panel=PANEL)


def _whole(value: object) -> int | None:
    """The form's hours or days: ASCII digits, at most four (the rule bounds the number itself)."""
    text = str(value or "").strip()
    return int(text) if re.fullmatch(r"[0-9]{1,4}", text) else None


@post("/", **ACTED)
async def add_timeout(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    async def add(who: SignedIn, form: dict[str, str]) -> Template:
        hours = _whole(form.get("hours"))
        if hours is None:
            return _done(f"Hours must be a whole number from 1 to {MOST_HOURS}.", status=400)
        network = await ip_timeouts.add(horde, form.get("ipaddr", ""), hours, by=who.user_id)
        return _done(f"{shown(network)} is in timeout for {hours} hour(s).")

    return await run_action(request, add, PANEL)


@post("/lift", **ACTED)
async def lift_timeout(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    async def lift(who: SignedIn, form: dict[str, str]) -> Template:
        ipaddr = form.get("ipaddr", "")
        lifted = await ip_timeouts.lift(horde, ipaddr)
        return _done(f"The timeout of {ipaddr} is lifted." if lifted else f"{ipaddr} had no timeout.")

    return await run_action(request, lift, PANEL)


@post("/block_worker", **ACTED)
async def block_worker(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    """A worker's last address in timeout for some days, as PUT /operations/block_worker_ipaddr."""

    async def block(who: SignedIn, form: dict[str, str]) -> Template:
        worker_id = form.get("worker_id", "")
        days = _whole(form.get("days"))
        if days is None:
            return _done(f"Days must be a whole number from 1 to {MOST_DAYS}.", status=400)
        network = await ip_timeouts.block_worker(horde, worker_id, days, by=who.user_id)
        return _done(f"The address of worker {worker_id}, {shown(network)}, is in timeout for {days} day(s).")

    return await run_action(request, block, PANEL)


router = Router(
    path=f"{PATH}/ip_timeouts",
    route_handlers=[add_timeout, lift_timeout, block_worker],
    include_in_schema=False,
)
