"""What one user can do to the others is bounded by the user, never by the names it picks: its
workers' failures put all its workers in maintenance for a cool-down, and the workers, shared
keys, teams and unexpired worker messages it may hold are counted (docs/reference/horde_api.md,
"Owners, not names")."""

from __future__ import annotations

import time

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.core.errors import HordeError
from horde_lite.core.modes import MODES_OFF, HordeModes, refuse_new_worker
from horde_lite.db.models import SharedKey, Team, User, Worker, WorkerMessage
from horde_lite.rc import Rc
from horde_lite.settings import Settings

# A worker put in maintenance by the failure rule says so, and when its owner may lift it.
FAILURE_MESSAGE = (
    "Put into maintenance automatically: this user's workers failed {count} jobs within {window:g} "
    "seconds. The owner may lift it (PUT /api/v2/workers/{{id}}) after {until} UTC."
)


def cooling(owner: User, now: float) -> bool:
    """The owner's workers are held in maintenance by the failure rule until its cool-down ends."""
    return owner.failure_cooldown_until > now


def _utc(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(seconds))


def failure_message(owner: User, settings: Settings) -> str:
    rule = settings.worker
    return FAILURE_MESSAGE.format(
        count=rule.owner_failure_limit,
        window=rule.owner_failure_window_seconds,
        until=_utc(owner.failure_cooldown_until),
    )


# The owner's other live workers not yet in maintenance, those another transaction holds skipped:
# waiting for them here, after the users row, could deadlock with a pop or submit holding one.
# A skipped worker is put in maintenance by its own next check-in (`hold_in_maintenance`).
_OTHERS = (
    select(Worker.id)
    .where(
        Worker.owner_id == bindparam("of_owner"),
        Worker.id != bindparam("failed_worker"),
        Worker.deleted_at.is_(None),
        Worker.maintenance.is_(False),
    )
    .with_for_update(skip_locked=True)
)
_INTO_MAINTENANCE = (
    update(Worker)
    .where(Worker.id.in_(_OTHERS.scalar_subquery()))
    .values(maintenance=True, maintenance_msg=bindparam("message_text"))
    .execution_options(synchronize_session=False)
)


async def note_failure(session: AsyncSession, settings: Settings, worker: Worker, now: float) -> None:
    """A real job of `worker` faulted or lapsed (the caller holds the worker's row). Counted
    against its owner in a sliding window; at the limit the owner's workers go into maintenance
    for the cool-down and the count starts again. The owner's users row is locked after the worker's
    (docs/explanation/locking.md)."""
    rule = settings.worker
    if rule.owner_failure_limit <= 0:
        return
    owner = await session.get(User, worker.owner_id, with_for_update=True, populate_existing=True)
    if owner is None:
        return
    since = now - rule.owner_failure_window_seconds
    recent = [t for t in owner.recent_failures or () if since < t <= now]
    recent.append(now)
    if len(recent) < rule.owner_failure_limit:
        owner.recent_failures = recent  # a new list: a change
        return
    owner.recent_failures = []
    owner.failure_cooldown_until = now + rule.owner_failure_cooldown_seconds
    message = failure_message(owner, settings)
    worker.maintenance, worker.maintenance_msg = True, message
    values = {"of_owner": owner.id, "failed_worker": worker.id, "message_text": message}
    await session.execute(_INTO_MAINTENANCE, values)


def hold_in_maintenance(worker: Worker, owner: User, settings: Settings, now: float) -> bool:
    """At a check-in: a worker of an owner in its cool-down goes (back) into maintenance. True when
    it changed the worker."""
    if worker.maintenance or not cooling(owner, now):
        return False
    worker.maintenance, worker.maintenance_msg = True, failure_message(owner, settings)
    return True


def refuse_early_lift(owner: User, now: float) -> None:
    """The owner lifting maintenance while the cool-down runs (a moderator may: `end_cooldown`)."""
    if cooling(owner, now):
        raise HordeError(
            Rc.WorkerMaintenance,
            "This user's workers are in maintenance after failing too many jobs; the owner may lift "
            f"it after {_utc(owner.failure_cooldown_until)} UTC.",
        )


def _limit(user: User, plain: int, trusted: int) -> int:
    """The limit that applies to `user`: trusted users and moderators get `trusted`; 0 is none."""
    return trusted if (user.trusted or user.moderator) else plain


async def lock_user(session: AsyncSession, user: User) -> None:
    """Serialize one user's creations on its users row, so two cannot both take the last place."""
    await session.execute(select(User.id).where(User.id == user.id).with_for_update())


_LIVE_WORKERS = select(func.count(Worker.id)).where(
    Worker.owner_id == bindparam("owner_id"), Worker.deleted_at.is_(None)
)
_SHARED_KEYS = select(func.count(SharedKey.key_hash)).where(SharedKey.user_id == bindparam("owner_id"))
_TEAMS = select(func.count(Team.id)).where(Team.owner_id == bindparam("owner_id"))
_ACTIVE_MESSAGES = select(func.count(WorkerMessage.id)).where(
    WorkerMessage.user_id == bindparam("owner_id"), WorkerMessage.expires_at > bindparam("now")
)


async def room_for_a_worker(
    session: AsyncSession, settings: Settings, owner: User, modes: HordeModes = MODES_OFF
) -> None:
    """Before a first pop creates a worker: the owner's live workers must be under its limit, and
    within its invitation when a horde mode asks for one (core/modes.py). The caller holds the
    owner's users row (`lock_user`)."""
    rule = settings.worker
    limit = _limit(owner, rule.max_per_user, rule.max_per_trusted_user)
    if limit <= 0 and not (modes.invite_only or modes.raid):
        return
    count = (await session.execute(_LIVE_WORKERS, {"owner_id": owner.id})).scalar_one()
    refuse_new_worker(modes, owner, count)
    if limit <= 0:
        return
    # A moderator's `worker_invited` (PUT /users/{id}) raises this user's limit, never lowers it.
    limit = max(limit, owner.worker_invited)
    if count >= limit:
        raise HordeError(
            Rc.TooManyWorkers,
            f"This user already has {count} workers (limit {limit}); delete one "
            "(DELETE /api/v2/workers/{id}) before a new name can pop.",
        )


async def room_for_a_shared_key(session: AsyncSession, settings: Settings, owner: User) -> None:
    """Before a shared key is created: the owner's keys must be under its limit."""
    rule = settings.sharedkeys
    limit = _limit(owner, rule.max_per_user, rule.max_per_trusted_user)
    if limit <= 0:
        return
    await lock_user(session, owner)
    count = (await session.execute(_SHARED_KEYS, {"owner_id": owner.id})).scalar_one()
    if count >= limit:
        raise HordeError(
            Rc.TooManySharedKeys,
            f"This user already has {count} shared keys (limit {limit}); delete one first.",
        )


async def room_for_a_team(session: AsyncSession, settings: Settings, owner: User) -> None:
    """Before a team is created: the teams the owner created must be under `[teams] max_per_user`
    (only trusted users and moderators create teams: one limit)."""
    limit = settings.teams.max_per_user
    if limit <= 0:
        return
    await lock_user(session, owner)
    count = (await session.execute(_TEAMS, {"owner_id": owner.id})).scalar_one()
    if count >= limit:
        raise HordeError(
            Rc.TooManyTeams,
            f"This user already created {count} teams (limit {limit}); delete one "
            "(DELETE /api/v2/teams/{id}) first.",
        )


async def room_for_a_message(session: AsyncSession, settings: Settings, sender: User, now: float) -> None:
    """Before a user who is not a moderator sends a worker message: its unexpired ones must be under
    `[messages] max_active_per_user`. Each is read at every pop of its worker until it expires, and
    up to 10240 characters: without a limit one user could fill its workers' pops and the table."""
    limit = settings.messages.max_active_per_user
    if limit <= 0 or sender.moderator:
        return
    await lock_user(session, sender)
    count = (await session.execute(_ACTIVE_MESSAGES, {"owner_id": sender.id, "now": now})).scalar_one()
    if count >= limit:
        raise HordeError(
            Rc.TooManyMessages,
            f"This user already has {count} unexpired worker messages (limit {limit}); delete one "
            "(DELETE /api/v2/workers/messages/{id}) or wait for one to expire.",
        )
