"""The `rc` codes: every error code the server answers with (upstream AI Horde's spelling, kept
exact on the wire), each with upstream's HTTP status for it. The lifecycle raises them
(`lifecycle.errors.HordeError`), each face shapes them (`api.errors`), the worker reads them."""

from __future__ import annotations

from enum import StrEnum
from typing import Self


class Rc(StrEnum):
    """Every `rc` code on the wire (the member's value, upstream's spelling) and its HTTP status.
    A raise site names a member, so a code without a status cannot be written."""

    status: int

    def __new__(cls, value: str, status: int) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.status = status
        return member

    BadRequest = "BadRequest", 400
    # Workers, users and kudos transfers (upstream's codes, 400 as upstream's validation errors).
    NoWorkerModSelected = "NoWorkerModSelected", 400
    WorkerNameAlreadyExists = "WorkerNameAlreadyExists", 400
    NoValidActions = "NoValidActions", 400
    KudosTransferFromAnon = "KudosTransferFromAnon", 400
    KudosTransferToAnon = "KudosTransferToAnon", 400
    KudosTransferToSelf = "KudosTransferToSelf", 400
    NegativeKudosTransfer = "NegativeKudosTransfer", 400
    InvalidKudosTransferAmount = "InvalidKudosTransferAmount", 400
    KudosTransferNotEnough = "KudosTransferNotEnough", 400
    InvalidTargetUsername = "InvalidTargetUsername", 400
    KudosLimit = "KudosLimit", 400
    # The horde's modes (upstream's codes and statuses): PUT /status/modes naming no mode, and a new
    # request while the horde is in maintenance (upstream answers it 400; the /v1 face 503).
    NoHordeModSelected = "NoHordeModSelected", 400
    MaintenanceMode = "MaintenanceMode", 400
    # A kudos transfer or award touching a flagged user (upstream's codes).
    SourceAccountFlagged = "SourceAccountFlagged", 400
    TargetAccountFlagged = "TargetAccountFlagged", 400
    # Teams (upstream's codes; TooManyTeams is horde_lite's, as TooManyWorkers).
    TeamNameAlreadyExists = "TeamNameAlreadyExists", 400
    NoTeamModSelected = "NoTeamModSelected", 400
    UntrustedTeamCreation = "UntrustedTeamCreation", 403
    NotOwner = "NotOwner", 403
    TooManyTeams = "TooManyTeams", 403
    # Prompt filters (upstream's codes): a prompt a filter refuses, a PATCH naming nothing to change.
    CorruptPrompt = "CorruptPrompt", 400
    NoFilterModSelected = "NoFilterModSelected", 400
    # A new user's name (upstream's codes; an empty or hostile name is a BadRequest).
    TooLongUserName = "TooLongUserName", 400
    NameAlreadyExists = "NameAlreadyExists", 400
    # Moderators' user actions (upstream's codes): awarding kudos, deleting a user.
    InvalidAwardUsername = "InvalidAwardUsername", 400
    KudosAwardToAnon = "KudosAwardToAnon", 400
    TeamNotFound = "TeamNotFound", 404
    MissingPrompt = "MissingPrompt", 400
    # A text request's upstream fields (requests/upstream_fields.py; upstream's codes).
    OnlyServiceAccountProxy = "OnlyServiceAccountProxy", 400
    RequiresTrust = "RequiresTrust", 400
    TokenOverflow = "TokenOverflow", 400
    ContextLengthExceeded = "ContextLengthExceeded", 400
    DuplicateGen = "DuplicateGen", 400
    AbortedGen = "AbortedGen", 400
    NotStreamingJob = "NotStreamingJob", 400
    ProgressTooLong = "ProgressTooLong", 400
    TooManyProgressPosts = "TooManyProgressPosts", 400
    GenerationTooLong = "GenerationTooLong", 400
    ClientDisconnected = "ClientDisconnected", 400
    InvalidAPIKey = "InvalidAPIKey", 401
    KudosUpfront = "KudosUpfront", 403
    SharedKeyInsufficientKudos = "SharedKeyInsufficientKudos", 403
    SharedKeyEmpty = "SharedKeyEmpty", 403
    SharedKeyExpired = "SharedKeyExpired", 403
    WrongCredentials = "WrongCredentials", 403
    AnonForbidden = "AnonForbidden", 403
    AnonForbiddenWorker = "AnonForbiddenWorker", 403
    AnonForbiddenUser = "AnonForbiddenUser", 403
    AnonForbiddenUserMod = "AnonForbiddenUserMod", 403
    NotUserOrMod = "NotUserOrMod", 403
    CannotDeleteMod = "CannotDeleteMod", 403
    NotAllowedAwards = "NotAllowedAwards", 403
    WorkerMaintenance = "WorkerMaintenance", 403
    # A flagged user's worker popping (upstream's code).
    WorkerFlaggedMaintenance = "WorkerFlaggedMaintenance", 403
    # Worker messages: a user's to another user's worker (upstream's code); more unexpired messages
    # than `[messages] max_active_per_user` (horde_lite's, as TooManyWorkers).
    MessagesOnlyOwnWorkers = "MessagesOnlyOwnWorkers", 403
    TooManyMessages = "TooManyMessages", 403
    TooManyWorkers = "TooManyWorkers", 403
    TooManySharedKeys = "TooManySharedKeys", 403
    TooManyFilters = "TooManyFilters", 403
    NotModerator = "NotModerator", 403
    # Switching maintenance (upstream's admins), a new worker under invite-only, an untrusted user's
    # new worker in raid mode.
    NotAdmin = "NotAdmin", 403
    WorkerInviteOnly = "WorkerInviteOnly", 403
    NotTrusted = "NotTrusted", 403
    # A model outside the shared key's or the user's allow-list (horde_lite's; accounts/limits.py).
    ModelNotAllowed = "ModelNotAllowed", 403
    Forbidden = "Forbidden", 403
    # A caller whose address a moderator put into timeout (upstream's code and status).
    TimeoutIP = "TimeoutIP", 403
    # Registration (horde_lite's own: upstream registers through OAuth pages).
    RegistrationClosed = "RegistrationClosed", 403
    InviteRequired = "InviteRequired", 403
    InviteRevoked = "InviteRevoked", 403
    InviteUsedUp = "InviteUsedUp", 403
    InviteExpired = "InviteExpired", 403
    RequestNotFound = "RequestNotFound", 404
    InvalidJobID = "InvalidJobID", 404
    UserNotFound = "UserNotFound", 404
    WorkerNotFound = "WorkerNotFound", 404
    SharedKeyNotFound = "SharedKeyNotFound", 404
    FilterNotFound = "FilterNotFound", 404
    # An unknown worker message: upstream spells it so (its ThingNotFound capitalizes
    # "WorkerMessage" into "Workermessage").
    WorkermessageNotFound = "WorkermessageNotFound", 404
    InviteNotFound = "InviteNotFound", 404
    ModelNotFound = "ModelNotFound", 404
    NotFound = "NotFound", 404
    MethodNotAllowed = "MethodNotAllowed", 405
    ProgressOutOfOrder = "ProgressOutOfOrder", 409
    RequestCancelled = "RequestCancelled", 410
    PayloadTooLarge = "PayloadTooLarge", 413
    # Deleting a user with work in flight (upstream's `Locked`, werkzeug's 423).
    Locked = "Locked", 423
    TooManyPrompts = "TooManyPrompts", 429
    RateLimited = "RateLimited", 429
    # The output tokens a key or user may reserve in a UTC day (horde_lite's; accounts/limits.py).
    DailyTokenLimit = "DailyTokenLimit", 429
    ProgressTooFast = "ProgressTooFast", 429
    InternalServerError = "InternalServerError", 500
    # An HTTP error of Litestar's that no code above names: answered with that error's own status.
    HTTPError = "HTTPError", 500
    WorkerFailed = "WorkerFailed", 502
    NoEligibleWorker = "NoEligibleWorker", 503
    QueueTimeout = "QueueTimeout", 503
    DatabaseUnavailable = "DatabaseUnavailable", 503
