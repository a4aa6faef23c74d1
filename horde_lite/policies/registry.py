"""Find policies through their entry points and build the ones the settings select."""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import msgspec

from horde_lite.policies.kinds import CANDIDATES, PolicyKind
from horde_lite.policies.protocols import (
    PROTOCOLS,
    SPEED_GATE_RENAMED,
    AllowanceCurve,
    ShadowMetrics,
    SpeedGate,
)
from horde_lite.settings import PoliciesSettings, SettingsError

GROUP_PREFIX = "horde_lite."


class PolicyError(SettingsError):
    """A policy name or option that cannot be loaded; raised at start-up."""


def group(kind: PolicyKind) -> str:
    return GROUP_PREFIX + kind


def installed(kind: PolicyKind) -> dict[str, EntryPoint]:
    return dict(_scan(tuple(sys.path), group(kind)))


@functools.lru_cache(maxsize=32)
def _scan(path: tuple[str, ...], name: str) -> tuple[tuple[str, EntryPoint], ...]:
    """One group's entry points on one `sys.path`: reading every installed distribution's metadata
    is the slowest part of building the policies, and they are built at each start and switch."""
    return tuple((ep.name, ep) for ep in entry_points(group=name))


def _build(kind: PolicyKind, name: str, options: dict[str, Any], setting: str | None = None) -> Any:
    """`setting`: the key that named it, when not `kind` itself (a candidate's)."""
    available = installed(kind)
    if name not in available:  # installed since the last scan (a package added to a running horde)
        _scan.cache_clear()
        available = installed(kind)
    key = setting or kind
    if name not in available:
        names = ", ".join(sorted(available)) or "none"
        raise PolicyError(f"[policies] {key} = {name!r} is not installed; installed {kind} policies: {names}")
    try:
        cls = available[name].load()
    except Exception as e:  # a broken third-party package must name itself
        raise PolicyError(f"[policies] {key} = {name!r}: loading {available[name].value} failed: {e}") from e
    try:
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            policy = msgspec.convert(options, cls)
        else:
            policy = cls(**options)
    except (msgspec.ValidationError, TypeError) as e:
        raise PolicyError(f"[policies.{key}.options] for {name!r}: {e}") from e
    if kind == PolicyKind.SPEED_GATE:
        _refuse_former_names(policy, f"[policies] {key} = {name!r}: {available[name].value}")
    if not isinstance(policy, PROTOCOLS[kind]):
        raise PolicyError(f"[policies] {key} = {name!r}: {available[name].value} is not a {kind} policy")
    return policy


def _refuse_former_names(gate: Any, what: str) -> None:
    """A gate written for the speed gate's former names: say which to rename (the former method
    names alone would fail the protocol check with no hint; the former attribute alone would
    quietly turn off the walk's use of the gate)."""
    stale = [old for old, new in SPEED_GATE_RENAMED.items() if hasattr(gate, old) and not hasattr(gate, new)]
    if stale:
        renames = ", ".join(f"{old} -> {SPEED_GATE_RENAMED[old]}" for old in stale)
        raise PolicyError(
            f"{what} uses the speed gate's former names; rename {renames} (docs/reference/policies.md)"
        )


@dataclass(frozen=True, slots=True)
class Policies:
    speed_gate: SpeedGate
    allowance_curve: AllowanceCurve
    shadow_metrics: ShadowMetrics
    names: dict[str, str]
    # What was built, per kind: its options and the policy_state version it applies (0: from the
    # settings, not yet matched with the database; operators/policy_state.py swaps the whole object).
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)
    # Candidates judged in shadow beside the ones in force, never applied (None: none configured).
    candidate_speed_gate: SpeedGate | None = None
    candidate_allowance_curve: AllowanceCurve | None = None


def load_policies(settings: PoliciesSettings) -> Policies:
    unknown = set(settings.options) - set(PolicyKind) - set(CANDIDATES)
    if unknown:
        raise PolicyError(f"[policies] options for unknown policy kinds: {', '.join(sorted(unknown))}")
    names: dict[str, str] = {kind: getattr(settings, kind) for kind in PolicyKind}
    built = {kind: _build(kind, names[kind], settings.options.get(kind, {})) for kind in PolicyKind}
    options = {kind: dict(settings.options.get(kind, {})) for kind in PolicyKind}
    candidates = _candidates(settings, names)
    return Policies(names=names, options=options, **built, **candidates)


def _candidates(settings: PoliciesSettings, names: dict[str, str]) -> dict[str, Any]:
    """Build the configured candidates (a bad name stops start-up like the ones in force) and add
    their names to `names` under the setting's key."""
    built: dict[str, Any] = {}
    for setting, kind in CANDIDATES.items():
        name = getattr(settings, setting)
        if name:
            built[setting] = _build(kind, name, settings.options.get(setting, {}), setting)
            names[setting] = name
    return built


def build(kind: str, name: str, options: dict[str, Any]) -> Any:
    """One policy, built exactly as start-up builds it (a switch validates with this)."""
    try:
        known = PolicyKind(kind)
    except ValueError:
        raise PolicyError(f"unknown policy kind {kind!r}; the kinds are: {', '.join(PolicyKind)}") from None
    return _build(known, name, options)


def listing(settings: PoliciesSettings) -> list[tuple[str, str, str, bool]]:
    """(kind, name, distribution, selected) for every installed policy."""
    rows = []
    for kind in PolicyKind:
        for name, ep in sorted(installed(kind).items()):
            dist = ep.dist.name if ep.dist is not None else "?"
            rows.append((kind, name, dist, getattr(settings, kind) == name))
    return rows
