"""Settings: litestar.toml tables and defaults (docs/reference/operators.md, "Settings"), environment
overrides, HORDE_LITE_CONFIG, and errors that name the offending key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from horde_lite.policies.registry import PolicyError, load_policies
from horde_lite.settings import (
    POLICY_TABLES,
    Settings,
    SettingsError,
    default_database_url,
    former_policy_options,
    load_settings,
)

ROOT = Path(__file__).resolve().parents[2]

# docs/reference/operators.md's settings tables, key by key.
CONTRACT: dict[str, dict[str, object]] = {
    "database": {"url": default_database_url()},
    "lease": {
        "base_seconds": 150,
        "preparation_allowance_seconds": 30,
        "progress_extension_seconds": 30,
        "max_seconds": 900,
        "sweep_seconds": 5,
    },
    "speed": {"assumed_tokens_per_second": 10, "samples": 20},
    "ratelimit": {
        "create_per_minute": 60,
        "status_per_minute": 600,
        "register_per_hour": 10,
        "store": "auto",
        "redis_namespace": "horde_lite",
    },
    "accounts": {"registration": "closed"},
    "pops": {"wait_max_seconds": 20, "idle_answer_seconds": 10},
    "worker": {"online_seconds": 300},
    "request": {"expiry_seconds": 1200, "max_length_limit": 16384},
    "chat": {"grace_seconds": 60, "max_queue_wait_seconds": 300, "default_max_tokens": 512},
    "allowance": {"ceiling": 4096, "floor": 512, "wait_full_seconds": 60, "wait_floor_seconds": 300},
    "webhooks": {
        "allow_private": False,
        "allow_http": False,
        "timeout_seconds": 3,
        "attempts": 3,
        "retry_seconds": 1,
        "queue_size": 256,
        "senders": 4,
    },
    "policies": {
        "speed_gate": "prefer_capable",
        "allowance_curve": "estimated_wait",
        "shadow_metrics": "over_capacity",
    },
}


def _write(tmp_path: Path, text: str, name: str = "litestar.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run from an empty directory, so no ./litestar.toml is read by accident."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(("table", "key"), [(t, k) for t, keys in CONTRACT.items() for k in keys])
def test_defaults_match_the_contract(elsewhere: Path, table: str, key: str) -> None:
    settings = load_settings(environ={})
    assert getattr(getattr(settings, table), key) == CONTRACT[table][key]


def test_repo_litestar_toml_loads_to_the_defaults() -> None:
    from_file = load_settings(ROOT / "litestar.toml", environ={})
    assert from_file == Settings()


def test_repo_litestar_toml_lists_every_table_and_key() -> None:
    """Every key settings.py knows is shown in litestar.toml (the file says so at its top); the
    policies and candidates as tables of the same shape, `name` and, commented, `options`."""
    import tomllib

    text = (ROOT / "litestar.toml").read_text()
    raw = tomllib.loads(text)
    for field in msgspec.structs.fields(Settings):
        assert field.name in raw, f"[{field.name}] missing from litestar.toml"
        table = getattr(Settings(), field.name)
        for sub in msgspec.structs.fields(table):
            if field.name == "policies" and sub.name in POLICY_TABLES:
                assert raw["policies"][sub.name]["name"] == getattr(table, sub.name), sub.name
                assert f"[policies.{sub.name}.options]" in text, f"[policies.{sub.name}.options] not shown"
                continue
            # Gathered from the [policies.<key>.options] tables checked above.
            if (field.name, sub.name) == ("policies", "options"):
                continue
            # [database] url is shown commented out: its default is computed (the user's data directory)
            shown = sub.name in raw[field.name] or (
                (field.name, sub.name) == ("database", "url") and "# url = " in text
            )
            assert shown, f"[{field.name}] {sub.name} missing from litestar.toml"


def test_every_policy_and_candidate_key_is_a_table_in_litestar_toml() -> None:
    fields = {f.name for f in msgspec.structs.fields(Settings().policies)}
    assert set(POLICY_TABLES) == fields - {"options", "reload_seconds"}


def test_a_candidate_is_written_like_the_policy_in_force(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[policies.candidate_allowance_curve]\nname = "horde_queue"\n'
        "[policies.candidate_allowance_curve.options]\nmaximum = 400\n"
        '[policies.candidate_speed_gate]\nname = "enforce_all"\n',
    )
    settings = load_settings(path, environ={})
    assert settings.policies.candidate_allowance_curve == "horde_queue"
    assert settings.policies.candidate_speed_gate == "enforce_all"
    assert settings.policies.options == {"candidate_allowance_curve": {"maximum": 400}}
    policies = load_policies(settings.policies)
    assert policies.candidate_allowance_curve.maximum == 400  # type: ignore[union-attr]
    assert former_policy_options(path) == []


def test_a_candidate_option_of_the_wrong_type_names_its_table(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[policies.candidate_allowance_curve]\nname = "horde_queue"\n'
        '[policies.candidate_allowance_curve.options]\nmaximum = "many"\n',
    )
    with pytest.raises(
        PolicyError, match=r"\[policies\.candidate_allowance_curve\.options\] for 'horde_queue'"
    ):
        load_policies(load_settings(path, environ={}).policies)


def test_options_in_the_former_table_are_read_and_named_for_moving(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[policies]\ncandidate_allowance_curve = "horde_queue"\n'
        "[policies.options.candidate_allowance_curve]\nmaximum = 300\n",
    )
    policies = load_policies(load_settings(path, environ={}).policies)
    assert policies.candidate_allowance_curve.maximum == 300  # type: ignore[union-attr]
    [warning] = former_policy_options(path)
    assert str(path) in warning
    assert "[policies.options.candidate_allowance_curve] is the former place" in warning
    assert "move them to [policies.candidate_allowance_curve.options]" in warning


def test_options_in_both_tables_are_refused_naming_both(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        "[policies.options.candidate_allowance_curve]\nmaximum = 300\n"
        '[policies.candidate_allowance_curve]\nname = "horde_queue"\n'
        "[policies.candidate_allowance_curve.options]\nmaximum = 400\n",
    )
    with pytest.raises(SettingsError) as refused:
        load_settings(path, environ={})
    message = str(refused.value)
    assert "[policies.candidate_allowance_curve.options]" in message
    assert "[policies.options.candidate_allowance_curve]" in message
    assert str(path) in message


def test_no_file_means_defaults(elsewhere: Path) -> None:
    assert load_settings(environ={}) == Settings()


def test_file_values_are_read(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[database]\nurl = "sqlite+aiosqlite:///other.db"\n[lease]\nbase_seconds = 200\n'
        '[kudos.models]\n"house-model" = 13\n',
    )
    settings = load_settings(path, environ={})
    assert settings.database.url == "sqlite+aiosqlite:///other.db"
    assert settings.lease.base_seconds == 200
    assert settings.lease.generation_window_seconds == 170
    assert settings.kudos.models == {"house-model": 13}
    assert settings.chat.grace_seconds == 60  # untouched tables keep their defaults


def test_cwd_litestar_toml_is_the_default_file(elsewhere: Path) -> None:
    _write(elsewhere, "[worker]\nonline_seconds = 60\n")
    assert load_settings(environ={}).worker.online_seconds == 60


def test_env_overrides_file_and_is_typed(elsewhere: Path) -> None:
    path = _write(elsewhere, "[lease]\nbase_seconds = 200\n")
    settings = load_settings(
        path,
        environ={
            "HORDE_LITE_DATABASE__URL": "postgresql+asyncpg://u:p@db/horde",
            "HORDE_LITE_LEASE__BASE_SECONDS": "180",
            "HORDE_LITE_CHAT__GRACE_SECONDS": "2.5",
            "HORDE_LITE_DATABASE__ECHO": "true",
            "HORDE_LITE_SPEED__SAMPLES": "5",
            "HORDE_LITE_POLICIES__SPEED_GATE": "off",
            "HORDE_LITE_KUDOS__MODELS": '{ "m" = 3 }',
            # Variables without a table separator are not settings (test harness, HORDE_LITE_CONFIG).
            "HORDE_LITE_TEST_PG_DB": "whatever",
        },
    )
    assert settings.database.url == "postgresql+asyncpg://u:p@db/horde"
    assert settings.lease.base_seconds == 180
    assert settings.chat.grace_seconds == 2.5
    assert settings.database.echo is True
    assert settings.speed.samples == 5
    assert settings.policies.speed_gate == "off"
    assert settings.kudos.models == {"m": 3}


def test_string_settings_take_env_values_verbatim(elsewhere: Path) -> None:
    # A URL or a policy name that happens to look like TOML stays a string.
    settings = load_settings(environ={"HORDE_LITE_POLICIES__SPEED_GATE": "true"})
    assert settings.policies.speed_gate == "true"


def test_horde_lite_config_names_the_file(elsewhere: Path) -> None:
    other = _write(elsewhere, "[request]\nexpiry_seconds = 60\n", name="other.toml")
    _write(elsewhere, "[request]\nexpiry_seconds = 999\n")
    settings = load_settings(environ={"HORDE_LITE_CONFIG": str(other)})
    assert settings.request.expiry_seconds == 60


def test_missing_named_file_is_an_error(elsewhere: Path) -> None:
    with pytest.raises(SettingsError, match=r"nope\.toml"):
        load_settings(environ={"HORDE_LITE_CONFIG": str(elsewhere / "nope.toml")})
    with pytest.raises(SettingsError, match=r"nope\.toml"):
        load_settings(elsewhere / "nope.toml", environ={})


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[lease]\nbase_secs = 10\n", "base_secs"),
        ("[leases]\nbase_seconds = 10\n", "leases"),
        ('[lease]\nbase_seconds = "soon"\n', "[lease] base_seconds"),
        ("[speed]\nsamples = 2.5\n", "[speed] samples"),
        ("[database]\nurl = 5\n", "[database] url"),
        ("[request]\nmax_length_limit = [1]\n", "[request] max_length_limit"),
        ("[policies]\nspeed_gate = 3\n", "[policies] speed_gate"),
        ('[kudos.models]\nm = "big"\n', "[kudos] models"),
        ('[policies.speed_gate]\nnme = "off"\n', "nme"),
        ("[lease\n", "not valid TOML"),
        ('[accounts]\nregistration = "anyone"\n', "[accounts] registration"),
        ("[ratelimit]\nregister_per_hour = -1\n", "[ratelimit] limits must be >= 0"),
        ('[ratelimit]\nstore = "postgres"\n', "[ratelimit] store must be one of"),
        ('[ratelimit]\nstore = "http://user:secret@cache:6379"\n', "[ratelimit] store must be one of"),
        ('[ratelimit]\nstore = "redis://"\n', "[ratelimit] store must be one of"),
        ('[ratelimit]\nredis_namespace = ""\n', "[ratelimit] redis_namespace"),
        ("[webhooks]\nattempts = 0\n", "[webhooks] attempts must be between 1 and 10"),
        ("[webhooks]\ntimeout_seconds = 0\n", "[webhooks] needs 0 < timeout_seconds"),
        ('[webhooks]\nallow_private = "yes"\n', "[webhooks] allow_private"),
        ("[pops]\nidle_answer_seconds = -1\n", "[pops] idle_answer_seconds must be between 0 (off) and 60"),
        ("[pops]\nidle_answer_seconds = 61\n", "[pops] idle_answer_seconds must be between 0 (off) and 60"),
        ('[pops]\nidle_answer_seconds = "long"\n', "[pops] idle_answer_seconds"),
    ],
)
def test_bad_file_names_the_key(elsewhere: Path, text: str, names: str) -> None:
    path = _write(elsewhere, text)
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ={})
    assert names in str(info.value)


@pytest.mark.parametrize(
    ("environ", "names"),
    [
        ({"HORDE_LITE_LEASE__BASE_SECS": "1"}, "HORDE_LITE_LEASE__BASE_SECS"),
        ({"HORDE_LITE_LEASES__BASE_SECONDS": "1"}, "HORDE_LITE_LEASES"),
        ({"HORDE_LITE_LEASE__BASE_SECONDS": "soon"}, "[lease] base_seconds"),
        ({"HORDE_LITE_SPEED__SAMPLES": "[1, 2]"}, "[speed] samples"),
        ({"HORDE_LITE_ACCOUNTS__REGISTRATION": "Open"}, "[accounts] registration"),
        # The change log notes a check-in that jumps by more than 5 s: no worker may go offline sooner.
        ({"HORDE_LITE_WORKER__ONLINE_SECONDS": "20"}, "[worker] online_seconds must be > 20"),
    ],
)
def test_bad_env_names_the_key(elsewhere: Path, environ: dict[str, str], names: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ=environ)
    assert names in str(info.value)


def test_policy_table_form_with_nested_options(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[policies.speed_gate]\nname = "enforce_all"\n'
        '[policies.allowance_curve]\nname = "jobs_per_thread"\n'
        "[policies.allowance_curve.options]\nfull_jobs_per_thread = 1.0\nfloor_jobs_per_thread = 4.0\n",
    )
    settings = load_settings(path, environ={})
    assert settings.policies.speed_gate == "enforce_all"
    assert settings.policies.allowance_curve == "jobs_per_thread"
    assert settings.policies.shadow_metrics == "over_capacity"
    assert settings.policies.options == {
        "allowance_curve": {"full_jobs_per_thread": 1.0, "floor_jobs_per_thread": 4.0}
    }
    policies = load_policies(settings.policies)
    assert policies.names["allowance_curve"] == "jobs_per_thread"
    assert policies.allowance_curve.full_jobs_per_thread == 1.0  # type: ignore[attr-defined]


def test_options_table_without_a_name_keeps_the_default_policy(elsewhere: Path) -> None:
    path = _write(elsewhere, "[policies.shadow_metrics.options]\n")
    settings = load_settings(path, environ={})
    assert settings.policies.shadow_metrics == "over_capacity"
    assert settings.policies.options == {"shadow_metrics": {}}


def test_bad_policy_option_names_the_key(elsewhere: Path) -> None:
    path = _write(
        elsewhere,
        '[policies.allowance_curve]\nname = "jobs_per_thread"\n'
        "[policies.allowance_curve.options]\nfull_jobs_per_threads = 1.0\n",
    )
    settings = load_settings(path, environ={})
    with pytest.raises(PolicyError, match="full_jobs_per_threads"):
        load_policies(settings.policies)


def test_unknown_policy_lists_the_installed_ones(elsewhere: Path) -> None:
    settings = load_settings(environ={"HORDE_LITE_POLICIES__SPEED_GATE": "fastest"})
    with pytest.raises(PolicyError) as info:
        load_policies(settings.policies)
    for name in ("fastest", "prefer_capable", "enforce_all", "enforce_chat", "off"):
        assert name in str(info.value)


def test_an_env_error_names_the_variable_not_a_missing_file(elsewhere: Path) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={"HORDE_LITE_LEASE__BASE_SECONDS": "soon"})
    message = str(info.value)
    assert message.startswith(
        "HORDE_LITE_LEASE__BASE_SECONDS='soon': [lease] base_seconds: expected a number"
    )
    assert "litestar.toml" not in message


def test_a_file_error_names_the_file_and_lists_the_keys(elsewhere: Path) -> None:
    path = _write(elsewhere, "[database]\nurll = 'x'\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ={})
    keys = "url, echo, null_pool, pgbouncer, listen_url"
    assert str(info.value) == f"{path}: unknown key 'urll' in [database] (its keys: {keys})"


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        ("postgres://horde:s3cret@db:5432/horde", "write postgresql+asyncpg://horde:***@db:5432/horde"),
        ("postgresql://horde:s3cret@db/horde", "write postgresql+asyncpg://horde:***@db/horde"),
        ("postgresql+psycopg2://horde:s3cret@db/horde", "write postgresql+asyncpg://horde:***@db/horde"),
        ("sqlite:///data/h.db", "write sqlite+aiosqlite:///data/h.db"),
        (
            "mysql://horde:s3cret@db/horde",
            "horde_lite runs on SQLite (sqlite+aiosqlite:///PATH) or PostgreSQL",
        ),
        ("horde.db", "is not a database URL"),
    ],
)
def test_a_url_for_another_driver_says_what_to_write(elsewhere: Path, url: str, fix: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings(environ={"HORDE_LITE_DATABASE__URL": url})
    message = str(info.value)
    assert message.startswith("HORDE_LITE_DATABASE__URL: [database] url ")
    assert fix in message
    assert "s3cret" not in message
    assert "\n" not in message


def test_a_rule_over_a_table_names_where_its_keys_came_from(elsewhere: Path) -> None:
    path = _write(elsewhere, "[allowance]\nceiling = 100\n")
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ={"HORDE_LITE_ALLOWANCE__FLOOR": "900"})
    assert (
        str(info.value) == f"HORDE_LITE_ALLOWANCE__FLOOR and {path}: [allowance] needs 0 <= floor <= ceiling"
    )


def test_the_default_database_does_not_depend_on_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    urls = set()
    for place in ("a", "b"):
        (tmp_path / place).mkdir()
        monkeypatch.chdir(tmp_path / place)
        urls.add(load_settings(environ={}).database.url)
    assert urls == {f"sqlite+aiosqlite:///{tmp_path / 'data' / 'horde-lite' / 'horde_lite.db'}"}


def test_the_registration_mode_is_read_from_the_environment(elsewhere: Path) -> None:
    settings = load_settings(environ={"HORDE_LITE_ACCOUNTS__REGISTRATION": "invite"})
    assert settings.accounts.registration == "invite"


def test_a_bad_rate_limit_store_never_shows_the_url_s_password(elsewhere: Path) -> None:
    path = _write(elsewhere, '[ratelimit]\nstore = "http://user:secret@cache:6379/0"\n')
    with pytest.raises(SettingsError) as info:
        load_settings(path, environ={})
    assert "[ratelimit] store" in str(info.value)
    assert "secret" not in str(info.value)
