"""The two public faces: the horde API (/api/v2) and the OpenAI-compatible chat front (/v1).
Request and response shapes and error mapping only; every rule lives in the lifecycle."""
