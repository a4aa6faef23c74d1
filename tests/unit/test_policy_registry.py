"""The policy registry (docs/reference/policies.md): policies are found only through the
`horde_lite.speed_gate|allowance_curve|shadow_metrics` entry points, selected by name with options
from `[policies]`, loaded once at start-up with an error naming the installed policies or the bad
option, and listed by `horde-lite policies list`. A policy from another distribution, installed by
the test as a real `*.dist-info` on sys.path, is discovered, selected by configuration and takes
effect over HTTP."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from litestar.testing import AsyncTestClient

import horde_lite
from horde_lite import cli
from horde_lite.app import create_app
from horde_lite.clock import ManualClock
from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import PROTOCOLS, AllowanceCurve, ShadowMetrics, SpeedGate
from horde_lite.policies.registry import PolicyError, installed, listing, load_policies
from horde_lite.settings import PoliciesSettings, load_settings
from horde_lite.testing.speed_gate_contract import check_speed_gate, speed_gate_contract
from tests.conftest import make_settings
from tests.support.apps import app_for
from tests.support.horde import HordeClient

PROJECT = Path(horde_lite.__file__).resolve().parent.parent
BUILT_IN = {
    "speed_gate": {"prefer_capable", "enforce_all", "enforce_chat", "off"},
    "allowance_curve": {"estimated_wait", "horde_queue", "jobs_per_thread"},
    "shadow_metrics": {"over_capacity", "off"},
}
PROTOCOL = {"speed_gate": SpeedGate, "allowance_curve": AllowanceCurve, "shadow_metrics": ShadowMetrics}
NOWHERE = "sqlite+aiosqlite:///does-not-matter.db"  # the factory loads policies without connecting


# --- built-in names ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(PolicyKind))
def test_built_in_policies_are_registered_by_this_project(kind: str) -> None:
    """Catches a stale install (entry points out of step with pyproject.toml) and a built-in policy
    loaded from anywhere but this repository's plugins/ folder, installed as `horde_lite_policies`."""
    found = installed(kind)
    assert BUILT_IN[kind] <= set(found)
    declared = tomllib.loads((PROJECT / "pyproject.toml").read_text())["project"]["entry-points"]
    ours = {
        ep.name: ep.value
        for ep in distribution("horde-lite").entry_points
        if ep.group == f"horde_lite.{kind}"
    }
    assert ours == declared[f"horde_lite.{kind}"], (
        "the installed entry points are stale: reinstall horde-lite"
    )
    for name in BUILT_IN[kind]:
        ep = found[name]
        assert ep.dist is not None
        assert ep.dist.name == "horde-lite"
        policy_class = ep.load()
        assert policy_class.__module__.startswith("horde_lite_policies."), ep.value
        source = Path(sys.modules[policy_class.__module__].__file__ or "").resolve()
        assert source.parent == PROJECT / "plugins", f"{ep.value} was imported from {source}"
        assert isinstance(policy_class(), PROTOCOL[kind])


def _imports(path: Path, *packages: str) -> bool:
    statement = re.compile(rf"\s*(import|from)\s+({'|'.join(packages)})(\.|\s|$)")
    return any(statement.match(line) for line in path.read_text().splitlines())


def test_the_core_never_imports_plugins_by_name() -> None:
    """Built-in policies are reached only through their entry points (docs/reference/policies.md)."""
    offenders = [
        str(path.relative_to(PROJECT))
        for path in (PROJECT / "horde_lite").rglob("*.py")
        if _imports(path, "plugins", "horde_lite_policies")
    ]
    assert offenders == []


def test_nothing_imports_the_folder_by_its_name_in_the_repository() -> None:
    """From the repository's root the plugins/ folder is importable as `plugins` (the current
    directory is on sys.path); an import by that name would load a second copy of each policy
    that no installed copy of the project has."""
    offenders = [
        str(path.relative_to(PROJECT))
        for folder in ("horde_lite", "plugins", "tests", "bench", "scripts")
        for path in (PROJECT / folder).rglob("*.py")
        if _imports(path, "plugins")
    ]
    assert offenders == []
    loaded = [name for name in sys.modules if name == "plugins" or name.startswith("plugins.")]
    assert loaded == [], "imported as `plugins`: entry points of a stale install? reinstall horde-lite"


def test_the_wheel_lists_every_package() -> None:
    """pyproject.toml lists the packages (plugins/ is mapped to `horde_lite_policies`, which `find`
    cannot do): a new horde_lite package missing from the list would be missing from the wheel."""
    setuptools = tomllib.loads((PROJECT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        ".".join(init.parent.relative_to(PROJECT).parts)
        for init in (PROJECT / "horde_lite").rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == on_disk | {"horde_lite_policies"}
    assert setuptools["package-dir"] == {"horde_lite_policies": "plugins"}


def test_the_kinds_are_the_configuration_and_database_values() -> None:
    """PolicyKind's values are what operators write and the database keeps: never renamed."""
    assert [kind.value for kind in PolicyKind] == ["speed_gate", "allowance_curve", "shadow_metrics"]
    assert set(PROTOCOLS) == set(PolicyKind)
    assert all(hasattr(PoliciesSettings(), kind) for kind in PolicyKind)


# --- selection from settings -------------------------------------------------------------------


def test_policies_are_selected_by_name_from_settings() -> None:
    settings = make_settings(
        NOWHERE,
        policies={"speed_gate": "enforce_chat", "allowance_curve": "horde_queue", "shadow_metrics": "off"},
    )
    policies = load_policies(settings.policies)
    assert policies.names == {
        "speed_gate": "enforce_chat",
        "allowance_curve": "horde_queue",
        "shadow_metrics": "off",
    }
    assert type(policies.speed_gate) is installed("speed_gate")["enforce_chat"].load()
    assert type(policies.allowance_curve) is installed("allowance_curve")["horde_queue"].load()
    assert type(policies.shadow_metrics) is installed("shadow_metrics")["off"].load()


def test_defaults_are_the_documented_choices() -> None:
    policies = load_policies(make_settings(NOWHERE).policies)
    assert policies.names == {
        "speed_gate": "prefer_capable",
        "allowance_curve": "estimated_wait",
        "shadow_metrics": "over_capacity",
    }


@pytest.mark.parametrize(
    "text",
    [
        '[policies]\nspeed_gate = "enforce_all"\n\n[policies.options.allowance_curve]\nbase = 400\n'
        '\n[policies.allowance_curve]\nname = "horde_queue"\n',
        '[policies.speed_gate]\nname = "enforce_all"\n\n[policies.allowance_curve]\nname = "horde_queue"\n'
        "\n[policies.allowance_curve.options]\nbase = 400\n",
    ],
    ids=["short-form", "table-form"],
)
def test_options_from_litestar_toml_reach_the_policy(tmp_path: Path, text: str) -> None:
    path = tmp_path / "litestar.toml"
    path.write_text(text)
    policies = load_policies(load_settings(path, environ={}).policies)
    assert policies.names["speed_gate"] == "enforce_all"
    assert policies.allowance_curve.base == 400  # type: ignore[attr-defined]


def test_an_unknown_name_stops_start_up_listing_the_installed_names() -> None:
    settings = make_settings(NOWHERE, policies={"speed_gate": "fastest"})
    with pytest.raises(PolicyError) as info:
        create_app(settings, ManualClock(), run_sweeper=False)
    message = str(info.value)
    assert "speed_gate" in message
    assert "'fastest'" in message
    for name in BUILT_IN["speed_gate"]:
        assert name in message


@pytest.mark.parametrize(
    ("kind", "name", "options", "names"),
    [
        ("speed_gate", "prefer_capable", {"strictness": 3}, "strictness"),
        ("allowance_curve", "jobs_per_thread", {"full_jobs_per_thread": "lots"}, "full_jobs_per_thread"),
        ("allowance_curve", "horde_queue", {"maximum": 1.5}, "maximum"),
        ("allowance_curve", "jobs_per_thread", {"full_jobs_per_thread": 5.0}, "floor_jobs_per_thread"),
        ("shadow_metrics", "over_capacity", {"record": "all"}, "record"),
    ],
)
def test_a_wrong_option_stops_start_up_naming_the_key(
    kind: str, name: str, options: dict[str, Any], names: str
) -> None:
    settings = make_settings(NOWHERE, policies={kind: name, "options": {kind: options}})
    with pytest.raises(PolicyError) as info:
        create_app(settings, ManualClock(), run_sweeper=False)
    assert names in str(info.value)
    assert f"[policies.{kind}.options]" in str(info.value)


def test_options_for_an_unknown_kind_stop_start_up() -> None:
    settings = make_settings(NOWHERE, policies={"options": {"speed_gates": {}}})
    with pytest.raises(PolicyError, match="speed_gates"):
        load_policies(settings.policies)


# --- a policy from another distribution --------------------------------------------------------

GATE_MODULE = '''
"""A third-party speed gate: refuses every job while `refuse` is set."""
import msgspec
from sqlalchemy import false, true


class RefuseAll(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    refuse: bool = True

    def admits(self, inputs):
        return not self.refuse

    def admits_sql(self, sql):
        return false() if self.refuse else true()


class NotAGate:
    pass


class FormerNames:
    """Written for the speed gate's former names."""

    capable_monotone = True

    def can_generate_with_eligibility_inputs(self, inputs):
        return True

    def text_wp_speed_gate_clause(self, sql):
        return true()


class FormerAttribute(RefuseAll, frozen=True):
    capable_monotone = True
'''


@dataclass(frozen=True)
class ThirdParty:
    distribution: str
    module: str
    gate: str  # entry point name of the working gate
    not_a_gate: str
    broken: str
    former_names: str  # the speed gate's former method and attribute names
    former_attribute: str  # the new methods, the former attribute


def install_distribution(
    site: Path, monkeypatch: pytest.MonkeyPatch, dist: str, module: str, source: str, entry_points: str
) -> None:
    """Install a distribution the way pip leaves it on disk: a module and a `*.dist-info`
    directory with METADATA and entry_points.txt, in a directory put on sys.path."""
    site.mkdir(exist_ok=True)
    (site / f"{module}.py").write_text(source)
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThirdParty]:
    """A third-party distribution with a working gate, a class that is not a gate and an entry
    point that does not import. Unique names per test: importlib caches modules by name."""
    tag = uuid.uuid4().hex[:8]
    module, dist = f"hl_third_party_{tag}", f"hl-third-party-{tag}"
    names = ThirdParty(
        dist,
        module,
        f"refuse_all_{tag}",
        f"not_a_gate_{tag}",
        f"broken_{tag}",
        f"former_names_{tag}",
        f"former_attribute_{tag}",
    )
    install_distribution(
        tmp_path / "site-packages",
        monkeypatch,
        dist,
        module,
        GATE_MODULE,
        "[horde_lite.speed_gate]\n"
        f"{names.gate} = {module}:RefuseAll\n"
        f"{names.not_a_gate} = {module}:NotAGate\n"
        f"{names.broken} = {module}_missing:Gate\n"
        f"{names.former_names} = {module}:FormerNames\n"
        f"{names.former_attribute} = {module}:FormerAttribute\n",
    )
    yield names
    sys.modules.pop(module, None)


def test_a_third_party_policy_is_discovered_with_its_distribution(third_party: ThirdParty) -> None:
    found = installed("speed_gate")
    assert third_party.gate in found
    assert found[third_party.gate].dist.name == third_party.distribution  # type: ignore[union-attr]
    settings = make_settings(NOWHERE, policies={"speed_gate": third_party.gate})
    rows = listing(settings.policies)
    assert ("speed_gate", third_party.gate, third_party.distribution, True) in rows
    assert ("speed_gate", "prefer_capable", "horde-lite", False) in rows


def test_a_third_party_entry_point_that_is_not_a_gate_or_does_not_load_is_named(
    third_party: ThirdParty,
) -> None:
    for name, says in (
        (third_party.not_a_gate, "is not a speed_gate policy"),
        (third_party.broken, "failed"),
    ):
        settings = make_settings(NOWHERE, policies={"speed_gate": name})
        with pytest.raises(PolicyError) as info:
            load_policies(settings.policies)
        assert name in str(info.value)
        assert says in str(info.value)


def test_a_gate_with_the_speed_gates_former_names_is_told_the_new_ones(third_party: ThirdParty) -> None:
    name = third_party.former_names
    settings = make_settings(NOWHERE, policies={"speed_gate": name})
    with pytest.raises(PolicyError) as info:
        load_policies(settings.policies)
    assert name in str(info.value)
    assert "former names" in str(info.value)
    renames = ("can_generate_with_eligibility_inputs -> admits", "text_wp_speed_gate_clause -> admits_sql")
    for rename in renames:
        assert rename in str(info.value)


def test_a_gate_that_still_sets_the_former_attribute_loads(third_party: ThirdParty) -> None:
    """The walk no longer reads `capable_monotone`: a gate with the new methods loads with it."""
    settings = make_settings(NOWHERE, policies={"speed_gate": third_party.former_attribute})
    assert type(load_policies(settings.policies).speed_gate).__name__ == "FormerAttribute"


@pytest.fixture
async def third_party_client(
    db_url: str, third_party: ThirdParty, request: pytest.FixtureRequest
) -> AsyncIterator[HordeClient]:
    refuse = getattr(request, "param", True)
    settings = make_settings(
        db_url, policies={"speed_gate": third_party.gate, "options": {"speed_gate": {"refuse": refuse}}}
    )
    app = app_for(settings, ManualClock())
    async with AsyncTestClient(app=app, timeout=30) as http:
        yield HordeClient(http, app.state.horde)


@pytest.mark.parametrize(
    ("third_party_client", "gets_job"), [(True, False), (False, True)], indirect=["third_party_client"]
)
async def test_a_third_party_gate_selected_by_configuration_takes_effect_over_http(
    third_party_client: HordeClient, third_party: ThirdParty, gets_job: bool
) -> None:
    """With `refuse = true` the pop finds no job for a request well within the worker's capacity;
    with `refuse = false` (its option from settings) the same pop gets it."""
    client = third_party_client
    assert client.horde.policies.names["speed_gate"] == third_party.gate
    key = await client.user("owner", kudos=1000)
    assert (await client.pop(key, "worker", models=["m"])).json()["id"] is None  # check-in
    created = await client.create(key, models=["m"], params={"max_length": 64, "max_context_length": 1024})
    assert created.status_code == 202, created.text
    job = (await client.pop(key, "worker", models=["m"])).json()
    assert (job["id"] is not None) is gets_job
    status = (await client.status(created.json()["id"])).json()
    assert status["waiting"] == (0 if gets_job else 1)


def test_a_third_party_gate_can_run_the_contract(third_party: ThirdParty, db_url: str) -> None:
    gate = installed("speed_gate")[third_party.gate].load()()
    check_speed_gate(gate, db_url, max_examples=10)


def test_the_documented_example_gate_is_selected_with_its_options_and_keeps_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_url: str
) -> None:
    """docs/reference/policies.md's MarginGate, installed as its own distribution, as written."""
    doc = (PROJECT / "docs" / "reference" / "policies.md").read_text()
    source = next(
        block.removeprefix("python\n")
        for block in doc.split("```")
        if block.startswith("python\n# my_horde_gate/__init__.py")
    )
    tag = uuid.uuid4().hex[:8]
    module, name = f"my_horde_gate_{tag}", f"margin_gate_{tag}"
    entry_points = f"[horde_lite.speed_gate]\n{name} = {module}:MarginGate\n"
    install_distribution(tmp_path / "site", monkeypatch, f"my-horde-gate-{tag}", module, source, entry_points)
    try:
        settings = make_settings(
            db_url, policies={"speed_gate": name, "options": {"speed_gate": {"margin_tokens": 128}}}
        )
        gate = load_policies(settings.policies).speed_gate
        assert gate.margin_tokens == 128  # type: ignore[attr-defined]
        check_speed_gate(gate, db_url, max_examples=20)
    finally:
        sys.modules.pop(module, None)


async def test_the_contract_runs_from_async_code(db_url: str) -> None:
    """`speed_gate_contract` is the same check for a caller inside an event loop."""
    gate = installed("speed_gate")["prefer_capable"].load()()
    await speed_gate_contract(gate, db_url, max_examples=5)


# --- horde-lite policies list ------------------------------------------------------------------


def test_policies_list_shows_every_installed_policy_and_marks_the_selected(
    third_party: ThirdParty, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no ./litestar.toml from the repository
    monkeypatch.delenv("HORDE_LITE_CONFIG", raising=False)
    (tmp_path / "litestar.toml").write_text(f'[policies.speed_gate]\nname = "{third_party.gate}"\n')
    result = CliRunner().invoke(cli.policies, ["list"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    marked = {(r[1], r[2]) for r in rows if r[0] == "*"}
    assert marked == {
        ("speed_gate", third_party.gate),
        ("allowance_curve", "estimated_wait"),
        ("shadow_metrics", "over_capacity"),
    }
    listed = {(r[-3], r[-2], r[-1]) for r in rows}
    for kind, names in BUILT_IN.items():
        for name in names:
            assert (kind, name, "(horde-lite)") in listed
    assert ("speed_gate", third_party.gate, f"({third_party.distribution})") in listed
