"""KoboldCpp: legacy jobs go to its native `/api/v1/generate` with the Kobold parameters as they
are (nothing is dropped); chat jobs go to its OpenAI-compatible `/v1/chat/completions`."""

from __future__ import annotations

from typing import Any

import httpx

from horde_lite.worker.backends.base import BackendError, Completion, Discovered
from horde_lite.worker.backends.http import raise_for_status, translated
from horde_lite.worker.backends.openai import OpenAIBackend


class KoboldBackend(OpenAIBackend):
    kind = "kobold"

    async def _value(self, path: str) -> Any:
        answer = await self._json("GET", f"{self.root}/api/v1/{path}")
        return answer if isinstance(answer, dict) else {}

    async def discover(self, models: list[str]) -> Discovered:
        found = Discovered(models=list(models))
        name = (await self._value("model")).get("result")
        if isinstance(name, str) and name:
            self.backend_models = [name]
            found.models = found.models or [name.removeprefix("koboldcpp/")]
        context = (await self._value("config/max_context_length")).get("value")
        if isinstance(context, int) and context > 0:
            found.context = context
        # Its config/max_length is the UI's default reply length, not a limit: not read.
        found.source = "/api/v1/model, /api/v1/config" if found.context else "flags"
        return found

    async def healthy(self) -> bool:
        try:
            response = await self.http.get(f"{self.root}/api/v1/model", timeout=5.0)
        except httpx.HTTPError:
            return False
        return response.status_code < 500

    async def text(self, model: str, payload: dict[str, Any]) -> Completion:
        """Its native route's text; it says no counts."""
        body = {k: v for k, v in payload.items() if k != "n"}
        with translated("kobold generate"):
            response = await self.http.post(f"{self.root}/api/v1/generate", json=body)
            await raise_for_status(response, "kobold generate")
        try:
            return Completion(str(response.json()["results"][0]["text"]))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise BackendError(f"kobold generate: unexpected answer {response.text[:200]!r}") from e
