"""A flagged user: one a moderator suspects of abuse (PUT /users/{id} `{"flagged": true}`), held
apart from the horde's economy as upstream does, without deleting it. Every effect is decided here
and applied where the horde already decides: its workers are refused at the pop (no job), a job they
held before earns nothing at the submit, its requests queue behind everyone's at admission, and
kudos neither leave nor reach it (transfers and awards). The anonymous user is never flagged."""

from __future__ import annotations

from horde_lite.core.errors import HordeError
from horde_lite.db.models import User
from horde_lite.rc import Rc

# Upstream's queue priority of a flagged user's requests: a thousandth of its kudos when it holds
# more than 10, else a fixed penalty that puts them behind a zero-kudos requester's (100 kudos of
# priority is 20 s of waiting, so the penalty is a 20 s handicap that ageing makes up).
FLAGGED_KUDOS_DIVISOR = 1000
FLAGGED_MIN_KUDOS = 10
FLAGGED_PENALTY = -100.0


def flaggable(user: User) -> None:
    """Flagging the anonymous user (everyone without a key) would stop everyone: refused."""
    if user.anonymous:
        raise HordeError(Rc.BadRequest, "The anonymous user cannot be flagged.", param="flagged")


def refuse_worker(owner: User) -> None:
    """A pop of a flagged user's worker: no job (upstream's answer, 403 WorkerFlaggedMaintenance)."""
    if owner.flagged:
        raise HordeError(
            Rc.WorkerFlaggedMaintenance,
            "This worker's owner has been flagged by the horde's moderators for suspicious activity: "
            "its workers get no jobs. Contact the moderators.",
        )


def reward(owner: User, earned: float) -> float:
    """What the owner of the worker that did a job earns: nothing while flagged (the requester then
    pays only the burn)."""
    return 0.0 if owner.flagged else earned


def request_priority(user: User) -> float:
    """A new request's queue priority: the requester's kudos, clamped at 0 (the anonymous
    account's balance goes negative as its jobs are charged); a flagged requester's is upstream's,
    a thousandth of its kudos above 10, else a penalty that queues it behind everyone's."""
    if not user.flagged:
        return max(user.kudos, 0.0)
    if user.kudos > FLAGGED_MIN_KUDOS:
        return float(round(user.kudos / FLAGGED_KUDOS_DIVISOR))
    return FLAGGED_PENALTY


def refuse_transfer(source: User, dest: User) -> None:
    """Kudos sent by, or to, a flagged user (upstream's codes and order: the sender first)."""
    if source.flagged:
        raise HordeError(
            Rc.SourceAccountFlagged,
            "Your account has been flagged for suspicious activity: it cannot transfer kudos. "
            "Contact the moderators.",
        )
    if dest.flagged:
        raise HordeError(
            Rc.TargetAccountFlagged,
            "The receiving account has been flagged for suspicious activity: kudos cannot be sent to it.",
        )


def refuse_award(dest: User) -> None:
    """Kudos awarded to a flagged user (upstream rejects the target)."""
    if dest.flagged:
        raise HordeError(
            Rc.TargetAccountFlagged,
            "This user has been flagged for suspicious activity: kudos cannot be awarded to it.",
        )
