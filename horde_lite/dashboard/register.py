"""The /register page: a form that creates a user (in `open` or `invite` mode) and one that rotates
the user's own key, each showing the new key once. Server-rendered with the dashboard's look and
headers (CSP, no framing, nothing cached, no referrer elsewhere), no script; a post from another
origin is refused as the dashboard's sign-in refuses it. The rules are accounts/registration.py's,
as for the API's routes; registrations count against `[ratelimit] register_per_hour`."""

from __future__ import annotations

from typing import Any

from litestar import Request, Router, get, post
from litestar.response import Template

from horde_lite.accounts import registration
from horde_lite.api.deps import HordeDep
from horde_lite.api.ratelimit import client_address
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.core.modes import registration_mode
from horde_lite.dashboard.routes import HEADERS, same_origin
from horde_lite.operators import ip_timeouts

PATH = "/register"


def _page(horde: Horde, status: int = 200, **context: Any) -> Template:
    context.setdefault("mode", registration_mode(horde.modes, horde.settings.accounts.registration))
    return Template("register.html", context=context, status_code=status, headers=HEADERS)


def _field(form: Any, name: str) -> str:
    return str(form.get(name) or "")


@get("/")
async def page(horde: HordeDep) -> Template:
    return _page(horde)


@post("/", status_code=200)
async def register(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    if not same_origin(request):
        return _page(horde, 403, message="A registration must come from this site's own form.")
    form = await request.form()
    username, invite = _field(form, "username"), _field(form, "invite").strip()
    try:
        await ip_timeouts.check(horde, client_address(request))  # as the API's route is guarded
        made = await registration.register(horde, username, invite or None)
    except HordeError as exc:
        return _page(horde, exc.rc.status, message=exc.message, username=username)
    return _page(horde, new_key=made.api_key, who=made.username)


@post("/rotate", status_code=200)
async def rotate(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    if not same_origin(request):
        return _page(horde, 403, rotate_message="A new key must be asked for from this site's own form.")
    key = _field(await request.form(), "apikey").strip()
    try:
        made = await registration.rotate_own_key(horde, Caller(apikey=key or None))
    except HordeError as exc:
        return _page(horde, exc.rc.status, rotate_message=exc.message)
    return _page(horde, new_key=made.api_key, who=made.username, rotated=True)


router = Router(path=PATH, route_handlers=[page, register, rotate], include_in_schema=False)
