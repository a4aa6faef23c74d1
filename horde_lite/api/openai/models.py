"""GET /v1/models (and /v1/models/{id}): the models at least one online chat worker serves."""

from __future__ import annotations

from typing import Any

from litestar import Request, get
from litestar.params import FromPath

from horde_lite.api.common import apikey_of, horde_of, transaction
from horde_lite.lifecycle.catalogue import chat_models
from horde_lite.lifecycle.errors import HordeError
from horde_lite.lifecycle.users import authenticate

Req = Request[Any, Any, Any]
OWNER = "horde_lite"


def _model(name: str, created: float) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": int(created), "owned_by": OWNER}


async def _listed(request: Req) -> list[tuple[str, float]]:
    horde = horde_of(request)
    async with transaction(horde) as session:
        key = apikey_of(request)
        if key:  # a wrong key is a 401 here too, so a client's "check connection" tells the truth
            await authenticate(session, key, horde.clock.now())
        return await chat_models(session, horde)


@get("/v1/models")
async def list_models(request: Req) -> dict[str, Any]:
    return {"object": "list", "data": [_model(name, created) for name, created in await _listed(request)]}


@get("/v1/models/{model:path}")
async def show_model(request: Req, model: FromPath[str]) -> dict[str, Any]:
    name = model.lstrip("/")
    for listed, created in await _listed(request):
        if listed == name:
            return _model(listed, created)
    raise HordeError("ModelNotFound", f"No online chat worker serves the model {name!r}.", param="model")


HANDLERS = [list_models, show_model]
