"""A text request made with the real horde-sdk, in a process of its own (it reads the horde's URL
once, at import, from AI_HORDE_URL, so one test process cannot point it at two servers): for the
real-model test and bench/real_model.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass

_CLIENT = """
import json, os, time
from horde_sdk.ai_horde_api.ai_horde_clients import AIHordeAPIManualClient
from horde_sdk.ai_horde_api.apimodels import (
    ModelGenerationInputKobold, TextGenerateAsyncRequest, TextGenerateAsyncResponse,
    TextGenerateStatusRequest, TextGenerateStatusResponse,
)
client = AIHordeAPIManualClient()
asked = TextGenerateAsyncRequest(
    apikey=os.environ["SDK_KEY"], prompt=os.environ["SDK_PROMPT"], models=[os.environ["SDK_MODEL"]],
    params=ModelGenerationInputKobold(max_length=int(os.environ["SDK_MAX_LENGTH"]), n=1, temperature=0.01),
)
created = client.submit_request(asked, TextGenerateAsyncResponse)
deadline = time.time() + float(os.environ["SDK_PATIENCE"])
while True:
    status = client.submit_request(TextGenerateStatusRequest(id=created.id_), TextGenerateStatusResponse)
    if status.done or status.faulted or time.time() > deadline:
        break
    time.sleep(0.1)
texts = [g.text for g in status.generations]
print(json.dumps({"id": str(created.id_), "done": status.done, "texts": texts}))
"""


@dataclass(frozen=True)
class SdkAnswer:
    request_id: str
    done: bool
    texts: list[str]


def sdk_text(
    horde_url: str, key: str, model: str, prompt: str, max_length: int, patience: float
) -> SdkAnswer:
    """Create a text request through the horde-sdk and poll it until done (or `patience` s)."""
    base = f"{horde_url.rstrip('/')}/api/"  # the trailing slash matters to the horde-sdk
    env = {
        **os.environ, "AI_HORDE_URL": base, "AI_HORDE_DEV_URL": base, "SDK_KEY": key, "SDK_MODEL": model,
        "SDK_PROMPT": prompt, "SDK_MAX_LENGTH": str(max_length), "SDK_PATIENCE": str(patience),
    }  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-c", _CLIENT], capture_output=True, text=True, timeout=patience + 60, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"the horde-sdk client failed: {result.stderr[-2000:]}")
    answer = json.loads(result.stdout.strip().splitlines()[-1])
    return SdkAnswer(answer["id"], answer["done"], answer["texts"])
