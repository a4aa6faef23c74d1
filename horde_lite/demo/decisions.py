"""The demo's decision lines: each notable decision of the policies in force, in words, with the
policy's name and its numbers. Read as the horde's operator would: the records from
GET /operator/decisions and the names from GET /operator/policies (the demo's own moderator key),
the fleet's capacities from GET /api/v2/workers. The speed gate that kept a worker from a job is
asked again here, through its own `admits`, with the numbers of that job."""

from __future__ import annotations

import textwrap
from collections import deque
from typing import Any

import httpx

from horde_lite.policies.kinds import PolicyKind
from horde_lite.policies.protocols import GateInputs, SpeedGate
from horde_lite.policies.registry import PolicyError, build

WIDTH = 80  # every line the demo prints fits a terminal this wide
KEPT = 12  # decision lines shown on the board


def fit(line: str, width: int = WIDTH) -> str:
    """`line` cut to `width` columns, the cut marked; the demo's last guard for its 80 columns."""
    return line if len(line) <= width else line[: width - 3] + "..."


def wrapped(line: str, width: int = WIDTH) -> list[str]:
    """`line` over as many lines as it needs, the later ones indented (nothing lost)."""
    return textwrap.wrap(line, width, subsequent_indent="      ", break_on_hyphens=False) or [""]


def tokens(n: int) -> str:
    return f"{n:,}"


def admission_line(a: dict[str, Any]) -> str | None:
    """An allowance decision worth a line: refused, downgraded, or funded over the allowance."""
    asked = a["asked"] * a["n"]
    what = tokens(asked) if a["n"] == 1 else f"{a['n']} x {tokens(a['asked'])}"
    wait = a["estimated_wait"]
    at = "no eligible worker" if wait is None else f"at a wait of {wait:.0f} s"
    curve = a["allowance_curve"]
    allowance = tokens(a["allowance"])
    if a["outcome"] == "refused":
        return f"refused: {what} > allowance {allowance}, {at} ({curve})"
    if a["outcome"] == "downgraded":
        return f"downgraded: {what} to the allowance {allowance}, {at} ({curve})"
    if a["outcome"] == "funded" and asked > a["allowance"]:
        return f"funded: {what} > allowance {allowance}, {at} ({curve})"
    return None


class Explainer:
    """Turns the records into lines, keeping the newest; `after` is the cursor of the next read."""

    def __init__(self, after: float = 0.0) -> None:
        self.after = after
        self.lines: deque[str] = deque(maxlen=KEPT)
        self.counts: dict[str, int] = {}
        self.policies: dict[str, str] = {}  # kind -> name in force (this server process's)
        self._options: dict[str, dict[str, Any]] = {}
        self._gates: dict[str, SpeedGate | None] = {}

    async def read(self, http: httpx.AsyncClient, key: str, workers: list[dict[str, Any]]) -> list[str]:
        """Read what was decided since the last call; returns the new lines (also kept)."""
        headers = {"apikey": key}
        policies = (await http.get("/operator/policies", headers=headers)).json()["policies"]
        self.policies = {kind: p["applied_name"] for kind, p in policies.items()}
        self._options = {kind: p["applied_options"] for kind, p in policies.items()}
        answer = (await http.get("/operator/decisions", params={"after": self.after}, headers=headers)).json()
        new: list[str] = []
        for a in answer["admissions"]:
            self.after = max(self.after, a["at"])
            line = admission_line(a)
            if line is not None:
                new.append(line)
        for r in answer["assignments"]:
            self.after = max(self.after, r["at"])
            new.extend(self.assignment_lines(r, workers))
        for line in new:
            kind = line.split(maxsplit=1)[0].rstrip(":")  # refused, downgraded, funded, shadow, kept
            self.counts[kind] = self.counts.get(kind, 0) + 1
            self.lines.append(line)
        return new

    def assignment_lines(self, r: dict[str, Any], workers: list[dict[str, Any]]) -> list[str]:
        """An over-capacity job: the shadow record. A job within capacity: each other worker the
        speed gate kept from it (a worker that could take the job but for its capacity)."""
        size, gate_name = r["max_length"], r["speed_gate"]
        if r["over_capacity"]:
            shadow = self.policies.get(PolicyKind.SHADOW_METRICS, "shadow")
            capable = {True: ", capable online", False: ", none capable", None: ""}[r["capable_online"]]
            return [
                f"shadow: {r['worker_name']}: {tokens(size)} > capacity {tokens(r['capacity'])}"
                f"{capable} ({shadow})"
            ]
        gate = self._gate(gate_name)
        if gate is None:
            return []
        lines = []
        for w in workers:
            if w["id"] == r["worker_id"] or not _could_take(w, r):
                continue
            inputs = GateInputs(
                is_chat=r["is_chat"], max_length=size, capacity=w["capacity"], capable_worker_online=True
            )
            if not gate.admits(inputs):
                lines.append(
                    f"kept from {w['name']}: capacity {tokens(w['capacity'])} < {tokens(size)} "
                    f"asked ({gate_name})"
                )
        return lines

    def _gate(self, name: str) -> SpeedGate | None:
        """The gate the record names, built as the server builds it (None: not installed here)."""
        if name not in self._gates:
            options = self._options.get(PolicyKind.SPEED_GATE, {}) if self._is_in_force(name) else {}
            try:
                self._gates[name] = build(PolicyKind.SPEED_GATE, name, options)
            except PolicyError:
                self._gates[name] = None
        return self._gates[name]

    def _is_in_force(self, name: str) -> bool:
        return self.policies.get(PolicyKind.SPEED_GATE) == name


def _could_take(w: dict[str, Any], r: dict[str, Any]) -> bool:
    """The worker serves the job's kind and size by its declarations (so only its capacity, the
    gate's number, stands between them)."""
    if not w.get("online", True):
        return False
    if r["is_chat"]:
        chat = w.get("chat")
        return bool(chat) and chat["max_completion_tokens"] >= r["max_length"]
    return int(w.get("max_length", 0)) >= r["max_length"]
