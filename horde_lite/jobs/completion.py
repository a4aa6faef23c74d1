"""Submit: accepted once, from the lease holder; pays the worker's owner, charges the requester,
measures the worker's lease speed, and ends the request when its last job is in."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
from sqlalchemy import bindparam, select
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import flagged, kudos, limits, owner_limits
from horde_lite.accounts.users import authenticate_user, hash_key, is_anonymous_key
from horde_lite.accounts.workers import record_speed_sample
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Generation, TextRequest, User, Worker
from horde_lite.db.rows import write_all_changes
from horde_lite.inputs import SubmitInput
from horde_lite.jobs.lease import LAPSED, JobLapsed, as_lease_holder, lapse, lease_ran_out
from horde_lite.jobs.output_bounds import check_submit
from horde_lite.jobs.settlement import give_back, job_ended, maybe_finish, shadow_outcome
from horde_lite.operators import usage
from horde_lite.rc import Rc
from horde_lite.requests import prices
from horde_lite.webhooks import payload as webhook
from horde_lite.webhooks.delivery import Delivery

log = logging.getLogger("horde_lite.completion")


# A speed sample counts at least this long a job (a submit milliseconds after its pop measures
# nothing) and never more than this speed: a worker cannot talk its capacity up (docs/decisions).
MIN_SAMPLE_SECONDS = 1.0
MAX_SAMPLE_TOKENS_PER_SECOND = 1000.0


def count_tokens(text: str, reported: int | None, allowed: int) -> int:
    """The completion tokens the worker reports, else ceil(len(text) / 4), never more than the job
    allowed (its max_length, a chat job's applied max_tokens): a worker's word, or an over-long
    text, cannot mint kudos or charge the requester beyond what it asked for."""
    counted = reported if reported is not None and reported >= 0 else prices.text_tokens(text)
    return max(0, min(counted, allowed))


def sample_seconds(tokens: int, elapsed: float) -> float:
    """The lease time a speed sample divides by: at least MIN_SAMPLE_SECONDS and long enough that
    the sample stays at or under MAX_SAMPLE_TOKENS_PER_SECOND."""
    return max(elapsed, MIN_SAMPLE_SECONDS, tokens / MAX_SAMPLE_TOKENS_PER_SECOND)


def _believed_usage(usage: dict[str, int], tokens: int, context: int) -> dict[str, int]:
    """The reported usage as shown to the client: completion_tokens capped to what was counted,
    prompt_tokens left out when it is more than the worker's declared context holds (the client
    then sees the horde's estimate), and total_tokens, when sent, the sum of what is kept."""
    believed = dict(usage)
    if believed.get("completion_tokens", 0) > tokens:
        believed["completion_tokens"] = tokens
    if believed.get("prompt_tokens", 0) > context:
        del believed["prompt_tokens"]
    if "total_tokens" in believed:
        believed["total_tokens"] = believed.get("prompt_tokens", 0) + believed.get("completion_tokens", 0)
    return believed


# The job's request, found through its generation, read fresh (`populate_existing`) and locked FOR
# UPDATE (the outer query's row only, not the subqueries'), with whether it has a hold and whether a
# limit counted it; the same with the poster's users row, found by its key's hash and not locked;
# then the generation with its worker, both locked. Built once, with bound parameters: a reused
# statement keeps its SQLAlchemy cache key.
_OWNING = select(Generation.request_id).where(Generation.id == bindparam("id")).scalar_subquery()
_REQUEST = (
    select(TextRequest, kudos.HAS_HOLD, limits.COUNTED)
    .where(TextRequest.id == _OWNING)
    .execution_options(populate_existing=True)
    .with_for_update()
)
_REQUEST_AND_POSTER = (
    _REQUEST.add_columns(User)
    # Joined on the key alone: a worker of another owner is found, and refused by the owner check.
    .join_from(TextRequest, User, User.api_key_hash == bindparam("digest"))
    .with_for_update(of=TextRequest)
)
_JOB = (
    select(Generation, Worker)
    .join(Worker, Worker.id == Generation.worker_id)
    .where(Generation.id == bindparam("id"))
    .execution_options(populate_existing=True)
    .with_for_update()
)


async def _request_and_poster(
    session: AsyncSession, apikey: str | None, generation_id: str, now: float
) -> tuple[TextRequest | None, User]:
    """The job's request (None: no such job) and the poster, a registered user's own key. A worker
    posting with its owner's key about a job that exists takes one statement; anything else (no
    key, the anonymous key, a shared key, an unknown key, no such job) takes the general path,
    which authenticates first and so answers as a separate authentication would."""
    found = None
    if not is_anonymous_key(apikey):
        values = {"id": generation_id, "digest": hash_key(apikey)}
        found = (await session.execute(_REQUEST_AND_POSTER, values)).one_or_none()
    if found is None:
        user = await authenticate_user(session, apikey, now)
        row = (await session.execute(_REQUEST, {"id": generation_id})).one_or_none()
        if row is None:
            return None, user
        found = (*row, user)
    request, has_hold, counted, user = found
    if not has_hold:
        kudos.note_holdless(session, request.id)
    if not counted:
        limits.note_uncounted(session, request.id)
    return request, user


async def load_generation_for_worker(
    session: AsyncSession, apikey: str | None, generation_id: str, horde: Horde, now: float
) -> tuple[Generation, Worker, TextRequest, User]:
    """The job `generation_id` of one of the poster's workers (`apikey`: its owner's key), with its
    worker, request and owner. A job whose lease ran out by `now` is aborted and given back here, and
    `JobLapsed` raised; the caller commits that (the lapse is kept) and refuses the post."""
    missing = HordeError(Rc.InvalidJobID, f"No processing generation with id {generation_id}.")
    # Lock order everywhere (submit, progress, lapse, cancel): the request, then its generation
    # and the worker (docs/explanation/locking.md). Concurrent submits, faults and lapses of one
    # request then serialize, never lose an update of its counts (PostgreSQL; SQLite has one
    # writer) and never deadlock. The request is found through its generation, with the poster,
    # in one statement, and the generation comes with its worker: two round trips.
    request, user = await _request_and_poster(session, apikey, generation_id, now)
    if request is None:
        raise missing
    job = (await session.execute(_JOB, {"id": generation_id})).one_or_none()
    if job is None:
        raise missing
    generation, worker = job
    if worker.owner_id != user.id:
        raise HordeError(Rc.WrongCredentials, "This generation belongs to another user's worker.")
    if lease_ran_out(generation, now):
        await lapse(session, horde, generation, worker, request)
        raise JobLapsed()
    return generation, worker, request, user


def require_live(generation: Generation) -> None:
    """Only a generation still holding its lease takes a submit or a progress post."""
    if generation.state == "aborted":
        raise HordeError(Rc.AbortedGen, LAPSED)
    if generation.state != "processing":
        raise HordeError(Rc.DuplicateGen, "This generation was already submitted.")


# What a stored submit may change on the job's generation, its worker and its request.
_STORED = (
    "submitted_at", "state", "chat_result", "usage", "text", "seed", "gen_metadata", "tokens", "reward"
)  # fmt: skip
_WORKER_TOTALS = (
    "completed_jobs", "tokens_generated", "kudos_earned", "speed_samples", "lease_speed", "capacity"
)  # fmt: skip
_REQUEST_SETTLED = ("kudos_spent", "state")


@dataclass(frozen=True, slots=True)
class Stored:
    reward: float  # 0 for a fault and for a paused worker's fake job
    webhook: Delivery | None = None  # to send once the submit has committed


async def submit(session: AsyncSession, horde: Horde, apikey: str | None, body: SubmitInput) -> Stored:
    """Store a worker's result: its reward and its request's webhook, if any (a fault and a paused
    worker's fake job have none, as upstream sends it only for a stored generation)."""
    now = horde.clock.now()
    generation, worker, request, owner = await load_generation_for_worker(
        session, apikey, body.id, horde, now
    )
    require_live(generation)
    generation.submitted_at = now
    if body.state == "faulted":
        generation.state = "faulted"
        if not generation.fake:
            worker.faulted_jobs += 1
            await give_back(session, horde, request, aborted=False, worker=worker)
            await owner_limits.note_failure(session, horde.settings, worker, now)
            await shadow_outcome(session, horde, generation, worker, request, "faulted")
            horde.notifier.on_commit(session, request.id, remote=request.waited)
        return Stored(0.0)
    if body.usage is not None and (request.is_chat or body.chat is not None):
        raise HordeError(
            Rc.BadRequest,
            "`usage` is a legacy job's; a chat job's usage travels in `chat.usage`. Nothing was "
            "stored; the job is still yours.",
        )
    text = body.generation
    # Past the job's bound nothing is stored and the job stays the worker's (it may submit again).
    message = body.chat.message if body.chat is not None else None
    check_submit(text, message, request.max_length, horde.settings)
    reported = None
    if body.chat is not None:
        reported = body.chat.usage.get("completion_tokens")
        content = body.chat.message.get("content")
        if not text and isinstance(content, str):
            text = content
    elif body.usage is not None:
        reported = body.usage.completion_tokens
    # Within the bound the text is kept as sent (upstream keeps it); only the count is capped.
    tokens = count_tokens(text, reported, request.max_length)
    if body.chat is not None:
        generation.chat_result = {
            "message": body.chat.message,
            "finish_reason": body.chat.finish_reason,
            "usage": _believed_usage(
                body.chat.usage, tokens, worker.chat_max_context_tokens or worker.max_context_length
            ),
        }
    elif body.usage is not None:
        sent = {k: v for k, v in msgspec.structs.asdict(body.usage).items() if v is not None}
        generation.usage = _believed_usage(sent, tokens, worker.max_context_length) or None
    generation.state = "censored" if body.state in ("censored", "csam") else "ok"
    generation.text = text
    generation.seed = None if body.seed is None else str(body.seed)
    generation.gen_metadata = body.gen_metadata
    generation.tokens = tokens
    if generation.fake:
        return Stored(0.0)
    earned = prices.job_reward(
        horde.sizes, tokens, generation.model, request.price_context, owner.trusted, request.job_price
    )
    reward = flagged.reward(owner, earned)
    generation.reward = reward
    charge = await kudos.charge_job(
        session,
        requester_id=request.user_id,
        shared_key_hash=request.shared_key_hash,
        worker_owner_id=worker.owner_id,
        request_id=request.id,
        generation_id=generation.id,
        reward=reward,
        now=now,
    )
    # Every charge is at least the burn of 1, so a request that has spent nothing is settling its
    # first job: the request is counted in the history once, by the job that first served it.
    used = usage.settlement(
        at=now,
        requester_id=request.user_id,
        shared_key_hash=request.shared_key_hash,
        worker_id=worker.id,
        owner_id=worker.owner_id,
        model=generation.model,
        first_of_request=request.kudos_spent == 0,
        tokens=tokens,
        charged=charge.amount,
        rewarded=reward,
    )
    request.kudos_spent = round(request.kudos_spent + charge.amount, 2)
    worker.completed_jobs += 1
    worker.tokens_generated += tokens
    worker.kudos_earned = round(worker.kudos_earned + reward, 2)
    record_speed_sample(worker, tokens, sample_seconds(tokens, now - generation.popped_at), horde.settings)
    if not await maybe_finish(session, request, ended=generation.id):
        # A request that ended released its hold whole: taking the charge from it first would
        # read and write the row only for the release to overwrite it.
        await kudos.consume_hold(session, request.id, charge.amount)
    ended = job_ended(horde, generation, worker, request, "completed")
    # The settlement's rows in one go (one statement on PostgreSQL): the ledger's, the usage
    # history's and the assignment record's, then the job's three rows as Core updates of what
    # changed (they are locked since the job's read). Nothing in this transaction reads them back.
    settled = ((generation, _STORED), (worker, _WORKER_TOTALS), (request, _REQUEST_SETTLED))
    await write_all_changes(session, settled, first=[*charge.ledger, used, *([ended] if ended else [])])
    horde.notifier.on_commit(session, request.id, remote=request.waited)
    log.info(
        "generation submitted generation=%s request=%s worker=%s tokens=%d reward=%.2f",
        generation.id, request.id, worker.id, tokens, reward,
    )  # fmt: skip
    return Stored(reward, webhook.delivery(request, generation, worker, reward))


@dataclass(frozen=True, slots=True)
class Submitted:
    reward: float  # 0 for a fault and for a paused worker's fake job


async def submit_job(horde: Horde, caller: Caller, body: SubmitInput) -> Submitted:
    """POST /generate/text/submit: the submit as the job's lease holder (a lapse of the job is
    honoured first). Its webhook is queued once the submit has committed, never waited for."""
    stored = await as_lease_holder(
        horde, caller, lambda session, apikey: submit(session, horde, apikey, body)
    )
    if stored.webhook is not None:
        horde.webhooks.send(stored.webhook)
    return Submitted(reward=stored.reward)
