"""Find policies through their entry points and build the ones the settings select."""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

import msgspec

from horde_lite.policies.protocols import KINDS, PROTOCOLS, AllowanceCurve, ShadowMetrics, SpeedGate
from horde_lite.settings import PoliciesSettings, SettingsError

GROUP_PREFIX = "horde_lite."


class PolicyError(SettingsError):
    """A policy name or option that cannot be loaded; raised at start-up."""


def group(kind: str) -> str:
    return GROUP_PREFIX + kind


def installed(kind: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group(kind))}


def _build(kind: str, name: str, options: dict[str, Any]) -> Any:
    available = installed(kind)
    if name not in available:
        names = ", ".join(sorted(available)) or "none"
        raise PolicyError(
            f"[policies] {kind} = {name!r} is not installed; installed {kind} policies: {names}"
        )
    try:
        cls = available[name].load()
    except Exception as e:  # a broken third-party package must name itself
        raise PolicyError(f"[policies] {kind} = {name!r}: loading {available[name].value} failed: {e}") from e
    try:
        if isinstance(cls, type) and issubclass(cls, msgspec.Struct):
            policy = msgspec.convert(options, cls)
        else:
            policy = cls(**options)
    except (msgspec.ValidationError, TypeError) as e:
        raise PolicyError(f"[policies.{kind}.options] for {name!r}: {e}") from e
    if not isinstance(policy, PROTOCOLS[kind]):
        raise PolicyError(f"[policies] {kind} = {name!r}: {available[name].value} is not a {kind} policy")
    return policy


@dataclass(frozen=True, slots=True)
class Policies:
    speed_gate: SpeedGate
    allowance_curve: AllowanceCurve
    shadow_metrics: ShadowMetrics
    names: dict[str, str]


def load_policies(settings: PoliciesSettings) -> Policies:
    unknown = set(settings.options) - set(KINDS)
    if unknown:
        raise PolicyError(f"[policies] options for unknown policy kinds: {', '.join(sorted(unknown))}")
    names = {kind: getattr(settings, kind) for kind in KINDS}
    built = {kind: _build(kind, names[kind], settings.options.get(kind, {})) for kind in KINDS}
    return Policies(names=names, **built)


def listing(settings: PoliciesSettings) -> list[tuple[str, str, str, bool]]:
    """(kind, name, distribution, selected) for every installed policy."""
    rows = []
    for kind in KINDS:
        for name, ep in sorted(installed(kind).items()):
            dist = ep.dist.name if ep.dist is not None else "?"
            rows.append((kind, name, dist, getattr(settings, kind) == name))
    return rows
