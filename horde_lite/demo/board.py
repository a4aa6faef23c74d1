"""The demo's live table, read from the server like any dashboard would: the workers' lease speed
and capacity from GET /api/v2/workers, the queue from GET /api/v2/status/models, the speed gate's
and the free allowance's decisions from GET /metrics; request outcomes from the demo's clients."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import httpx

from horde_lite.demo.load import KINDS, Tally
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


def render(snap: dict[str, Any], tally: Tally, headline: str, served_by: dict[str, int]) -> str:
    lines = [headline, ""]
    lines.append(f"{'requests (clients)':22}{'waiting':>9}{'served':>9}{'refused':>9}{'failed':>9}")
    for kind in KINDS:
        c = tally.counts[kind]
        lines.append(f"  {kind:20}{c['waiting']:>9}{c['served']:>9}{c['refused']:>9}{c['failed']:>9}")
    lines.append("")
    for model in snap["models"]:
        lines.append(
            f"queue {model['name']}: {model['jobs']} jobs, {model['queued']} tokens waiting, "
            f"eta {model['eta']} s, {model['count']} workers"
        )
    lines.append("")
    lines.append(
        f"{'workers (/api/v2/workers)':28}{'chat':>6}{'lease tok/s':>13}{'capacity':>10}"
        f"{'done':>7}{'kudos':>9}{'jobs run':>10}"
    )
    for w in snap["workers"]:
        speed = "unmeasured" if w.get("lease_speed") is None else f"{w['lease_speed']:.1f}"
        chat = "-" if not w.get("chat") else ("tools" if "tools" in w["chat"]["features"] else "yes")
        lines.append(
            f"  {w['name']:26}{chat:>6}{speed:>13}{w['capacity']:>10}{w['requests_fulfilled']:>7}"
            f"{w['kudos_rewards']:>9.1f}{served_by.get(w['name'], 0):>10}"
        )
    metrics = snap["metrics"]
    over = metric_sums(metrics, "horde_text_gate_shadow_assignments_total", "horde_chat")
    limited = sum(metric_sums(metrics, "horde_pop_lease_capacity_limited_total", "horde_chat").values())
    decisions = metric_sums(metrics, "horde_text_free_allowance_decisions_total", "horde_outcome")
    lines.append("")
    lines.append(
        f"speed gate (/metrics): over-capacity jobs admitted: legacy {over['false']}, chat {over['true']}; "
        f"pops by capacity-limited workers (refused big chat jobs while a capable one is online): {limited}"
    )
    lines.append("free allowance (/metrics): " + ", ".join(f"{k} {decisions[k]}" for k in ADMISSION_OUTCOMES))
    return "\n".join(lines)
