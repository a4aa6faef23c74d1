"""Sending generation webhooks in the background, as upstream does: a worker's submit only queues
its webhook, after its transaction committed, so a slow or dead receiver never holds a submit, a
request or a database connection.

- Each server process keeps a bounded queue (`[webhooks] queue_size`) drained by a few sender tasks
  (`senders`), started on first use in the event loop that queued (a test harness may run an app
  in two loops). A delivery that finds the queue full is dropped and counted: one unreachable
  receiver cannot pile up work without limit.
- A delivery makes up to `attempts` attempts, each bounded by `timeout_seconds` (the name's
  resolution, the connection and the answer's status line; the answer's body is never read), with
  `retry_seconds` before the second and twice as long before each later one. A 2xx answer
  delivers it; redirects are not followed (one could lead to an address the rules refuse).
- Every attempt resolves the host and refuses the delivery (no retry) when any of its addresses is
  not public (targets.refusal; `allow_private` lifts this), then connects to an address it checked,
  with the host's name kept in the Host header and, for https, in the TLS server name, which the
  certificate is verified against. The name is never looked up twice, so a resolver that answers
  differently the second time (DNS rebinding) cannot steer the connection. No proxy from the
  environment is used, and no connection is kept for another delivery.
- Each delivery's end is counted in `horde.webhook.outcomes` (ok, giveup, dropped, refused).
  Deliveries still waiting when the process stops are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from dataclasses import dataclass, field

import httpx

from horde_lite import __version__
from horde_lite.metrics import Metrics, WebhookOutcome
from horde_lite.settings import WebhookSettings
from horde_lite.webhooks.targets import IPAddress, literal_address, refusal

log = logging.getLogger("horde_lite.webhooks")

_HEADERS = {"Content-Type": "application/json", "User-Agent": f"horde_lite/{__version__} webhook"}


@dataclass(frozen=True, slots=True)
class Delivery:
    """One POST to make: the URL the request named and the encoded body (payload.py)."""

    url: str
    body: bytes
    request_id: str
    generation_id: str


class AddressRefused(Exception):
    """The webhook's host resolved to an address webhooks may not reach."""


async def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address `host` resolves to, in the resolver's order, each once."""
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for *_, sockaddr in found:
        address = ipaddress.ip_address(sockaddr[0])
        if address not in addresses:
            addresses.append(address)
    return addresses


def pinned(url: httpx.URL, address: IPAddress) -> tuple[httpx.URL, dict[str, str], dict[str, str]]:
    """The request to `address` that reaches `url`'s host: the URL with the address in place of the
    name, the name in the Host header and, for https, as the TLS server name (the certificate is
    verified against it)."""
    headers = {**_HEADERS, "Host": url.netloc.decode("ascii")}
    by_name = literal_address(url.host) is None
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" and by_name else {}
    return url.copy_with(host=str(address)), headers, extensions


@dataclass
class _Lane:
    """One event loop's queue, its senders and their HTTP client."""

    queue: asyncio.Queue[Delivery]
    senders: list[asyncio.Task[None]] = field(default_factory=list)
    client: httpx.AsyncClient | None = None  # made by the first delivery, not by a submit
    busy: int = 0  # deliveries taken from the queue and not yet ended


class WebhookDeliveries:
    """This process's webhook sender (one per app, built with the horde)."""

    def __init__(self, settings: WebhookSettings, metrics: Metrics) -> None:
        self._settings = settings
        self._metrics = metrics
        self._lanes: dict[asyncio.AbstractEventLoop, _Lane] = {}
        self._closed = False

    def send(self, delivery: Delivery) -> None:
        """Queue `delivery`; never waits, never raises. A full queue drops it, counted."""
        if self._closed:
            self._metrics.webhook_ended("dropped")
            return
        try:
            self._lane().queue.put_nowait(delivery)
        except asyncio.QueueFull:
            self._metrics.webhook_ended("dropped")
            log.warning(
                "webhook dropped, the queue is full request=%s generation=%s",
                delivery.request_id, delivery.generation_id,
            )  # fmt: skip

    def _lane(self) -> _Lane:
        loop = asyncio.get_running_loop()
        lane = self._lanes.get(loop)
        if lane is None:
            lane = self._lanes[loop] = _Lane(asyncio.Queue(self._settings.queue_size))
            lane.senders = [
                loop.create_task(self._sender(lane), name=f"webhook-sender-{n}")
                for n in range(self._settings.senders)
            ]
        return lane

    async def _sender(self, lane: _Lane) -> None:
        while True:
            delivery = await lane.queue.get()
            lane.busy += 1
            if lane.client is None:  # loading the certificates takes a while: not in a submit
                lane.client = httpx.AsyncClient(
                    timeout=self._settings.timeout_seconds,
                    limits=httpx.Limits(max_keepalive_connections=0),
                    follow_redirects=False,
                    trust_env=False,  # no proxy from the environment: it would connect elsewhere
                )
            try:
                outcome = await self._deliver(lane.client, delivery)
            except Exception:  # a fault of ours must not stop the sender
                log.exception("webhook failed request=%s", delivery.request_id)
                outcome = "giveup"
            self._metrics.webhook_ended(outcome)
            lane.busy -= 1
            lane.queue.task_done()

    async def _deliver(self, client: httpx.AsyncClient, delivery: Delivery) -> WebhookOutcome:
        url = httpx.URL(delivery.url)
        settings = self._settings
        what = f"request={delivery.request_id} generation={delivery.generation_id} host={url.host}"
        for attempt in range(1, settings.attempts + 1):
            try:
                async with asyncio.timeout(settings.timeout_seconds):
                    status = await self._attempt(client, url, delivery.body)
                if 200 <= status < 300:
                    log.info("webhook delivered %s status=%d attempt=%d", what, status, attempt)
                    return "ok"
                log.info("webhook answered %d %s attempt=%d", status, what, attempt)
            except AddressRefused as refused:
                log.warning("webhook refused %s: %s", what, refused)
                return "refused"
            except (httpx.HTTPError, httpx.InvalidURL, OSError, TimeoutError, ValueError) as e:
                log.info("webhook attempt failed %s attempt=%d: %r", what, attempt, e)
            if attempt < settings.attempts:
                await asyncio.sleep(settings.retry_seconds * 2 ** (attempt - 1))
        log.warning("webhook given up %s after %d attempts", what, settings.attempts)
        return "giveup"

    async def _attempt(self, client: httpx.AsyncClient, url: httpx.URL, body: bytes) -> int:
        """One attempt: resolve, check every address, POST to the first that connects; its status."""
        port = url.port or (443 if url.scheme == "https" else 80)
        addresses = await resolve(url.raw_host.decode("ascii"), port)
        if not self._settings.allow_private:
            for address in addresses:
                if (why := refusal(address)) is not None:
                    raise AddressRefused(f"{url.host} resolves to {address}: {why}")
        unreachable: Exception = OSError(f"{url.host} resolves to no address")
        for address in addresses:
            target, headers, extensions = pinned(url, address)
            try:
                async with client.stream(
                    "POST", target, content=body, headers=headers, extensions=extensions
                ) as answer:
                    return answer.status_code
            except httpx.ConnectError as e:  # the next address may answer
                unreachable = e
        raise unreachable

    async def idle(self) -> None:
        """Wait until every delivery queued so far has ended, in whichever loop it is sent."""
        here = asyncio.get_running_loop()
        for loop, lane in list(self._lanes.items()):
            if loop is here:
                await lane.queue.join()
            elif not loop.is_closed():
                await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(lane.queue.join(), loop))

    async def close(self, within: float) -> None:
        """Stop: wait up to `within` seconds for this loop's deliveries, then drop what is left
        (counted). Senders of another loop are cancelled there."""
        self._closed = True
        here = asyncio.get_running_loop()
        for loop, lane in list(self._lanes.items()):
            if loop is here:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(within):
                        await lane.queue.join()
                left = lane.queue.qsize() + lane.busy
                for sender in lane.senders:
                    sender.cancel()
                await asyncio.gather(*lane.senders, return_exceptions=True)
                if lane.client is not None:
                    await lane.client.aclose()
                if left:
                    self._metrics.webhook_ended("dropped", left)
                    log.warning("stopping with %d webhook(s) not delivered", left)
            elif not loop.is_closed():
                with contextlib.suppress(RuntimeError):  # that loop closed meanwhile
                    for sender in lane.senders:
                        loop.call_soon_threadsafe(sender.cancel)
        self._lanes.clear()
