"""The scopes and limits of shared keys and users: a model allow-list, concurrent requests, requests
per minute, output tokens per UTC day, and a budget refilled once per UTC calendar month.

A request through a shared key must fit the key's limits and its owner's. The decision is pure
(`scoped_models`, `refusal`); admission calls the shells below under the owner's users row lock and
the key's row lock (docs/explanation/locking.md), so concurrent requests through one key or user
count each other's admissions. A refusal raises before anything is written; admission's
transaction is rolled back with it.

A rate or daily limit counts `limit_admissions` rows: one per request admitted while such a limit
applied to its user or key, holding the output it reserved (all its jobs' max_length); the request's
end lowers it to what its jobs generated (`settle_tokens`)."""

from __future__ import annotations

import calendar
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlalchemy import and_, bindparam, exists, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm.attributes import set_committed_value

from horde_lite.core.errors import HordeError
from horde_lite.db.models import Generation, LimitAdmission, SharedKey, TextRequest, User
from horde_lite.inputs import ALLOWED_MODEL_NAME
from horde_lite.rc import Rc

if TYPE_CHECKING:
    from horde_lite.accounts.users import Requester
    from horde_lite.inputs import UserUpdate
    from horde_lite.settings import Settings

MINUTE = 60.0
DAY = 86400.0
MAX_ALLOWED_MODELS = 50  # as many as one request may name
MAX_MODEL_NAME = 255  # the model columns' width
MAX_RATE = 100_000  # requests per minute
MAX_CONCURRENCY = 500  # upstream's bound of a user's concurrency
NONE = -1  # a limit that does not apply
_NAME = re.compile(ALLOWED_MODEL_NAME)


# --- the pure rules ------------------------------------------------------------------------------


def check_model_list(models: Sequence[str]) -> str | None:
    """What is wrong with an allow-list, in words (None: nothing): the rule the request bodies'
    `AllowedModels` type states, for the settings file. Names are matched exactly, as workers
    declare them: a name with surrounding spaces or control characters could never match."""
    if len(models) > MAX_ALLOWED_MODELS:
        return f"at most {MAX_ALLOWED_MODELS} models, got {len(models)}"
    for name in models:
        if len(name) > MAX_MODEL_NAME or not _NAME.fullmatch(name):
            return (
                f"model name {name[:40]!r} is empty, longer than {MAX_MODEL_NAME} characters, or has "
                "surrounding spaces or control characters"
            )
    return None


def allow_list(models: Sequence[str]) -> list[str]:
    """An allow-list as stored: each name once, in the order given."""
    return list(dict.fromkeys(models))


def scoped_models(asked: list[str], *allow_lists: Sequence[str]) -> list[str]:
    """The models a request may ask under its key's and user's allow-lists ([] any): every model it
    names must be on each list; a request naming none asks for any model on all of them (served
    only by workers of those), and is refused when the lists share none."""
    lists = [list(a) for a in allow_lists if a]
    if not lists:
        return asked
    for allowed in lists:
        outside = [m for m in asked if m not in allowed]
        if outside:
            raise HordeError(
                Rc.ModelNotAllowed,
                f"This key may only ask for {_listed(allowed)}; {outside[0]!r} is not among them.",
                param="model",
            )
    if asked:
        return asked
    shared = [m for m in lists[0] if all(m in other for other in lists[1:])]
    if not shared:
        raise HordeError(
            Rc.ModelNotAllowed,
            "The shared key's and its owner's allowed models have none in common.",
            param="model",
        )
    return shared


def _listed(models: list[str]) -> str:
    shown = ", ".join(models[:5])
    return shown + (f" and {len(models) - 5} more" if len(models) > 5 else "")


@dataclass(frozen=True, slots=True)
class Limits:
    """One holder's limits in force (-1: none), and how a refusal names it."""

    holder: str  # "this shared key" | "this user"
    concurrency: int = NONE
    requests_per_minute: int = NONE
    tokens_per_day: int = NONE

    @property
    def counted(self) -> bool:
        """Whether its admissions are written down for a rate or daily limit."""
        return self.requests_per_minute >= 0 or self.tokens_per_day >= 0


@dataclass(frozen=True, slots=True)
class Usage:
    """What a holder has in use when a request comes, as admission read it under the locks."""

    waiting: int  # its requests not yet over
    last_minute: int  # requests admitted in the last 60 s
    minute_frees_at: float | None  # when the oldest of the last `requests_per_minute` leaves the minute
    tokens_today: int  # output reserved (or, for ended requests, generated) since the UTC day began


def day_start(now: float) -> float:
    return math.floor(now / DAY) * DAY


def month_start(now: float) -> float:
    t = time.gmtime(now)
    return float(calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0)))


def refusal(limits: Limits, usage: Usage, asked_tokens: int, now: float) -> HordeError | None:
    """The first limit the request would pass, as the refusal to raise (None: it fits them all)."""
    who = limits.holder
    if limits.concurrency >= 0 and usage.waiting + 1 > limits.concurrency:
        # Upstream's words for a user's concurrency.
        return HordeError(
            Rc.TooManyPrompts,
            f"Parallel requests ({usage.waiting + 1}) exceeded the concurrency of {who} "
            f"({limits.concurrency}). Please try again once a request ends.",
        )
    if limits.requests_per_minute >= 0 and usage.last_minute >= limits.requests_per_minute:
        frees = usage.minute_frees_at if usage.minute_frees_at is not None else now + MINUTE
        wait = max(1, math.ceil(frees - now))
        return HordeError(
            Rc.RateLimited,
            f"{who.capitalize()} may make {limits.requests_per_minute} requests per minute; "
            f"the next fits in {wait} seconds.",
            retry_after=wait,
        )
    if limits.tokens_per_day >= 0 and usage.tokens_today + asked_tokens > limits.tokens_per_day:
        wait = max(1, math.ceil(day_start(now) + DAY - now))
        left = max(0, limits.tokens_per_day - usage.tokens_today)
        return HordeError(
            Rc.DailyTokenLimit,
            f"{who.capitalize()} may reserve {limits.tokens_per_day} output tokens per UTC day and has "
            f"{left} left; this request asks {asked_tokens} (all its jobs' max_length). The day "
            f"ends in {wait} seconds.",
            retry_after=wait,
        )
    return None


def user_limits(user: User, settings: Settings) -> Limits:
    """A user's limits: its own, else the horde's defaults; the anonymous user (everyone without a
    key) has only its own. Its concurrency is admission's waiting cap (`user_concurrency`)."""
    own = user.anonymous
    s = settings.limits
    return Limits(
        "this user",
        requests_per_minute=_either(user.requests_per_minute, NONE if own else s.requests_per_minute),
        tokens_per_day=_either(user.tokens_per_day, NONE if own else s.tokens_per_day),
    )


def user_allowed_models(user: User, settings: Settings) -> list[str]:
    return list(user.allowed_models or ([] if user.anonymous else settings.limits.allowed_models))


def user_concurrency(user: User, settings: Settings) -> int:
    """The most requests the user may have waiting: its own concurrency, else the horde's cap."""
    if user.concurrency is not None:
        return user.concurrency
    s = settings.request
    return s.max_waiting_anonymous if user.anonymous else s.max_waiting_per_user


def key_limits(shared: SharedKey) -> Limits:
    return Limits(
        "this shared key",
        concurrency=shared.concurrency,
        requests_per_minute=shared.requests_per_minute,
        tokens_per_day=shared.tokens_per_day,
    )


def _either(own: int | None, default: int) -> int:
    return default if own is None else own


# --- the shells: reads and writes under admission's locks ----------------------------------------

_la = LimitAdmission.__table__


def _scope(user_id: int, key_hash: str | None):  # type: ignore[no-untyped-def]
    if key_hash is None:
        return _la.c.user_id == user_id
    return and_(_la.c.user_id == user_id, _la.c.shared_key_hash == key_hash)


async def _usage(
    session: AsyncSession, limits: Limits, user_id: int, key_hash: str | None, now: float
) -> Usage:
    """Read only what the holder's limits need (a holder without limits costs no query)."""
    waiting = 0
    if limits.concurrency >= 0 and key_hash is not None:  # a user's count is admission's cap
        waiting = (
            await session.execute(
                select(func.count()).where(
                    TextRequest.user_id == user_id,
                    TextRequest.state == "waiting",
                    TextRequest.shared_key_hash == key_hash,
                )
            )
        ).scalar_one()
    last_minute, frees_at = 0, None
    if limits.requests_per_minute >= 0:
        recent = and_(_scope(user_id, key_hash), _la.c.created_at > now - MINUTE)
        last_minute = (await session.execute(select(func.count()).where(recent))).scalar_one()
        if last_minute >= limits.requests_per_minute > 0:
            # The request that must leave the minute for one more to fit.
            nth = (
                select(_la.c.created_at)
                .where(recent)
                .order_by(_la.c.created_at.desc())
                .offset(limits.requests_per_minute - 1)
                .limit(1)
            )
            oldest = (await session.execute(nth)).scalar_one()
            frees_at = oldest + MINUTE
    tokens = 0
    if limits.tokens_per_day >= 0:
        today = and_(_scope(user_id, key_hash), _la.c.created_at >= day_start(now))
        tokens = (
            await session.execute(select(func.coalesce(func.sum(_la.c.tokens), 0)).where(today))
        ).scalar_one()
    return Usage(waiting, last_minute, frees_at, int(tokens))


async def check(
    session: AsyncSession, settings: Settings, requester: Requester, asked_tokens: int, now: float
) -> bool:
    """Refuse a request past any limit of its user or its shared key (the key's first). Called with
    the users row (and the key's row) locked. True when the request must be written down
    (`admission_note`) for a rate or daily limit."""
    holders: list[tuple[Limits, str | None]] = [(user_limits(requester.user, settings), None)]
    if requester.shared_key is not None:
        holders.insert(0, (key_limits(requester.shared_key), requester.shared_key.key_hash))
    for limits, key_hash in holders:
        usage = await _usage(session, limits, requester.user.id, key_hash, now)
        refused = refusal(limits, usage, asked_tokens, now)
        if refused is not None:
            raise refused
    return any(limits.counted for limits, _ in holders)


def admission_note(requester: Requester, request_id: str, tokens: int, now: float) -> LimitAdmission:
    """The row that writes a request down for its user's and key's rate and daily limits, for
    admission to insert with the request."""
    shared = requester.shared_key
    return LimitAdmission(
        request_id=request_id,
        user_id=requester.user.id,
        shared_key_hash=shared.key_hash if shared else None,
        created_at=now,
        tokens=tokens,
    )


_GENERATED = (
    select(func.coalesce(func.sum(Generation.tokens), 0))
    .where(
        Generation.request_id == bindparam("ended_request"),
        Generation.fake.is_(False),
        Generation.state.in_(("ok", "censored")),
    )
    .scalar_subquery()
)
_SETTLE = (
    update(_la)
    .where(_la.c.request_id == bindparam("ended_request"), _la.c.tokens > _GENERATED)
    .values(tokens=_GENERATED)
)


_COUNTED = select(_la.c.request_id).where(_la.c.request_id == bindparam("ended_request"))
# Whether the request was written down for a limit, as a column of a statement reading
# text_requests (a submit's read of its request). Only admission writes one, in the transaction that
# inserts the request, so a reader that sees none will never see one: it tells the session
# (`note_uncounted`), and the request's end then skips `_COUNTED`'s round trip.
COUNTED = exists().where(_la.c.request_id == TextRequest.id).label("limit_counted")
_UNCOUNTED = "horde_lite.uncounted_requests"  # session.info key: requests known to be uncounted


def note_uncounted(session: AsyncSession, request_id: str) -> None:
    session.info.setdefault(_UNCOUNTED, set()).add(request_id)


async def settle_tokens(session: AsyncSession, request_id: str) -> None:
    """A request is over: its reservation becomes what its jobs generated, so the day's limit
    counts what was made, not what was asked. A request never written down costs one lookup by key
    (a Core statement: nothing is flushed for it); one that was has its jobs' pending ends flushed
    first, so that the sum reads them."""
    if request_id in session.info.get(_UNCOUNTED, ()):
        return
    values = {"ended_request": request_id}
    if (await session.execute(_COUNTED, values)).first() is None:
        return
    await session.flush()
    await session.execute(_SETTLE, values)


async def forget_before(session: AsyncSession, now: float) -> None:
    """Rows no limit reads any more: older than the UTC day and the minute."""
    await session.execute(_la.delete().where(_la.c.created_at < min(day_start(now), now - MINUTE)))


# --- the monthly refill --------------------------------------------------------------------------


async def refill(session: AsyncSession, requester: Requester, now: float) -> None:
    """Once per UTC calendar month, at the requester's first request of it: a user with monthly
    kudos receives them (upstream's `receive_monthly_kudos`, by calendar month), and a shared key
    with a monthly amount has its budget reset to it and what it spent to 0. Each is a conditional
    UPDATE, so concurrent requests refill it exactly once on both databases."""
    from horde_lite.accounts import kudos  # kudos imports nothing of this module's

    user, month = requester.user, month_start(now)
    if not user.anonymous and user.monthly_kudos > 0 and _due(user.monthly_kudos_last_received, month):
        given = await session.execute(
            update(User)
            .where(
                User.id == user.id,
                User.monthly_kudos > 0,
                or_(User.monthly_kudos_last_received.is_(None), User.monthly_kudos_last_received < month),
            )
            .values(monthly_kudos_last_received=now)
        )
        if given.rowcount == 1:
            await kudos.record(session, user.id, float(user.monthly_kudos), "monthly", _month_ref(now), now)
            set_committed_value(user, "monthly_kudos_last_received", now)
    shared = requester.shared_key
    if shared is not None and shared.monthly_kudos >= 0 and shared.refilled_at < month:
        reset = await session.execute(
            update(SharedKey)
            .where(
                SharedKey.key_hash == shared.key_hash,
                SharedKey.monthly_kudos >= 0,
                SharedKey.refilled_at < month,
            )
            .values(kudos=SharedKey.monthly_kudos, utilized=0.0, refilled_at=now)
        )
        if reset.rowcount == 1:
            await session.refresh(shared)


def _due(last: float | None, month: float) -> bool:
    return last is None or last < month


def _month_ref(now: float) -> str:
    return time.strftime("month:%Y-%m", time.gmtime(now))


# --- a moderator's changes (PUT /users/{id}) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class UserLimitsChanged:
    """What PUT /users/{id} changed of the user's limits: only what it set is not None."""

    concurrency: int | None = None
    monthly_kudos: int | None = None  # the new monthly amount
    allowed_models: list[str] | None = None
    requests_per_minute: int | None = None
    tokens_per_day: int | None = None


# The fields of PUT /users/{id} that set a user's limits (moderators only).
USER_LIMIT_FIELDS = (
    "concurrency",
    "monthly_kudos",
    "allowed_models",
    "requests_per_minute",
    "tokens_per_day",
)


def sets_limits(body: UserUpdate) -> bool:
    return any(getattr(body, name) is not None for name in USER_LIMIT_FIELDS)


async def set_user_limits(
    session: AsyncSession, user: User, body: UserUpdate, actor_id: int, now: float
) -> UserLimitsChanged:
    """Set what the body sends, the users row locked by the caller. `monthly_kudos` is upstream's:
    added to the monthly amount (never below 0), and given at once when positive; the month it is
    first set counts as received."""
    from horde_lite.accounts import kudos

    if body.monthly_kudos is not None and user.anonymous:
        raise HordeError(
            Rc.BadRequest, "The anonymous user's kudos are everyone's: it receives no monthly kudos."
        )
    if body.concurrency is not None:
        user.concurrency = body.concurrency
    if body.allowed_models is not None:
        user.allowed_models = allow_list(body.allowed_models)
    if body.requests_per_minute is not None:
        user.requests_per_minute = body.requests_per_minute
    if body.tokens_per_day is not None:
        user.tokens_per_day = body.tokens_per_day
    monthly = None
    if body.monthly_kudos is not None:
        monthly = max(0, user.monthly_kudos + body.monthly_kudos)
        user.monthly_kudos = monthly
        if user.monthly_kudos_last_received is None:
            user.monthly_kudos_last_received = now
        if body.monthly_kudos > 0:
            await kudos.record(
                session, user.id, float(body.monthly_kudos), "monthly", f"moderator:{actor_id}", now
            )
    await session.flush()
    return UserLimitsChanged(
        concurrency=body.concurrency,
        monthly_kudos=monthly,
        allowed_models=user.allowed_models if body.allowed_models is not None else None,
        requests_per_minute=body.requests_per_minute,
        tokens_per_day=body.tokens_per_day,
    )
