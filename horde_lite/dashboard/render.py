"""Each dashboard panel's template context: the queries' typed data (queries.py) plus its charts as SVG.

A panel is a name, a title, a template under templates/panels/ and an async builder; the page
renders them all, `/dashboard/panels/<name>` one (what the page's script re-fetches).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import Environment

from horde_lite.accounts import invites as invite_codes
from horde_lite.accounts import worker_messages
from horde_lite.core.context import Horde
from horde_lite.dashboard import modes_panel
from horde_lite.dashboard import queries as data
from horde_lite.dashboard.svg import Mark, Rule, Series, Stack, ago, bar_chart, duration, xy_chart
from horde_lite.filters import patterns
from horde_lite.filters import store as filter_store
from horde_lite.operators import ip_timeouts as address_timeouts
from horde_lite.operators.ip_rule import MOST_DAYS, MOST_HOURS
from horde_lite.requests.admission_rule import AdmissionOutcome

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
REFRESH_SECONDS = 5

OUTCOME_COLORS = {
    "completed": "#2e7d32",
    "faulted": "#c62828",
    "aborted": "#ef6c00",
    "cancelled": "#9e9e9e",
    "running": "#1e88e5",
}
ADMISSION_COLORS = {
    AdmissionOutcome.FREE.value: "#43a047",
    AdmissionOutcome.FUNDED.value: "#1e88e5",
    AdmissionOutcome.DOWNGRADED.value: "#fb8c00",
    AdmissionOutcome.REFUSED.value: "#e53935",
}
MODEL_COLORS = ("#1e88e5", "#43a047", "#8e24aa", "#fb8c00", "#00897b", "#6d4c41", "#9e9e9e")


def seconds(value: float | None) -> str:
    """A duration as an operator reads it: "42 s", "3.5 min", "2.0 h"; "-" when unknown."""
    if value is None:
        return "-"
    if value < 90:
        return f"{value:.0f} s"
    if value < 5400:
        return f"{value / 60:.1f} min"
    if value < 2 * 86400:
        return f"{value / 3600:.1f} h"
    return f"{value / 86400:.1f} d"


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))


def filters(env: Environment) -> None:
    """The templates' filters (registered by the template config's engine callback)."""
    env.filters["seconds"] = seconds
    env.filters["utc"] = utc
    env.filters["speed"] = lambda v: "unmeasured" if v is None else f"{v:.1f}"


def _time_bars(bin_starts: list[float], by_key: dict[str, list[int]], colors: dict[str, str], *,
               title: str, y_label: str, width: float) -> Any:  # fmt: skip
    stacks = [Stack(key, colors[key], values) for key, values in by_key.items() if any(values)]
    return bar_chart(
        [ago(start) for start in bin_starts],
        stacks,
        title=title,
        x_label=f"time (bins of {duration(width)}, relative to now)",
        y_label=y_label,
    )


async def fleet(horde: Horde) -> dict[str, Any]:
    rows = await data.fleet(horde)
    return {"rows": rows, "online": sum(r.state != "offline" for r in rows)}


async def queue(horde: Horde) -> dict[str, Any]:
    view = await data.queue(horde)
    # Waiting requests by size bucket, stacked by model (the busiest six, the rest as "other").
    totals: dict[str, int] = {}
    for cell in view.cells:
        totals[cell.model] = totals.get(cell.model, 0) + cell.requests
    top = sorted(totals, key=lambda m: -totals[m])[:6]
    stacks = []
    for i, model in enumerate([*top, "other"]):
        cells = [c for c in view.cells if c.model == model or (model == "other" and c.model not in top)]
        values = [sum(c.requests for c in cells if c.bucket == b) for b in data.BUCKETS]
        label = model if model != "" else "(any model)"
        stacks.append(Stack(label, MODEL_COLORS[i % len(MODEL_COLORS)], values))
    by_bucket = bar_chart(
        data.BUCKETS, stacks, title="Waiting requests by size bucket", x_label="max_length (tokens)",
        y_label="requests (per model)", empty="the queue is empty",
    )  # fmt: skip
    mark = None
    if view.latest is not None and view.latest.estimated_wait is not None:
        mark = Mark(f"now: {seconds(view.latest.estimated_wait)} -> {view.latest.allowance} tokens",
                    view.latest.estimated_wait, view.latest.allowance)  # fmt: skip
    curve = xy_chart(
        [
            Series(f"curve in force: {view.curve_name}", view.curve, "#1e88e5"),
            Series("admissions (last 24 h)", view.recent, "#90a4ae", "dots"),
        ],
        title="Free allowance against estimated wait",
        x_label="estimated wait (s)",
        y_label="free allowance (tokens)",
        x_range=(0.0, max(x for x, _ in view.curve)),
        rules=[Rule(f"ceiling {view.ceiling}", view.ceiling, "#9e9e9e"),
               Rule(f"floor {view.floor}", view.floor, "#9e9e9e")],
        mark=mark,
    )  # fmt: skip
    return {"view": view, "by_bucket": by_bucket, "curve": curve}


async def policies(horde: Horde) -> dict[str, Any]:
    return {"view": await data.policies(horde)}


async def shadow(horde: Horde) -> dict[str, Any]:
    view = await data.shadow(horde)
    over = _time_bars(view.bin_starts, view.over_by_outcome, OUTCOME_COLORS, width=view.bins.width,
                      title="Over-capacity assignments by outcome", y_label="assignments")  # fmt: skip
    service = xy_chart(
        [
            Series("within capacity", [(t, s) for t, s, oc in view.service if not oc], "#1e88e5", "dots"),
            Series("over capacity", [(t, s) for t, s, oc in view.service if oc], "#e53935", "dots"),
        ],
        title="Service time of ended assignments",
        x_label="assigned at (relative to now)",
        y_label="service time (s)",
        x_fmt=ago,
        x_range=(view.bins.start - horde.clock.now(), 0.0),
        rules=[Rule(f"base lease {duration(view.lease_base)}", view.lease_base, "#6d4c41"),
               Rule(f"longest lease {duration(view.lease_max)}", view.lease_max, "#bcaaa4")],
        empty="no assignment has ended yet",
    )  # fmt: skip
    # The table: one row per (bucket, trust), one column per outcome.
    table: dict[tuple[str, bool], dict[str, int]] = {}
    for cell in view.cells:
        table.setdefault((cell.bucket, cell.trusted), {})[cell.outcome] = cell.count
    return {"view": view, "over": over, "service": service, "table": table, "outcomes": data.OUTCOMES}


async def allowance(horde: Horde) -> dict[str, Any]:
    view = await data.allowance(horde)
    chart = _time_bars(view.bin_starts, view.by_outcome, ADMISSION_COLORS, width=view.bins.width,
                       title="Allowance decisions by outcome", y_label="decisions")  # fmt: skip
    kinds = sorted({k for k, _, _ in view.by_requester})
    table = {k: {o: n for kk, o, n in view.by_requester if kk == k} for k in kinds}
    return {"view": view, "chart": chart, "table": table, "outcomes": data.ADMISSION_OUTCOMES}


async def candidates(horde: Horde) -> dict[str, Any]:
    view = await data.candidate_comparison(horde)
    gate_chart = curve_chart = None
    if view.gate is not None:
        # Per size bucket: what the candidate gate would refuse, split by where the job would go.
        by_bucket = {b: [0, 0, 0, 0] for b in data.BUCKETS}
        for c in view.gate.cells:
            row = by_bucket[c.size_bucket]
            row[0] += c.assignments - c.refused
            row[1] += c.moved
            row[2] += c.no_eligible_worker
            row[3] += c.capable_unknown
        layers = ("allowed", "refused: moved to a capable worker", "refused: no eligible worker",
                  "refused: not recorded")  # fmt: skip
        colors = ("#cfd8dc", "#8e24aa", "#e53935", "#ffb300")
        gate_chart = bar_chart(
            data.BUCKETS,
            [Stack(label, colors[k], [by_bucket[b][k] for b in data.BUCKETS])
             for k, label in enumerate(layers)],
            title=f"Assignments under candidate gate {view.gate.gate}", x_label="size bucket (max_length)",
            y_label="assignments (7 days)", empty="no assignment recorded in the last 7 days",
        )  # fmt: skip
    if view.curve is not None:
        total = view.curve.total
        curve_chart = bar_chart(
            list(data.ADMISSION_OUTCOMES),
            [Stack("in force", "#90a4ae", [total.in_force.get(o, 0) for o in data.ADMISSION_OUTCOMES]),
             Stack(f"candidate {view.curve.curve}", "#8e24aa",
                   [total.would_be.get(o, 0) for o in data.ADMISSION_OUTCOMES])],
            title=f"Admission outcomes under candidate curve {view.curve.curve}", x_label="outcome",
            y_label="decisions (7 days)", grouped=True, empty="no admission recorded in the last 7 days",
        )  # fmt: skip
    return {
        "view": view,
        "gate_chart": gate_chart,
        "curve_chart": curve_chart,
        "outcomes": data.ADMISSION_OUTCOMES,
    }


async def invites(horde: Horde) -> dict[str, Any]:
    return {
        "invites": await invite_codes.listing(horde),
        "mode": horde.settings.accounts.registration,
        "now": horde.clock.now(),
    }


async def users(horde: Horde, search: str = "") -> dict[str, Any]:
    return {"view": await data.users(horde, search)}


async def timeouts(horde: Horde) -> dict[str, Any]:
    return {"timeouts": await address_timeouts.live(horde), "most_hours": MOST_HOURS, "most_days": MOST_DAYS}


async def usage(horde: Horde) -> dict[str, Any]:
    view = await data.usage_history(horde)
    labels = [d[5:] for d in view.days]  # MM-DD
    tokens = bar_chart(labels, [Stack("output tokens", "#1e88e5", view.tokens)],
                       title="Output tokens per day", x_label="day (UTC)", y_label="tokens",
                       empty="no usage in the last 30 days")  # fmt: skip
    requests = bar_chart(labels, [Stack("requests served", "#43a047", view.requests)],
                         title="Requests served per day", x_label="day (UTC)", y_label="requests",
                         empty="no usage in the last 30 days")  # fmt: skip
    return {"view": view, "tokens_chart": tokens, "requests_chart": requests}


async def prompt_filters(horde: Horde) -> dict[str, Any]:
    return {
        "filters": await filter_store.listing(horde),
        "most": horde.settings.filters.max_filters,
        "max_pattern": patterns.MAX_PATTERN,
        "max_description": patterns.MAX_DESCRIPTION,
        "max_replacement": patterns.MAX_REPLACEMENT,
    }


async def messages(horde: Horde) -> dict[str, Any]:
    return {"rows": await worker_messages.recent(horde), "shown": worker_messages.PAGE_SIZE}


@dataclass(frozen=True, slots=True)
class Panel:
    name: str
    title: str
    # A searchable panel's builder also takes the page's `q` (its search box).
    build: Callable[..., Awaitable[dict[str, Any]]]
    wide: bool = False
    searchable: bool = False

    async def context(self, horde: Horde, search: str) -> dict[str, Any]:
        return await (self.build(horde, search) if self.searchable else self.build(horde))

    @property
    def template(self) -> str:
        return f"panels/{self.name}.html"


PANELS: dict[str, Panel] = {
    p.name: p
    for p in (
        Panel("fleet", "Fleet", fleet, wide=True),
        Panel("queue", "Queue and free allowance", queue, wide=True),
        Panel("shadow", "Shadow records: over-capacity assignments", shadow, wide=True),
        Panel("allowance", "Allowance decisions", allowance),
        Panel("policies", "Policies", policies),
        Panel("candidates", "Candidate comparison (last 7 days)", candidates, wide=True),
        Panel("users", "Users", users, wide=True, searchable=True),
        Panel("invites", "Invite codes", invites, wide=True),
        Panel("modes", "Horde modes", modes_panel.context, wide=True),
        Panel("usage", "Usage (last 30 days)", usage, wide=True),
        Panel("timeouts", "Address timeouts", timeouts, wide=True),
        Panel("filters", "Prompt filters", prompt_filters, wide=True),
        Panel("messages", "Worker messages", messages, wide=True),
    )
}
