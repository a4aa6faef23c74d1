"""Each face's router carries its own exception handlers; the app's answer only what no router's
route matched, picking the face by the path."""

from __future__ import annotations

from typing import Any

from litestar import Litestar, Request

from horde_lite.api.errors import HORDE_HANDLERS, OPENAI_HANDLERS, UNROUTED_HANDLERS
from horde_lite.api.horde import router as horde_router
from horde_lite.api.openai import router as openai_router
from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc


def _request(path: str) -> Request[Any, Any, Any]:
    scope: Any = {"type": "http", "method": "GET", "path": path, "headers": [], "query_string": b"",
                  "app": Litestar(), "server": ("test", 80), "scheme": "http", "root_path": ""}  # fmt: skip
    return Request(scope)


def _body(handlers: Any, path: str) -> Any:
    refusal = HordeError(Rc.ModelNotFound, "no such model", param="model")
    answer = handlers[HordeError](_request(path), refusal)
    assert answer.status_code == 404
    return answer.content


def test_each_faces_router_carries_its_handlers() -> None:
    assert horde_router.exception_handlers == HORDE_HANDLERS
    assert openai_router.exception_handlers == OPENAI_HANDLERS


def test_the_face_is_the_routers_not_the_paths() -> None:
    horde = {"message": "no such model", "rc": "ModelNotFound"}
    openai = {"error": {"message": "no such model", "type": "invalid_request_error", "param": "model",
                        "code": "model_not_found"}}  # fmt: skip
    assert _body(HORDE_HANDLERS, "/v1/chat/completions") == horde
    assert _body(OPENAI_HANDLERS, "/api/v2/generate/text/async") == openai
    # The fallback (a 404 or 405 no router saw) goes by the path's prefix.
    assert _body(UNROUTED_HANDLERS, "/v1/nowhere") == openai
    assert _body(UNROUTED_HANDLERS, "/api/v2/nowhere") == horde
