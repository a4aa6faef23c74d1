"""Wire structs of the horde face (/api/v2): the exact bodies clients send and receive.

Request bodies are the lifecycle's input structs (``horde_lite.inputs``), re-exported here so the
face names every shape it speaks in one module. Response structs carry upstream's exact field names; the
face builds them from the typed results its lifecycle entry points return, so the OpenAPI schema Litestar
generates from them is the wire.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

# The request bodies the lifecycle consumes, re-exported: the face names every shape it speaks here.
from horde_lite.inputs import (  # noqa: F401
    CreateTeamInput,
    FilterCheckInput,
    FilterInput,
    FilterPatch,
    HordeModesInput,
    InviteInput,
    KudosAwardInput,
    KudosTransferInput,
    ModifyTeamInput,
    PopInput,
    ProgressInput,
    RegisterInput,
    SharedKeyInput,
    SharedKeyPatch,
    SubmitInput,
    TextRequestInput,
    UserCreate,
    UserUpdate,
    WorkerMessageInput,
    WorkerUpdate,
)

# --- requests and jobs
#
# Upstream's models: RequestAsync, RequestStatusKobold, GenerationKobold, GenerationPayloadKobold,
# NoValidRequestFoundKobold, GenerationSubmitted. A field that is UNSET is left out of the answer
# (an absent key, not a null), exactly as the routes have always answered.


class ContextAdjustment(msgspec.Struct, kw_only=True):
    """A value horde_lite changed from what the client asked, and why."""

    field: str
    requested: int
    applied: int
    reason: str


class RequestWarning(msgspec.Struct, kw_only=True):
    code: str
    message: str


class RequestAsync(msgspec.Struct, kw_only=True):
    """202 from POST /generate/text/async: the request is queued."""

    id: str
    kudos: float
    message: str | UnsetType = UNSET  # the first warning's message, when there is one
    warnings: list[RequestWarning] | UnsetType = UNSET
    context_adjustments: list[ContextAdjustment] | UnsetType = UNSET  # chat, or when something changed


class RequestQuote(msgspec.Struct, kw_only=True):
    """200 from POST /generate/text/async with `dry_run`: nothing was created."""

    kudos: float
    max_length: int  # the length it would run at (lowered by a downgrade)
    context_adjustments: list[ContextAdjustment] | UnsetType = UNSET


class ChatResult(msgspec.Struct, kw_only=True):
    """A chat job's submitted message (tool calls included), finish_reason and usage."""

    message: dict[str, Any]
    finish_reason: str
    usage: dict[str, int]


GenerationState = Literal["ok", "censored"]


class GenerationKobold(msgspec.Struct, kw_only=True):
    text: str
    model: str
    state: GenerationState
    worker_id: str
    worker_name: str
    seed: int | str | UnsetType = UNSET
    gen_metadata: list[dict[str, Any]] | UnsetType = UNSET
    chat: ChatResult | UnsetType = UNSET


class RequestStatusKobold(msgspec.Struct, kw_only=True):
    """GET and DELETE /generate/text/status/{id}; `generations` lists finished ones only."""

    finished: int
    processing: int
    restarted: int
    waiting: int
    done: bool
    faulted: bool
    wait_time: int
    queue_position: int
    kudos: float
    is_possible: bool
    generations: list[GenerationKobold]


class NoValidRequestFoundKobold(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Waiting requests this worker's declarations are too small for (a key only when counted)."""

    max_length: int = 0
    max_context_length: int = 0


class ResponseModelMessagePop(msgspec.Struct, kw_only=True):
    """A worker message as a pop hands it (upstream's model of that name)."""

    id: str
    message: str
    origin: str
    expiry: str  # RFC 822, as upstream: "Mon, 01 Jan 2024 12:00:00 -0000"


class ResponseModelMessage(ResponseModelMessagePop, kw_only=True):
    """A worker message in full (upstream's model of that name): its worker (absent for a message
    to every worker), its sender's id and when it was sent."""

    user_id: str  # the sender's id, as upstream writes it: the number of "name#id", as a string
    created: str  # RFC 822
    worker_id: str | UnsetType = UNSET


class GenerationPayloadKobold(msgspec.Struct, kw_only=True):
    """POST /generate/text/pop. No job: `id` null, `ids` and `payload` empty. A job: the Kobold
    payload (`kind` "text") or the chat payload (`kind` "chat", with `stream`). Either way the
    worker's unexpired messages (`messages`)."""

    id: str | None
    ids: list[str]
    payload: dict[str, Any]
    skipped: NoValidRequestFoundKobold
    messages: list[ResponseModelMessagePop] = []
    model: str | UnsetType = UNSET
    ttl: int | UnsetType = UNSET  # the lease, seconds
    kind: Literal["text", "chat"] | UnsetType = UNSET
    stream: bool | UnsetType = UNSET
    softprompt: str | UnsetType | None = UNSET  # null on text jobs (softprompts are not served)
    # A pop that asked to wait (`wait_seconds`): the wait applied, 0 when the horde does not wait.
    # Absent for a pop that did not ask, as upstream answers it.
    wait_seconds: int | UnsetType = UNSET


class GenerationSubmitted(msgspec.Struct, kw_only=True):
    reward: float


class GenerationProgress(msgspec.Struct, kw_only=True):
    """POST /generate/text/progress: when the lease now ends, and whether to stop."""

    lease_expires_at: datetime
    cancel: bool


# --- status, stats, workers, users, kudos
#
# Upstream's models: ActiveModel, HordePerformance, HordeModes, Newspiece, StatsTxtTotals,
# TxtModelStats, WorkerDetails, ModifyWorker, DeletedWorker, UserDetails, ModifyUser,
# KudosTransferred, SharedKeyDetails. Image and interrogation fields upstream's models require are
# zeros; horde_lite's own additions to a worker's record follow upstream's fields.


class Heartbeat(msgspec.Struct, kw_only=True):
    message: str
    version: str


class ActiveModel(msgspec.Struct, kw_only=True):
    name: str
    count: int  # online workers serving it
    performance: float  # their mean lease speed, tokens per second
    queued: int  # tokens waiting
    jobs: int
    eta: int  # seconds
    type: Literal["text"] = "text"


class HordePerformance(msgspec.Struct, kw_only=True):
    queued_text_requests: int
    queued_tokens: float
    text_worker_count: int
    text_thread_count: int
    past_minute_tokens: float
    # Upstream's image and interrogation figures (worker_count and thread_count are image workers).
    queued_requests: int = 0
    worker_count: int = 0
    thread_count: int = 0
    queued_megapixelsteps: float = 0.0
    past_minute_megapixelsteps: float = 0.0
    queued_forms: float = 0.0
    interrogator_count: int = 0
    interrogator_thread_count: int = 0


class HordeModes(msgspec.Struct, kw_only=True):
    """GET /status/modes (upstream's HordeModes): raid mode is shown to moderators only."""

    maintenance_mode: bool
    invite_only_mode: bool
    raid_mode: bool | UnsetType = UNSET


class HordeModesSet(msgspec.Struct, kw_only=True):
    """PUT /status/modes (upstream's HordeModes as it answers a switch): the modes the switch
    named, as they now are; the others are left out."""

    maintenance_mode: bool | UnsetType = UNSET
    invite_only_mode: bool | UnsetType = UNSET
    raid_mode: bool | UnsetType = UNSET


class Newspiece(msgspec.Struct, kw_only=True):
    date_published: str
    newspiece: str
    importance: str
    tags: list[str]
    title: str
    more_info_urls: list[str]


class SinglePeriodTxtStat(msgspec.Struct, kw_only=True):
    requests: int
    tokens: int


class StatsTxtTotals(msgspec.Struct, kw_only=True):
    minute: SinglePeriodTxtStat
    hour: SinglePeriodTxtStat
    day: SinglePeriodTxtStat
    month: SinglePeriodTxtStat
    total: SinglePeriodTxtStat


class TxtModelStats(msgspec.Struct, kw_only=True):
    """Finished jobs per model name."""

    day: dict[str, int]
    month: dict[str, int]
    total: dict[str, int]


class WorkerKudosDetails(msgspec.Struct, kw_only=True):
    generated: float
    uptime: int = 0  # horde_lite pays no uptime kudos


class WorkerChat(msgspec.Struct, kw_only=True):
    """A chat worker's declared limits and features (horde_lite's chat block)."""

    max_completion_tokens: int
    max_context_tokens: int | None
    features: list[str]
    image_transports: list[str]


class TeamDetailsLite(msgspec.Struct, kw_only=True):
    """A worker's team; both null when it has none (as upstream answers)."""

    name: str | None
    id: str | None


class WorkerDetails(msgspec.Struct, kw_only=True):
    type: Literal["text"]
    name: str
    id: str
    online: bool
    models: list[str]
    max_length: int
    max_context_length: int
    threads: int
    bridge_agent: str
    nsfw: bool
    trusted: bool
    flagged: bool
    maintenance_mode: bool
    paused: bool
    info: str | None
    performance: str  # "<lease speed> tokens per second"
    requests_fulfilled: int
    kudos_rewards: float
    kudos_details: WorkerKudosDetails
    tokens_generated: int
    uncompleted_jobs: int
    uptime: int  # seconds from its first pop to its last
    team: TeamDetailsLite
    # horde_lite's additions: the chat block, the lease speed (null while unmeasured, then the
    # assumed speed is used) and the capacity it gives, the uncompleted jobs by kind.
    chat: WorkerChat | None
    lease_speed: float | None
    speed_measured: bool
    assumed_speed: float
    capacity: int
    aborted_jobs: int
    faulted_jobs: int


class ModifyWorker(msgspec.Struct, kw_only=True):
    """Only the fields the PUT changed."""

    maintenance: bool | UnsetType = UNSET
    paused: bool | UnsetType = UNSET
    info: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    team: str | UnsetType = UNSET


class DeletedWorker(msgspec.Struct, kw_only=True):
    deleted_id: str
    deleted_name: str


# --- teams
#
# Upstream's models: TeamDetails (text: TeamDetailsKobold), WorkerDetailsLite, ActiveModelLite,
# ModifyTeam, DeletedTeam.


class WorkerDetailsLite(msgspec.Struct, kw_only=True):
    type: Literal["text"]
    name: str
    id: str
    online: bool


class ActiveModelLite(msgspec.Struct, kw_only=True):
    name: str
    count: int  # the team's workers serving it


class TeamDetails(msgspec.Struct, kw_only=True):
    """A team and its live workers' figures, summed (they leave with a worker that leaves)."""

    name: str
    id: str
    info: str | None
    creator: str  # "name#id"
    worker_count: int
    workers: list[WorkerDetailsLite]
    models: list[ActiveModelLite]
    contributions: int  # tokens generated
    requests_fulfilled: int
    kudos: float  # earned by its workers
    uptime: int  # seconds, summed over its workers
    performance: float  # mean lease speed of its online workers, tokens per second
    total_speed: float  # their sum


class ModifyTeam(msgspec.Struct, kw_only=True):
    """The team as created or changed."""

    id: str
    name: str
    info: str | None


class DeletedTeam(msgspec.Struct, kw_only=True):
    deleted_id: str
    deleted_name: str


# --- prompt filters
#
# Upstream's FilterDetails, FilterPromptSuspicion and FilterRegex.


class FilterDetails(msgspec.Struct, kw_only=True):
    """A prompt filter. `id` is a string, as upstream answers it."""

    id: str
    regex: str
    filter_type: int
    description: str | None
    replacement: str
    user: str  # the moderator who added it or changed it last, "name#id"
    action: Literal["block", "replace"]  # horde_lite's: what a match does (the type's range)


class FilterMatch(msgspec.Struct, kw_only=True):
    """horde_lite's: one filter's verdict on a checked prompt."""

    id: str
    filter_type: int
    action: Literal["block", "replace"]
    match: str | None  # the text it matched (its first 200 characters); null when cut off
    timed_out: bool


class FilterPromptSuspicion(msgspec.Struct, kw_only=True):
    """POST /filters. `suspicion` is a string, as upstream answers it: "2" when a blocking filter
    matched (the request would be refused), "1" when only replacing filters did, else "0"."""

    suspicion: str
    matches: list[str]
    filters: list[FilterMatch]


class FilterRegex(msgspec.Struct, kw_only=True):
    """GET /filters/regex: one type's patterns joined by `|`."""

    filter_type: int
    regex: str


class UserKudosDetails(msgspec.Struct, kw_only=True):
    accumulated: float  # earned by the user's workers less what its requests were charged
    gifted: float  # transferred to others
    admin: float  # granted or taken by operators and moderators
    received: float  # transferred from others
    donated: float = 0.0
    recurring: float = 0.0
    awarded: float = 0.0
    styled: float = 0.0


class ContributionsDetails(msgspec.Struct, kw_only=True):
    fulfillments: int
    tokens: int
    megapixelsteps: float = 0.0


class UserThingRecords(msgspec.Struct, kw_only=True):
    tokens: int
    megapixelsteps: float = 0.0


class UserAmountRecords(msgspec.Struct, kw_only=True):
    text: int
    image: int = 0
    interrogation: int = 0


class UserRecords(msgspec.Struct, kw_only=True):
    """Upstream's records, text only, from the usage history kept (docs/reference/usage.md)."""

    usage: UserThingRecords  # tokens the user's requests were given
    contribution: UserThingRecords  # tokens the user's workers generated
    fulfillment: UserAmountRecords  # jobs the user's workers finished
    request: UserAmountRecords  # requests of the user's that were served


class MonthlyKudos(msgspec.Struct, kw_only=True):
    """Upstream's MonthlyKudos: what the user receives each UTC calendar month."""

    amount: int
    last_received: str | None  # ISO 8601, UTC; null never


class UserDetails(msgspec.Struct, kw_only=True):
    username: str  # "name#id"; the anonymous user is "Anonymous#0"
    id: int
    kudos: float
    trusted: bool
    moderator: bool
    kudos_details: UserKudosDetails
    worker_count: int
    account_age: int  # seconds
    contributions: ContributionsDetails
    records: UserRecords
    worker_ids: list[str] | UnsetType = UNSET  # the user's own key, a moderator, or public_workers
    sharedkey_ids: list[str] | UnsetType = UNSET  # the user's own key or a moderator; hashes, not keys
    worker_invited: int = 0  # workers the user may hold beyond the default limit (0: the default)
    contact: str | UnsetType = UNSET  # the user's own key or a moderator
    admin_comment: str | UnsetType = UNSET  # moderators only
    flagged: bool | UnsetType = UNSET  # the user's own key or a moderator
    # The user's limits in force (docs/reference/keys.md), to the user and moderators: upstream's
    # concurrency and monthly_kudos, horde_lite's others (-1 none; [] any model).
    concurrency: int | UnsetType = UNSET
    monthly_kudos: MonthlyKudos | UnsetType = UNSET
    allowed_models: list[str] | UnsetType = UNSET
    requests_per_minute: int | UnsetType = UNSET
    tokens_per_day: int | UnsetType = UNSET


class ModifyUser(msgspec.Struct, kw_only=True):
    """Only the fields the PUT changed."""

    new_kudos: float | UnsetType = UNSET
    trusted: bool | UnsetType = UNSET
    moderator: bool | UnsetType = UNSET
    username: str | UnsetType = UNSET  # the new "name#id"
    contact: str | UnsetType = UNSET
    admin_comment: str | UnsetType = UNSET
    public_workers: bool | UnsetType = UNSET
    worker_invited: int | UnsetType = UNSET
    flagged: bool | UnsetType = UNSET
    concurrency: int | UnsetType = UNSET
    monthly_kudos: int | UnsetType = UNSET  # the new monthly amount
    allowed_models: list[str] | UnsetType = UNSET
    requests_per_minute: int | UnsetType = UNSET
    tokens_per_day: int | UnsetType = UNSET


class CreatedUser(msgspec.Struct, kw_only=True):
    """POST /users (horde_lite's own route): the new user and its key, shown this once."""

    id: int
    username: str  # "name#id"
    api_key: str


class DeletedUserAnswer(msgspec.Struct, kw_only=True):
    """DELETE /users/{id}: upstream's SimpleResponse, with what went with the user."""

    message: str
    deleted_username: str  # as it was: "name#id"
    kudos: float  # the balance the deleted row keeps
    workers_deleted: int
    sharedkeys_removed: int


class KudosTransferred(msgspec.Struct, kw_only=True):
    transferred: float


class KudosAwarded(msgspec.Struct, kw_only=True):
    awarded: float


class SharedKeyDetails(msgspec.Struct, kw_only=True):
    id: str  # the key as the caller gave it (its hash, when given the hash)
    username: str  # the owner
    name: str
    kudos: float  # the budget; -1 unlimited
    utilized: float
    expiry: float | None  # epoch seconds; null never
    max_text_tokens: int  # -1 no cap
    allowed_models: list[str]  # [] any model
    concurrency: int  # requests waiting or running at once; -1 no limit
    requests_per_minute: int  # -1 no limit
    tokens_per_day: int  # output tokens reserved per UTC day; -1 no limit
    monthly_kudos: float  # `kudos` is reset to this each UTC calendar month; -1 never


class SimpleResponse(msgspec.Struct, kw_only=True):
    message: str


class IPTimeout(msgspec.Struct, kw_only=True):
    """A live address timeout (upstream's `IPTimeout`): a single IPv4 address bare, else a CIDR."""

    ipaddr: str
    seconds: int  # left, rounded up


# --- registration, keys and invite codes (horde_lite's own: upstream registers through OAuth pages)


class UserKeyDetails(msgspec.Struct, kw_only=True):
    """A user and its new API key: shown in this answer only (only its hash is stored)."""

    id: int
    username: str  # "name#id"
    api_key: str


class InviteDetails(msgspec.Struct, kw_only=True, omit_defaults=True):
    """An invite code. `code` is in the answer that made it only; listings show `hint`, its first
    characters, and `id`, which a revocation also takes."""

    id: int
    hint: str
    uses: int
    uses_left: int
    state: Literal["active", "used up", "expired", "revoked"]  # accounts.invites.InviteState
    expires_at: float | None  # epoch seconds; null: never
    created_by: str | None  # "name#id"; null: the CLI or open operator pages
    created_at: float
    revoked_at: float | None
    code: str | UnsetType = UNSET
