"""GET /v1/models (and /v1/models/{id}): the models at least one online chat worker serves."""

from __future__ import annotations

from litestar import get
from litestar.params import FromPath

from horde_lite.api.deps import CallerDep, HordeDep
from horde_lite.api.openai.schemas import Model, ModelList
from horde_lite.core.errors import HordeError
from horde_lite.operators.catalogue import list_chat_models
from horde_lite.rc import Rc


async def _listed(horde: HordeDep, caller: CallerDep) -> list[Model]:
    return [Model(id=name, created=int(created)) for name, created in await list_chat_models(horde, caller)]


@get("/models")
async def list_models(horde: HordeDep, caller: CallerDep) -> ModelList:
    return ModelList(data=await _listed(horde, caller))


@get("/models/{model:path}")
async def show_model(model: FromPath[str], horde: HordeDep, caller: CallerDep) -> Model:
    name = model.lstrip("/")
    for listed in await _listed(horde, caller):
        if listed.id == name:
            return listed
    raise HordeError(Rc.ModelNotFound, f"No online chat worker serves the model {name!r}.", param="model")


HANDLERS = [list_models, show_model]
