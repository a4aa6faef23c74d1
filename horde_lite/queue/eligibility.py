"""One eligibility check: "could worker W take request R now" (docs/explanation/dispatch.md).

It exists as SQL clauses over a worker row and a request row (read by the pop, the status route,
worker availability and the wait estimate) and as a Python mirror over plain facts (read where a
single pair is judged, and by the property tests that prove the two agree). The speed gate's two
halves come from the selected policy.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from sqlalchemy import Float, String, Text, and_, bindparam, exists, func, not_, or_, select, true
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import aliased
from sqlalchemy.sql.elements import ColumnElement

from horde_lite.db.models import QueueOwnerRefusal, QueueRefusal, TextRequest, Worker
from horde_lite.db.sqltypes import TextArrayContainsAll, TextArrayHas, TextArraysOverlap
from horde_lite.policies.protocols import GateInputs, GateSql, SpeedGate
from horde_lite.settings import Settings

T = TypeVar("T")
WorkerRow = type[Worker]  # the mapped class or an alias of it
RequestRow = type[TextRequest]


@dataclass(frozen=True, slots=True)
class Rules:
    """What the clauses need besides the two rows: the time and the settings in force."""

    now: float
    online_seconds: float
    assumed_speed: float
    slow_speed: float
    generation_window: float
    gate: SpeedGate
    horizon_seconds: float = 300.0  # the wait estimate's horizon ([allowance])

    @classmethod
    def from_settings(cls, settings: Settings, gate: SpeedGate, now: float) -> Rules:
        allowance = settings.allowance
        return cls(
            now=now,
            online_seconds=settings.worker.online_seconds,
            assumed_speed=settings.speed.assumed_tokens_per_second,
            slow_speed=settings.worker.slow_tokens_per_second,
            generation_window=settings.lease.generation_window_seconds,
            gate=gate,
            horizon_seconds=max(allowance.estimate_horizon_seconds, allowance.wait_floor_seconds),
        )

    @property
    def online_since(self) -> float:
        return self.now - self.online_seconds


# --- SQL ---------------------------------------------------------------------------------------


def worker_online(w: WorkerRow, rules: Rules) -> ColumnElement[bool]:
    return w.last_check_in >= rules.online_since


def worker_speed(w: WorkerRow, rules: Rules) -> ColumnElement[float]:
    return func.coalesce(w.lease_speed, rules.assumed_speed)


def serves_request_models(w: WorkerRow, r: RequestRow) -> ColumnElement[bool]:
    """A request with no models takes any worker; otherwise the two model lists must overlap.

    Read from the rows' JSON lists (kept in step with worker_models/request_models, which serve
    the listings and indexed look-ups): a row-local test. As an EXISTS over the link tables it sat
    under an OR, and PostgreSQL hashed the whole request_models x worker_models join to answer it,
    a cost that grew with the queue on every read (bench/README.md)."""
    return serves_models(w.models, r)


def serves_models(models: ColumnElement[Any], r: RequestRow) -> ColumnElement[bool]:
    """`models` (a JSON list: a worker's column, or a bound list) serve request `r`."""
    return or_(r.any_model, TextArraysOverlap(models, r.models))


# The rules below that compare a worker's declaration with a request's needs take each side as
# values: a worker's columns in the claim, the pop's bound parameters in the queue's walk; a
# request's columns, or its entry's in the queue's index (which carry the same names and lengths).


def chat_lengths_admit(
    need_length: Any, need_context: Any, *, completion: Any, context: Any
) -> ColumnElement[bool]:
    """A chat job of `need_length` tokens in a context of `need_context` (the prompt and the
    reply) fits a worker's chat limits."""
    return and_(completion >= need_length, context >= need_context)


def legacy_lengths_admit(
    need_length: Any, need_context: Any, *, max_length: Any, max_context_length: Any
) -> ColumnElement[bool]:
    """A legacy job of `need_length` tokens in a context of `need_context` fits a worker's limits."""
    return and_(max_length >= need_length, max_context_length >= need_context)


def choices_admit(r: Any, *, nsfw: Any, trusted: Any, fast: Any) -> list[ColumnElement[bool]]:
    """The request's choices (`r`: a request or its entry) that a worker of these traits meets:
    NSFW, trusted workers only, no slow workers."""
    return [or_(not_(r.nsfw), nsfw), or_(not_(r.trusted_workers), trusted), or_(r.slow_workers, fast)]


def chat_limits_admit(w: WorkerRow, r: RequestRow) -> ColumnElement[bool]:
    return and_(
        w.chat_max_completion_tokens.is_not(None),
        chat_lengths_admit(
            r.max_length,
            r.prompt_tokens + r.max_length,
            completion=w.chat_max_completion_tokens,
            context=w.chat_max_context_tokens,
        ),
        TextArrayContainsAll(w.chat_features, r.required_features),
        TextArrayContainsAll(w.chat_image_transports, r.required_transports),
    )


def legacy_limits_admit(w: WorkerRow, r: RequestRow) -> ColumnElement[bool]:
    return legacy_lengths_admit(
        r.max_length, r.max_context_length, max_length=w.max_length, max_context_length=w.max_context_length
    )


def allow_list_admits(r: RequestRow, worker_id: ColumnElement[Any]) -> ColumnElement[bool]:
    """The request targets no worker, or names this one in its allow-list."""
    return or_(not_(r.targeted), TextArrayHas(r.worker_allow, worker_id))


def targeting_admits(w: WorkerRow, r: RequestRow) -> ColumnElement[bool]:
    """The request's own choice of workers by name (allow-list, deny-list), and its history: a
    worker whose job of it lapsed or faulted is never offered it again, nor is any other worker of
    that worker's owner (names are free; owners are who fails a request)."""
    return and_(
        allow_list_admits(r, w.id),
        not_(TextArrayHas(r.worker_deny, w.id)),
        not_(TextArrayHas(r.failed_workers, w.id)),
        not_(TextArrayHas(r.failed_owners, owner_text(w.owner_id))),
    )


def trusted_admits(r: Any, trusted: Any) -> ColumnElement[bool]:
    """A request (or its entry) asking for trusted workers only takes a trusted one."""
    return or_(not_(r.trusted_workers), trusted)


def owner_text(owner_id: Any) -> ColumnElement[str]:
    """A user id as `failed_owners` holds it (text: the JSON list tests compare strings)."""
    return sql_cast(owner_id, String)


def _serving(cw: WorkerRow, rules: Rules) -> list[ColumnElement[bool]]:
    """A worker the capable-worker question counts at all: online, not in maintenance, not paused."""
    return [worker_online(cw, rules), not_(cw.maintenance), not_(cw.paused)]


def capable_chat_worker_clauses(cw: WorkerRow, r: RequestRow, rules: Rules) -> list[ColumnElement[bool]]:
    """A worker that can finish chat request `r` inside the base lease."""
    # Plain comparisons before the JSON list tests (SQLite evaluates them in this order).
    return [
        *_serving(cw, rules),
        cw.capacity >= r.max_length,
        chat_limits_admit(cw, r),
        trusted_admits(r, cw.trusted),
        serves_request_models(cw, r),
        targeting_admits(cw, r),
    ]


# Built once: an ORM alias adapts each column the first time it is read (about a third of a
# millisecond each), so a fresh alias per call cost every pop and estimate several milliseconds.
# Reusing it is safe: the subquery below never correlates it (`correlate_except`).
_CAPABLE_WORKER = aliased(Worker, name="capable_worker")


def capable_worker_online(r: RequestRow, rules: Rules) -> ColumnElement[bool]:
    cw = _CAPABLE_WORKER
    return exists(
        select(1).select_from(cw).where(*capable_chat_worker_clauses(cw, r, rules)).correlate_except(cw)
    )


def refuses_by_name(request_id: Any, worker_id: Any) -> ColumnElement[bool]:
    """The request refuses the worker by name, in its deny-list or since the worker failed it (a
    probe of queue_refusals' key; the walks read it, the claim reads the request's lists)."""
    x = QueueRefusal
    return exists(select(1).where(x.request_id == request_id, x.worker_id == worker_id).correlate_except(x))


def refuses_owner(request_id: Any, owner_id: Any) -> ColumnElement[bool]:
    """The request refuses every worker of the owner, since one of them failed it (a probe of
    queue_owner_refusals' key, read by the walks beside `refuses_by_name`)."""
    x = QueueOwnerRefusal
    return exists(select(1).where(x.request_id == request_id, x.owner_id == owner_id).correlate_except(x))


def capable_worker_online_for_entry(e: Any, rules: Rules) -> ColumnElement[bool]:
    """`capable_worker_online` asked of a queue entry `e` (a QueueEntry row or alias): true only
    for a plain chat entry (see QueueEntry.plain; a chat entry's `need_context` is the prompt and
    the reply, as the question reads), whose columns and its request's refusals by name carry every
    rule the question reads, and then exactly when the question of its request is true; false
    otherwise (not known)."""
    cw = _CAPABLE_WORKER
    clauses = [
        *_serving(cw, rules),
        cw.capacity >= e.need_length,
        cw.chat_max_completion_tokens.is_not(None),
        chat_lengths_admit(
            e.need_length,
            e.need_context,
            completion=cw.chat_max_completion_tokens,
            context=cw.chat_max_context_tokens,
        ),
        # Row-local, as `serves_request_models`: read only for the few workers of enough capacity,
        # where an EXISTS over worker_models became a scan of the model's links per entry.
        or_(e.model == "", TextArrayHas(cw.models, e.model)),
        trusted_admits(e, cw.trusted),
        or_(e.target == "", cw.id == e.target),
        not_(refuses_by_name(e.request_id, cw.id)),
        not_(refuses_owner(e.request_id, cw.owner_id)),
    ]
    return and_(e.plain, e.is_chat, exists(select(1).select_from(cw).where(*clauses).correlate_except(cw)))


def speed_gate_admits_sql(
    r: RequestRow, capacity: Any, rules: Rules, capable: ColumnElement[bool] | None = None
) -> ColumnElement[bool]:
    """The speed gate's rule for request `r` and a worker of `capacity` (a column or a bound value)."""
    return rules.gate.admits_sql(
        GateSql(
            is_chat=r.is_chat,
            max_length=r.max_length,
            capacity=capacity,
            capable_worker_online=(lambda: capable_worker_online(r, rules))
            if capable is None
            else (lambda: capable),
        )
    )


def eligibility_clauses(
    w: WorkerRow,
    r: RequestRow,
    rules: Rules,
    *,
    ignore_paused: bool = False,
    gate: bool = True,
    capable: ColumnElement[bool] | None = None,
) -> list[ColumnElement[bool]]:
    """Every rule for (w, r) except the request's own queue state. `ignore_paused` serves a paused
    worker's fake jobs, which are copied from requests it would otherwise get. `capable`, when
    given, is the already known answer to "is a capable worker for r online" (the wait estimate
    computes it once per request instead of once per worker and request pair)."""
    # Plain comparisons first, the JSON list tests (models, allow/deny lists) after them: SQLite
    # evaluates the terms in this order and stops at the first false one.
    return [
        worker_online(w, rules),
        true() if ignore_paused else not_(w.paused),
        or_(not_(w.maintenance), r.user_id == w.owner_id),
        *choices_admit(r, nsfw=w.nsfw, trusted=w.trusted, fast=worker_speed(w, rules) >= rules.slow_speed),
        or_(and_(r.is_chat, chat_limits_admit(w, r)), and_(not_(r.is_chat), legacy_limits_admit(w, r))),
        serves_request_models(w, r),
        targeting_admits(w, r),
        speed_gate_admits_sql(r, w.capacity, rules, capable) if gate else true(),
    ]


# --- statements built once ---------------------------------------------------------------------

# A statement built from the clauses above holds the time as a value; rebuilt on every call,
# SQLAlchemy walks its whole clause tree again to find it in the compiled cache (a few ms for the
# pop's and the estimate's). Built once per speed gate, with the time as the bound parameter `now`
# (and the rows' keys as the caller's own bound parameters), it is found at once.
NOW = bindparam("now", type_=Float)
_BUILT: dict[tuple[Any, ...], tuple[SpeedGate, Any]] = {}


def built_once(rules: Rules, key: tuple[Any, ...], build: Callable[[Rules], T]) -> T:
    """`build(symbolic rules)` once per gate, rule settings and `key`; execute the result with
    {"now": rules.now, ...}."""
    full = (id(rules.gate), rules.online_seconds, rules.assumed_speed, rules.slow_speed, *key)
    cached = _BUILT.get(full)
    if cached is not None and cached[0] is rules.gate:
        return cast(T, cached[1])
    statement = build(replace(rules, now=NOW))  # type: ignore[arg-type]
    _BUILT[full] = (rules.gate, statement)
    return statement


def request_offered(r: RequestRow, now: float) -> list[ColumnElement[bool]]:
    """A request a pop may take a job from."""
    return [r.state == "waiting", r.n_remaining > 0, r.expires_at > now]


# --- Python mirror -----------------------------------------------------------------------------


# Not frozen: a frozen dataclass sets each field through `object.__setattr__`, which made building
# the facts (one per judged class of the wait estimate's walk) 7x slower. Nothing changes them.
@dataclass(slots=True)
class WorkerFacts:
    id: str
    owner_id: int
    last_check_in: float
    models: frozenset[str]
    max_length: int
    max_context_length: int
    capacity: int
    lease_speed: float | None = None
    trusted: bool = False
    nsfw: bool = True
    maintenance: bool = False
    paused: bool = False
    chat_max_completion_tokens: int | None = None
    chat_max_context_tokens: int | None = None
    chat_features: frozenset[str] = field(default_factory=frozenset)
    chat_image_transports: frozenset[str] = field(default_factory=frozenset)


@dataclass(slots=True)  # not frozen: see WorkerFacts
class RequestFacts:
    user_id: int
    is_chat: bool
    max_length: int
    max_context_length: int
    prompt_tokens: int = 0
    models: frozenset[str] = field(default_factory=frozenset)
    required_features: frozenset[str] = field(default_factory=frozenset)
    required_transports: frozenset[str] = field(default_factory=frozenset)
    worker_allow: frozenset[str] = field(default_factory=frozenset)
    worker_deny: frozenset[str] = field(default_factory=frozenset)
    trusted_workers: bool = False
    slow_workers: bool = True
    nsfw: bool = False
    failed_workers: frozenset[str] = field(default_factory=frozenset)
    failed_owners: frozenset[str] = field(default_factory=frozenset)  # user ids as text


def _serves(w: WorkerFacts, r: RequestFacts) -> bool:
    return not r.models or bool(w.models & r.models)


def _chat_limits(w: WorkerFacts, r: RequestFacts) -> bool:
    return (
        w.chat_max_completion_tokens is not None
        and w.chat_max_context_tokens is not None
        and w.chat_max_completion_tokens >= r.max_length
        and w.chat_max_context_tokens >= r.prompt_tokens + r.max_length
        and r.required_features <= w.chat_features
        and r.required_transports <= w.chat_image_transports
    )


def _targeting(w: WorkerFacts, r: RequestFacts) -> bool:
    return (
        (not r.worker_allow or w.id in r.worker_allow)
        and w.id not in r.worker_deny
        and (not r.trusted_workers or w.trusted)
        and w.id not in r.failed_workers
        and str(w.owner_id) not in r.failed_owners
    )


def is_capable(w: WorkerFacts, r: RequestFacts, rules: Rules) -> bool:
    return (
        w.last_check_in >= rules.online_since
        and not w.maintenance
        and not w.paused
        and _serves(w, r)
        and _chat_limits(w, r)
        and _targeting(w, r)
        and w.capacity >= r.max_length
    )


def speed_gate_admits(gate: SpeedGate, inputs: GateInputs) -> bool:
    return gate.admits(inputs)


def fast_enough(lease_speed: float | None, rules: Rules) -> bool:
    """A worker a request that refuses slow workers still takes (`worker_speed` in SQL)."""
    return (lease_speed if lease_speed is not None else rules.assumed_speed) >= rules.slow_speed


def admits(w: WorkerFacts, r: RequestFacts, rules: Rules) -> bool:
    """Every rule of `eligibility_clauses` but the speed gate."""
    limits = (
        _chat_limits(w, r)
        if r.is_chat
        else (w.max_length >= r.max_length and w.max_context_length >= r.max_context_length)
    )
    return (
        w.last_check_in >= rules.online_since
        and not w.paused
        and (not w.maintenance or r.user_id == w.owner_id)
        and _serves(w, r)
        and limits
        and _targeting(w, r)
        and (r.slow_workers or fast_enough(w.lease_speed, rules))
        and (not r.nsfw or w.nsfw)
    )


# The gate's inputs are frozen values with few distinct shapes, so one object serves every pair of
# that shape: fetching it costs a quarter of building it, and the estimate asks for thousands.
_gate_inputs = functools.lru_cache(maxsize=4096, typed=True)(GateInputs)


def gate_passes(w: WorkerFacts, r: RequestFacts, rules: Rules, capable_worker_online: bool) -> bool:
    inputs = _gate_inputs(r.is_chat, r.max_length, w.capacity, capable_worker_online)
    return speed_gate_admits(rules.gate, inputs)


def is_eligible(w: WorkerFacts, r: RequestFacts, fleet: list[WorkerFacts], rules: Rules) -> bool:
    """The Python twin of `eligibility_clauses` (gate included); `fleet` is every known worker."""
    if not admits(w, r, rules):
        return False
    return gate_passes(w, r, rules, any(is_capable(c, r, rules) for c in fleet))


# Row columns, for readers that judge rows in Python (the wait estimate).
WORKER_FACT_COLUMNS = tuple(WorkerFacts.__slots__)
WORKER_FACT_JSON = frozenset(("models", "chat_features", "chat_image_transports"))
REQUEST_FACT_COLUMNS = (
    "user_id", "is_chat", "max_length", "max_context_length", "prompt_tokens", "models", "any_model",
    "required_features", "required_transports", "targeted", "worker_allow", "worker_deny",
    "trusted_workers", "slow_workers", "nsfw", "failed_workers", "failed_owners",
)  # fmt: skip
# Of those, the JSON lists, which a bulk reader may select as text (`cast(column, Text)`).
REQUEST_FACT_JSON = frozenset(
    ("models", "required_features", "required_transports", "worker_allow", "worker_deny", "failed_workers",
     "failed_owners")
)  # fmt: skip


def fact_columns(entity: Any, names: Sequence[str], json: frozenset[str]) -> tuple[Any, ...]:
    """The columns `names` of a worker or request entity, those in `json` cast to text: a bulk
    reader parses a JSON list only when it is not empty (see `_set`)."""
    return tuple(getattr(entity, c).cast(Text).label(c) if c in json else getattr(entity, c) for c in names)


def worker_facts(row: Any) -> WorkerFacts:
    """A worker (a row or an object with WORKER_FACT_COLUMNS) as facts."""
    return worker_facts_of(tuple(getattr(row, name) for name in WORKER_FACT_COLUMNS))


_WORKER_JSON_AT = frozenset(i for i, name in enumerate(WORKER_FACT_COLUMNS) if name in WORKER_FACT_JSON)


def worker_facts_of(values: Sequence[Any]) -> WorkerFacts:
    """Facts from the values of WORKER_FACT_COLUMNS, in that order (a bulk reader's row slice:
    positional access is several times cheaper than a row's attributes)."""
    return WorkerFacts(*(_set(v) if i in _WORKER_JSON_AT else v for i, v in enumerate(values)))


_NONE: frozenset[str] = frozenset()


def _set(value: Any) -> frozenset[str]:
    """A JSON list column as a set. Read as text (see `REQUEST_FACT_JSON`), an empty list is not
    parsed at all and the same list (a model name) is parsed once: most rows hold several lists,
    mostly empty, and decoding them was most of the estimate's cost per request."""
    if isinstance(value, str):
        return _NONE if value in ("[]", "") else _parsed(value)
    return frozenset(value) if value else _NONE


@functools.lru_cache(maxsize=4096)
def _parsed(text: str) -> frozenset[str]:
    return frozenset(json.loads(text))


def request_facts(row: Any) -> RequestFacts:
    """A request (a row or an object with REQUEST_FACT_COLUMNS) as facts."""
    return request_facts_of(tuple(getattr(row, name) for name in REQUEST_FACT_COLUMNS))


def request_facts_of(values: Sequence[Any]) -> RequestFacts:
    """Facts from the values of REQUEST_FACT_COLUMNS, in that order, the way the SQL clauses read
    them: a request with no models takes any worker; an allow-list counts only when the request
    is targeted."""
    (user_id, is_chat, max_length, max_context_length, prompt_tokens, models, any_model, features,
     transports, targeted, allow, deny, trusted_workers, slow_workers, nsfw, failed,
     owners) = values  # fmt: skip
    return RequestFacts(
        user_id,
        is_chat,
        max_length,
        max_context_length,
        prompt_tokens,
        _NONE if any_model else _set(models),
        _set(features),
        _set(transports),
        _set(allow) if targeted else _NONE,
        _set(deny),
        trusted_workers,
        slow_workers,
        nsfw,
        _set(failed),
        _set(owners),
    )
