"""Teams (upstream's): a name under which workers pool their figures. Trusted users and moderators
create them (upstream's rule), up to `[teams] max_per_user` each; the creator or a moderator changes
or deletes one; a worker's owner joins it to any team (PUT /workers/{id} `team`, accounts/workers.py).
A team's figures are its live workers' usage history (`team_stats`), so a worker that leaves takes
its own along;
a deleted team's workers leave it, and a deleted worker leaves its team."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass

from sqlalchemy import bindparam, case, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from horde_lite.accounts import owner_limits
from horde_lite.accounts.users import authenticate_user, display_name
from horde_lite.accounts.workers import clean_name, effective_speed, worker_name_key
from horde_lite.core.context import Caller, Horde
from horde_lite.core.errors import HordeError
from horde_lite.db.models import Team, User, Worker
from horde_lite.inputs import CreateTeamInput, ModifyTeamInput
from horde_lite.operators import usage
from horde_lite.rc import Rc

SHORTEST_NAME = 3  # upstream's


@dataclass(frozen=True, slots=True)
class TeamStats:
    """What a team's workers have done, summed."""

    contributions: int  # tokens generated
    requests_fulfilled: int  # jobs completed
    kudos: float  # earned by its workers
    uptime: int  # seconds from each worker's first pop to its last


NO_STATS = TeamStats(contributions=0, requests_fulfilled=0, kudos=0.0, uptime=0)

_UPTIME = case(
    (Worker.last_check_in > Worker.created_at, Worker.last_check_in - Worker.created_at), else_=0.0
)
_MEMBERS = select(Worker.team_id, Worker.id, _UPTIME).where(
    Worker.team_id.in_(bindparam("team_ids", expanding=True)), Worker.deleted_at.is_(None)
)


async def team_stats(session: AsyncSession, team_ids: list[str]) -> dict[str, TeamStats]:
    """Each team's figures: its live workers' work from the usage history, and their uptime (two
    statements for any number of teams; a team without workers is absent: NO_STATS)."""
    if not team_ids:
        return {}
    members = (await session.execute(_MEMBERS, {"team_ids": team_ids})).all()
    done = await usage.worker_totals(session, [worker_id for _, worker_id, _ in members])
    sums: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for team_id, worker_id, uptime in members:
        figures, worker = sums[team_id], done.get(worker_id, usage.Totals())
        figures[0] += worker.tokens
        figures[1] += worker.jobs
        figures[2] += worker.kudos_earned
        figures[3] += float(uptime or 0)
    return {
        team_id: TeamStats(int(tokens), int(jobs), round(kudos, 2), int(uptime))
        for team_id, (tokens, jobs, kudos, uptime) in sums.items()
    }


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    name: str
    online: bool
    speed: float  # the measured lease speed, or the assumed one


@dataclass(frozen=True, slots=True)
class TeamRecord:
    team: Team
    creator: str  # "name#id"
    stats: TeamStats
    members: list[Member]  # live workers, by name
    models: dict[str, int]  # model -> how many members serve it

    @property
    def online_speeds(self) -> list[float]:
        return [m.speed for m in self.members if m.online]


@dataclass(frozen=True, slots=True)
class DeletedTeam:
    id: str
    name: str


def _not_found(team_id: str) -> HordeError:
    return HordeError(Rc.TeamNotFound, f"Team with ID {team_id[:64]!r} not found.")


async def find_team(session: AsyncSession, team_id: str, *, lock: bool = False, share: bool = False) -> Team:
    """A team by id (anything that is not an id finds nothing). `lock`: FOR UPDATE (its change or
    deletion); `share`: FOR SHARE (a worker joining it, so a concurrent deletion waits or wins)."""
    team = None
    if len(team_id) <= 36 and "\x00" not in team_id:
        locking = {"read": True} if share else (True if lock else None)
        team = await session.get(Team, team_id, with_for_update=locking, populate_existing=bool(locking))
    if team is None:
        raise _not_found(team_id)
    return team


async def _records(horde: Horde, session: AsyncSession, teams: list[Team]) -> list[TeamRecord]:
    """The records of `teams`, in three statements however many there are."""
    ids = [t.id for t in teams]
    stats = await team_stats(session, ids)
    owners = select(User.id, User).where(User.id.in_({t.owner_id for t in teams}))
    creators = dict((await session.execute(owners)).tuples().all())
    members: dict[str, list[Member]] = defaultdict(list)
    models: dict[str, Counter[str]] = defaultdict(Counter)
    if ids:
        now = horde.clock.now()
        online_since = now - horde.settings.worker.online_seconds
        rows = await session.execute(
            select(Worker.team_id, Worker.id, Worker.name, Worker.last_check_in, Worker.lease_speed)
            .add_columns(Worker.models)
            .where(Worker.team_id.in_(ids), Worker.deleted_at.is_(None))
            .order_by(Worker.name, Worker.id)
        )
        for team_id, worker_id, name, check_in, lease_speed, served in rows:
            speed = effective_speed(lease_speed, horde.settings)
            members[team_id].append(Member(worker_id, name, check_in >= online_since, speed))
            models[team_id].update(dict.fromkeys(served or (), 1))
    return [
        TeamRecord(
            team=t,
            creator=display_name(creators[t.owner_id]),
            stats=stats.get(t.id, NO_STATS),
            members=members[t.id],
            models=dict(sorted(models[t.id].items())),
        )
        for t in teams
    ]


async def list_teams(horde: Horde) -> list[TeamRecord]:
    """GET /teams: every team, oldest first."""
    async with horde.reading() as session:
        teams = list((await session.execute(select(Team).order_by(Team.created_at, Team.id))).scalars())
        return await _records(horde, session, teams)


async def team_by_id(horde: Horde, team_id: str) -> TeamRecord:
    """GET /teams/{id}."""
    async with horde.reading() as session:
        team = await find_team(session, team_id)
        return (await _records(horde, session, [team]))[0]


async def _name_is_free(session: AsyncSession, name: str, key: str, team: Team | None = None) -> None:
    taken = (await session.execute(select(Team.id).where(Team.name_key == key))).scalar_one_or_none()
    if taken is not None and (team is None or taken != team.id):
        raise HordeError(Rc.TeamNameAlreadyExists, f"The team name {name!r} is already taken.")


async def _written(session: AsyncSession, name: str) -> None:
    """Flush in a savepoint: a name another transaction took meanwhile is refused by name."""
    try:
        async with session.begin_nested():
            await session.flush()
    except IntegrityError:
        raise HordeError(Rc.TeamNameAlreadyExists, f"The team name {name!r} is already taken.") from None


async def create_team(horde: Horde, caller: Caller, body: CreateTeamInput) -> Team:
    """POST /teams: a trusted user or a moderator, within its limit of teams. Who may is checked
    before the name, as upstream."""
    now = horde.clock.now()
    async with horde.transaction() as session:
        owner = await authenticate_user(session, caller.apikey, now)
        if owner.anonymous:
            raise HordeError(Rc.AnonForbidden, "The anonymous user cannot create teams; use your key.")
        if not (owner.trusted or owner.moderator):
            raise HordeError(Rc.UntrustedTeamCreation, "Only trusted users and moderators can create teams.")
        name = clean_name(body.name, "team", SHORTEST_NAME)
        key = worker_name_key(name)
        await owner_limits.room_for_a_team(session, horde.settings, owner)
        await _name_is_free(session, name, key)
        team = Team(id=str(uuid.uuid4()), name=name, name_key=key, info=body.info or "", owner_id=owner.id,
                    created_at=now)  # fmt: skip
        session.add(team)
        await _written(session, name)
        return team


def _creator_or_moderator(actor: User, team: Team, rc: Rc, what: str) -> None:
    if actor.id != team.owner_id and not actor.moderator:
        raise HordeError(rc, f"Only the team's creator or a moderator can {what}.")


async def modify_team(horde: Horde, caller: Caller, team_id: str, body: ModifyTeamInput) -> Team:
    """PATCH /teams/{id}: its creator or a moderator (upstream's codes: NotOwner for the info,
    NotModerator for the name). Every permission is checked before anything changes."""
    async with horde.transaction() as session:
        team = await find_team(session, team_id, lock=True)
        actor = await authenticate_user(session, caller.apikey, horde.clock.now())
        if body.info is not None:
            _creator_or_moderator(actor, team, Rc.NotOwner, "change its info")
        if body.name is not None:
            _creator_or_moderator(actor, team, Rc.NotModerator, "rename it")
        if body.info is None and body.name is None:
            raise HordeError(Rc.NoTeamModSelected, "No team modification selected.")
        if body.info is not None:
            team.info = body.info
        if body.name is not None:
            name = clean_name(body.name, "team", SHORTEST_NAME)
            key = worker_name_key(name)
            await _name_is_free(session, name, key, team)
            team.name, team.name_key = name, key
        await _written(session, team.name)
        return team


async def delete_team(horde: Horde, caller: Caller, team_id: str) -> DeletedTeam:
    """DELETE /teams/{id}: its creator or a moderator. Its workers leave it first, in the same
    transaction. The team's row is locked before that, so a worker joining it meanwhile (which reads
    it FOR SHARE) either joined before and is taken out, or finds it gone."""
    async with horde.transaction() as session:
        team = await find_team(session, team_id, lock=True)
        actor = await authenticate_user(session, caller.apikey, horde.clock.now())
        _creator_or_moderator(actor, team, Rc.NotModerator, "delete it")
        deleted = DeletedTeam(id=team.id, name=team.name)
        leaving = update(Worker).where(Worker.team_id == team.id).values(team_id=None)
        await session.execute(leaving.execution_options(synchronize_session=False))
        await session.execute(delete(Team).where(Team.id == team.id))
        return deleted
