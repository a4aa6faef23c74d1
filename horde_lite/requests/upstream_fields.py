"""Upstream's text request fields beyond the queue's own choices (GenerationInputKobold): what
horde_lite does with each, so that none is dropped silently.

- Honoured: `webhook` (checked here by webhooks/targets.py, kept with the request, POSTed for each
  finished generation by webhooks/delivery.py) and `disable_batching` (a pop takes one job of the
  request at a time; upstream's rule: a request of more than one job may disable batching only when
  its requester is trusted, here a moderator too).
- Accepted either way, as nothing in horde_lite distinguishes what they ask: `validated_backends`
  (horde_lite keeps no list of validated backends: every worker's backend counts as one) and
  `extra_slow_workers` (no worker declares itself extra slow; upstream reads it only for images).
- Accepted only at upstream's default, what clients send, and refused by name otherwise:
  `softprompt`, `style`, `extra_source_images` (400 BadRequest, with the reason) and
  `proxied_account` (upstream's 400 OnlyServiceAccountProxy: horde_lite has no service accounts).
"""

from __future__ import annotations

from horde_lite.core.errors import HordeError
from horde_lite.db.models import User
from horde_lite.inputs import TextRequestInput
from horde_lite.rc import Rc
from horde_lite.settings import WebhookSettings
from horde_lite.webhooks.targets import check_url

# Each refused field and why, in the refusal's words.
REFUSED_FIELDS: dict[str, str] = {
    "softprompt": (
        "is not served: horde_lite's workers run no KoboldAI softprompts; send null or leave it out"
    ),
    "style": "names a style, and horde_lite has none; send the prompt, params and models themselves",
    "extra_source_images": (
        "is refused: a text request takes no images (upstream refuses them on text too); a chat "
        "payload's messages may carry images"
    ),
}


def _sent(body: TextRequestInput, name: str) -> bool:
    """Whether a refused field holds something other than upstream's default (null; for
    `extra_source_images`, an empty list too)."""
    value = getattr(body, name)
    return value is not None and not (name == "extra_source_images" and value == [])


def checked_webhook(body: TextRequestInput, settings: WebhookSettings) -> str | None:
    """Refuse by name what horde_lite cannot do; return the webhook URL the request keeps (None:
    none). Needs no database: called before the request's transaction."""
    sent = [name for name in REFUSED_FIELDS if _sent(body, name)]
    if sent:
        reasons = "; ".join(f"`{name}` {REFUSED_FIELDS[name]}" for name in sent)
        raise HordeError(
            Rc.BadRequest, f"{reasons}.", param=sent[0], errors={name: REFUSED_FIELDS[name] for name in sent}
        )
    if body.proxied_account is not None and body.proxied_account != "":
        raise HordeError(
            Rc.OnlyServiceAccountProxy,
            "Only service accounts can provide a proxied_account value, and horde_lite has none.",
            param="proxied_account",
        )
    return None if body.webhook is None else check_url(body.webhook, settings)


def batching_disabled(body: TextRequestInput, requester: User, n: int) -> bool:
    """Whether the request's pops take one job at a time. Upstream's rule: for more than one job,
    only a trusted requester may ask it (each pop then hands out less work)."""
    if body.disable_batching and n > 1 and not (requester.trusted or requester.moderator):
        raise HordeError(
            Rc.RequiresTrust,
            "Only trusted users can set disable_batching on a request of more than one job.",
            param="disable_batching",
        )
    return body.disable_batching
