"""Admission: validate a text or chat request, size its free output allowance, decide whether it
is free, funded, downgraded or refused, and queue it."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, NoReturn

from sqlalchemy import Select, bindparam, func, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import flagged, kudos, limits
from horde_lite.accounts.users import Requester, authenticate, check_shared_key
from horde_lite.core.context import Caller, Horde, InForce
from horde_lite.core.errors import HordeError
from horde_lite.core.modes import refuse_new_requests
from horde_lite.core.notify import JobsArrived
from horde_lite.db.models import (
    AdmissionRecord,
    CandidateRecord,
    KudosHold,
    LimitAdmission,
    RequestModel,
    TextRequest,
    Worker,
    WorkerModel,
)
from horde_lite.db.rows import After, insert_rows
from horde_lite.filters import screen
from horde_lite.inputs import ChatPayload, TextRequestInput
from horde_lite.metrics import allowance_attributes, wait_attributes
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import AllowanceInputs
from horde_lite.queue import eligibility
from horde_lite.queue.estimate import Estimate, estimate, horde_totals, queued_row
from horde_lite.rc import Rc
from horde_lite.requests import chat as chat_rules
from horde_lite.requests import prices, upstream_fields, worker_lists
from horde_lite.requests.admission_rule import (
    AdmissionFacts,
    AdmissionOutcome,
    Judgement,
    Refusal,
    downgrade_note,
    judge,
    kudos_upfront_message,
    needs_spendable,
)
from horde_lite.settings import Settings

log = logging.getLogger("horde_lite.admission")


@dataclass
class AdmissionSpec:
    """A request as admission judges it, whichever route it came from."""

    requester: Requester
    is_chat: bool
    max_length: int
    max_context_length: int
    n: int = 1
    prompt: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    chat: dict[str, Any] | None = None
    stream: bool = False
    prompt_tokens: int = 0
    required_features: list[str] = field(default_factory=list)
    required_transports: list[str] = field(default_factory=list)
    models: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)
    worker_deny: list[str] = field(default_factory=list)
    trusted_workers: bool = False
    slow_workers: bool = True
    allow_downgrade: bool = False
    nsfw: bool = False
    dry_run: bool = False
    native_route: bool = True
    requested_max_length: int = 0
    context_adjustments: list[dict[str, Any]] = field(default_factory=list)
    client_agent: str = ""
    webhook: str | None = None  # checked (requests/upstream_fields.py)
    disable_batching: bool = False


@dataclass(frozen=True)
class Admission:
    request_id: str | None
    created_at: float  # the request's (a dry run's: when it was judged)
    kudos: float
    outcome: AdmissionOutcome
    allowance: int
    max_length: int
    estimate: Estimate
    context_adjustments: list[dict[str, Any]]
    warnings: list[dict[str, str]]


# --- building the spec -------------------------------------------------------------------------


def _int_param(params: dict[str, Any], name: str, default: int) -> int:
    value = params.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HordeError(
            Rc.BadRequest, f"params.{name} must be an integer.", errors={f"params.{name}": "integer"}
        )
    return value


def legacy_spec(
    requester: Requester, body: TextRequestInput, horde: Horde, client_agent: str
) -> AdmissionSpec:
    """A native-route request without a chat payload (the horde's raw prompt + Kobold params)."""
    limit = horde.settings.request.max_length_limit
    params = dict(body.params)
    n = _int_param(params, "n", 1)
    max_length = _int_param(params, "max_length", 80)
    max_context_length = _int_param(params, "max_context_length", 2048)
    if not body.prompt.strip():
        raise HordeError(Rc.MissingPrompt, "A text request needs a prompt.")
    if not 1 <= n <= horde.settings.request.max_n:
        raise HordeError(Rc.BadRequest, f"params.n must be between 1 and {horde.settings.request.max_n}.")
    if not 16 <= max_length <= limit:
        raise HordeError(Rc.BadRequest, f"params.max_length must be between 16 and {limit}.")
    if max_context_length < 80:
        raise HordeError(Rc.BadRequest, "params.max_context_length must be at least 80.")
    if max_context_length < max_length:
        raise HordeError(
            Rc.TokenOverflow,
            f"max_context_length ({max_context_length}) must be at least max_length ({max_length}).",
        )
    params.update(n=n, max_length=max_length, max_context_length=max_context_length)
    return AdmissionSpec(
        requester=requester,
        is_chat=False,
        prompt=body.prompt,
        params=params,
        n=n,
        max_length=max_length,
        requested_max_length=max_length,
        max_context_length=max_context_length,
        models=_scoped_models(horde.settings, requester, body.models),
        workers=list(dict.fromkeys(body.workers)),
        worker_deny=_deny_list(body),
        trusted_workers=body.trusted_workers,
        slow_workers=body.slow_workers,
        allow_downgrade=body.allow_downgrade,
        nsfw=body.nsfw,
        dry_run=body.dry_run,
        client_agent=client_agent,
    )


def _clean_models(models: list[str]) -> list[str]:
    return list(dict.fromkeys(m.strip() for m in models if m and m.strip()))[:50]


def _scoped_models(settings: Settings, requester: Requester, models: list[str]) -> list[str]:
    """The request's models within its key's and user's allow-lists (none named: all they allow)."""
    shared = requester.shared_key
    return limits.scoped_models(
        _clean_models(models),
        shared.allowed_models if shared is not None else [],
        limits.user_allowed_models(requester.user, settings),
    )


def _deny_list(body: TextRequestInput) -> list[str]:
    # Upstream: `worker_blacklist: true` turns `workers` into a deny-list.
    if body.worker_blacklist is True:
        return list(body.workers)
    return list(body.worker_blacklist) if isinstance(body.worker_blacklist, list) else []


def _chat_limits_query(by_model: bool) -> Select[tuple[int | None, int | None]]:
    query = select(
        func.max(Worker.chat_max_completion_tokens), func.max(Worker.chat_max_context_tokens)
    ).where(
        Worker.last_check_in >= bindparam("online_since"),
        Worker.chat_max_completion_tokens.is_not(None),
        Worker.paused.is_(False),
        or_(Worker.maintenance.is_(False), Worker.owner_id == bindparam("requester_id")),
    )
    if by_model:
        models = bindparam("models", expanding=True)
        served = select(WorkerModel.worker_id).where(WorkerModel.model.in_(models))
        query = query.where(Worker.id.in_(served))
    return query


# Built once (for any model, and for some): a chat creation reads one of them.
_CHAT_LIMITS = {by_model: _chat_limits_query(by_model) for by_model in (False, True)}


async def chat_limits(
    session: AsyncSession, in_force: InForce, models: list[str], now: float, requester_id: int
) -> tuple[int | None, int | None]:
    """The largest max_completion_tokens and max_context_tokens declared by online chat workers for
    these models (None: no such worker online). A worker in maintenance counts only for its
    owner's requests, as everywhere."""
    values: dict[str, Any] = {"online_since": in_force.rules(now).online_since, "requester_id": requester_id}
    if models:
        values["models"] = models
    completion, context = (await session.execute(_CHAT_LIMITS[bool(models)], values)).one()
    return completion, context


def _chat_asked(payload: ChatPayload, settings: Settings) -> int:
    """The max_tokens a chat payload asks, after the checks that need no database."""
    limit = settings.request.max_length_limit
    requested = payload.max_tokens or settings.chat.default_max_tokens
    if requested > limit:
        raise HordeError(Rc.BadRequest, f"max_tokens must be at most {limit}.", param="max_tokens")
    chat_rules.validate(payload)
    bad = chat_rules.bad_image_urls(payload)
    if bad:
        raise HordeError(
            Rc.BadRequest,
            f"image_url must be an http(s) URL or a data: URL; got {bad[0]!r}.",
            param="messages",
        )
    return requested


def _lowered(requested: int, largest: int | None) -> tuple[int, list[dict[str, Any]]]:
    """The max_tokens applied: only ever lowered, to the largest an online chat worker declares."""
    if largest is None or requested <= largest:
        return requested, []
    reason = (
        "lowered to the largest max_completion_tokens declared by an online chat worker "
        "for the requested model"
    )
    return largest, [{"field": "max_tokens", "requested": requested, "applied": largest, "reason": reason}]


def _check_context(models: list[str], tokens: int, applied: int, largest_context: int | None) -> None:
    """On the /v1 front, which answers while the client waits, messages no online worker for the
    model can hold are a client error (OpenAI's context_length_exceeded), not a wait: max_tokens is
    already as low as horde_lite lowers it. The native route queues them, like any request no
    worker can take yet."""
    need = tokens + applied
    if largest_context is None or need <= largest_context:
        return
    what = ", ".join(models) if models else "any model"
    raise HordeError(
        Rc.ContextLengthExceeded,
        f"This request needs {need} context tokens ({tokens} for the messages, estimated as "
        f"characters / 3, plus max_tokens {applied}); the online chat workers for {what} accept at "
        f"most {largest_context}. Shorten the messages or lower max_tokens.",
        param="messages",
    )


async def chat_spec(
    session: AsyncSession,
    horde: Horde,
    in_force: InForce,
    requester: Requester,
    payload: ChatPayload,
    *,
    models: list[str],
    stream: bool = False,
    dry_run: bool = False,
    native_route: bool = True,
    base: TextRequestInput | None = None,
    client_agent: str = "",
) -> AdmissionSpec:
    """A chat request from either route. Its max_tokens is only ever lowered to what an online chat
    worker for its model declares, and the client is told in `context_adjustments`."""
    requested = _chat_asked(payload, in_force.settings)
    models = _scoped_models(in_force.settings, requester, models)
    now = horde.clock.now()
    largest, largest_context = await chat_limits(session, in_force, models, now, requester.user.id)
    applied, adjustments = _lowered(requested, largest)
    features, transports = chat_rules.requirements(payload)
    tokens = chat_rules.prompt_tokens(payload)
    if not native_route:
        _check_context(models, tokens, applied, largest_context)
    spec = AdmissionSpec(
        requester=requester,
        is_chat=True,
        chat=chat_rules.worker_payload(payload, applied),
        stream=stream,
        n=1,
        max_length=applied,
        requested_max_length=requested,
        max_context_length=tokens + applied,
        prompt_tokens=tokens,
        required_features=features,
        required_transports=transports,
        models=models,
        dry_run=dry_run,
        native_route=native_route,
        context_adjustments=adjustments,
        client_agent=client_agent,
        params={"n": 1, "max_length": applied, "max_context_length": tokens + applied},
    )
    if base is not None:
        spec = replace(
            spec,
            workers=list(dict.fromkeys(base.workers)),
            worker_deny=_deny_list(base),
            trusted_workers=base.trusted_workers,
            slow_workers=base.slow_workers,
            nsfw=base.nsfw,
        )
    return spec


# --- the decision ------------------------------------------------------------------------------


_WAITING_OF_USER = select(func.count(TextRequest.id)).where(
    TextRequest.user_id == bindparam("user_id"), TextRequest.state == "waiting"
)


# A transaction-level advisory lock per capped account (its users id in the second key): taken by
# the creations of an account whose users row they do not lock, so its count and its insert
# serialize with theirs and with nothing else (PostgreSQL; SQLite has one writer already).
_ADVISORY_WAITING = 0x686C  # "hl": horde_lite's waiting caps
_LOCK_WAITING = select(func.pg_advisory_xact_lock(_ADVISORY_WAITING, bindparam("user_id")))


async def _too_many(session: AsyncSession, settings: Settings, spec: AdmissionSpec) -> None:
    limit = limits.user_concurrency(spec.requester.user, settings)
    if spec.requester.user.anonymous and session.get_bind().dialect.name == "postgresql":
        # The anonymous account is shared and its users row is not locked (its charges update it
        # at every anonymous submit): without this, concurrent creations would all count below the
        # cap and all be admitted. Held until commit, so the next one counts this one's row.
        await session.execute(_LOCK_WAITING, {"user_id": spec.requester.user.id})
    waiting = (await session.execute(_WAITING_OF_USER, {"user_id": spec.requester.user.id})).scalar_one()
    if waiting >= limit:
        raise HordeError(
            Rc.TooManyPrompts,
            f"Parallel requests ({waiting + 1}) exceeded the user limit ({limit}): you already have "
            f"{waiting} requests waiting. Please try again once one ends.",
        )


async def declaration_gap(
    session: AsyncSession, in_force: InForce, spec: AdmissionSpec, now: float
) -> str | None:
    """Why no online worker can serve `spec`, in the words of what the workers declare."""
    rules = in_force.rules(now)
    query = select(Worker).where(
        Worker.last_check_in >= rules.online_since, Worker.paused.is_(False), Worker.maintenance.is_(False)
    )
    if spec.models:
        query = query.where(
            Worker.id.in_(select(WorkerModel.worker_id).where(WorkerModel.model.in_(spec.models)))
        )
    workers = list((await session.execute(query)).scalars())
    what = ", ".join(spec.models) if spec.models else "any model"
    if spec.is_chat:
        workers = [w for w in workers if w.chat_max_completion_tokens is not None]
    if not workers:
        kind = "chat worker" if spec.is_chat else "worker"
        return f"no online {kind} serves {what}"
    if spec.is_chat:
        most = max(w.chat_max_completion_tokens or 0 for w in workers)
        if most < spec.max_length:
            return _too_long(what, most, spec.max_length)
        for feature in spec.required_features:
            if not any(feature in (w.chat_features or []) for w in workers):
                return f"no online worker for {what} declares {feature}"
        for transport in spec.required_transports:
            if not any(transport in (w.chat_image_transports or []) for w in workers):
                return f"no online worker for {what} accepts {transport} images"
        most_ctx = max(w.chat_max_context_tokens or 0 for w in workers)
        need = spec.prompt_tokens + spec.max_length
        if most_ctx < need:
            return (
                f"online workers for {what} declare at most {most_ctx} context tokens; "
                f"this request needs {need}"
            )
        return _gate_gap(in_force, spec, workers, now)
    most = max(w.max_length for w in workers)
    if most < spec.max_length:
        return _too_long(what, most, spec.max_length)
    most_ctx = max(w.max_context_length for w in workers)
    if most_ctx < spec.max_context_length:
        return (
            f"online workers for {what} declare at most {most_ctx} context tokens; "
            f"this request asks {spec.max_context_length}"
        )
    return _gate_gap(in_force, spec, workers, now)


def _gate_gap(in_force: InForce, spec: AdmissionSpec, workers: list[Worker], now: float) -> str | None:
    """The speed gate, named with its numbers, when it alone turns away every online worker that
    could otherwise take `spec` (the Python mirror of the eligibility check, which the contract
    test keeps equal to the SQL the pop runs)."""
    rules = in_force.rules(now)
    request = eligibility.request_facts(_new_row(in_force.settings, spec, now))
    fleet = [eligibility.worker_facts(w) for w in workers]
    others = [w for w in fleet if eligibility.admits(w, request, rules)]
    if not others or any(eligibility.is_eligible(w, request, fleet, rules) for w in others):
        return None
    field = "max_length" if spec.native_route and not spec.is_chat else "max_tokens"
    best = max(w.capacity for w in others)
    count = f"the {len(others)} online workers" if len(others) > 1 else "the one online worker"
    return (
        f"the speed gate {in_force.policies.names[PolicyKind.SPEED_GATE]} turns away {count} that "
        f"could otherwise take it: the largest capacity is {best} tokens, below the {spec.max_length} "
        f"{field} asked"
    )


def _too_long(what: str, most: int, asked: int) -> str:
    return f"online workers for {what} declare at most {most} tokens; this request asks {asked}"


def _price(horde: Horde, row: TextRequest) -> float:
    """Price the request as it will be queued (after any downgrade), once: its jobs' rewards and
    charges are bounded by what it stores here. Returns the quote, what a funded request holds."""
    prompt_tokens = row.prompt_tokens if row.is_chat else prices.text_tokens(row.prompt)
    context = prices.priced_context(row.max_context_length, prompt_tokens, row.max_length)
    price = prices.request_price(horde.sizes, row.models, row.max_length, row.n_total, context)
    row.job_price, row.price_context = price.job_price, price.context
    return price.total


def _new_row(settings: Settings, spec: AdmissionSpec, now: float) -> TextRequest:
    """The request's row as it would be queued, not yet in the session: the estimate reads it as
    it is, and a refusal or a dry run never writes it."""
    request_id = str(uuid.uuid4())
    priority = flagged.request_priority(spec.requester.user)
    row = TextRequest(
        id=request_id,
        user_id=spec.requester.user.id,
        shared_key_hash=spec.requester.shared_key.key_hash if spec.requester.shared_key else None,
        requester_kind=spec.requester.kind,
        state="waiting",
        is_chat=spec.is_chat,
        stream=spec.stream,
        waited=not spec.native_route,  # the /v1 fronts answer while their client waits
        prompt=spec.prompt,
        params=spec.params,
        chat=spec.chat,
        max_length=spec.max_length,
        max_context_length=spec.max_context_length,
        prompt_tokens=spec.prompt_tokens,
        required_features=spec.required_features,
        required_transports=spec.required_transports,
        any_model=not spec.models,
        models=spec.models,
        targeted=bool(spec.workers) and not spec.worker_deny,
        worker_allow=spec.workers if not spec.worker_deny else [],
        worker_deny=spec.worker_deny,
        trusted_workers=spec.trusted_workers,
        slow_workers=spec.slow_workers,
        nsfw=spec.nsfw,
        n_total=spec.n,
        n_remaining=spec.n,
        initial_priority=priority,
        effective_start=now - priority / 5.0,
        created_at=now,
        expires_at=now + settings.request.expiry_seconds,
        requested_max_length=spec.requested_max_length or spec.max_length,
        context_adjustments=spec.context_adjustments,
        client_agent=spec.client_agent[:255],
        webhook=spec.webhook,
        disable_batching=spec.disable_batching,
    )
    return row


async def _insert(
    session: AsyncSession,
    row: TextRequest,
    written: list[AdmissionRecord | CandidateRecord | LimitAdmission | KudosHold],
    notice: After | None,
) -> None:
    """Queue the admitted request: its row and its models, with what its decision writes (its
    records, its limits' note, its hold), as Core inserts, and then `notice` (`insert_rows`: one
    statement on PostgreSQL): nothing reads them back as objects in this transaction. The row's
    triggers enter it in the queue's index with the workers its deny-list refuses."""
    models = (RequestModel(request_id=row.id, model=m) for m in row.models)
    await insert_rows(session, [row, *models, *written], after=notice)


async def admit(
    session: AsyncSession, horde: Horde, spec: AdmissionSpec, in_force: InForce | None = None
) -> Admission:
    """Decide and (unless a dry run) queue: read and lock the facts, `judge` them, then write what
    the judgement says. Raises HordeError for a refusal; the caller's transaction is rolled back
    then, so a refused request leaves no row and no hold. `in_force`: the caller's snapshot of the
    policies (taken here when not given), the only one this admission reads."""
    in_force = in_force or horde.in_force()
    now = horde.clock.now()
    # The estimate's copy of the queue catches up on its own connection while this one works.
    caught_up = horde.mirror.catch_up(now)
    key_left = await _lock_requester(session, in_force.settings, spec, now)
    row = _new_row(in_force.settings, spec, now)
    cost = _price(horde, row)
    read = await _read_allowance(session, horde, in_force, spec, row, caught_up, now)
    facts = _facts(in_force, spec, read, cost, key_left)
    if needs_spendable(facts):  # a query: read only when the request is not free
        spendable = await kudos.spendable(session, spec.requester.user, in_force.settings.kudos)
        facts = replace(facts, spendable=spendable)
    judged = judge(facts)
    if judged.outcome is AdmissionOutcome.REFUSED:
        await _refuse(session, horde, in_force, spec, facts, judged, read, now)
    warnings: list[dict[str, str]] = []
    if judged.outcome is AdmissionOutcome.DOWNGRADED:
        cost = _downgrade(horde, row, facts, judged.max_length, warnings)
    if spec.requester.shared_key is not None:
        # A free request through a key still spends the key's budget when its jobs are charged:
        # it must fit what is left, and reserves it so concurrent requests cannot overspend.
        check_shared_key(spec.requester.shared_key, now, judged.max_length, cost, left=key_left)
    # The key's and user's limits, under their row locks: a dry run is refused like the request.
    reserved = judged.max_length * spec.n
    counted = await limits.check(session, in_force.settings, spec.requester, reserved, now)
    adjustments = list(row.context_adjustments)
    if not judged.writes:  # a dry run: judged like the real request; nothing is written
        return Admission(
            None, now, cost, judged.outcome, judged.allowance, judged.max_length, read.estimate,
            adjustments, warnings,
        )  # fmt: skip
    written: list[AdmissionRecord | CandidateRecord | LimitAdmission | KudosHold] = [
        *_records(in_force.policies.names, spec, judged, read, row.id, now)
    ]
    if counted:
        written.append(limits.admission_note(spec.requester, row.id, reserved, now))
    shared = spec.requester.shared_key
    if judged.holds(shared is not None):
        written.append(kudos.new_hold(
            spec.requester.user.id, row.id, cost, now,
            shared_key_hash=shared.key_hash if shared else None, reserves_user=judged.reserves_user,
        ))  # fmt: skip
    # Waiting pops that may take its jobs try again once it commits (jobs/pop_waiters.py); other
    # processes' are told by a NOTIFY sent with the writes.
    horde.notifier.jobs_on_commit(
        session, JobsArrived.of_request(row.id, row.any_model, row.models, row.n_remaining)
    )
    await _insert(session, row, written, horde.notifier.jobs_notice(session))
    _count_decision(horde, spec, judged, read)
    log.info(
        "request admitted request=%s requester=%s outcome=%s max_length=%d allowance=%d chat=%s",
        row.id, spec.requester.kind, judged.outcome, judged.max_length, judged.allowance, spec.is_chat,
    )  # fmt: skip
    return Admission(
        row.id, row.created_at, cost, judged.outcome, judged.allowance, judged.max_length, read.estimate,
        adjustments, warnings,
    )  # fmt: skip


async def _lock_requester(
    session: AsyncSession, settings: Settings, spec: AdmissionSpec, now: float
) -> float | None:
    """Lock and read what the decision acts on: the requester, its shared key and its waiting
    count. Returns what the shared key's budget has left (None: no key, or no budget)."""
    shared = spec.requester.shared_key
    if not spec.requester.user.anonymous and not spec.requester.locked:
        # One registered requester's creations serialize: its waiting count and spendable kudos are
        # read, then acted on (two concurrent funded requests must not both spend the same kudos).
        # Lock order (docs/explanation/locking.md): the users row, then the shared key row. The
        # routes lock it as they authenticate (`decide`), in the same statement.
        await session.refresh(spec.requester.user, with_for_update=True)
    # A new month's kudos and key budget before anything reads them.
    await limits.refill(session, spec.requester, now)
    if shared is not None:
        # The key's own limits first: an expired, empty or capped key is refused whatever the
        # request would cost (its budget is checked against the cost later).
        check_shared_key(shared, now, spec.max_length, 0.0)
    key_left: float | None = None
    if shared is not None:
        await kudos.lock_shared_key(session, shared)
        if shared.kudos >= 0:
            reserved = await kudos.shared_key_reserved(session, shared.key_hash)
            key_left = shared.kudos - shared.utilized - reserved
    await _too_many(session, settings, spec)
    return key_left


@dataclass(frozen=True, slots=True)
class _Read:
    """What admission read to size the allowance: for the decision, its records and metrics."""

    estimate: Estimate
    inputs: AllowanceInputs
    totals_read: bool  # the horde-wide totals in `inputs` were read (else they are 0, unread)
    allowance: int  # the curve in force's
    candidate_allowance: int | None  # a candidate curve's (None: none, or a dry run)


async def _read_allowance(
    session: AsyncSession,
    horde: Horde,
    in_force: InForce,
    spec: AdmissionSpec,
    row: TextRequest,
    caught_up: asyncio.Task[None],
    now: float,
) -> _Read:
    """Estimate the request's wait and size its free output allowance, by the curve in force and
    by a candidate judged in shadow beside it (never for a dry run)."""
    policies = in_force.policies
    rules = in_force.rules(now)
    est = await estimate(horde, queued_row(row), rules, caught_up)
    candidate = None if spec.dry_run else policies.candidate_allowance_curve
    # Horde-wide totals cost a scan of the queue: read them only for a curve that asks.
    totals_read = any(
        getattr(curve, "reads_horde_totals", True)
        for curve in (policies.allowance_curve, candidate)
        if curve is not None
    )
    threads, queued = 0, 0
    if totals_read:
        threads, queued = await horde_totals(session, rules)
        queued += 1  # the request being admitted (written once decided) counts among them
    inputs = AllowanceInputs(
        estimated_wait_seconds=est.estimated_wait,
        competing_jobs=est.competing_jobs,
        eligible_threads=est.eligible_threads,
        online_text_threads=threads,
        queued_text_requests=queued,
        settings=in_force.settings.allowance,
    )
    allowance = policies.allowance_curve.allowance(inputs)
    candidate_allowance = None if candidate is None else candidate.allowance(inputs)
    return _Read(est, inputs, totals_read, allowance, candidate_allowance)


def _facts(
    in_force: InForce, spec: AdmissionSpec, read: _Read, cost: float, key_left: float | None
) -> AdmissionFacts:
    requester = spec.requester
    return AdmissionFacts(
        max_length=spec.max_length,
        n=spec.n,
        slow_workers=spec.slow_workers,
        allow_downgrade=spec.allow_downgrade,
        native_route=spec.native_route,
        is_chat=spec.is_chat,
        dry_run=spec.dry_run,
        cost=cost,
        allowance=read.allowance,
        candidate_allowance=read.candidate_allowance,
        eligible_workers=read.estimate.eligible_workers,
        floor=in_force.settings.allowance.floor,
        anonymous=requester.user.anonymous,
        has_shared_key=requester.shared_key is not None,
        key_left=key_left,
    )


def _downgrade(
    horde: Horde, row: TextRequest, facts: AdmissionFacts, applied: int, warnings: list[dict[str, str]]
) -> float:
    """Lower the row to each job's share of the allowance, price it again and warn the client.
    Returns the new price."""
    adjustment, warning = downgrade_note(facts, applied)
    row.max_length = applied
    row.params = {**row.params, "max_length": applied}
    row.slow_workers = True
    row.context_adjustments = [*row.context_adjustments, adjustment]
    warnings.append(warning)
    return _price(horde, row)


async def _refuse(
    session: AsyncSession,
    horde: Horde,
    in_force: InForce,
    spec: AdmissionSpec,
    facts: AdmissionFacts,
    judged: Judgement,
    read: _Read,
    now: float,
) -> NoReturn:
    """Record a refusal (unless a dry run) and raise it, in the words of its reason."""
    if judged.records:
        await _record(session, horde, in_force, spec, judged, read, None, now)
    if judged.key_budget and spec.requester.shared_key is not None:
        # The owner could pay but the key's budget cannot: say so rather than KudosUpfront.
        check_shared_key(spec.requester.shared_key, now, spec.max_length, facts.cost, left=facts.key_left)
    if judged.refusal is Refusal.NO_ELIGIBLE_WORKER:
        gap = await declaration_gap(session, in_force, spec, now)
        detail = f": {gap}" if gap else ""
        raise HordeError(Rc.NoEligibleWorker, f"No online worker can serve this request{detail}.", gap=gap)
    raise HordeError(
        Rc.KudosUpfront,
        kudos_upfront_message(facts, judged.refusal or Refusal.OVER_ALLOWANCE),
        allowance=judged.allowance,
        kudos=facts.cost,
    )


# session.info key of a refusal's records: its transaction is rolled back, `decide` keeps them.
_REFUSAL_RECORDS = "horde_lite.refusal_records"


async def _record(
    session: AsyncSession,
    horde: Horde,
    in_force: InForce,
    spec: AdmissionSpec,
    judged: Judgement,
    read: _Read,
    request_id: str | None,
    now: float,
) -> None:
    """A refusal's record (not a dry run's): metrics, its admission record and, when a candidate
    curve decided differently, its candidate record (an admitted request's are inserted with it)."""
    records = _records(in_force.policies.names, spec, judged, read, request_id, now)
    if judged.outcome is AdmissionOutcome.REFUSED:
        session.info[_REFUSAL_RECORDS] = records  # the transaction is rolled back: see `decide`
    else:
        await insert_rows(session, records)
    _count_decision(horde, spec, judged, read)


def _count_decision(horde: Horde, spec: AdmissionSpec, judged: Judgement, read: _Read) -> None:
    """An admission decision's metrics."""
    metrics, kind = horde.metrics, spec.requester.kind
    metrics.free_allowance_decisions.add(
        1,
        allowance_attributes(kind, judged.outcome, spec.max_length, judged.allowance, spec.is_chat),  # type: ignore[arg-type]
    )
    if read.estimate.estimated_wait is not None:
        metrics.free_allowance_estimated_wait_seconds.record(
            read.estimate.estimated_wait,
            wait_attributes(kind, spec.is_chat),  # type: ignore[arg-type]
        )


def _records(
    names: dict[str, str],
    spec: AdmissionSpec,
    judged: Judgement,
    read: _Read,
    request_id: str | None,
    now: float,
) -> list[AdmissionRecord | CandidateRecord]:
    """The decision's admission record and, when a candidate curve decided differently, its
    candidate record. `names`: the policies' names in force for this admission."""
    inputs, totals = read.inputs, read.totals_read
    records: list[AdmissionRecord | CandidateRecord] = [
        AdmissionRecord(
            at=now,
            request_id=request_id,
            requester_kind=spec.requester.kind,
            is_chat=spec.is_chat,
            requested_max_length=spec.max_length,
            n=spec.n,
            allowance=judged.allowance,
            outcome=judged.outcome.value,
            estimated_wait=read.estimate.estimated_wait,
            competing_jobs=inputs.competing_jobs,
            eligible_threads=inputs.eligible_threads,
            online_text_threads=inputs.online_text_threads if totals else None,
            queued_text_requests=inputs.queued_text_requests if totals else None,
            allowance_curve=names[PolicyKind.ALLOWANCE_CURVE],
            slow_workers=spec.slow_workers,
            downgrade_allowed=judged.downgrade_allowed,
            can_fund=judged.can_fund,
        )
    ]
    if judged.candidate is not None:
        candidate_allowance, candidate_outcome = judged.candidate
        records.append(
            CandidateRecord(
                at=now,
                kind=PolicyKind.ALLOWANCE_CURVE,
                candidate=names["candidate_allowance_curve"],
                in_force=names[PolicyKind.ALLOWANCE_CURVE],
                request_id=request_id,
                is_chat=spec.is_chat,
                max_length=spec.max_length,
                decision=judged.outcome.value,
                candidate_decision=candidate_outcome.value,
                allowance=judged.allowance,
                candidate_allowance=candidate_allowance,
            )
        )
    return records


# --- the entry points ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """A request as judged (`spec`) and what admission made of it."""

    spec: AdmissionSpec
    admission: Admission


# Builds the request's spec in the admission's transaction, with the admission's snapshot.
SpecBuilder = Callable[[AsyncSession, Requester, InForce], Awaitable[AdmissionSpec]]


class _DryRun(Exception):
    """Raised inside the admission transaction so a dry run keeps nothing."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision


async def decide(horde: Horde, caller: Caller, build: SpecBuilder) -> Decision:
    """Authenticate the caller, build the request's spec and admit it, in one transaction (a refusal
    rolls it back: no row, no hold). A dry run (`spec.dry_run`) is judged exactly like the real
    request, refusals included, and then rolled back: nothing is kept and nothing is cached. Both
    routes that create requests (the native route and the chat front) come through here, so the
    horde's maintenance mode refuses them all before anything is read."""
    in_force = horde.in_force()  # one snapshot for the spec and the decision alike
    refuse_new_requests(in_force.modes)
    session: AsyncSession | None = None
    try:
        async with horde.transaction() as session:
            requester = await authenticate(session, caller.apikey, horde.clock.now(), lock=True)
            spec = await build(session, requester, in_force)
            decision = Decision(spec=spec, admission=await admit(session, horde, spec, in_force))
            if spec.dry_run:
                raise _DryRun(decision)
    except _DryRun as rolled_back:
        return rolled_back.decision
    except HordeError:
        if session is not None:
            await _keep_refusal_records(horde, session)
        raise
    return decision


async def _keep_refusal_records(horde: Horde, refused: AsyncSession) -> None:
    """A refusal rolls its transaction back; the records `_record` left for it are written after,
    in a short transaction of their own (a second transaction inside the first would wait for
    the one SQLite writer). Losing them must not turn the refusal into a server error."""
    records = refused.info.pop(_REFUSAL_RECORDS, None)
    if not records:
        return
    try:
        async with horde.transaction() as session:
            session.add_all(records)
    except Exception:
        log.exception("could not keep the records of a refused request")


async def request_text(horde: Horde, caller: Caller, body: TextRequestInput) -> Decision:
    """POST /generate/text/async: a legacy prompt or a native chat payload (`dry_run`: a quote)."""

    worker_lists.check_lengths(body, horde.settings.request.max_worker_list)
    webhook = upstream_fields.checked_webhook(body, horde.settings.webhooks)
    body = await screen.screened_request(horde, caller, body)  # refused, or its replacements made

    async def build(session: AsyncSession, requester: Requester, in_force: InForce) -> AdmissionSpec:
        if body.chat is None:
            spec = legacy_spec(requester, body, horde, caller.client_agent)
        else:
            spec = await chat_spec(
                session, horde, in_force, requester, body.chat, models=body.models, dry_run=body.dry_run,
                base=body, client_agent=caller.client_agent,
            )  # fmt: skip
        spec.webhook = webhook
        spec.disable_batching = upstream_fields.batching_disabled(body, requester.user, spec.n)
        # A deny-list, when sent, is the request's whole choice of workers (its allow-list is not read).
        allow = [] if spec.worker_deny else spec.workers
        spec.workers, spec.worker_deny = await worker_lists.resolve(session, allow, spec.worker_deny)
        return spec

    return await decide(horde, caller, build)
