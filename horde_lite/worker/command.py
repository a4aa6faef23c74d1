"""`horde-lite worker`: the click command (docs/reference/worker.md)."""

from __future__ import annotations

import asyncio
import logging
import sys

import click

from horde_lite import __version__
from horde_lite.worker.backends import KINDS, SimulatedBackend
from horde_lite.worker.backends.base import Backend
from horde_lite.worker.config import WorkerConfig
from horde_lite.worker.runner import Worker

LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"
KEY_ENV = "HORDE_LITE_WORKER_KEY"


@click.command(
    "worker",
    help="Run a worker: pop jobs from a horde and generate them on a model server (--backend) "
    "or with the built-in simulator (--simulate).",
)
@click.option("--horde", "horde_url", required=True, help="The horde's base URL, e.g. http://127.0.0.1:8000.")
@click.option("--key", envvar=KEY_ENV, help=f"Your API key (or {KEY_ENV}, which keeps it out of ps).")
@click.option("--name", required=True, help="The worker's name, unique on the horde.")
@click.option("--backend", "backend_url", help="The model server, e.g. http://127.0.0.1:8080/v1.")
@click.option(
    "--backend-type",
    type=click.Choice(sorted(KINDS)),
    default="openai",
    show_default=True,
    help="openai: any OpenAI-compatible server; kobold: KoboldCpp (native API for legacy jobs).",
)
@click.option(
    "--simulate", type=float, metavar="TOKENS_PER_SECOND", help="No model: write filler at this rate."
)
@click.option(
    "--model", "models", multiple=True, help="A model name to serve (repeatable); default: the backend's."
)
@click.option("--threads", type=click.IntRange(1, 100), default=1, show_default=True, help="Jobs at once.")
@click.option(
    "--max-length", type=click.IntRange(16, 65536), help="Largest legacy output (default: half the context)."
)
@click.option(
    "--max-context-length",
    type=click.IntRange(80),
    help="Context (default: the backend's; required when the backend does not say it).",
)
@click.option(
    "--max-completion-tokens", type=click.IntRange(1), help="Chat: largest output (default: max-length)."
)
@click.option(
    "--max-context-tokens", type=click.IntRange(1), help="Chat: context (default: max-context-length)."
)
@click.option(
    "--tools", is_flag=True, help="Declare the chat feature `tools` (the backend handles tool calls)."
)
@click.option(
    "--json-schema", is_flag=True, help="Declare `json_schema` (the backend does structured output)."
)
@click.option("--vision", is_flag=True, help="Declare `vision` (the backend takes images).")
@click.option(
    "--image-transport",
    "image_transports",
    multiple=True,
    type=click.Choice(["url", "base64"]),
    help="Image parts the backend can read (repeatable; with --vision).",
)
@click.option("--no-chat", is_flag=True, help="Legacy text jobs only: declare no chat block.")
@click.option("--nsfw", is_flag=True, help="Accept requests marked nsfw.")
@click.option(
    "--priority-username", "priority_usernames", multiple=True, help="name#id served first (repeatable)."
)
@click.option(
    "--backend-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds the backend may stay silent before the job is faulted.",
)
@click.option(
    "--progress-interval",
    type=click.FloatRange(0.05),
    default=0.3,
    show_default=True,
    help="Seconds between two progress posts of a streaming job.",
)
@click.option(
    "--drain-seconds",
    type=click.FloatRange(0),
    default=30.0,
    show_default=True,
    help="On SIGINT/SIGTERM, how long jobs in hand may run before they are faulted.",
)
@click.option(
    "--wait-seconds",
    type=click.IntRange(0, 60),
    default=20,
    show_default=True,
    help="How long a pop may wait at the horde for a job (0: answered at once, then back-off).",
)
@click.option("--verbose", is_flag=True, help="Log HTTP requests too.")
def worker(
    horde_url: str,
    key: str | None,
    name: str,
    backend_url: str | None,
    backend_type: str,
    simulate: float | None,
    models: tuple[str, ...],
    threads: int,
    max_length: int | None,
    max_context_length: int | None,
    max_completion_tokens: int | None,
    max_context_tokens: int | None,
    tools: bool,
    json_schema: bool,
    vision: bool,
    image_transports: tuple[str, ...],
    no_chat: bool,
    nsfw: bool,
    priority_usernames: tuple[str, ...],
    backend_timeout: float,
    progress_interval: float,
    drain_seconds: float,
    wait_seconds: int,
    verbose: bool,
) -> None:
    if not key:  # checked here, not by click, so the message can name the environment variable
        raise click.UsageError(f"missing the owner's API key: give --key KEY or set {KEY_ENV}")
    if (backend_url is None) == (simulate is None):
        raise click.UsageError("give exactly one of --backend URL and --simulate TOKENS_PER_SECOND")
    if simulate is not None and simulate <= 0:
        raise click.UsageError("--simulate needs a positive number of tokens per second")
    if simulate is not None and not models:
        raise click.UsageError("--simulate needs --model NAME (the model the simulated worker claims)")
    features = [f for f, on in (("tools", tools), ("json_schema", json_schema), ("vision", vision)) if on]
    config = WorkerConfig(
        horde=horde_url,
        key=key,
        name=name,
        models=list(models),
        threads=threads,
        max_length=max_length,
        max_context_length=max_context_length,
        chat=not no_chat,
        max_completion_tokens=max_completion_tokens,
        max_context_tokens=max_context_tokens,
        features=features,
        image_transports=list(image_transports),
        nsfw=nsfw,
        priority_usernames=list(priority_usernames),
        progress_interval=progress_interval,
        drain_seconds=drain_seconds,
        wait_seconds=wait_seconds,
    )
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT, stream=sys.stderr, force=True)
    if not verbose:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    backend: Backend = (
        SimulatedBackend(simulate)
        if simulate is not None
        else KINDS[backend_type](str(backend_url), backend_timeout)
    )
    serving = (
        f"simulated at {simulate:g} tokens/s" if simulate is not None else f"{backend_type} {backend_url}"
    )
    banner = (
        f"horde-lite worker {__version__}: {name} for the horde at {horde_url}; backend {serving}; "
        f"models {', '.join(models) or '(from the backend)'}"
    )
    sys.exit(asyncio.run(Worker(config, backend).run(banner)))
