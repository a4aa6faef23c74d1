"""The demo's live board, 80 columns wide, read from the server like any dashboard would: the
workers' lease speed and capacity from GET /api/v2/workers, the queue from
GET /api/v2/status/models, the totals from GET /metrics, each notable decision from the operator
routes (demo/decisions.py); request outcomes and the last answer from the demo's own clients."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx

from horde_lite.demo.decisions import Explainer, fit, tokens
from horde_lite.demo.load import KINDS, Tally
from horde_lite.policies.kinds import PolicyKind
from horde_lite.requests.admission_rule import ADMISSION_OUTCOMES

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_sums(text: str, name: str, label: str) -> Counter[str]:
    """The samples of a Prometheus counter summed by one label."""
    out: Counter[str] = Counter()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        labels = dict(_LABEL.findall(match.group(2) or ""))
        out[labels.get(label, "")] += int(float(match.group(3)))
    return out


async def snapshot(http: httpx.AsyncClient) -> dict[str, Any]:
    workers = (await http.get("/api/v2/workers")).json()
    models = (await http.get("/api/v2/status/models", params={"type": "text"})).json()
    metrics = (await http.get("/metrics")).text
    return {"workers": workers, "models": models, "metrics": metrics}


def render(
    snap: dict[str, Any],
    tally: Tally,
    headline: str,
    served_by: dict[str, int],
    explainer: Explainer,
    answers: list[tuple[str, str, str]],
) -> str:
    """The board; `answers`: (label, kind, text) of what the clients got, e.g. the last answer."""
    p = explainer.policies
    lines = [
        headline,
        f"policies: gate {p.get(PolicyKind.SPEED_GATE, '?')}, allowance "
        f"{p.get(PolicyKind.ALLOWANCE_CURVE, '?')}, shadow {p.get(PolicyKind.SHADOW_METRICS, '?')}",
        "",
        f"{'requests (clients)':24}{'waiting':>9}{'served':>9}{'refused':>9}{'failed':>9}",
    ]
    for kind in KINDS:
        c = tally.counts[kind]
        lines.append(f"  {kind:22}{c['waiting']:>9}{c['served']:>9}{c['refused']:>9}{c['failed']:>9}")
    for model in snap["models"]:
        lines.append(
            f"queue {model['name']}: {model['jobs']:g} jobs, {tokens(int(model['queued']))} tokens, "
            f"eta {model['eta']} s"
        )
    lines.append("")
    lines.append(f"{'workers':20}{'chat':>6}{'tok/s':>8}{'capacity':>10}{'done':>7}{'kudos':>10}{'jobs':>7}")
    for w in snap["workers"]:
        speed = "-" if w.get("lease_speed") is None else f"{w['lease_speed']:.1f}"
        chat = "-" if not w.get("chat") else ("tools" if "tools" in w["chat"]["features"] else "yes")
        lines.append(
            f"  {w['name'][:18]:18}{chat:>6}{speed:>8}{tokens(w['capacity']):>10}"
            f"{w['requests_fulfilled']:>7}{w['kudos_rewards']:>10.1f}{served_by.get(w['name'], 0):>7}"
        )
    lines.append("(tok/s '-': not measured yet, capacity from the assumed speed)")
    lines.append("")
    lines.append("decisions, newest last (GET /operator/decisions):")
    lines.extend(f"  {line}" for line in explainer.lines)
    if not explainer.lines:
        lines.append("  (none yet)")
    metrics = snap["metrics"]
    decisions = metric_sums(metrics, "horde_text_free_allowance_decisions_total", "horde_outcome")
    over = sum(metric_sums(metrics, "horde_text_gate_shadow_assignments_total", "horde_chat").values())
    limited = sum(metric_sums(metrics, "horde_pop_lease_capacity_limited_total", "horde_chat").values())
    lines.append("")
    lines.append("allowance (/metrics): " + ", ".join(f"{k} {decisions[k]}" for k in ADMISSION_OUTCOMES))
    lines.append(f"speed gate (/metrics): over-capacity jobs {over}, capacity-limited pops {limited}")
    for label, kind, text in answers:
        if text:
            lines.append(f'{label} ({kind}): "{" ".join(text.split())}"')
    return "\n".join(fit(line) for line in lines)
