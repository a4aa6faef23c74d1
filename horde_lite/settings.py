"""Typed settings read from `litestar.toml`, overridden by `HORDE_LITE_<TABLE>__<KEY>` variables.

Litestar does not read the file itself: the app factory calls `load_settings()`. msgspec structs
with `forbid_unknown_fields` make an unknown key or a wrong type stop start-up; `SettingsError`
then names where the value came from (the file or the variable), the key and what was expected.
"""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec
import platformdirs
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from horde_lite.db.change_log import CHECK_IN_NOTED_JUMP
from horde_lite.inputs import DEFAULT_MAX_LENGTH_LIMIT, MAX_POP_WAIT_SECONDS
from horde_lite.policies.kinds import CANDIDATES, PolicyKind

ENV_PREFIX = "HORDE_LITE_"
CONFIG_ENV = "HORDE_LITE_CONFIG"
DEFAULT_CONFIG = "litestar.toml"


class _Table(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


def data_dir() -> Path:
    """Where the default SQLite file lives: the user's data directory (on Linux
    `$XDG_DATA_HOME/horde-lite`, else `~/.local/share/horde-lite`), whatever the current directory."""
    return platformdirs.user_data_path("horde-lite")


def default_database_url() -> str:
    return f"sqlite+aiosqlite:///{data_dir() / 'horde_lite.db'}"


# The drivers horde_lite runs on, and what a URL naming another driver of the same database means.
DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}
SCHEMES = {"postgres": "postgresql", "postgresql": "postgresql", "sqlite": "sqlite"}


def masked(url: str) -> str:
    """A database URL fit for a log line or an error: the password replaced by *** and, for SQLite,
    the file's absolute path (a relative one is relative to the current directory)."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url.split("@")[-1]  # not a URL (refused below): never show what precedes '@'
    database = parsed.database or ""
    sqlite_file = parsed.get_backend_name() == "sqlite" and database not in ("", ":memory:")
    if sqlite_file and not database.startswith("file:"):  # a file: URI is shown as written
        parsed = parsed.set(database=os.path.abspath(database))
    return parsed.render_as_string(hide_password=True)


def check_database_url(url: str, key: str = "url") -> None:
    """Refuse a URL horde_lite cannot open (`[database] key`), saying what to write instead."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ValueError(
            f"[database] {key} {masked(url)!r} is not a database URL; write sqlite+aiosqlite:///PATH "
            "or postgresql+asyncpg://USER:PASSWORD@HOST:5432/DATABASE"
        ) from None
    scheme = parsed.drivername.partition("+")[0]
    database = SCHEMES.get(scheme)
    if database is None:
        raise ValueError(
            f"[database] {key} {masked(url)}: horde_lite runs on SQLite (sqlite+aiosqlite:///PATH) "
            "or PostgreSQL (postgresql+asyncpg://USER:PASSWORD@HOST:5432/DATABASE)"
        )
    wanted = DRIVERS[database]
    if parsed.drivername != wanted:
        fixed = parsed.set(drivername=wanted).render_as_string(hide_password=True)
        driver = wanted.partition("+")[2]
        raise ValueError(
            f"[database] {key} {masked(url)}: horde_lite needs the {driver} driver; write {fixed}"
        )


class DatabaseSettings(_Table):
    # A setting or HORDE_LITE_DATABASE__URL wins; the default does not depend on the current directory.
    url: str = msgspec.field(default_factory=default_database_url)
    echo: bool = False
    # No connection pool: each transaction opens its own connection (tests drive one app from two
    # event loops; a pooled asyncpg connection belongs to the loop that opened it).
    null_pool: bool = False
    # The url reaches PostgreSQL through PgBouncer in transaction pooling mode: no statement is
    # kept prepared across transactions and no startup parameter is sent (db/engine.py).
    pgbouncer: bool = False
    # A direct PostgreSQL URL (or a PgBouncer database in session mode) for each process's two
    # long-lived connections: the LISTEN connection, which carries wake-ups between processes, and,
    # with pgbouncer on, the reader of the queue's copy, which transactions wait on. Empty: the
    # url; with pgbouncer on, no process listens (waiters in other processes see changes within
    # chat.poll_seconds) and the copy reads through PgBouncer.
    listen_url: str = ""

    def __post_init__(self) -> None:
        check_database_url(self.url)
        on_sqlite = make_url(self.url).get_backend_name() == "sqlite"
        if self.pgbouncer and on_sqlite:
            raise ValueError("[database] pgbouncer is for a PostgreSQL url; SQLite has no PgBouncer")
        if self.listen_url:
            if on_sqlite:
                raise ValueError("[database] listen_url is for a PostgreSQL url; SQLite has no LISTEN")
            check_database_url(self.listen_url, "listen_url")
            if make_url(self.listen_url).get_backend_name() != "postgresql":
                raise ValueError(
                    f"[database] listen_url {masked(self.listen_url)}: write a PostgreSQL URL "
                    "(postgresql+asyncpg://USER:PASSWORD@HOST:5432/DATABASE)"
                )

    @property
    def reader(self) -> tuple[str, bool]:
        """Where the queue copy's reader connects, and whether through PgBouncer. Behind PgBouncer
        a transaction that waits for the copy holds a server connection meanwhile: with every one
        held so, a reader queued in PgBouncer behind them would never be served."""
        if self.pgbouncer and self.listen_url:
            return self.listen_url, False
        return self.url, self.pgbouncer

    @property
    def listener_url(self) -> str | None:
        """Where this process LISTENs for other processes' wake-ups (None: it does not)."""
        if make_url(self.url).get_backend_name() != "postgresql":
            return None
        if self.listen_url:
            return self.listen_url
        return None if self.pgbouncer else self.url


class LeaseSettings(_Table):
    base_seconds: float = 150
    preparation_allowance_seconds: float = 30
    progress_extension_seconds: float = 30
    max_seconds: float = 900
    sweep_seconds: float = 5

    @property
    def generation_window_seconds(self) -> float:
        return self.base_seconds - self.preparation_allowance_seconds


class SpeedSettings(_Table):
    assumed_tokens_per_second: float = 10
    samples: int = 20


class WorkerSettings(_Table):
    online_seconds: float = 300
    # A request with `slow_workers: false` skips workers slower than this (upstream's text rule).
    slow_tokens_per_second: float = 2.0
    # Live workers one user may hold (counted at the pop that would create one; 0 = no limit):
    # names are free, so without it one user could pass for many.
    max_per_user: int = 3
    # The same for trusted users and moderators.
    max_per_trusted_user: int = 20
    # An owner whose workers fail (fault or lapse) this many real jobs within the window has all
    # its workers put in maintenance for the cool-down (0 = never).
    owner_failure_limit: int = 10
    owner_failure_window_seconds: float = 600
    owner_failure_cooldown_seconds: float = 600

    def __post_init__(self) -> None:
        # The change log notes a check-in that jumps by more than this (a worker coming back): a
        # worker must not go offline sooner.
        if self.online_seconds <= CHECK_IN_NOTED_JUMP:
            raise ValueError(f"[worker] online_seconds must be > {CHECK_IN_NOTED_JUMP:g}")
        if min(self.max_per_user, self.max_per_trusted_user, self.owner_failure_limit) < 0:
            raise ValueError(
                "[worker] max_per_user, max_per_trusted_user and owner_failure_limit must be >= 0 "
                "(0 turns a limit off)"
            )
        if self.owner_failure_window_seconds <= 0 or self.owner_failure_cooldown_seconds < 0:
            raise ValueError(
                "[worker] needs owner_failure_window_seconds > 0 and owner_failure_cooldown_seconds >= 0"
            )


class SharedKeySettings(_Table):
    # Shared keys one user may hold (each has its own budget and is its own rate-limit key; 0 = no
    # limit), and the same for trusted users and moderators.
    max_per_user: int = 10
    max_per_trusted_user: int = 100

    def __post_init__(self) -> None:
        if self.max_per_user < 0 or self.max_per_trusted_user < 0:
            raise ValueError("[sharedkeys] limits must be >= 0 (0 turns a limit off)")


class TeamSettings(_Table):
    # Teams one user may create (only trusted users and moderators can; 0 = no limit): each is a
    # name taken from everyone else.
    max_per_user: int = 3

    def __post_init__(self) -> None:
        if self.max_per_user < 0:
            raise ValueError("[teams] max_per_user must be >= 0 (0 turns the limit off)")


class FilterSettings(_Table):
    """The prompt filters' bounds (horde_lite/filters): what one request's screening may cost."""

    # How often each server process reads the filters again (a process that changed them reads
    # them at once).
    reload_seconds: float = 2.0
    # One filter against one text: the regex library's timeout. It checks its clock now and then,
    # so a match it cuts off may run a few times this long. A match cut off refuses the request.
    match_seconds: float = 0.05
    # Every filter against every text of one request: past it the request is refused.
    admission_seconds: float = 0.5
    # The most filters the horde may hold (each one is matched against every request).
    max_filters: int = 200

    def __post_init__(self) -> None:
        if not 0 < self.reload_seconds <= 3600:
            raise ValueError("[filters] reload_seconds must be > 0 and at most 3600")
        if not 0 < self.match_seconds <= self.admission_seconds <= 60:
            raise ValueError("[filters] need 0 < match_seconds <= admission_seconds <= 60")
        if not 1 <= self.max_filters <= 10_000:
            raise ValueError("[filters] max_filters must be between 1 and 10000")


class MessageSettings(_Table):
    # Unexpired worker messages one user who is not a moderator may have sent (each up to 10240
    # characters, handed to its worker at every pop until it expires; 0 = no limit).
    max_active_per_user: int = 10
    # Days an expired message stays listable (`validity=expired`) before the periodic sweep
    # deletes it; 0 = kept forever.
    keep_expired_days: int = 30

    def __post_init__(self) -> None:
        if not 0 <= self.max_active_per_user <= 1_000_000:
            raise ValueError("[messages] max_active_per_user must be between 0 (no limit) and 1000000")
        if not 0 <= self.keep_expired_days <= 100_000:
            raise ValueError("[messages] keep_expired_days must be between 0 (forever) and 100000")


class LimitSettings(_Table):
    """The limits of a registered user a moderator has not set (accounts/limits.py); -1: none. The
    anonymous user has only what a moderator sets on it: it is everyone without a key."""

    requests_per_minute: int = -1
    tokens_per_day: int = -1
    # The models its requests may name; [] any.
    allowed_models: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        from horde_lite.accounts.limits import MAX_RATE, check_model_list  # it reads no settings

        if not -1 <= self.requests_per_minute <= MAX_RATE or not -1 <= self.tokens_per_day <= 2**31 - 1:
            raise ValueError(
                f"[limits] requests_per_minute (-1..{MAX_RATE}) and tokens_per_day must be >= -1"
            )
        problem = check_model_list(self.allowed_models)
        if problem:
            raise ValueError(f"[limits] allowed_models: {problem}")


class RequestSettings(_Table):
    expiry_seconds: float = 1200
    max_length_limit: int = DEFAULT_MAX_LENGTH_LIMIT
    max_n: int = 20
    # Requests a single requester may have waiting at once (upstream TooManyPrompts).
    max_waiting_per_user: int = 100
    # The anonymous key is shared by everyone who has no account.
    max_waiting_anonymous: int = 2000
    # A request is faulted once more than this many distinct OWNERS' workers failed it.
    max_failures: int = 2
    # A job's output (its streamed progress and its submitted result) holds at most
    # max_length x this many characters, plus a fixed slack (jobs/output_bounds.py).
    output_chars_per_token: int = 16
    # The most worker ids one `workers` or `worker_blacklist` list may name.
    max_worker_list: int = 200

    def __post_init__(self) -> None:
        if not 1 <= self.output_chars_per_token <= 1024:
            raise ValueError("[request] output_chars_per_token must be between 1 and 1024")
        if not 1 <= self.max_worker_list <= 10_000:
            raise ValueError("[request] max_worker_list must be between 1 and 10000")


class ChatSettings(_Table):
    grace_seconds: float = 60
    max_queue_wait_seconds: float = 300
    default_max_tokens: int = 512
    # The slow poll of a waiting /v1 call; changes wake it at once (in process, and via
    # PostgreSQL LISTEN/NOTIFY across processes), so this only bounds what no wake-up reaches.
    poll_seconds: float = 3.0
    # Accepted progress posts of one streaming job: at most progress_burst plus
    # progress_per_second for every second since its pop (jobs/output_bounds.py).
    progress_per_second: float = 10.0
    progress_burst: int = 32

    def __post_init__(self) -> None:
        if self.progress_per_second <= 0 or self.progress_burst < 1:
            raise ValueError("[chat] needs progress_per_second > 0 and progress_burst >= 1")


class AllowanceSettings(_Table):
    ceiling: int = 4096
    floor: int = 512
    wait_full_seconds: float = 60
    wait_floor_seconds: float = 300
    # How far ahead the wait estimate counts competing work: past this wait it stops (the curve is
    # flat there), so creation and status reads cost what the horizon holds, not the whole queue.
    # Never below wait_floor_seconds.
    estimate_horizon_seconds: float = 300

    def __post_init__(self) -> None:
        if not 0 <= self.floor <= self.ceiling:
            raise ValueError("[allowance] needs 0 <= floor <= ceiling")
        if not 0 <= self.wait_full_seconds < self.wait_floor_seconds:
            raise ValueError("[allowance] needs 0 <= wait_full_seconds < wait_floor_seconds")


LARGEST_BILLION = 100_000.0  # no model is larger: a listed size above it is a typo
# Every balance, hold and amount of kudos lies within +-KUDOS_LIMIT (the database checks it too):
# far above any real horde's figures, far below where a float's cents stop being exact.
KUDOS_LIMIT = 1e12


class KudosSettings(_Table):
    anonymous_floor: float = -50
    registered_floor: float = 25
    # The largest size (billions) a number in a model's name may claim ("x-99999B" is sized at
    # this); a model meant to be priced higher is listed by the operator.
    name_size_limit_billion: float = 13
    # A model reference file in the AI Horde's text format ("" for none); [kudos.models] wins.
    model_reference: str = ""
    # Parameter counts by model name, editable by the operator (`[kudos.models]` in litestar.toml).
    models: dict[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        for floor in ("anonymous_floor", "registered_floor"):
            if not -KUDOS_LIMIT <= getattr(self, floor) <= KUDOS_LIMIT:
                raise ValueError(f"[kudos] {floor} must be between -{KUDOS_LIMIT:g} and {KUDOS_LIMIT:g}")
        if not 0 < self.name_size_limit_billion <= LARGEST_BILLION:
            raise ValueError(f"[kudos] name_size_limit_billion must be > 0 and <= {LARGEST_BILLION:g}")
        for name, billions in self.models.items():
            if not 0 < billions <= LARGEST_BILLION:
                raise ValueError(f"[kudos] models: {name!r} must be > 0 and <= {LARGEST_BILLION:g}")


class PoliciesSettings(_Table):
    speed_gate: str = "prefer_capable"
    allowance_curve: str = "estimated_wait"
    shadow_metrics: str = "over_capacity"
    # A candidate judged in shadow beside the policy in force, never applied ("": none); written
    # like the policy in force, `[policies.candidate_speed_gate]` with its `name` and `options`.
    candidate_speed_gate: str = ""
    candidate_allowance_curve: str = ""
    # Options per policy kind and candidate, gathered from `[policies.<kind>.options]` (_read_toml).
    options: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # How often each server process reads policy_state for a switch, and the live address timeouts.
    reload_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.reload_seconds <= 0:
            raise ValueError("[policies] reload_seconds must be > 0")


class HttpSettings(_Table):
    # Origins a browser may call the API from (CORS); ["*"] is any origin, as upstream; [] turns CORS off.
    cors_origins: list[str] = msgspec.field(default_factory=lambda: ["*"])
    # GET /operator/policies and /operator/decisions, and the dashboard, without a moderator's key (a
    # horde on a private network).
    open_operator_pages: bool = False


RATE_STORES = ("auto", "memory", "database")
REDIS_SCHEMES = ("redis", "rediss")


class RateLimitSettings(_Table):
    # Calls per minute per (API key, client address) pair; 0 = no limit.
    create_per_minute: int = 60
    status_per_minute: int = 600
    # Registrations (the API's and the page's, refused ones too) per client address per hour.
    register_per_hour: int = 10
    # Where the calls are counted: "memory" (each server process on its own), "database" (the
    # horde's database, shared by every process and host), a redis:// or rediss:// URL (shared),
    # or "auto": "database" on PostgreSQL, "memory" on SQLite.
    store: str = "auto"
    # The prefix of the limits' keys in Redis: hordes sharing one Redis server need different ones.
    redis_namespace: str = "horde_lite"

    def __post_init__(self) -> None:
        if min(self.create_per_minute, self.status_per_minute, self.register_per_hour) < 0:
            raise ValueError("[ratelimit] limits must be >= 0 (0 turns a limit off)")
        if self.store not in RATE_STORES:
            check_redis_url(self.store)
        if not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", self.redis_namespace):
            raise ValueError("[ratelimit] redis_namespace must be 1 to 64 letters, digits or _ . : -")

    @property
    def redis_url(self) -> str | None:
        return self.store if self.store not in RATE_STORES else None


def check_redis_url(url: str) -> None:
    """Refuse a `[ratelimit] store` that is neither a known store nor a Redis URL (the URL's
    password is never repeated), or a Redis URL without the redis package."""
    scheme, sep, rest = url.partition("://")
    if scheme not in REDIS_SCHEMES or not sep or not rest.rpartition("@")[2].strip("/"):
        shown = f"{scheme}://..." if sep else url[:40]  # never the rest of a URL: it may hold a password
        raise ValueError(
            f"[ratelimit] store must be one of {', '.join(RATE_STORES)} or a redis:// or rediss:// URL "
            f"(redis://HOST:6379/0), not {shown!r}"
        )
    if importlib.util.find_spec("redis") is None:
        raise ValueError("[ratelimit] store is a Redis URL but the redis package is missing: "
                         "pip install 'horde-lite[redis]'")  # fmt: skip


class AccountsSettings(_Table):
    # Who may create an account through POST /api/v2/register and the /register page: nobody
    # ("closed": the CLI only), holders of a moderator's invite code ("invite"), anyone ("open").
    registration: Literal["closed", "invite", "open"] = "closed"


class ModerationSettings(_Table):
    # Users who may switch the horde's maintenance mode through the API and the dashboard, as
    # `name#id` (upstream's ADMINS); the operator's `horde-lite modes set` always may.
    admins: list[str] = msgspec.field(default_factory=list)

    def __post_init__(self) -> None:
        for admin in self.admins:
            if not re.fullmatch(r".+#[0-9]+", admin):
                raise ValueError(f"[moderation] admins: {admin!r} is not a user's name#id (e.g. alice#1)")


class UsageSettings(_Table):
    # Days of usage history kept (operators/usage.py), trimmed by the periodic sweep; 0 = forever.
    keep_days: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.keep_days <= 100_000:
            raise ValueError("[usage] keep_days must be between 0 (forever) and 100000")


class WebhookSettings(_Table):
    """Webhooks of text requests (horde_lite/webhooks): where they may point and how they are sent."""

    # Deliver to loopback, private, link-local and other non-public addresses too (receivers on
    # the horde's own network); off, a webhook reaches only public addresses.
    allow_private: bool = False
    # Accept http:// URLs as well as https:// (upstream accepts only https).
    allow_http: bool = False
    # One attempt's limit, name resolution, connection and answer included.
    timeout_seconds: float = 3.0
    # Attempts per generation, and the wait before the second (doubled before each later one).
    attempts: int = 3
    retry_seconds: float = 1.0
    # Deliveries waiting in each server process; one more is dropped (and counted).
    queue_size: int = 256
    # Deliveries under way at once in each server process.
    senders: int = 4

    def __post_init__(self) -> None:
        if not 0 < self.timeout_seconds <= 60 or not 0 <= self.retry_seconds <= 600:
            raise ValueError("[webhooks] needs 0 < timeout_seconds <= 60 and 0 <= retry_seconds <= 600")
        if not 1 <= self.attempts <= 10:
            raise ValueError("[webhooks] attempts must be between 1 and 10")
        if not 1 <= self.queue_size <= 100_000 or not 1 <= self.senders <= 64:
            raise ValueError("[webhooks] needs queue_size between 1 and 100000 and senders between 1 and 64")


class PopSettings(_Table):
    """Waiting pops: a pop that finds no job may wait for one (docs/reference/horde_api.md)."""

    # The longest a pop waits for a job, whatever its `wait_seconds` asks; 0 turns waiting off.
    wait_max_seconds: int = 20
    # How often a process with waiting pops checks the database for new jobs where no
    # cross-process channel tells it (SQLite shared by processes, PostgreSQL's listener down).
    wait_poll_seconds: float = 1.0
    # How long a process answers a known worker's idle poll again from memory while no wake-up
    # says a job may have come (jobs/idle_answers.py); 0: every poll reads the database.
    idle_answer_seconds: float = 10.0

    def __post_init__(self) -> None:
        if not 0 <= self.wait_max_seconds <= MAX_POP_WAIT_SECONDS:
            raise ValueError(f"[pops] wait_max_seconds must be between 0 (off) and {MAX_POP_WAIT_SECONDS}")
        if not 0.05 <= self.wait_poll_seconds <= 60:
            raise ValueError("[pops] wait_poll_seconds must be between 0.05 and 60")
        if not 0 <= self.idle_answer_seconds <= 60:
            raise ValueError("[pops] idle_answer_seconds must be between 0 (off) and 60")


class Settings(_Table):
    database: DatabaseSettings = msgspec.field(default_factory=DatabaseSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)
    ratelimit: RateLimitSettings = msgspec.field(default_factory=RateLimitSettings)
    accounts: AccountsSettings = msgspec.field(default_factory=AccountsSettings)
    lease: LeaseSettings = msgspec.field(default_factory=LeaseSettings)
    speed: SpeedSettings = msgspec.field(default_factory=SpeedSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    request: RequestSettings = msgspec.field(default_factory=RequestSettings)
    sharedkeys: SharedKeySettings = msgspec.field(default_factory=SharedKeySettings)
    teams: TeamSettings = msgspec.field(default_factory=TeamSettings)
    messages: MessageSettings = msgspec.field(default_factory=MessageSettings)
    limits: LimitSettings = msgspec.field(default_factory=LimitSettings)
    filters: FilterSettings = msgspec.field(default_factory=FilterSettings)
    chat: ChatSettings = msgspec.field(default_factory=ChatSettings)
    allowance: AllowanceSettings = msgspec.field(default_factory=AllowanceSettings)
    kudos: KudosSettings = msgspec.field(default_factory=KudosSettings)
    policies: PoliciesSettings = msgspec.field(default_factory=PoliciesSettings)
    usage: UsageSettings = msgspec.field(default_factory=UsageSettings)
    moderation: ModerationSettings = msgspec.field(default_factory=ModerationSettings)
    webhooks: WebhookSettings = msgspec.field(default_factory=WebhookSettings)
    pops: PopSettings = msgspec.field(default_factory=PopSettings)


class SettingsError(Exception):
    """Raised at start-up for a bad settings file or variable; the message names the key."""


# The [policies] keys written as a table of their own: `name` and `options`.
POLICY_TABLES: tuple[str, ...] = (*(kind.value for kind in PolicyKind), *CANDIDATES)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from e
    policies = raw.get("policies")
    if isinstance(policies, dict):
        raw["policies"] = _gather_policy_tables(policies, path)
    return raw


def _gather_policy_tables(policies: dict[str, Any], path: Path) -> dict[str, Any]:
    """`[policies.speed_gate]` (or `.candidate_speed_gate`) is written as a table with `name` and
    `options`: its name becomes the flat key and its options go into `options`, so the struct stays
    flat. Options under the former `[policies.options.<key>]` are still read (start-up warns:
    `former_policy_options`); the same key in both places is refused rather than one silently won."""
    policies = dict(policies)
    options = dict(policies.get("options", {}))
    for key in POLICY_TABLES:  # plain str keys: msgspec refuses a subclass
        value = policies.get(key)
        if not isinstance(value, dict):
            continue
        extra = sorted(set(value) - {"name", "options"})
        if extra:
            raise SettingsError(
                f"{path}: unknown key(s) {', '.join(extra)} in [policies.{key}] "
                f"(expected `name` and [policies.{key}.options])"
            )
        name = value.get("name")
        if name is not None:
            policies[key] = name
        else:
            policies.pop(key)
        if "options" in value:
            if key in options:
                raise SettingsError(
                    f"{path}: options for {key} in both [policies.{key}.options] and "
                    f"[policies.options.{key}]; keep [policies.{key}.options] only"
                )
            options[key] = value["options"]
    policies["options"] = options
    return policies


def former_policy_options(path: str | Path | None = None, environ: dict[str, str] | None = None) -> list[str]:
    """A warning for each `[policies.options.<key>]` table in the settings file: the former place of
    a policy's options, still read; each names the table to move it to."""
    config_path = Path(path) if path is not None else settings_file(environ)[0]
    try:
        raw = tomllib.loads(config_path.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return []  # no file, or load_settings has already said what is wrong with it
    policies = raw.get("policies")
    former = policies.get("options") if isinstance(policies, dict) else None
    if not isinstance(former, dict):
        return []
    return [
        f"{config_path.absolute()}: [policies.options.{key}] is the former place of these options; they are "
        f"read, but move them to [policies.{key}.options] (docs/reference/policies.md)"
        for key in former
    ]


Overrides = dict[str, dict[str, tuple[str, str]]]  # table -> field -> (variable name, raw value)


def _env_overrides(environ: dict[str, str]) -> Overrides:
    out: Overrides = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        table, _, field = key[len(ENV_PREFIX) :].lower().partition("__")
        out.setdefault(table, {})[field] = (key, value)
    return out


def _field_names(table_type: Any) -> list[str]:
    return [f.name for f in msgspec.structs.fields(table_type)]


def _tables() -> dict[str, Any]:
    return {f.name: f.type for f in msgspec.structs.fields(Settings)}


def _coerce_env(table_type: type[_Table], table: str, field: str, variable: str, value: str) -> Any:
    """Environment values are strings: decode them as the field's type (TOML syntax)."""
    fields = {f.name: f for f in msgspec.structs.fields(table_type)}
    if field not in fields:
        raise SettingsError(f"{variable}: [{table}] has no key {field!r} (its keys: {', '.join(fields)})")
    if fields[field].type is str or fields[field].type == "str":
        return value
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


# msgspec's type names as an operator reads them.
_TYPES = {"float": "a number", "int": "a whole number", "bool": "true or false", "str": "a string",
          "array": "a list", "object": "a table", "null": "nothing"}  # fmt: skip
_ERROR = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<at>[^`]*)`)?$", re.S)


def _explain(error: msgspec.ValidationError, file: str | None, env: Overrides) -> str:
    """One line naming the source (file or variable), the key and what is wrong."""
    match = _ERROR.match(str(error))
    assert match is not None  # the pattern matches any text
    what, at = match["what"], [p for p in (match["at"] or "").split(".") if p]
    table = at[0] if at else None
    key = at[1].partition("[")[0] if len(at) > 1 else None
    unknown = re.match(r"Object contains unknown field `(.+)`", what)
    if unknown:  # the unknown key is named in the message, its table in the path
        key, table = (unknown[1], table) if table else (None, unknown[1])
    origin = env.get(table or "", {}).get(key or "")
    source = f"{origin[0]}={origin[1]!r}" if origin else (file or "the defaults")
    if table and key is None and not unknown:  # a rule over a table: blame the keys it names
        fields = _field_names(_tables()[table])
        mentioned = [f for f in fields if re.search(rf"\b{f}\b", what)] or fields
        from_env = [env[table][f][0] for f in mentioned if f in env.get(table, {})]
        from_file = [file] if file and len(from_env) < len(mentioned) else []
        source = " and ".join([*from_env, *from_file]) or source
    if unknown and key is None:
        return f"{source}: unknown table [{table}] (the tables: {', '.join(_field_names(Settings))})"
    if unknown:
        known = _field_names(_tables()[table])
        return f"{source}: unknown key {key!r} in [{table}] (its keys: {', '.join(known)})"
    typed = re.match(r"Expected `(\w+)[^`]*`, got `(\w+)`", what)
    if typed:
        what = f"expected {_TYPES.get(typed[1], typed[1])}, got {_TYPES.get(typed[2], typed[2])}"
    place = f"[{table}] {key}" if key else f"[{table}]" if table else ""
    if place and what.startswith(f"[{table}]"):
        place = ""  # the rule's message names its table already
    return f"{source}: {place + ': ' if place else ''}{what}"


def settings_file(environ: dict[str, str] | None = None) -> tuple[Path, bool]:
    """The settings file to read and whether it was named explicitly (HORDE_LITE_CONFIG)."""
    environ = os.environ if environ is None else environ
    return Path(environ.get(CONFIG_ENV, DEFAULT_CONFIG)), CONFIG_ENV in environ


def load_settings(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Read the toml file (if any), apply environment overrides and validate everything."""
    environ = dict(os.environ if environ is None else environ)
    config_path, explicit = (Path(path), True) if path is not None else settings_file(environ)
    config_path = config_path.absolute()  # messages name the file whatever the current directory
    data: dict[str, Any] = {}
    if config_path.exists():
        data = _read_toml(config_path)
    elif explicit:
        hint = f" ({CONFIG_ENV} names it)" if path is None else ""
        raise SettingsError(f"settings file {config_path} does not exist{hint}")
    table_types = _tables()
    env = _env_overrides(environ)
    for table, fields in env.items():
        if table not in table_types:
            variable = next(iter(fields.values()))[0]
            raise SettingsError(
                f"{variable}: unknown settings table [{table}] (the tables: {', '.join(table_types)})"
            )
        section = data.setdefault(table, {})
        if not isinstance(section, dict):
            raise SettingsError(f"{config_path}: {table} must be a table ([{table}])")
        for field, (variable, value) in fields.items():
            section[field] = _coerce_env(table_types[table], table, field, variable, value)
    try:
        return msgspec.convert(data, Settings, strict=False)
    except msgspec.ValidationError as e:
        raise SettingsError(_explain(e, str(config_path) if config_path.exists() else None, env)) from e
