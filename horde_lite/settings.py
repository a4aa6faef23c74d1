"""Typed settings read from `litestar.toml`, overridden by `HORDE_LITE_<TABLE>__<KEY>` variables.

Litestar does not read the file itself: the app factory calls `load_settings()`. msgspec structs
with `forbid_unknown_fields` make an unknown key or a wrong type stop start-up with a message that
names the exact key.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import msgspec

ENV_PREFIX = "HORDE_LITE_"
CONFIG_ENV = "HORDE_LITE_CONFIG"
DEFAULT_CONFIG = "litestar.toml"


class _Table(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    pass


class DatabaseSettings(_Table):
    url: str = "sqlite+aiosqlite:///horde_lite.db"
    echo: bool = False
    # No connection pool: each transaction opens its own connection (tests drive one app from two
    # event loops; a pooled asyncpg connection belongs to the loop that opened it).
    null_pool: bool = False


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


class RequestSettings(_Table):
    expiry_seconds: float = 1200
    max_length_limit: int = 16384
    max_n: int = 20
    # Requests a single requester may have waiting at once (upstream TooManyPrompts).
    max_waiting_per_user: int = 100
    # The anonymous key is shared by everyone who has no account.
    max_waiting_anonymous: int = 2000
    # Most requests' failures tolerated before the request is faulted.
    max_failures: int = 2


class ChatSettings(_Table):
    grace_seconds: float = 60
    max_queue_wait_seconds: float = 300
    default_max_tokens: int = 512
    # The slow poll of a waiting /v1 call; changes wake it at once (in process, and via
    # PostgreSQL LISTEN/NOTIFY across processes), so this only bounds what no wake-up reaches.
    poll_seconds: float = 3.0


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


class KudosSettings(_Table):
    anonymous_floor: float = -50
    registered_floor: float = 25
    # Parameter count (billions) used when a model is neither listed nor named like "...-12B-...".
    default_parameters_billion: float = 7
    # Parameter counts by model name, editable by the operator (`[kudos.models]` in litestar.toml).
    models: dict[str, float] = msgspec.field(default_factory=dict)


class PoliciesSettings(_Table):
    speed_gate: str = "prefer_capable"
    allowance_curve: str = "estimated_wait"
    shadow_metrics: str = "over_capacity"
    # A candidate judged in shadow beside the policy in force, never applied ("": none); its
    # options go under [policies.options.candidate_speed_gate] etc. (docs/reference/policies.md).
    candidate_speed_gate: str = ""
    candidate_allowance_curve: str = ""
    # Options per policy kind: `[policies.speed_gate.options]` etc.
    options: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    # How often each server process reads policy_state for a switch (decision 0028).
    reload_seconds: float = 2.0

    def __post_init__(self) -> None:
        if self.reload_seconds <= 0:
            raise ValueError("[policies] reload_seconds must be > 0")


class HttpSettings(_Table):
    # Origins a browser may call the API from (CORS); ["*"] is any origin, as upstream; [] turns CORS off.
    cors_origins: list[str] = msgspec.field(default_factory=lambda: ["*"])
    # GET /operator/policies without a moderator's key (a horde on a private network).
    open_operator_pages: bool = False


class RateLimitSettings(_Table):
    # Calls per minute per (API key, client address) pair, counted per server process; 0 = no limit.
    create_per_minute: int = 60
    status_per_minute: int = 600

    def __post_init__(self) -> None:
        if self.create_per_minute < 0 or self.status_per_minute < 0:
            raise ValueError("[ratelimit] limits must be >= 0 (0 turns a limit off)")


class Settings(_Table):
    database: DatabaseSettings = msgspec.field(default_factory=DatabaseSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)
    ratelimit: RateLimitSettings = msgspec.field(default_factory=RateLimitSettings)
    lease: LeaseSettings = msgspec.field(default_factory=LeaseSettings)
    speed: SpeedSettings = msgspec.field(default_factory=SpeedSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    request: RequestSettings = msgspec.field(default_factory=RequestSettings)
    chat: ChatSettings = msgspec.field(default_factory=ChatSettings)
    allowance: AllowanceSettings = msgspec.field(default_factory=AllowanceSettings)
    kudos: KudosSettings = msgspec.field(default_factory=KudosSettings)
    policies: PoliciesSettings = msgspec.field(default_factory=PoliciesSettings)


class SettingsError(Exception):
    """Raised at start-up for a bad settings file or variable; the message names the key."""


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SettingsError(f"{path}: not valid TOML: {e}") from e
    # `[policies.speed_gate.options]` is written nested under the kind; gather those tables into
    # `options` so the struct stays flat.
    policies = raw.get("policies")
    if isinstance(policies, dict):
        options = dict(policies.get("options", {}))
        for kind in ("speed_gate", "allowance_curve", "shadow_metrics"):
            value = policies.get(kind)
            if isinstance(value, dict):
                extra = sorted(set(value) - {"name", "options"})
                if extra:
                    raise SettingsError(
                        f"{path}: unknown key(s) {', '.join(extra)} in [policies.{kind}] "
                        f"(expected `name` and [policies.{kind}.options])"
                    )
                name = value.get("name")
                if name is not None:
                    policies[kind] = name
                else:
                    policies.pop(kind)
                if "options" in value:
                    options[kind] = value["options"]
        policies["options"] = options
    return raw


def _env_overrides(environ: dict[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        table, _, field = key[len(ENV_PREFIX) :].lower().partition("__")
        out.setdefault(table, {})[field] = value
    return out


def _coerce_env(table_type: type[_Table], table: str, field: str, value: str) -> Any:
    """Environment values are strings: decode them as the field's type (TOML syntax)."""
    fields = {f.name: f for f in msgspec.structs.fields(table_type)}
    if field not in fields:
        raise SettingsError(
            f"{ENV_PREFIX}{table.upper()}__{field.upper()}: unknown setting [{table}] {field}"
        )
    if fields[field].type is str or fields[field].type == "str":
        return value
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def load_settings(path: str | Path | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Read the toml file (if any), apply environment overrides and validate everything."""
    environ = dict(os.environ if environ is None else environ)
    explicit = path is not None or CONFIG_ENV in environ
    config_path = Path(path if path is not None else environ.get(CONFIG_ENV, DEFAULT_CONFIG))
    data: dict[str, Any] = {}
    if config_path.exists():
        data = _read_toml(config_path)
    elif explicit:
        raise SettingsError(f"settings file {config_path} does not exist")
    table_types = {f.name: f.type for f in msgspec.structs.fields(Settings)}
    for table, fields in _env_overrides(environ).items():
        if table not in table_types:
            raise SettingsError(f"{ENV_PREFIX}{table.upper()}__...: unknown settings table [{table}]")
        section = data.setdefault(table, {})
        for field, value in fields.items():
            section[field] = _coerce_env(table_types[table], table, field, value)
    try:
        return msgspec.convert(data, Settings, strict=False)
    except msgspec.ValidationError as e:
        raise SettingsError(f"{config_path}: {e}") from e
