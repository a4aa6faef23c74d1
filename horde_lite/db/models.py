"""The tables. Times are epoch seconds (floats): they compare and subtract the same way on SQLite
and PostgreSQL, and the queue key `effective_start` is plain arithmetic on them (docs/decisions)."""

from __future__ import annotations

from typing import Any

from advanced_alchemy.base import DefaultBase
from advanced_alchemy.types import BigIntIdentity
from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column

from horde_lite.db.sqltypes import JsonDoc, JsonList

ID = String(36)  # canonical dashed lowercase UUID4


class Base(DefaultBase):
    """advanced-alchemy's declarative base: its registry's metadata names constraints and indexes
    by its convention (`advanced_alchemy.base.convention`, the names the migrations use)."""

    __abstract__ = True


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    username: Mapped[str] = mapped_column(String(100), unique=True)
    api_key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # Materialised sum of the user's kudos_events; written only by the ledger.
    kudos: Mapped[float] = mapped_column(Float, default=0.0)
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)
    moderator: Mapped[bool] = mapped_column(Boolean, default=False)
    anonymous: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[float] = mapped_column(Float)
    # When the user's workers' newest real jobs failed (faulted or lapsed), inside the owner
    # failure window and at most `[worker] owner_failure_limit` of them (accounts/owner_limits.py).
    recent_failures: Mapped[list[float]] = mapped_column(JsonList, default=list, server_default="[]")
    # Until then the user's workers are held in maintenance: a check-in puts one back in.
    failure_cooldown_until: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    # What PUT /users/{id} sets (accounts/profiles.py): how the horde's moderators reach the user
    # (shown to the user and moderators), their note on it (moderators only), whether the user's
    # worker ids are public, and how many workers it may hold when above the default limit.
    contact: Mapped[str] = mapped_column(String(500), default="", server_default="")
    admin_comment: Mapped[str] = mapped_column(String(500), default="", server_default="")
    public_workers: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    worker_invited: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Set by a moderator (accounts/flagged.py): the user's workers get no jobs and earn nothing, its
    # requests queue last, and kudos neither leave nor reach it. Never the anonymous user.
    flagged: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Limits a moderator set (accounts/limits.py). None: the horde's default (`[limits]`, and
    # `[request] max_waiting_per_user` for concurrency); -1: none.
    allowed_models: Mapped[list[str]] = mapped_column(JsonList, default=list, server_default="[]")
    concurrency: Mapped[int | None] = mapped_column(Integer, nullable=True)
    requests_per_minute: Mapped[int | None] = mapped_column(Integer, nullable=True)
    tokens_per_day: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Upstream's recurring kudos: added once per UTC calendar month, when it was last added.
    monthly_kudos: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    monthly_kudos_last_received: Mapped[float | None] = mapped_column(Float, nullable=True)


class SharedKey(Base):
    __tablename__ = "shared_keys"

    # The key is a UUID that is also its public id (upstream); only its hash is stored.
    key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255), default="")
    kudos: Mapped[float] = mapped_column(Float, default=-1)  # budget; -1 = unlimited
    utilized: Mapped[float] = mapped_column(Float, default=0.0)
    expiry: Mapped[float | None] = mapped_column(Float, nullable=True)
    max_text_tokens: Mapped[int] = mapped_column(Integer, default=-1)  # -1 = no cap
    created_at: Mapped[float] = mapped_column(Float)
    # The key's scope and limits (accounts/limits.py): [] any model; -1 no limit.
    allowed_models: Mapped[list[str]] = mapped_column(JsonList, default=list, server_default="[]")
    concurrency: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    requests_per_minute: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    tokens_per_day: Mapped[int] = mapped_column(Integer, default=-1, server_default="-1")
    # The budget `kudos` is reset to this (and `utilized` to 0) once per UTC calendar month; -1 never.
    monthly_kudos: Mapped[float] = mapped_column(Float, default=-1.0, server_default="-1")
    refilled_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class LimitAdmission(Base):
    """A request admitted while a requests-per-minute or tokens-per-day limit applied to its user
    or shared key: what the limits count. `tokens` is the output reserved at admission, lowered to
    what its jobs generated when the request ends. Kept past the request (no foreign key to it)
    until the day is over."""

    __tablename__ = "limit_admissions"
    __table_args__ = (
        Index("ix_limit_admissions_user", "user_id", "created_at"),
        Index("ix_limit_admissions_key", "shared_key_hash", "created_at"),
    )

    request_id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    shared_key_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    tokens: Mapped[int] = mapped_column(Integer)


class InviteCode(Base):
    """A moderator's invite code for registration in `invite` mode. Only the code's hash is kept
    (it is shown once, as keys are), with its first characters to tell codes apart in a listing."""

    __tablename__ = "invite_codes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    code_hash: Mapped[str] = mapped_column(String(64), unique=True)
    hint: Mapped[str] = mapped_column(String(8))
    uses: Mapped[int] = mapped_column(Integer)  # registrations it allows
    used: Mapped[int] = mapped_column(Integer, default=0)  # counted with each user it created
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: never
    # The moderator who made it; None for the CLI and open operator pages.
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class PromptFilter(Base):
    """A moderator's regular expression, screened against every request's prompt or messages
    (horde_lite/filters): upstream's `filters`, whose type says whether a match refuses the request
    or is replaced."""

    __tablename__ = "filters"
    # One filter per pattern and type (upstream's PUT answers the one there), compared by the
    # pattern's hash: a pattern may be longer than a PostgreSQL index entry.
    __table_args__ = (UniqueConstraint("filter_type", "regex_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    regex: Mapped[str] = mapped_column(Text)
    regex_hash: Mapped[str] = mapped_column(String(64))  # SHA-256 of `regex`, hex
    filter_type: Mapped[int] = mapped_column(Integer)
    # Shown to the client whose request it refuses; None: a generic line is.
    description: Mapped[str | None] = mapped_column(String(1000), nullable=True)
    replacement: Mapped[str] = mapped_column(String(255), default="", server_default="")
    # The moderator who added it or changed it last.
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class KudosEvent(Base):
    """Append-only ledger: a balance is the sum of its user's events."""

    __tablename__ = "kudos_events"

    id: Mapped[int] = mapped_column(BigIntIdentity, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    amount: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))
    ref: Mapped[str] = mapped_column(String(80), default="")
    created_at: Mapped[float] = mapped_column(Float)


class KudosHold(Base):
    """Upfront kudos reserved for one request, keyed `upfront:<request id>` so retries can't stack."""

    __tablename__ = "kudos_holds"

    key: Mapped[str] = mapped_column(String(80), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    request_id: Mapped[str] = mapped_column(ID, index=True)
    amount: Mapped[float] = mapped_column(Float)
    remaining: Mapped[float] = mapped_column(Float)
    active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[float] = mapped_column(Float)
    # A request made through a shared key reserves the key's budget with its hold (free requests
    # too); `reserves_user` says whether the hold also reserves the owner's kudos (funded only).
    shared_key_hash: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    reserves_user: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())


class Team(Base):
    """A group's workers pooled under one name (upstream's teams); its figures are its workers'."""

    __tablename__ = "teams"

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    # The name as compared, as a worker's (accounts/workers.py worker_name_key): unique.
    name_key: Mapped[str] = mapped_column(String(100), unique=True)
    info: Mapped[str] = mapped_column(String(1000), default="", server_default="")
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[float] = mapped_column(Float)


class Worker(Base):
    __tablename__ = "workers"
    __table_args__ = (
        Index("ix_workers_online", "last_check_in"),
        # The speed gate's "is a worker that can finish this online" seeks the workers of enough
        # capacity (few: the fast ones), not every online worker, for each request it asks about.
        Index("ix_workers_capacity", "capacity", "last_check_in"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    name: Mapped[str] = mapped_column(String(100))
    # The name as compared (accounts/workers.py worker_name_key): unique, so two workers can never
    # share a name up to case, Unicode form or spacing on either database. NULL once deleted.
    name_key: Mapped[str | None] = mapped_column(String(100), nullable=True, unique=True)
    info: Mapped[str] = mapped_column(String(1000), default="", server_default="")
    # Set by DELETE /workers/{id}: the row stays for the history (its generations, counters).
    deleted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    # The owner's trusted flag, copied at each check-in and when an operator changes it, so the
    # pop's WHERE clause needs no join for `trusted_workers`.
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)
    models: Mapped[list[str]] = mapped_column(JsonList, default=list)
    max_length: Mapped[int] = mapped_column(Integer, default=512)
    max_context_length: Mapped[int] = mapped_column(Integer, default=2048)
    threads: Mapped[int] = mapped_column(Integer, default=1)
    bridge_agent: Mapped[str] = mapped_column(String(255), default="")
    nsfw: Mapped[bool] = mapped_column(Boolean, default=False)
    priority_user_ids: Mapped[list[int]] = mapped_column(JsonList, default=list)
    # The chat block; NULL limits = not a chat worker.
    chat_max_completion_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    chat_max_context_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)
    chat_features: Mapped[list[str]] = mapped_column(JsonList, default=list)
    chat_image_transports: Mapped[list[str]] = mapped_column(JsonList, default=list)
    maintenance: Mapped[bool] = mapped_column(Boolean, default=False)
    maintenance_msg: Mapped[str] = mapped_column(String(255), default="")
    paused: Mapped[bool] = mapped_column(Boolean, default=False)
    last_check_in: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    # Lease speed (tokens per second of lease): mean of the newest samples; NULL = unmeasured.
    lease_speed: Mapped[float | None] = mapped_column(Float, nullable=True)
    speed_samples: Mapped[list[float]] = mapped_column(JsonList, default=list)
    # floor(speed x generation window), with the assumed speed while unmeasured; kept in step with
    # lease_speed and the settings at every check-in and submit so SQL can compare integers.
    capacity: Mapped[int] = mapped_column(Integer, default=0)
    completed_jobs: Mapped[int] = mapped_column(Integer, default=0)
    aborted_jobs: Mapped[int] = mapped_column(Integer, default=0)
    faulted_jobs: Mapped[int] = mapped_column(Integer, default=0)
    tokens_generated: Mapped[int] = mapped_column(BigInteger, default=0)
    kudos_earned: Mapped[float] = mapped_column(Float, default=0.0)
    # The team its owner joined it to. Deleting a team takes its workers out first
    # (accounts/teams.py): SQLite adds a column's foreign key only inline, whose ON DELETE action
    # its reflection cannot read back, so the key declares none and refuses a dangling reference.
    team_id: Mapped[str | None] = mapped_column(ForeignKey("teams.id"), nullable=True, index=True)
    # The address its last pop came from (canonical text; NULL: none yet, or not an IP address),
    # written with the check-in: what a moderator's worker block times out.
    ipaddr: Mapped[str | None] = mapped_column(String(45), nullable=True)


class IpTimeout(Base):
    """A network a moderator put into timeout (operators/ip_timeouts.py): no request creation and
    no worker call from an address in it until `expires_at` (the horde's clock). A single address is
    its own /32, a single IPv6 address its /64."""

    __tablename__ = "ip_timeouts"

    network: Mapped[str] = mapped_column(String(49), primary_key=True)  # canonical CIDR text
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    created_at: Mapped[float] = mapped_column(Float)
    # The moderator who set it; None for open operator pages or a deleted moderator.
    created_by: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"), nullable=True)
    # Set by a worker block: the worker whose last address it is (lifting the block lifts it).
    worker_id: Mapped[str | None] = mapped_column(ID, nullable=True)


class WorkerMessage(Base):
    """A message to one worker, or to every worker (`worker_id` NULL: a moderator's), handed to it
    with each pop until it expires (accounts/worker_messages.py). Kept past its expiry for the
    listing until `[messages] keep_expired_days`."""

    __tablename__ = "worker_messages"
    __table_args__ = (
        # A pop's question: does this worker (or every worker) have an unexpired message.
        Index("ix_worker_messages_worker", "worker_id", "expires_at"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    worker_id: Mapped[str | None] = mapped_column(ForeignKey("workers.id", ondelete="CASCADE"), nullable=True)
    # Who sent it (upstream's `user_id`).
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    message: Mapped[str] = mapped_column(Text)
    origin: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class WorkerModel(Base):
    """The models a worker serves, one row each, so model matching is an indexed join."""

    __tablename__ = "worker_models"

    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id", ondelete="CASCADE"), primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class TextRequest(Base):
    __tablename__ = "text_requests"
    __table_args__ = (
        # The queue order (effective_start, created_at, id) within a state: the order walks follow.
        Index("ix_text_requests_queue", "state", "effective_start", "created_at", "id"),
        # A user's requests in a state: the waiting ones are counted at every creation and read at
        # every pop of the user's workers, among the ones ended and kept until they expire.
        Index("ix_text_requests_user_state", "user_id", "state"),
    )

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    shared_key_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    requester_kind: Mapped[str] = mapped_column(String(16))  # anonymous | registered | shared_key
    # waiting (offered or running) | done | cancelled | faulted
    state: Mapped[str] = mapped_column(String(16), default="waiting")
    is_chat: Mapped[bool] = mapped_column(Boolean, default=False)
    stream: Mapped[bool] = mapped_column(Boolean, default=False)
    # A client of the /v1 fronts waits on it in some server process: its changes are announced to
    # the other processes too (NOTIFY on PostgreSQL). Nobody waits on a native-route request.
    waited: Mapped[bool] = mapped_column(Boolean, default=False, server_default=true())
    prompt: Mapped[str] = mapped_column(Text, default="")
    params: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    # Chat payload handed to the worker (messages, tools, response_format, sampling).
    chat: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc, nullable=True)
    max_length: Mapped[int] = mapped_column(Integer)
    max_context_length: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    required_features: Mapped[list[str]] = mapped_column(JsonList, default=list)
    required_transports: Mapped[list[str]] = mapped_column(JsonList, default=list)
    any_model: Mapped[bool] = mapped_column(Boolean, default=True)
    models: Mapped[list[str]] = mapped_column(JsonList, default=list)
    # Allow-list of worker ids; `targeted` says whether it is in force (an empty list is not).
    targeted: Mapped[bool] = mapped_column(Boolean, default=False)
    worker_allow: Mapped[list[str]] = mapped_column(JsonList, default=list)
    worker_deny: Mapped[list[str]] = mapped_column(JsonList, default=list)
    trusted_workers: Mapped[bool] = mapped_column(Boolean, default=False)
    slow_workers: Mapped[bool] = mapped_column(Boolean, default=True)
    nsfw: Mapped[bool] = mapped_column(Boolean, default=True)
    n_total: Mapped[int] = mapped_column(Integer, default=1)
    # Jobs not yet handed out; a lapse or a fault gives one back.
    n_remaining: Mapped[int] = mapped_column(Integer, default=1)
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    # Ids of the workers whose job of this request lapsed or faulted: never offered it again.
    failed_workers: Mapped[list[str]] = mapped_column(JsonList, default=list, server_default="[]")
    # The owners of those workers (user ids as strings, as the JSON list tests compare text): every
    # worker of theirs, named then or later, is refused, and the request is faulted only when more
    # than `max_failures` distinct owners failed it. A new owner here always comes with a new
    # worker in `failed_workers`, whose change the change log's triggers note.
    failed_owners: Mapped[list[str]] = mapped_column(JsonList, default=list, server_default="[]")
    initial_priority: Mapped[float] = mapped_column(Float, default=0.0)
    # created - initial_priority / 5 s: sorts like upstream's growing priority, without rewrites.
    effective_start: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float, index=True)
    kudos_spent: Mapped[float] = mapped_column(Float, default=0.0)
    # The price fixed at admission (requests/prices.py): the most one job may be charged, burn
    # included, and the context tokens its jobs are rewarded at.
    job_price: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    price_context: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # What was asked (max_length is what was applied); the decision itself is its admission record.
    requested_max_length: Mapped[int] = mapped_column(Integer)
    context_adjustments: Mapped[list[Any]] = mapped_column(JsonDoc, default=list)
    client_agent: Mapped[str] = mapped_column(String(255), default="")
    # Where each finished generation is POSTed (webhooks/), checked at admission; upstream's length.
    webhook: Mapped[str | None] = mapped_column(String(1024), nullable=True)
    # A pop takes one of its jobs at a time, whatever `amount` it asks (upstream's disable_batching).
    # No Python default: an insert that does not name it (an older schema's rows) takes the server's.
    disable_batching: Mapped[bool] = mapped_column(Boolean, server_default=false())


class RequestModel(Base):
    __tablename__ = "request_models"

    request_id: Mapped[str] = mapped_column(
        ForeignKey("text_requests.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(255), primary_key=True, index=True)


class QueueEntry(Base):
    """The queue's index (queue/queue_index.py): one row per waiting request, model it asks
    for ("" for a request any model serves) and worker it targets ("" for a request that targets
    none), in queue order, with the limits a worker must meet.
    A hint beside the truth: readers judge the request row itself, so a stale entry costs a skipped
    candidate, never a wrong answer. Only requests with a job to hand out have entries."""

    __tablename__ = "queue_entries"
    __table_args__ = (
        # Covering: a walk reads the order and the limits from the index alone.
        Index(
            "ix_queue_entries_walk",
            "model",
            "effective_start",
            "created_at",
            "request_id",
            "is_chat",
            "need_length",
            "need_context",
            "nsfw",
            "trusted_workers",
            "slow_workers",
            "target",
            "plain",
        ),
        # A walk's probe: does any entry of a model ask for no more than a worker's longest
        # length (one index lookup; without it, a worker too small for a model's whole queue
        # read every entry of that model to find none).
        Index("ix_queue_entries_need", "model", "need_length"),
    )

    request_id: Mapped[str] = mapped_column(
        ForeignKey("text_requests.id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    effective_start: Mapped[float] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    is_chat: Mapped[bool] = mapped_column(Boolean)
    # Legacy: max_length and max_context_length; chat: max_tokens and prompt + max_tokens.
    need_length: Mapped[int] = mapped_column(Integer)
    need_context: Mapped[int] = mapped_column(Integer)
    # The request's own choices that most often refuse a worker, so a walk skips them in the index.
    nsfw: Mapped[bool] = mapped_column(Boolean, server_default=false())
    trusted_workers: Mapped[bool] = mapped_column(Boolean, server_default=false())
    slow_workers: Mapped[bool] = mapped_column(Boolean, server_default=true())
    # A targeted request's entry names one worker of its allow-list ("": any worker, as far as the
    # index can tell): a walk skips other workers' targeted entries inside the index.
    target: Mapped[str] = mapped_column(ID, primary_key=True, server_default="")
    # The request asks for no chat features or image transports and has no allow-list the entries
    # do not name: whether a worker can take it then reads from the entry and the request's refusals
    # by name (QueueRefusal), so a walk can ask the speed gate's question here (queue_index.py).
    plain: Mapped[bool] = mapped_column(Boolean, server_default=false())


class QueueRefusal(Base):
    """A worker a request refuses by name, for good: its deny-list, and each worker that failed it
    (settlement.give_back). Written with the request and at each failure, gone with the request; a
    walk skips, inside its statement, the entries of requests that refuse the walking worker."""

    __tablename__ = "queue_refusals"

    # The walk asks (request, worker) pairs; a request's rows go with it (ON DELETE CASCADE).
    request_id: Mapped[str] = mapped_column(
        ForeignKey("text_requests.id", ondelete="CASCADE"), primary_key=True
    )
    worker_id: Mapped[str] = mapped_column(ID, primary_key=True)


class QueueOwnerRefusal(Base):
    """An owner a request refuses, for good, since one of its workers failed it
    (settlement.give_back): all its workers, those it names later too. Beside queue_refusals, as
    that table is beside the deny-list and failed workers: a walk skips these inside its statement."""

    __tablename__ = "queue_owner_refusals"

    request_id: Mapped[str] = mapped_column(
        ForeignKey("text_requests.id", ondelete="CASCADE"), primary_key=True
    )
    owner_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)


class Generation(Base):
    """One job handed to one worker by a pop, with its lease."""

    __tablename__ = "generations"
    __table_args__ = (Index("ix_generations_lease", "state", "lease_expires_at"),)

    id: Mapped[str] = mapped_column(ID, primary_key=True)
    request_id: Mapped[str] = mapped_column(ForeignKey("text_requests.id", ondelete="CASCADE"), index=True)
    worker_id: Mapped[str] = mapped_column(ForeignKey("workers.id", ondelete="CASCADE"), index=True)
    model: Mapped[str] = mapped_column(String(255), default="")
    # processing | ok | censored | faulted | aborted | cancelled
    state: Mapped[str] = mapped_column(String(16), default="processing")
    # A paused worker's job: copied from a real request, moves nothing, recorded nowhere.
    fake: Mapped[bool] = mapped_column(Boolean, default=False)
    popped_at: Mapped[float] = mapped_column(Float)
    lease_expires_at: Mapped[float] = mapped_column(Float)
    submitted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    text: Mapped[str | None] = mapped_column(Text, nullable=True)
    seed: Mapped[str | None] = mapped_column(String(64), nullable=True)
    gen_metadata: Mapped[list[Any] | None] = mapped_column(JsonDoc, nullable=True)
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    reward: Mapped[float] = mapped_column(Float, default=0.0)
    # Shadow record of the speed gate: fixed at assignment because speed moves.
    over_capacity_at_assignment: Mapped[bool] = mapped_column(Boolean, default=False)
    capacity_at_assignment: Mapped[int] = mapped_column(Integer, default=0)
    speed_at_assignment: Mapped[float] = mapped_column(Float, default=0.0)
    # Chat: streamed progress and the submitted message.
    progress_seq: Mapped[int] = mapped_column(Integer, default=0)
    progress_content: Mapped[str] = mapped_column(Text, default="")
    progress_tool_calls: Mapped[list[Any]] = mapped_column(JsonDoc, default=list)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    chat_result: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc, nullable=True)
    # A legacy job's usage as its worker reported it, bounded (a chat job's is in chat_result).
    usage: Mapped[dict[str, int] | None] = mapped_column(JsonDoc, nullable=True)


# --- history: what operators read to compare policies --------------------------------------------------
# Kept after the requests and jobs they describe expire; no foreign keys, so nothing cascades away.


class AssignmentRecord(Base):
    """The shadow record of one real assignment (a non-fake job handed to a worker), with its
    outcome once the job ends."""

    __tablename__ = "assignment_records"
    __table_args__ = (Index("ix_assignment_records_at", "at"),)

    generation_id: Mapped[str] = mapped_column(ID, primary_key=True)
    at: Mapped[float] = mapped_column(Float)  # popped at
    request_id: Mapped[str] = mapped_column(ID)
    worker_id: Mapped[str] = mapped_column(ID)
    worker_trusted: Mapped[bool] = mapped_column(Boolean)
    is_chat: Mapped[bool] = mapped_column(Boolean)
    max_length: Mapped[int] = mapped_column(Integer)
    capacity: Mapped[int] = mapped_column(Integer)
    speed: Mapped[float] = mapped_column(Float)
    over_capacity: Mapped[bool] = mapped_column(Boolean)
    # Over capacity only: was a capable worker for the request online at the pop (None: not asked).
    capable_online: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    speed_gate: Mapped[str] = mapped_column(String(64))  # the policy in force
    # None while running; completed | faulted | aborted | cancelled
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class UsageRecord(Base):
    """Durable usage (operators/usage.py): what one requester got from one worker on one model in
    one clock hour (UTC), through one shared key or none (""). Written with each settlement, kept
    after the requests and jobs expire, trimmed only by `[usage] keep_days`."""

    __tablename__ = "usage_records"
    __table_args__ = (
        Index("ix_usage_records_user", "user_id", "hour"),
        Index("ix_usage_records_owner", "owner_id", "hour"),
        Index("ix_usage_records_worker", "worker_id", "hour"),
    )

    hour: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)  # epoch s
    user_id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)  # requester
    worker_id: Mapped[str] = mapped_column(ID, primary_key=True)
    model: Mapped[str] = mapped_column(String(255), primary_key=True)
    shared_key_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # "": no shared key
    owner_id: Mapped[int] = mapped_column(Integer)  # the worker's owner, who earned the rewards
    requests: Mapped[int] = mapped_column(Integer, default=0)  # requests served first in this row
    jobs: Mapped[int] = mapped_column(Integer, default=0)
    tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    kudos_spent: Mapped[float] = mapped_column(Float, default=0.0)  # charged to the requester
    kudos_earned: Mapped[float] = mapped_column(Float, default=0.0)  # rewarded to the owner


class CandidateRecord(Base):
    """What the candidate policy would have decided differently at one pop or admission."""

    __tablename__ = "candidate_records"
    __table_args__ = (Index("ix_candidate_records_at", "at"),)

    id: Mapped[int] = mapped_column(BigIntIdentity, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    kind: Mapped[str] = mapped_column(String(32))  # speed_gate | allowance_curve
    candidate: Mapped[str] = mapped_column(String(64))
    in_force: Mapped[str] = mapped_column(String(64))
    request_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    worker_id: Mapped[str | None] = mapped_column(ID, nullable=True)
    worker_trusted: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    is_chat: Mapped[bool] = mapped_column(Boolean)
    max_length: Mapped[int] = mapped_column(Integer)
    capacity: Mapped[int | None] = mapped_column(Integer, nullable=True)
    capable_online: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    decision: Mapped[str] = mapped_column(String(32))  # what the policy in force decided
    candidate_decision: Mapped[str] = mapped_column(String(32))
    allowance: Mapped[int | None] = mapped_column(Integer, nullable=True)
    candidate_allowance: Mapped[int | None] = mapped_column(Integer, nullable=True)


class AdmissionRecord(Base):
    """One admission decision (free, funded, downgraded or refused), refusals included."""

    __tablename__ = "admission_records"
    __table_args__ = (Index("ix_admission_records_at", "at"),)

    id: Mapped[int] = mapped_column(BigIntIdentity, primary_key=True)
    at: Mapped[float] = mapped_column(Float)
    request_id: Mapped[str | None] = mapped_column(ID, nullable=True)  # None: refused
    requester_kind: Mapped[str] = mapped_column(String(16))
    is_chat: Mapped[bool] = mapped_column(Boolean)
    requested_max_length: Mapped[int] = mapped_column(Integer)
    n: Mapped[int] = mapped_column(Integer)
    allowance: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))
    estimated_wait: Mapped[float | None] = mapped_column(Float, nullable=True)
    competing_jobs: Mapped[int] = mapped_column(Integer, default=0)
    eligible_threads: Mapped[int] = mapped_column(Integer, default=0)
    # Horde-wide totals, read only when the curve in force asks for them (None: not read).
    online_text_threads: Mapped[int | None] = mapped_column(Integer, nullable=True)
    queued_text_requests: Mapped[int | None] = mapped_column(Integer, nullable=True)
    allowance_curve: Mapped[str] = mapped_column(String(64))  # the policy in force
    # The rest of what the outcome rule read, so another curve's outcome can be recomputed:
    slow_workers: Mapped[bool] = mapped_column(Boolean, default=True)
    downgrade_allowed: Mapped[bool] = mapped_column(Boolean, default=False)  # legacy, native, asked
    # The requester could pay the upfront cost (kudos and key budget); None: not read (it was free).
    can_fund: Mapped[bool | None] = mapped_column(Boolean, nullable=True)


class PolicyState(Base):
    """The policy in force for each kind, shared by every process of the horde."""

    __tablename__ = "policy_state"

    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    options: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    version: Mapped[int] = mapped_column(Integer, default=1)
    changed_at: Mapped[float] = mapped_column(Float)


class PolicyChange(Base):
    """The log of policy switches."""

    __tablename__ = "policy_changes"

    id: Mapped[int] = mapped_column(BigIntIdentity, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    kind: Mapped[str] = mapped_column(String(32))
    old_name: Mapped[str | None] = mapped_column(String(64), nullable=True)
    new_name: Mapped[str] = mapped_column(String(64))
    options: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    source: Mapped[str] = mapped_column(String(32))  # cli | sighup | start-up


class HordeModeState(Base):
    """The horde's modes in force (one row, id 1), shared by every process of the horde."""

    __tablename__ = "horde_modes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    maintenance: Mapped[bool] = mapped_column(Boolean, default=False)
    invite_only: Mapped[bool] = mapped_column(Boolean, default=False)
    raid: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=0)
    changed_at: Mapped[float] = mapped_column(Float)


class HordeModeChange(Base):
    """The log of mode switches: which mode, on or off, by whom and through what."""

    __tablename__ = "horde_mode_changes"

    id: Mapped[int] = mapped_column(BigIntIdentity, primary_key=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    mode: Mapped[str] = mapped_column(String(16))  # maintenance | invite_only | raid
    enabled: Mapped[bool] = mapped_column(Boolean)
    changed_by: Mapped[str] = mapped_column(String(120))  # the user's name#id; "operator" for the CLI
    source: Mapped[str] = mapped_column(String(16))  # api | dashboard | cli


class RateCount(Base):
    """One rate limit's count for one caller in its current window (api/rate_counts.py), shared by
    every process and host of the horde. Rows whose window has ended are purged now and then."""

    __tablename__ = "rate_counts"

    # The limit's name and a hash of the caller's identity (never a usable API key).
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    # When the window that began with its first call ends (the horde's clock).
    window_end: Mapped[float] = mapped_column(Float, index=True)
    hits: Mapped[int] = mapped_column(Integer)
