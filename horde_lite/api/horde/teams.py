"""/teams: the public team records; POST (trusted users and moderators), PATCH and DELETE (the
team's creator or a moderator). A worker joins a team through PUT /workers/{id} `team`."""

from __future__ import annotations

from litestar import delete, get, patch, post
from litestar.params import FromPath, JSONBody

from horde_lite.accounts import teams
from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.horde.schemas import (
    ActiveModelLite,
    CreateTeamInput,
    DeletedTeam,
    ModifyTeam,
    ModifyTeamInput,
    TeamDetails,
    WorkerDetailsLite,
)
from horde_lite.db.models import Team


def team_details(found: teams.TeamRecord) -> TeamDetails:
    t, stats, speeds = found.team, found.stats, found.online_speeds
    members = [WorkerDetailsLite(type="text", name=m.name, id=m.id, online=m.online) for m in found.members]
    return TeamDetails(
        name=t.name, id=t.id, info=t.info or None, creator=found.creator, worker_count=len(members),
        workers=members,
        models=[ActiveModelLite(name=name, count=count) for name, count in found.models.items()],
        contributions=stats.contributions, requests_fulfilled=stats.requests_fulfilled, kudos=stats.kudos,
        uptime=stats.uptime, performance=round(sum(speeds) / len(speeds), 1) if speeds else 0.0,
        total_speed=round(sum(speeds), 1),
    )  # fmt: skip


def modify_team(team: Team) -> ModifyTeam:
    return ModifyTeam(id=team.id, name=team.name, info=team.info or None)


@get("/teams")
async def list_teams(horde: HordeDep) -> list[TeamDetails]:
    """Every team, oldest first."""
    return [team_details(t) for t in await teams.list_teams(horde)]


@post("/teams", status_code=200)
async def create_team(data: JSONBody[CreateTeamInput], horde: HordeDep, caller: CallerDep) -> ModifyTeam:
    return modify_team(await teams.create_team(horde, caller, data))


@get("/teams/{team_id:str}")
async def show_team(horde: HordeDep, team_id: FromPath[str]) -> TeamDetails:
    return team_details(await teams.team_by_id(horde, team_id))


@patch("/teams/{team_id:str}")
async def change_team(
    data: JSONBody[ModifyTeamInput], horde: HordeDep, caller: CallerDep, team_id: FromPath[str]
) -> ModifyTeam:
    return modify_team(await teams.modify_team(horde, caller, team_id, data))


@delete("/teams/{team_id:str}", status_code=200)
async def delete_team(horde: HordeDep, caller: CallerDep, team_id: FromPath[str]) -> DeletedTeam:
    found = await teams.delete_team(horde, caller, team_id)
    return DeletedTeam(deleted_id=found.id, deleted_name=found.name)


HANDLERS = [list_teams, create_team, show_team, change_team, delete_team]
