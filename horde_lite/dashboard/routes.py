"""The operators' dashboard at /dashboard (docs/reference/dashboard.md): server-rendered HTML with
inline SVG charts, one fragment route per panel that the page's script re-fetches.

Access (`moderator_guard`, with the dashboard's `DOOR`): open when `[http] open_operator_pages` is
true; otherwise a moderator's key, sent as the `apikey` header (scripts) or once through the login
form, which sets an HttpOnly, SameSite=Strict cookie holding a signed session (queries.py: never the
key, never its hash). The /register page (register.py) is mounted beside the dashboard by its plugin.

The invites, users and modes panels' actions (`/dashboard/invites...`, `/dashboard/users/...`,
`/dashboard/modes`) change things: their door (`ACTIONS`) stays shut on open pages, and each is a
form post checked like the sign-in's (`same_origin`). Each calls the entry point the horde API's
routes call (accounts/invites.py, accounts/profiles.py, operators/mode_rights.py), as the signed-in
moderator, and answers with a page saying what was done or refused.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import msgspec
from litestar import Request, Response, Router, get, post
from litestar.config.app import AppConfig
from litestar.datastructures import Cookie
from litestar.params import FromPath
from litestar.plugins import InitPluginProtocol
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.response import Redirect, Template
from litestar.template.config import TemplateConfig

from horde_lite.accounts import invites, profiles, worker_messages, workers
from horde_lite.api.deps import HordeDep
from horde_lite.api.guards import Door, Refused, moderator, moderator_guard, viewer_of
from horde_lite.api.static_files import static_files_router
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.dashboard import queries
from horde_lite.dashboard.render import PANELS, REFRESH_SECONDS, STATIC, TEMPLATES, filters
from horde_lite.inputs import UserCreate, UserUpdate, WorkerMessageInput
from horde_lite.operators import horde_modes, mode_rights
from horde_lite.rc import Rc

COOKIE = "horde_lite_dashboard"
PATH = "/dashboard"
# No framing, nothing cached, only the app's own script and styles, and no referrer to another
# origin. `same-origin`, not `no-referrer`: under `no-referrer` a browser sends `Origin: null` with
# the sign-in form's POST, which the origin check below must refuse.
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


# The dashboard's answers to whom `moderator_guard` turns away (401 without a moderator's key).
DOOR = Door(
    no_key=(Rc.InvalidAPIKey, "Sign in with a moderator's API key."),
    anonymous_key=(Rc.InvalidAPIKey, "A moderator's API key is required."),
    not_moderator="Only a moderator's own key opens the dashboard.",
    session_cookie=COOKIE,
)
GUARDED: dict[str, Any] = {"guards": [moderator_guard], "opt": {"door": DOOR}}
ACTIONS = Door(
    no_key=(Rc.InvalidAPIKey, "Sign in with a moderator's API key to change anything."),
    anonymous_key=DOOR.anonymous_key,
    not_moderator=DOOR.not_moderator,
    session_cookie=COOKIE,
    opened_by_open_pages=False,
)


def _login(status: int, message: str) -> Template:
    return Template("login.html", context={"message": message}, status_code=status, headers=HEADERS)


def _login_page(request: Request[Any, Any, Any], exc: Refused) -> Template:
    """The page's answer to a refused caller: the sign-in form, with the refusal's status."""
    return _login(exc.rc.status, exc.message)


def _plain_refusal(request: Request[Any, Any, Any], exc: Refused) -> Response[str]:
    """A fragment's answer to a refused caller: the reason as text (the page's script shows it)."""
    return Response(exc.message, status_code=exc.rc.status, media_type="text/plain", headers=HEADERS)


def same_origin(request: Request[Any, Any, Any]) -> bool:
    """A form post from this site (SameSite cookies aside, refuse another origin's posts outright).
    `Origin: null` (a sandboxed frame, a privacy-stripped origin) is refused: it proves nothing. No
    `Origin` at all is a client that is not a browser, which a forged cross-site post cannot be."""
    origin = request.headers.get("origin")
    if not origin or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def _contexts(horde: Horde, names: list[str], search: str = "") -> list[dict[str, Any]]:
    return [{"panel": PANELS[n], "ctx": await PANELS[n].context(horde, search)} for n in names]


@get("/", **GUARDED, exception_handlers={Refused: _login_page})
async def page(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    who = viewer_of(request)
    context = {
        "panels": await _contexts(horde, list(PANELS), request.query_params.get("q", "")),
        "viewer": who.name,
        "by_session": who.by_session,
        "refresh": REFRESH_SECONDS,
        "now": horde.clock.now(),
    }
    return Template("dashboard.html", context=context, headers=HEADERS)


@get("/panels/{name:str}", **GUARDED, exception_handlers={Refused: _plain_refusal})
async def panel(
    request: Request[Any, Any, Any], horde: HordeDep, name: FromPath[str]
) -> Template | Response[str]:
    if name not in PANELS:
        return Response(f"No panel {name!r}.", status_code=404, media_type="text/plain", headers=HEADERS)
    (item,) = await _contexts(horde, [name], request.query_params.get("q", ""))
    return Template("fragment.html", context=item, headers=HEADERS)


@post("/login", status_code=303)
async def login(request: Request[Any, Any, Any], horde: HordeDep) -> Template | Redirect:
    if not same_origin(request):
        return _login(403, "A sign-in must come from this site's own form.")
    form = await request.form()
    key = str(form.get("apikey") or "").strip()
    try:
        user = await moderator(horde, key, DOOR)
    except Refused as exc:
        return _login(exc.rc.status, exc.message)
    token = queries.session_token(user, horde.clock.now())
    cookie = Cookie(
        key=COOKIE, value=token, path=PATH, max_age=queries.SESSION_SECONDS, httponly=True,
        samesite="strict", secure=request.url.scheme == "https",
    )  # fmt: skip
    return Redirect(PATH, status_code=303, cookies=[cookie], headers=HEADERS)


def _whole(value: object) -> int | None:
    """A form's whole number: ASCII digits, at most six (a bound far above any valid value)."""
    text = str(value or "").strip()
    return int(text) if re.fullmatch(r"[0-9]{1,6}", text) else None


# The invites and users panels' actions: shut on open pages, answered with a page.
ACTED: dict[str, Any] = {
    "guards": [moderator_guard],
    "opt": {"door": ACTIONS},
    "exception_handlers": {Refused: _login_page},
    "status_code": 200,
}


def _invite_page(status: int, message: str, code: str | None = None) -> Template:
    context = {"message": message, "code": code}
    return Template("invite.html", context=context, status_code=status, headers=HEADERS)


@post("/invites", **ACTED)
async def create_invite(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    """The invites panel's form: a new code, shown on the page that answers (once)."""
    if not same_origin(request):
        return _invite_page(403, "A new invite code must come from this site's own form.")
    form = await request.form()
    uses, days = _whole(form.get("uses")), _whole(form.get("days"))
    if uses is None or days is None:
        return _invite_page(400, "Registrations and days must be whole numbers.")
    try:
        made = await invites.create(horde, uses=uses, days=days, by=viewer_of(request).name)
    except HordeError as exc:
        return _invite_page(exc.rc.status, exc.message)
    return _invite_page(200, "", made.code)


@post("/invites/{invite:str}/revoke", **{**ACTED, "status_code": 303})
async def revoke_invite(
    request: Request[Any, Any, Any], horde: HordeDep, invite: FromPath[str]
) -> Template | Redirect:
    if not same_origin(request):
        return _invite_page(403, "A revocation must come from this site's own form.")
    try:
        await invites.revoke(horde, invite)
    except HordeError as exc:
        return _invite_page(exc.rc.status, exc.message)
    return Redirect(f"{PATH}#panel-invites", status_code=303, headers=HEADERS)


def _mode_refused(status: int, message: str) -> Template:
    return action_page(message, status=status, panel="modes")


@post("/modes", **{**ACTED, "status_code": 303})
async def switch_mode(request: Request[Any, Any, Any], horde: HordeDep) -> Template | Redirect:
    """The modes panel's form: one mode on or off, as the signed-in moderator (an admin for
    maintenance), through the API's rules; back to the panel when done."""
    if not same_origin(request):
        return _mode_refused(403, "A mode switch must come from this site's own dashboard.")
    form = await request.form()
    named, enabled = str(form.get("mode") or ""), str(form.get("enabled") or "")
    mode = next((m for m in horde_modes.MODES if m == named), None)
    if mode is None or enabled not in ("on", "off"):
        return _mode_refused(400, "Name a mode (maintenance, invite_only, raid) and on or off.")
    who = profiles.SignedIn(viewer_of(request).user_id or 0)
    try:
        await mode_rights.change(horde, who, {mode: enabled == "on"}, "dashboard")
    except HordeError as exc:
        return _mode_refused(exc.rc.status, exc.message)
    return Redirect(f"{PATH}#panel-modes", status_code=303, headers=HEADERS)


@post("/logout", status_code=303)
async def logout(request: Request[Any, Any, Any]) -> Redirect:
    redirect = Redirect(PATH, status_code=303, headers=HEADERS)
    if same_origin(request):
        redirect.delete_cookie(COOKIE, path=PATH)
    return redirect


# --- the users panel's actions -------------------------------------------------------------------


def action_page(
    message: str,
    *,
    status: int = 200,
    api_key: str = "",
    confirm: dict[str, Any] | None = None,
    panel: str = "users",
) -> Template:
    """The page every dashboard action answers with: what happened, and a link back to its panel."""
    context = {
        "message": message, "api_key": api_key, "confirm": confirm, "failed": status >= 400, "panel": panel
    }  # fmt: skip
    return Template("action.html", context=context, status_code=status, headers=HEADERS)


async def _form(request: Request[Any, Any, Any]) -> dict[str, str]:
    """The posted form's fields that hold something (an empty box is a field not sent)."""
    form = await request.form()
    return {k: str(v).strip() for k, v in form.items() if str(v).strip()}


async def run_action(request: Request[Any, Any, Any], act: Any, panel: str = "users") -> Template:
    """Run one action as the signed-in moderator: its page, or the refusal's (the rule's message)."""
    if not same_origin(request):
        return action_page("A change must come from this site's own dashboard.", status=403, panel=panel)
    who = profiles.SignedIn(viewer_of(request).user_id or 0)
    try:
        return await act(who, await _form(request))
    except HordeError as exc:
        return action_page(exc.message, status=exc.rc.status, panel=panel)
    except msgspec.ValidationError as exc:
        return action_page(f"Nothing changed: {exc}.", status=400, panel=panel)


@post("/users/create", **ACTED)
async def create_user(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        body = msgspec.convert(form, UserCreate, strict=False)
        made = await profiles.create(horde, who, body)
        return action_page(f"Created {made.name}. Its API key, shown this once:", api_key=made.api_key)

    return await run_action(request, act)


@post("/users/{user_id:str}/kudos", **ACTED)
async def change_kudos(request: Request[Any, Any, Any], horde: HordeDep, user_id: FromPath[str]) -> Template:
    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        body = msgspec.convert({"kudos": form.get("amount")}, UserUpdate, strict=False)
        changed = await profiles.modify_user(horde, who, user_id, body)
        return action_page(f"User {user_id} now has {changed.new_kudos} kudos.")

    return await run_action(request, act)


@post("/users/{user_id:str}/flags", **ACTED)
async def change_flags(request: Request[Any, Any, Any], horde: HordeDep, user_id: FromPath[str]) -> Template:
    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        flags = {k: form[k] for k in ("trusted", "moderator", "flagged") if k in form}
        changed = await profiles.modify_user(
            horde, who, user_id, msgspec.convert(flags, UserUpdate, strict=False)
        )
        said = [f"{k} {'on' if getattr(changed, k) else 'off'}" for k in flags]
        return action_page(f"User {user_id}: {', '.join(said)}.")

    return await run_action(request, act)


@post("/users/{user_id:str}/delete", **ACTED)
async def delete_user(request: Request[Any, Any, Any], horde: HordeDep, user_id: FromPath[str]) -> Template:
    """Asked once without `confirm`: a page naming the user, whose button posts again with it."""

    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        if form.get("confirm") != "yes":
            name = form.get("name", f"user {user_id}")[:200]
            question = {"action": f"{PATH}/users/{user_id}/delete", "name": name}
            warning = "Its workers are deleted, its shared keys removed and its key stops working."
            return action_page(f"Delete {name}? {warning} This cannot be undone.", confirm=question)
        gone = await profiles.delete(horde, who, user_id)
        return action_page(
            f"Deleted {gone.name}: {gone.workers} worker(s) deleted, {gone.shared_keys} shared key(s) "
            f"removed; its balance of {gone.kudos:.2f} kudos stays with the deleted row."
        )

    return await run_action(request, act)


# --- the worker messages panel's actions ---------------------------------------------------------


@post("/messages", **ACTED)
async def send_message(request: Request[Any, Any, Any], horde: HordeDep) -> Template:
    """To the worker named (by name or id), or with no worker to every worker."""

    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        named = form.get("worker", "")
        worker_id = worker_messages.canonical(named) if named else None
        if named and worker_id is None:
            worker_id = (await workers.worker_by_name(horde, named)).worker.id
        fields = {k: form[k] for k in ("message", "origin", "expiry") if k in form}
        body = msgspec.convert({**fields, "worker_id": worker_id}, WorkerMessageInput, strict=False)
        sent = await worker_messages.send(horde, who, body)
        return action_page(f"Sent to {named or 'every worker'}: message {sent.id}.", panel="messages")

    return await run_action(request, act, "messages")


@post("/messages/{message_id:str}/delete", **ACTED)
async def delete_message(
    request: Request[Any, Any, Any], horde: HordeDep, message_id: FromPath[str]
) -> Template:
    async def act(who: profiles.SignedIn, form: dict[str, str]) -> Template:
        await worker_messages.remove(horde, who, message_id)
        return action_page(f"Deleted message {message_id}.", panel="messages")

    return await run_action(request, act, "messages")


router = Router(
    path=PATH,
    route_handlers=[
        page,
        panel,
        login,
        logout,
        create_invite,
        revoke_invite,
        switch_mode,
        create_user,
        change_kudos,
        change_flags,
        delete_user,
        send_message,
        delete_message,
        static_files_router("/static", STATIC, "dashboard_static"),
    ],
    include_in_schema=False,
)


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(
        directory=TEMPLATES, engine=JinjaTemplateEngine, engine_callback=lambda e: filters(e.engine)
    )


class DashboardPlugin(InitPluginProtocol):
    """Mounts the dashboard and its templates (an app that set its own template config keeps it)."""

    def on_app_init(self, app_config: AppConfig) -> AppConfig:
        from horde_lite.dashboard.filter_actions import router as filters_router  # they import this
        from horde_lite.dashboard.ip_actions import router as ip_router  # module
        from horde_lite.dashboard.register import router as register_router

        app_config.route_handlers.extend([router, register_router, ip_router, filters_router])
        if app_config.template_config is None:
            app_config.template_config = template_config()
        return app_config
