"""What clients and workers send, as typed structs. The horde API decodes request bodies straight
into these (msgspec validates types and ranges); defaults are applied here, on the server, because
the horde-sdk sends only the fields its caller set."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from horde_lite.operators.ip_rule import LONGEST as LONGEST_ADDRESS
from horde_lite.operators.ip_rule import MOST_DAYS, MOST_HOURS

CHAT_FEATURES = ("tools", "json_schema", "vision")
IMAGE_TRANSPORTS = ("url", "base64")

# Every integer is bounded to its column (a 32-bit INTEGER) or tighter, and every string that is
# stored to its column, so nothing that passes validation is unstorable (docs/decisions).
INT32_MAX = 2**31 - 1
INT64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Positive = Annotated[int, msgspec.Meta(gt=0, le=INT32_MAX)]
Count = Annotated[int, msgspec.Meta(ge=0, le=INT32_MAX)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=INT32_MAX)]
MAX_CONTEXT = 1_048_576
Id = Annotated[str, msgspec.Meta(max_length=100)]
ShortText = Annotated[str, msgspec.Meta(max_length=1000)]
# Model names are stored in VARCHAR(255) columns (worker_models, request_models).
ModelName = Annotated[str, msgspec.Meta(max_length=255)]
# A submitted seed is stored as text in a VARCHAR(64): a 64-bit integer or a short string of
# printable ASCII (so "²", which str.isdigit() calls a digit, never reaches int()).
Seed = INT64 | Annotated[str, msgspec.Meta(max_length=64, pattern=r"^[ -~]*$")]
# A username, optionally "name#id" (ASCII digits; see users.user_id_part).
Username = Annotated[str, msgspec.Meta(max_length=200)]


# What a chat payload's fields may hold beyond their types: requests/chat.py refuses anything else
# in words; the schema states the same (extra_json_schema, which decoding does not read).
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
PART_TYPES = ("text", "image_url")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
_IMAGE_URL = {"type": "string", "pattern": "^(data:|https?://)"}
_PARTS = {  # msgspec writes its own `items`: the parts' rule is added beside it
    "allOf": [{"items": {
        "anyOf": [
            {"type": "object", "required": ["type", "text"],
             "properties": {"type": {"const": "text"}, "text": {"type": "string"}}},
            {"type": "object", "required": ["type", "image_url"],
             "properties": {"type": {"const": "image_url"}, "image_url": {"anyOf": [
                 _IMAGE_URL, {"type": "object", "required": ["url"], "properties": {"url": _IMAGE_URL}}]}}},
        ]
    }}]
}  # fmt: skip
ToolChoice = Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(TOOL_CHOICES)})]
_FORMATS = {"required": ["type"], "properties": {"type": {"enum": list(RESPONSE_FORMATS)}}}
ResponseFormat = Annotated[dict[str, Any], msgspec.Meta(extra_json_schema=_FORMATS)]
# What a worker's name may hold once NFKC-normalized (accounts/workers.py); the schema promises the
# normalized form, with at least one character that is not a space.
NAME_CHARACTERS = r"A-Za-z0-9 _.()\[\]'-"
_NAME_PATTERN = f"^[{NAME_CHARACTERS}]*[{NAME_CHARACTERS.replace(' ', '')}][{NAME_CHARACTERS}]*$"


WorkerName = Annotated[
    str, msgspec.Meta(min_length=1, max_length=100, extra_json_schema={"pattern": _NAME_PATTERN})
]


class _In(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class ChatBlock(_In, forbid_unknown_fields=True):
    """A chat worker's declaration in its pop."""

    max_completion_tokens: Positive
    max_context_tokens: Positive
    features: list[Literal["tools", "json_schema", "vision"]] = []
    image_transports: list[Literal["url", "base64"]] = []


# The longest pop wait a body may ask for, and so the most `[pops] wait_max_seconds` may allow.
MAX_POP_WAIT_SECONDS = 60


class PopInput(_In):
    name: Annotated[
        str, msgspec.Meta(min_length=1, max_length=100, extra_json_schema={"pattern": _NAME_PATTERN})
    ]
    models: list[ModelName] = []
    max_length: Annotated[int, msgspec.Meta(ge=16, le=65536)] = 512
    max_context_length: Annotated[int, msgspec.Meta(ge=80, le=MAX_CONTEXT)] = 2048
    threads: Annotated[int, msgspec.Meta(ge=1, le=100)] = 1
    amount: Annotated[int, msgspec.Meta(ge=1, le=20)] = 1
    bridge_agent: ShortText = "unknown:0:unknown"
    nsfw: bool = False
    priority_usernames: list[Username] = []
    softprompts: list[ShortText] = []
    chat: ChatBlock | None = None
    # A long poll: with no job, wait up to this many seconds for one (0: answer at once, as
    # upstream). `[pops] wait_max_seconds` caps it horde-wide.
    wait_seconds: Annotated[int, msgspec.Meta(ge=0, le=MAX_POP_WAIT_SECONDS)] = 0


class KoboldParams(_In):
    """The Kobold params admission reads, bounded to their columns here; admission applies the
    tighter rules (n up to max_n, max_length 16 up to max_length_limit, context at least 80)."""

    n: Int32 = 1
    max_length: Int32 = 80
    max_context_length: Annotated[int, msgspec.Meta(ge=-(2**31), le=MAX_CONTEXT)] = 2048


class ChatMessage(_In):
    role: Annotated[str, msgspec.Meta(extra_json_schema={"enum": list(ROLES)})]
    content: str | Annotated[list[dict[str, Any]], msgspec.Meta(extra_json_schema=_PARTS)] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatOptions(_In, kw_only=True):
    """Sampling, tools and output format: the same fields on the native chat payload and on /v1."""

    temperature: Annotated[float, msgspec.Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, msgspec.Meta(ge=0, le=1)] | None = None
    stop: str | list[str] | None = None
    seed: INT64 | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None


# `[request] max_length_limit`'s default: the most output tokens a request may ask. Admission
# refuses more than the setting; the schema states the default's bound, so that a body it calls
# valid is not refused (a bound in the type would also refuse what a raised setting allows).
DEFAULT_MAX_LENGTH_LIMIT = 16384
MaxTokens = Annotated[int, msgspec.Meta(gt=0, extra_json_schema={"maximum": DEFAULT_MAX_LENGTH_LIMIT})]


class ChatPayload(ChatOptions, kw_only=True):
    """A chat request on the native route (and, converted, from the /v1 front)."""

    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_tokens: MaxTokens | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens > INT32_MAX:  # its column's bound
            raise ValueError(f"max_tokens must be at most {INT32_MAX}")


# A request's webhook: its length is the column's (text_requests.webhook, upstream's). What the
# schema promises is accepted at the default settings: https and a DNS name starting with a letter
# (never an IP literal, which only its address can judge), an optional port and a path of printable
# ASCII; the server's own rule, with its reasons, is webhooks/targets.py's.
WEBHOOK_MAX_LENGTH = 1024
WEBHOOK_PATTERN = r"^https://[A-Za-z][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*(?::[1-9][0-9]{0,3})?(?:/[!-~]*)?$"
WebhookUrl = Annotated[
    str, msgspec.Meta(extra_json_schema={"maxLength": WEBHOOK_MAX_LENGTH, "pattern": WEBHOOK_PATTERN})
]
# Upstream's request fields for features horde_lite does not have: declared so that the value
# clients send by default is accepted and any other is refused by name with its reason
# (requests/upstream_fields.py), and described as accepting only that default.
NullOnly = Annotated[Any, msgspec.Meta(extra_json_schema={"type": "null"})]
NullOrEmptyText = Annotated[
    Any, msgspec.Meta(extra_json_schema={"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 0}]})
]
NullOrEmptyList = Annotated[
    Any, msgspec.Meta(extra_json_schema={"anyOf": [{"type": "null"}, {"type": "array", "maxItems": 0}]})
]


class TextRequestInput(_In, forbid_unknown_fields=True):
    """POST /generate/text/async (upstream's GenerationInputKobold, and a `chat` payload): every
    upstream field is honoured or refused by name, and a field upstream does not have is refused
    as unknown, never dropped."""

    prompt: str = ""
    params: dict[str, Any] = {}
    models: list[ModelName] = []
    workers: list[str] = []
    worker_blacklist: bool | list[str] = []
    trusted_workers: bool = False
    slow_workers: bool = True
    extra_slow_workers: bool = False
    validated_backends: bool = True
    allow_downgrade: bool = False
    dry_run: bool = False
    nsfw: bool = False
    disable_batching: bool = False
    webhook: WebhookUrl | None = None
    proxied_account: NullOrEmptyText = None
    softprompt: NullOnly = None
    style: NullOnly = None
    extra_source_images: NullOrEmptyList = None
    chat: ChatPayload | None = None

    def __post_init__(self) -> None:
        # The params admission stores in columns are bounded where they enter; the others travel
        # to the worker as they are (the body rules keep their integers within 64 bits).
        fields = KoboldParams.__struct_fields__
        known = {k: v for k, v in self.params.items() if k in fields and v is not None}
        try:
            msgspec.convert(known, KoboldParams)
        except msgspec.ValidationError as e:
            raise ValueError(f"params: {e}") from None


class SubmitChat(_In):
    message: dict[str, Any]
    finish_reason: Annotated[str, msgspec.Meta(max_length=64)] = "stop"
    usage: dict[Annotated[str, msgspec.Meta(max_length=64)], Count] = {}


class SubmitUsage(_In, forbid_unknown_fields=True):
    """A legacy job's usage as the worker's model counted it (a horde_lite extension; a chat job's
    travels in `chat.usage`)."""

    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class SubmitInput(_In):
    id: Id
    generation: str = ""
    state: Literal["ok", "censored", "faulted", "csam"] = "ok"
    seed: Seed | None = None
    gen_metadata: list[dict[str, Any]] | None = None
    chat: SubmitChat | None = None
    usage: SubmitUsage | None = None


class ProgressDelta(_In):
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ProgressInput(_In):
    id: Id
    seq: Positive
    delta: ProgressDelta = msgspec.field(default_factory=ProgressDelta)
    completion_tokens: Count | None = None


class WorkerUpdate(_In):
    """PUT /workers/{id} (upstream's ModifyWorkerInput): only the fields sent change."""

    maintenance: bool | None = None
    maintenance_msg: ShortText | None = None
    paused: bool | None = None
    info: Annotated[str, msgspec.Meta(max_length=1000)] | None = None
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None
    team: Annotated[str, msgspec.Meta(max_length=36)] | None = None  # a team's id; "" leaves the team


# A worker message (upstream's bounds): its text, who it says it is from, and its lifetime in hours,
# which is capped at 30 days (a longer one is lowered to it, as upstream writes it).
MESSAGE_MAX_CHARACTERS = 10_240
MESSAGE_MAX_HOURS = 30 * 24
# What accounts/worker_messages.py refuses, stated in the schema: control characters (a message may
# hold line breaks and tabs), and a text of spaces only.
_CONTROLS = r"\x00-\x08\x0b-\x1f\x7f-\x9f"
_ALL_CONTROLS = r"\x00-\x1f\x7f-\x9f"
MESSAGE_PATTERN = f"^[^{_CONTROLS}]*[^\\s{_ALL_CONTROLS}][^{_CONTROLS}]*$"
ORIGIN_PATTERN = f"^[^{_ALL_CONTROLS}]*[^\\s{_ALL_CONTROLS}][^{_ALL_CONTROLS}]*$"


class WorkerMessageInput(_In, forbid_unknown_fields=True):
    """POST /workers/messages (upstream's message input): to one worker, or with no `worker_id` to
    every worker (moderators only); `origin` is a moderator's choice, a user's own id otherwise."""

    message: Annotated[
        str,
        msgspec.Meta(
            min_length=1, max_length=MESSAGE_MAX_CHARACTERS, extra_json_schema={"pattern": MESSAGE_PATTERN}
        ),
    ]
    worker_id: Id | None = None
    origin: (
        Annotated[
            str, msgspec.Meta(min_length=1, max_length=255, extra_json_schema={"pattern": ORIGIN_PATTERN})
        ]
        | None
    ) = None
    expiry: Annotated[
        int, msgspec.Meta(ge=1, le=INT32_MAX, extra_json_schema={"description": "hours; over 720 is 720"})
    ] = 12


# A team's name: the worker name rule (accounts/workers.py clean_name), at least upstream's 3
# characters; the schema promises the normalized form with at least 3 characters that are not spaces.
_TEAM_NAME_CHARACTER = f"[{NAME_CHARACTERS.replace(' ', '')}]"
TeamName = Annotated[
    str,
    msgspec.Meta(
        min_length=3,
        max_length=100,
        extra_json_schema={"pattern": f"^ *{_TEAM_NAME_CHARACTER}(?: *{_TEAM_NAME_CHARACTER}){{2,}} *$"},
    ),
]
TeamInfo = Annotated[str, msgspec.Meta(max_length=1000)]


class CreateTeamInput(_In):
    """POST /teams (upstream's CreateTeamInput)."""

    name: TeamName
    info: TeamInfo | None = None


class ModifyTeamInput(_In):
    """PATCH /teams/{id} (upstream's ModifyTeamInput): only the fields sent change; info "" clears."""

    name: TeamName | None = None
    info: TeamInfo | None = None


# A prompt filter (filters/patterns.py): upstream's types 10..29 (10-19 refuse, 20-29 replace), a
# pattern checked before it is stored, a description shown to the clients it refuses, and upstream's
# 255-character replacement column.
FilterType = Annotated[int, msgspec.Meta(ge=10, le=29)]
FilterPattern = Annotated[str, msgspec.Meta(min_length=1, max_length=2000)]
FilterDescription = Annotated[str, msgspec.Meta(max_length=1000)]
FilterReplacement = Annotated[str, msgspec.Meta(max_length=255)]
# The longest prompt a moderator's check (POST /filters) takes.
MAX_CHECKED_PROMPT = 100_000


class FilterInput(_In, forbid_unknown_fields=True):
    """PUT /filters (upstream's PutNewFilter)."""

    regex: FilterPattern
    filter_type: FilterType
    description: FilterDescription | None = None
    replacement: FilterReplacement = ""


class FilterPatch(_In, forbid_unknown_fields=True):
    """PATCH /filters/{id} (upstream's PatchExistingFilter): only the fields sent change."""

    regex: FilterPattern | None = None
    filter_type: FilterType | None = None
    description: FilterDescription | None = None
    replacement: FilterReplacement | None = None


class FilterCheckInput(_In, forbid_unknown_fields=True):
    """POST /filters: a prompt to check against the filters, of one type when `filter_type` is sent."""

    prompt: Annotated[str, msgspec.Meta(max_length=MAX_CHECKED_PROMPT)]
    filter_type: FilterType | None = None


# A shared key's budget (-1: unlimited) and lifetime in days (-1: never expires), bounded so that
# now + expiry days is a finite float and the budget a finite one.
KeyKudos = Annotated[float, msgspec.Meta(ge=-1, le=1e12)]
KeyExpiry = Annotated[int, msgspec.Meta(ge=-1, le=36_500)]


# A key's or user's scope and limits (accounts/limits.py): model names as workers declare them (no
# surrounding spaces, no control characters), at most as many as a request may name; -1: no limit.
ALLOWED_MODEL_NAME = r"^[^\x00-\x20\x7f](?:[^\x00-\x1f\x7f]*[^\x00-\x20\x7f])?$"
AllowedModels = Annotated[
    list[Annotated[str, msgspec.Meta(min_length=1, max_length=255, pattern=ALLOWED_MODEL_NAME)]],
    msgspec.Meta(max_length=50),
]
Concurrency = Annotated[int, msgspec.Meta(ge=-1, le=500)]  # upstream's bound (0..500) and -1
PerMinute = Annotated[int, msgspec.Meta(ge=-1, le=100_000)]
PerDay = Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)]
# 5000, upstream's default budget; the monthly amount when a key is made with one.
KEY_DEFAULT_KUDOS = 5000


class SharedKeyInput(_In):
    kudos: Annotated[KeyKudos, msgspec.Meta(extra_json_schema={"default": KEY_DEFAULT_KUDOS})] | (
        msgspec.UnsetType
    ) = msgspec.UNSET
    expiry: KeyExpiry = -1  # days; -1 never
    name: Annotated[str, msgspec.Meta(max_length=255)] = ""
    max_text_tokens: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] = -1
    allowed_models: AllowedModels = msgspec.field(default_factory=list)  # [] any
    concurrency: Concurrency = -1
    requests_per_minute: PerMinute = -1
    tokens_per_day: PerDay = -1
    monthly_kudos: KeyKudos = -1  # the budget each UTC calendar month; -1 none


class SharedKeyPatch(_In):
    """PATCH /sharedkeys/{id}: only the fields sent change."""

    kudos: KeyKudos | msgspec.UnsetType = msgspec.UNSET
    expiry: KeyExpiry | msgspec.UnsetType = msgspec.UNSET
    name: Annotated[str, msgspec.Meta(max_length=255)] | msgspec.UnsetType = msgspec.UNSET
    max_text_tokens: Annotated[int, msgspec.Meta(ge=-1, le=INT32_MAX)] | msgspec.UnsetType = msgspec.UNSET
    allowed_models: AllowedModels | msgspec.UnsetType = msgspec.UNSET
    concurrency: Concurrency | msgspec.UnsetType = msgspec.UNSET
    requests_per_minute: PerMinute | msgspec.UnsetType = msgspec.UNSET
    tokens_per_day: PerDay | msgspec.UnsetType = msgspec.UNSET
    monthly_kudos: KeyKudos | msgspec.UnsetType = msgspec.UNSET


# --- users and kudos (PUT /users/{id}, POST /kudos/transfer)

# A kudos amount a moderator or a transfer moves: finite and far inside a float's exact range.
KudosAmount = Annotated[float, msgspec.Meta(ge=-1e9, le=1e9)]


# What a moderator writes about a user (contact, admin_comment): empty clears it.
UserNote = Annotated[str, msgspec.Meta(max_length=500)]
# A field of upstream's ModifyUserInput that horde_lite refuses by name (accounts/profiles.py says
# why): declared so that the refusal can give its reason, and described as accepting no value.
Refused = Annotated[Any, msgspec.Meta(extra_json_schema={"not": {}})]


class UserUpdate(_In, forbid_unknown_fields=True):
    """PUT /users/{id} (upstream's ModifyUserInput): only the fields sent change. The fields typed
    `Refused` are upstream's that horde_lite does not have; each is refused by name with its reason,
    and any other field is refused as unknown, never dropped."""

    kudos: KudosAmount | None = None  # added to the balance (negative: taken), through the ledger
    trusted: bool | None = None
    moderator: bool | None = None
    username: Annotated[str, msgspec.Meta(min_length=1, max_length=100)] | None = None
    contact: UserNote | None = None
    admin_comment: UserNote | None = None
    public_workers: bool | None = None
    worker_invited: Count | None = None
    flagged: bool | None = None  # moderators: the user's workers get no jobs, kudos cannot move
    usage_multiplier: Refused = msgspec.UNSET
    undelete: Refused = msgspec.UNSET
    reset_suspicion: Refused = msgspec.UNSET
    customizer: Refused = msgspec.UNSET
    vpn: Refused = msgspec.UNSET
    special: Refused = msgspec.UNSET
    education: Refused = msgspec.UNSET
    service: Refused = msgspec.UNSET
    filtered: Refused = msgspec.UNSET
    generate_proxy_passkey: Refused = msgspec.UNSET
    # Limits (accounts/limits.py). Upstream's: concurrency (0..500) and monthly_kudos (added to the
    # monthly amount, and given at once when positive); horde_lite's: the others, -1 none.
    concurrency: Annotated[int, msgspec.Meta(ge=0, le=500)] | None = None
    monthly_kudos: Annotated[int, msgspec.Meta(ge=-(10**9), le=10**9)] | None = None
    allowed_models: AllowedModels | None = None
    requests_per_minute: PerMinute | None = None
    tokens_per_day: PerDay | None = None


class UserCreate(_In, forbid_unknown_fields=True):
    """POST /users: a new user, made by a moderator; its key is shown once in the answer."""

    username: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    kudos: Annotated[float, msgspec.Meta(ge=0, le=1e9)] = 0.0  # granted through the ledger
    trusted: bool = False
    moderator: bool = False


class KudosAwardInput(_In):
    """POST /kudos/award (upstream's body and default amount): a moderator gives kudos. The amount
    is not bounded below when decoded, so that zero and negatives get a named refusal."""

    username: Username
    amount: Annotated[float, msgspec.Meta(le=1e9, extra_json_schema={"minimum": 0.01})] = 100


class KudosTransferInput(_In):
    """POST /kudos/transfer: to a user ("name#id") or a shared key; upstream's default amount."""

    username: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    # Not bounded below when decoded: a negative or zero amount gets upstream's named refusal
    # (transfers.py); the schema promises what is accepted, at least a cent.
    amount: Annotated[float, msgspec.Meta(le=1e9, extra_json_schema={"minimum": 0.01})] = 100


# --- registration and invite codes (POST /api/v2/register, POST /api/v2/invites)


class RegisterInput(_In, forbid_unknown_fields=True):
    """POST /api/v2/register: a new user's name (the CLI's rules: accounts/users.checked_username)
    and, when the horde registers by invitation, a moderator's invite code."""

    username: Annotated[str, msgspec.Meta(min_length=1, max_length=100)]
    invite: Annotated[str, msgspec.Meta(max_length=100)] | None = None


class InviteInput(_In, forbid_unknown_fields=True):
    """POST /api/v2/invites: how many registrations the code allows and for how many days (0: it
    never expires)."""

    uses: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1
    days: Annotated[int, msgspec.Meta(ge=0, le=36_500)] = 7


# --- the horde's modes (PUT /api/v2/status/modes)


class HordeModesInput(_In, forbid_unknown_fields=True):
    """PUT /api/v2/status/modes (upstream's fields): each mode sent is switched on or off; one sent
    as null, or not sent, is left as it is."""

    maintenance_mode: bool | None = None
    invite_only_mode: bool | None = None
    raid_mode: bool | None = None


# --- address timeouts (/api/v2/operations/ipaddr, /operations/block_worker_ipaddr/{id}) ------------

IpText = Annotated[str, msgspec.Meta(min_length=1, max_length=LONGEST_ADDRESS)]


class IpTimeoutInput(_In, forbid_unknown_fields=True):
    """POST /api/v2/operations/ipaddr (upstream's `AddTimeoutIPInput`): an address or CIDR and for
    how many hours (upstream's 1 to 720)."""

    ipaddr: IpText
    hours: Annotated[int, msgspec.Meta(ge=1, le=MOST_HOURS)]


class IpTimeoutLift(_In, forbid_unknown_fields=True):
    """DELETE /api/v2/operations/ipaddr (upstream's `DeleteTimeoutIPInput`)."""

    ipaddr: IpText


class WorkerTimeoutInput(_In, forbid_unknown_fields=True):
    """PUT /api/v2/operations/block_worker_ipaddr/{id} (upstream's `AddWorkerTimeout`): days, 1 to 30."""

    days: Annotated[int, msgspec.Meta(ge=1, le=MOST_DAYS)]
