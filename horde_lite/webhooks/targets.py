"""Where a webhook may point. A webhook makes the horde itself send a POST wherever a client says:
left open, any client could make it reach the horde's own machine, its network or a cloud metadata
service. Two rules, one for each moment:

- At admission (`check_url`), the URL: https (http too when `[webhooks] allow_http`), at most
  WEBHOOK_MAX_LENGTH characters, a host that is a DNS name or an IP literal, a valid port, no spaces or
  control characters; and a literal address must be a public one.
- At delivery (`refusal` over every address the host resolves to): a name can resolve anywhere, and
  differently from one lookup to the next, so each delivery resolves it, refuses it if any of its
  addresses is not public, and connects to an address it checked (delivery.py), never to the name.

`[webhooks] allow_private` lifts the address rule for a horde whose receivers are on its own network.
"""

from __future__ import annotations

import ipaddress
import re
import socket

import httpx

from horde_lite.core.errors import HordeError
from horde_lite.inputs import WEBHOOK_MAX_LENGTH
from horde_lite.rc import Rc
from horde_lite.settings import WebhookSettings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# A DNS name as it is looked up (IDNA already applied): labels of letters, digits, '-' and '_'.
_HOSTNAME = re.compile(r"^[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*\.?$")
# IPv6 prefixes that carry an IPv4 address (other than the mapped, 6to4 and Teredo forms, which
# `ipaddress` reads): NAT64's well-known prefix, by which a NAT64 network reaches that IPv4 address.
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _refused(reason: str) -> HordeError:
    return HordeError(Rc.BadRequest, f"webhook: {reason}", param="webhook", errors={"webhook": reason})


def _embedded(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for, when it carries one."""
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]  # the client's address, the one packets reach
    if address in _NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _kind(address: IPAddress) -> str | None:
    """What makes one address not public, in words (None: it is public)."""
    if address.is_unspecified:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    if address.is_private:
        return "private"
    if not address.is_global:  # shared address space (100.64.0.0/10) and the like
        return "not public"
    return None


def refusal(address: IPAddress) -> str | None:
    """Why a webhook may not reach `address` (None: it may): it, or the IPv4 address it carries, is
    loopback, private, link-local, multicast, reserved, unspecified or otherwise not public."""
    inner = _embedded(address) if isinstance(address, ipaddress.IPv6Address) else None
    if inner is not None and (inner_kind := _kind(inner)) is not None:
        return f"{address} carries the {inner_kind} address {inner}"
    kind = _kind(address)
    return None if kind is None else f"{address} is a {kind} address"


def literal_address(host: str) -> IPAddress | None:
    """The address a URL's host spells out (None: a name). IPv4's older forms count ("127.1",
    "0x7f000001", "2130706433"): the resolver reads them as addresses."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not re.fullmatch(r"[0-9A-Fa-fXx.]+", host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def check_url(url: str, settings: WebhookSettings) -> str:
    """The webhook URL a request keeps, or a 400 BadRequest saying what is wrong with it."""
    if len(url) > WEBHOOK_MAX_LENGTH:
        raise _refused(f"the URL is longer than {WEBHOOK_MAX_LENGTH} characters.")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise _refused("the URL may not contain spaces or control characters.")
    try:
        parsed = httpx.URL(url)
        host, raw_host = parsed.host, parsed.raw_host.decode("ascii")
    except (httpx.InvalidURL, ValueError) as e:  # an IDNA error is a ValueError
        raise _refused(f"not a URL ({e}).") from None
    schemes = ("https", "http") if settings.allow_http else ("https",)
    if parsed.scheme not in schemes:
        # Upstream's words: a webhook's body travels encrypted.
        raise _refused("webhooks need to point to an https endpoint.")
    if not host:
        raise _refused("the URL names no host.")
    if "%" in host:  # an escaped character, or an IPv6 zone: nothing a public host needs
        raise _refused(f"{host!r} is neither a host name nor an IP address.")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise _refused(f"port {parsed.port} is not between 1 and 65535.")
    address = literal_address(host)
    if address is None and not _HOSTNAME.match(raw_host):
        raise _refused(f"{host!r} is neither a host name nor an IP address.")
    if address is not None and not settings.allow_private and (why := refusal(address)) is not None:
        raise _refused(f"{why}; webhooks reach only public addresses.")
    return url
