"""The money and job invariants of a horde, read straight from its database.

Shared by the stateful test (checked after every step) and the soak (`bench/soak.py`, checked after
the drain). Each check reads committed rows only, so it must hold between any two transactions:

- every balance equals the sum of its ledger events;
- no active hold on a request that is over (or gone), and no hold outside 0 <= remaining <= amount;
- no job handed out twice: a request's running and finished jobs never exceed its `n`;
- the status counts add up: a waiting request's `waiting + processing + finished == n`, a done one
  has all `n` finished, a cancelled or faulted one hands nothing more out;
- one settlement per job: each generation has at most one reward and one charge, the charge is
  `reward + 1` (the documented burn, docs/explanation/kudos_accounting.md), stored generations
  agree with their events, and nothing but a stored non-fake result is paid;
- kudos are conserved: charges paid = rewards earned + 1 per job, and the balances sum to the
  operator's grants minus those burns;
- the price is the horde's: no job is charged more than its request's `job_price` (fixed at
  admission), so no request is charged more than its quote, whatever its workers declared;
- every balance, hold, price and amount is finite and within +-KUDOS_LIMIT;
- the queue's index holds exactly the waiting requests, each under its models (or "" for any);
- each request refuses by name (`queue_refusals`) exactly its deny-list's and its failed workers, and
  by owner (`queue_owner_refusals`) exactly the owners whose workers failed it;
- the usage history is the ledger's: each user's kudos spent in `usage_records` equal its `charge`
  events and each owner's kudos earned its `reward` events; each worker's jobs and tokens there equal
  its own counters (what its submits were paid for); a user's requests served never exceed its jobs;
- after a drain (`drained=True`): every request is final and no job is running.

`copy_matches_the_database` checks the app's in-memory copy of the queue and the fleet against a
fresh load (the stateful test, after every step).

`check` returns the violations as readable lines (empty: all hold) plus the figures the soak prints.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from horde_lite.core.context import Horde
from horde_lite.db.models import (
    Generation,
    KudosEvent,
    KudosHold,
    QueueEntry,
    QueueOwnerRefusal,
    QueueRefusal,
    SharedKey,
    TextRequest,
    UsageRecord,
    User,
    Worker,
)
from horde_lite.queue.mirror import QueueMirror
from horde_lite.queue.queue_index import TARGET_ENTRIES, TARGET_LENGTH
from horde_lite.settings import KUDOS_LIMIT

FINISHED = ("ok", "censored")
JOB_KINDS = ("reward", "charge")
# Balances are floats moved by amounts rounded to cents; sums taken in another order differ by
# float noise only. A real leak is at least a cent.
TOLERANCE = 0.005


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations


def _close(a: float, b: float, slack: float = TOLERANCE) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=slack)


async def check(engine: AsyncEngine, *, drained: bool = False, limit: int = 20) -> Report:
    """Read every table once, in one transaction, and check the invariants above.

    At most `limit` violations are listed per invariant (the count of the rest is added)."""
    async with engine.connect() as conn:
        if conn.dialect.name == "postgresql":  # one snapshot for every read (SQLite's BEGIN IMMEDIATE is one)
            await conn.execution_options(isolation_level="REPEATABLE READ")
        users = (await conn.execute(select(User.id, User.username, User.kudos))).all()
        events = (
            await conn.execute(select(KudosEvent.user_id, KudosEvent.amount, KudosEvent.kind, KudosEvent.ref))
        ).all()
        holds = (
            await conn.execute(
                select(
                    KudosHold.key,
                    KudosHold.request_id,
                    KudosHold.amount,
                    KudosHold.remaining,
                    KudosHold.active,
                )
            )
        ).all()
        requests = (
            await conn.execute(
                select(
                    TextRequest.id,
                    TextRequest.state,
                    TextRequest.n_total,
                    TextRequest.n_remaining,
                    TextRequest.kudos_spent,
                    TextRequest.shared_key_hash,
                    TextRequest.any_model,
                    TextRequest.models,
                    TextRequest.targeted,
                    TextRequest.worker_allow,
                    TextRequest.worker_deny,
                    TextRequest.required_features,
                    TextRequest.required_transports,
                    TextRequest.failed_workers,
                    TextRequest.job_price,
                    TextRequest.failed_owners,
                )
            )
        ).all()
        entries = (
            await conn.execute(
                select(QueueEntry.request_id, QueueEntry.model, QueueEntry.target, QueueEntry.plain)
            )
        ).all()
        refusals = (await conn.execute(select(QueueRefusal.request_id, QueueRefusal.worker_id))).all()
        owner_refusals = (
            await conn.execute(select(QueueOwnerRefusal.request_id, QueueOwnerRefusal.owner_id))
        ).all()
        generations = (
            await conn.execute(
                select(
                    Generation.id, Generation.request_id, Generation.state, Generation.fake, Generation.reward
                )
            )
        ).all()
        shared = (await conn.execute(select(SharedKey.key_hash, SharedKey.utilized, SharedKey.kudos))).all()
        used = (
            await conn.execute(
                select(
                    UsageRecord.user_id, UsageRecord.owner_id, UsageRecord.worker_id, UsageRecord.requests,
                    UsageRecord.jobs, UsageRecord.tokens, UsageRecord.kudos_spent, UsageRecord.kudos_earned,
                )
            )
        ).all()  # fmt: skip
        workers = (
            await conn.execute(select(Worker.id, Worker.completed_jobs, Worker.tokens_generated))
        ).all()
        await conn.rollback()

    found: dict[str, list[str]] = defaultdict(list)

    def bad(invariant: str, message: str) -> None:
        found[invariant].append(message)

    # --- every amount finite and bounded -------------------------------------------------------------
    amounts = [
        *((f"user {u.username} balance", u.kudos) for u in users),
        *((f"ledger event {e.kind} {e.ref}", e.amount) for e in events),
        *((f"hold {h.key}", x) for h in holds for x in (h.amount, h.remaining)),
        *((f"request {r.id}", x) for r in requests for x in (r.kudos_spent, r.job_price)),
        *((f"generation {g.id} reward", g.reward) for g in generations),
        *((f"shared key {k.key_hash[:8]}", x) for k in shared for x in (k.utilized, k.kudos)),
    ]
    for what, amount in amounts:
        if not (math.isfinite(amount) and abs(amount) <= KUDOS_LIMIT):
            bad("every amount finite and bounded", f"{what}: {amount!r}")

    # --- balances and the ledger ------------------------------------------------------------------
    ledger: dict[int, float] = defaultdict(float)
    for e in events:
        ledger[e.user_id] += e.amount
    for u in users:
        if not _close(u.kudos, ledger.get(u.id, 0.0)):
            bad(
                "balance == ledger",
                f"user {u.username} (id {u.id}): balance {u.kudos!r}, ledger {ledger[u.id]!r}",
            )

    # --- the queue's index: the models (or "" for any) of a waiting request with a job to hand out,
    # each with the workers a short allow-list names (or "" for any), nothing else ---------------
    indexed: dict[str, set[tuple[str, str, bool]]] = defaultdict(set)
    for e in entries:
        indexed[e.request_id].add((e.model, e.target, bool(e.plain)))
    for r in requests:
        offered = r.state == "waiting" and r.n_remaining > 0
        allow = set(r.worker_allow) if r.targeted else set()
        models = {""} if r.any_model else set(r.models)
        few = 0 < len(allow) * len(models) <= TARGET_ENTRIES and all(len(w) <= TARGET_LENGTH for w in allow)
        named = allow if few else {""}
        plain = not (r.required_features or r.required_transports) and (not r.targeted or few)
        want = {(m, w, plain) for m in models for w in named} if offered else set()
        if indexed.pop(r.id, set()) != want:
            bad(
                "queue index == requests with a job to hand out",
                f"request {r.id} ({r.state}, {r.n_remaining} left): entries differ from {sorted(want)}",
            )
    for request_id in indexed:
        bad("queue index == requests with a job to hand out", f"entries of request {request_id}, gone")
    refused: dict[str, set[str]] = defaultdict(set)
    for x in refusals:
        refused[x.request_id].add(x.worker_id)
    for r in requests:
        named = {w for w in (*(r.worker_deny or ()), *(r.failed_workers or ())) if len(w) <= TARGET_LENGTH}
        if refused.pop(r.id, set()) != named:
            bad(
                "refusals == deny-list and failed workers",
                f"request {r.id}: refusals differ from {sorted(named)}",
            )
    for request_id in refused:
        bad("refusals == deny-list and failed workers", f"refusals of request {request_id}, gone")
    owners_refused: dict[str, set[str]] = defaultdict(set)
    for x in owner_refusals:
        owners_refused[x.request_id].add(str(x.owner_id))
    for r in requests:
        if owners_refused.pop(r.id, set()) != set(r.failed_owners or ()):
            bad("owner refusals == failed owners", f"request {r.id}: differ from {sorted(r.failed_owners)}")
    for request_id in owners_refused:
        bad("owner refusals == failed owners", f"owner refusals of request {request_id}, gone")

    # --- per request: jobs within n, status counts -------------------------------------------------
    by_request: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for g in generations:
        if not g.fake:
            by_request[g.request_id][g.state] += 1
    state_of: dict[str, str] = {}
    over: set[str] = set()  # requests that hand out nothing more and run nothing
    for r in requests:
        counts = by_request.get(r.id, {})
        finished = sum(counts.get(s, 0) for s in FINISHED)
        processing = counts.get("processing", 0)
        state_of[r.id] = r.state
        where = (
            f"request {r.id} ({r.state}, n={r.n_total}, waiting={r.n_remaining}, "
            f"processing={processing}, finished={finished})"
        )
        if finished + processing > r.n_total:
            bad("no job handed out twice", f"{where}: more jobs running or finished than n")
        if r.n_remaining < 0:
            bad("status counts add up", f"{where}: negative waiting count")
        if r.state == "waiting":
            if r.n_remaining + processing + finished != r.n_total:
                bad("status counts add up", f"{where}: waiting + processing + finished != n")
            if r.n_remaining == 0 and processing == 0:
                bad("status counts add up", f"{where}: nothing left to do but still waiting")
        elif r.state == "done":
            if finished != r.n_total or processing or r.n_remaining:
                bad("status counts add up", f"{where}: done without all n finished")
        elif r.state in ("cancelled", "faulted"):
            if r.n_remaining:
                bad("status counts add up", f"{where}: still has jobs to hand out")
        else:
            bad("status counts add up", f"{where}: unknown state")
        if r.state != "waiting" and processing == 0:
            over.add(r.id)
        if drained and (r.state == "waiting" or processing):
            bad("every request final after the drain", where)

    # --- holds -------------------------------------------------------------------------------------
    for h in holds:
        if not (-TOLERANCE <= h.remaining <= h.amount + TOLERANCE):
            bad("holds in range", f"hold {h.key}: remaining {h.remaining} outside 0..{h.amount}")
        if h.active and (h.request_id not in state_of or h.request_id in over):
            state = state_of.get(h.request_id, "gone (expired)")
            bad("no active hold on a finished request", f"hold {h.key}: active, request {state}")

    # --- settlements: one per stored job, charge = reward + 1 ----------------------------------------
    paid: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    rewards = charges = grants = 0.0
    for e in events:
        if e.kind in JOB_KINDS:
            paid[e.ref][e.kind].append(e.amount)
            if e.kind == "reward":
                rewards += e.amount
            else:
                charges += e.amount
        else:
            grants += e.amount
    jobs_paid = 0
    for ref, kinds in paid.items():
        reward, charge = kinds.get("reward", []), kinds.get("charge", [])
        if len(reward) != 1 or len(charge) != 1:
            bad(
                "no generation submitted twice",
                f"generation {ref}: {len(reward)} rewards, {len(charge)} charges",
            )
            continue
        jobs_paid += 1
        if not _close(charge[0], -round(reward[0] + 1, 2)):
            bad("kudos paid == earned + burns", f"generation {ref}: reward {reward[0]}, charge {charge[0]}")
    spent: dict[str, float] = defaultdict(float)
    price_of = {r.id: r.job_price for r in requests}
    for g in generations:
        kinds = paid.get(g.id)
        stored = g.state in FINISHED and not g.fake
        if stored and kinds is None:
            bad("one settlement per stored job", f"generation {g.id} ({g.state}) was never paid")
        elif not stored and kinds is not None:
            bad("one settlement per stored job", f"generation {g.id} ({g.state}, fake={g.fake}) was paid")
        elif kinds is not None and kinds.get("reward") and not _close(kinds["reward"][0], g.reward):
            bad(
                "one settlement per stored job",
                f"generation {g.id}: reward {g.reward}, ledger {kinds['reward'][0]}",
            )
        if kinds is not None and kinds.get("charge"):
            spent[g.request_id] -= kinds["charge"][0]
            price = price_of.get(g.request_id)
            if price is not None and -kinds["charge"][0] > price + TOLERANCE:
                bad("no charge above its job's share of the quote", f"generation {g.id}: charged "
                    f"{-kinds['charge'][0]}, its request's job price {price}")  # fmt: skip
    for r in requests:
        if not _close(r.kudos_spent, spent.get(r.id, 0.0), TOLERANCE * (1 + r.n_total)):
            bad(
                "one settlement per stored job",
                f"request {r.id}: kudos {r.kudos_spent}, charged {spent.get(r.id, 0.0)}",
            )
    key_spent: dict[str, float] = defaultdict(float)
    for r in requests:
        if r.shared_key_hash is not None:
            key_spent[r.shared_key_hash] += spent.get(r.id, 0.0)
    for k in shared:
        # Expired requests are deleted, so the key may have paid for more than the rows show.
        if k.utilized + TOLERANCE * (1 + len(requests)) < key_spent.get(k.key_hash, 0.0):
            bad(
                "shared key totals",
                f"shared key {k.key_hash[:8]}: utilized {k.utilized} < charged {key_spent[k.key_hash]}",
            )

    slack = TOLERANCE * (1 + jobs_paid)
    if not _close(-charges, rewards + jobs_paid, slack):
        bad(
            "kudos paid == earned + burns",
            f"charged {-charges:.2f} != rewarded {rewards:.2f} + {jobs_paid} jobs",
        )
    total = sum(u.kudos for u in users)
    if not _close(total, grants - jobs_paid, slack):
        bad(
            "kudos paid == earned + burns",
            f"balances sum to {total:.2f}, grants {grants:.2f}, burns {jobs_paid}",
        )

    # --- the usage history is the ledger's -----------------------------------------------------------
    history_spent: dict[int, float] = defaultdict(float)
    history_earned: dict[int, float] = defaultdict(float)
    history_jobs: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    asked: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for row in used:
        history_spent[row.user_id] += row.kudos_spent
        history_earned[row.owner_id] += row.kudos_earned
        history_jobs[row.worker_id][0] += row.jobs
        history_jobs[row.worker_id][1] += row.tokens
        asked[row.user_id][0] += row.requests
        asked[row.user_id][1] += row.jobs
    ledger_spent: dict[int, float] = defaultdict(float)
    ledger_earned: dict[int, float] = defaultdict(float)
    ledger_jobs: dict[int, int] = defaultdict(int)
    for e in events:
        if e.kind == "charge":
            ledger_spent[e.user_id] -= e.amount
            ledger_jobs[e.user_id] += 1
        elif e.kind == "reward":
            ledger_earned[e.user_id] += e.amount
    for u in users:
        jobs_of = ledger_jobs.get(u.id, 0)
        slack = TOLERANCE * (1 + jobs_of)
        spent_here, charged = history_spent.get(u.id, 0.0), ledger_spent.get(u.id, 0.0)
        if not _close(spent_here, charged, slack):
            bad(
                "usage history == ledger",
                f"user {u.username}: history spent {spent_here!r}, charged {charged!r}",
            )
        earned_here, rewarded = history_earned.get(u.id, 0.0), ledger_earned.get(u.id, 0.0)
        if not _close(earned_here, rewarded, slack):
            bad(
                "usage history == ledger",
                f"user {u.username}: history earned {earned_here!r}, rewarded {rewarded!r}",
            )
        served, jobs_asked = asked.get(u.id, [0, 0])
        if jobs_asked != jobs_of or served > jobs_asked or (jobs_asked > 0) != (served > 0):
            counts = f"{served} requests and {jobs_asked} jobs in the history, {jobs_of} charges"
            bad("usage history == ledger", f"user {u.username}: {counts}")
    for w in workers:
        kept = tuple(history_jobs.get(w.id, [0, 0]))
        if kept != (w.completed_jobs, w.tokens_generated):
            bad("usage history == ledger", f"worker {w.id}: history (jobs, tokens) {kept}, "
                f"counters {(w.completed_jobs, w.tokens_generated)}")  # fmt: skip

    report = Report()
    for invariant, lines in found.items():
        report.violations.extend(f"{invariant}: {line}" for line in lines[:limit])
        if len(lines) > limit:
            report.violations.append(f"{invariant}: ... and {len(lines) - limit} more")
    states: dict[str, int] = defaultdict(int)
    for r in requests:
        states[r.state] += 1
    gen_states: dict[str, int] = defaultdict(int)
    for g in generations:
        gen_states[g.state] += 1
    report.figures = {
        "users": len(users),
        "requests stored": len(requests),
        **{f"requests {s}": n for s, n in sorted(states.items())},
        "generations stored": len(generations),
        **{f"generations {s}": n for s, n in sorted(gen_states.items())},
        "jobs paid": jobs_paid,
        "kudos rewarded": round(rewards, 2),
        "kudos charged": round(-charges, 2),
        "kudos burned": jobs_paid,
        "kudos granted": round(grants, 2),
        "active holds": sum(1 for h in holds if h.active),
        "usage rows": len(used),
    }
    return report


async def copy_matches_the_database(horde: Horde) -> None:
    """The app's copy of the queue and the fleet (queue/mirror.py), caught up, holds what a
    fresh load of the database reads. Calls running in the background (a /v1 client waiting) may
    commit between the two reads: the load is compared with the copy read before it and after it
    when those two agree (nothing changed meanwhile), a few times over."""
    for _ in range(5):
        now = horde.clock.now()
        kept = (await horde.mirror.current(now)).summary(now)
        fresh = QueueMirror(horde.settings)
        try:
            loaded = (await fresh.current(now)).summary(now)
        finally:
            await fresh.close()
        if (await horde.mirror.current(now)).summary(now) == kept:
            assert kept == loaded
            return
    raise AssertionError("the horde kept changing while its copy was compared")
