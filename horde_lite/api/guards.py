"""The one guard of every route for moderators and operators (`guards=[moderator_guard]`): the
operator pages (/operator/*) and the dashboard's page, panels and user actions.

Open to anyone with `[http] open_operator_pages` (except a door that changes things, such as the
dashboard's user actions); otherwise a moderator's own key (the `apikey`
header or a Bearer token), or, on a route whose door names a cookie, a signed session from the
dashboard's sign-in. A refusal is a `Refused` (a `HordeError`): the operator pages answer it in
the horde's error shape, the dashboard's routes with their sign-in page or a line of text. What a
route's door says to whom is the route's (`opt={"door": ...}`), so the answers stay each route's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection
from litestar.handlers import BaseRouteHandler

from horde_lite.accounts.users import authenticate, is_anonymous_key
from horde_lite.api.deps import apikey_of
from horde_lite.core.context import Horde
from horde_lite.core.errors import HordeError
from horde_lite.dashboard.queries import session_moderator
from horde_lite.db.models import User
from horde_lite.rc import Rc


@dataclass(frozen=True, slots=True)
class Door:
    """What a kind of operator route answers the callers it turns away."""

    no_key: tuple[Rc, str]  # no key sent (and no valid session where a cookie is read)
    anonymous_key: tuple[Rc, str]  # the anonymous key, or a blank one
    not_moderator: str  # NotModerator: another user's key, or a shared key (even a moderator's)
    session_cookie: str | None = None  # a cookie holding a signed session, read when no key is sent
    # `[http] open_operator_pages` lets anyone through; a door that changes things stays shut.
    opened_by_open_pages: bool = True


OPERATOR_PAGES = Door(
    no_key=(Rc.NotModerator, "Operator pages need a moderator's API key (apikey header)."),
    anonymous_key=(Rc.NotModerator, "Only a moderator may read the operator pages."),
    not_moderator="Only a moderator may read the operator pages.",
)
# Operator routes that change things (invite codes): shut even when the pages are open.
OPERATOR_ACTIONS = Door(
    no_key=(Rc.NotModerator, "This needs a moderator's API key (apikey header)."),
    anonymous_key=(Rc.NotModerator, "Only a moderator may do this."),
    not_moderator="Only a moderator may do this.",
    opened_by_open_pages=False,
)


class Refused(HordeError):
    """A caller the guard turned away."""


@dataclass(frozen=True, slots=True)
class Viewer:
    """Who the guard let in: a moderator's name, "" on open pages."""

    name: str = ""
    by_session: bool = False
    user_id: int | None = None  # the moderator's; None on open pages


def open_pages(horde: Horde) -> bool:
    return bool(horde.settings.http.open_operator_pages)


async def moderator(horde: Horde, key: str | None, door: Door) -> User:
    """The moderator whose own key this is; `Refused` with the door's answer otherwise (an unknown
    key is InvalidAPIKey, whatever the door)."""
    if is_anonymous_key(key):
        raise Refused(*door.anonymous_key)
    async with horde.transaction() as session:
        try:
            found = await authenticate(session, key, horde.clock.now())
        except HordeError as exc:
            raise Refused(exc.rc, exc.message, **exc.extra) from exc
    if found.shared_key is not None or not found.user.moderator:
        raise Refused(Rc.NotModerator, door.not_moderator)
    return found.user


async def moderator_guard(connection: ASGIConnection[Any, Any, Any, Any], route: BaseRouteHandler) -> None:
    """Let a moderator (or anyone, on open pages) through to the route, leaving `Viewer` in the
    connection's state; raise `Refused` otherwise."""
    horde: Horde = connection.app.state.horde
    door: Door = route.opt.get("door", OPERATOR_PAGES)
    connection.state.viewer = await _viewer(connection, horde, door)


async def _viewer(connection: ASGIConnection[Any, Any, Any, Any], horde: Horde, door: Door) -> Viewer:
    if open_pages(horde) and door.opened_by_open_pages:
        return Viewer()
    key = apikey_of(connection)
    if key is not None:
        found = await moderator(horde, key, door)
        return Viewer(found.username, user_id=found.id)
    if door.session_cookie is not None:
        user = await session_moderator(horde, connection.cookies.get(door.session_cookie))
        if user is not None:
            return Viewer(user.username, by_session=True, user_id=user.id)
    raise Refused(*door.no_key)


def viewer_of(connection: ASGIConnection[Any, Any, Any, Any]) -> Viewer:
    """The `Viewer` the guard left for this request."""
    viewer: Viewer = connection.state.viewer
    return viewer
