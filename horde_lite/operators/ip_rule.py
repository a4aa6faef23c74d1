"""What an address timeout covers, as pure functions of the text a moderator or a connection gives:
no database, no clock. `ip_timeouts.py` stores and checks what these return.

A timeout covers a network. A single IPv4 address is its own /32; a single IPv6 address (or a
network narrower than /64) is its /64, as upstream times out a worker's IPv6 address: a host is
handed a whole /64 and picks addresses in it at will, so a timeout of one of them alone would let
the host step aside to the next. An IPv4-mapped IPv6 address
(`::ffff:192.0.2.1`, how a dual-stack listener shows an IPv4 client) is the IPv4 address it maps.
A network wider than `WIDEST` is refused: it would shut out a provider's whole allocation or more
(`/0`, everyone) by one mistyped prefix.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Final

from horde_lite.core.errors import HordeError
from horde_lite.rc import Rc

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

# The shortest prefix a timeout may have, by IP version: an IPv4 /8 (16.7 million addresses), an
# IPv6 /32 (a regional registry's usual allocation to one provider).
WIDEST: Final = {4: 8, 6: 32}
# A host's share of IPv6: the prefix a single IPv6 address is widened to.
IPV6_HOST_PREFIX: Final = 64
# Upstream's bounds (`AddTimeoutIPInput.hours`, `AddWorkerTimeout.days`).
MOST_HOURS: Final = 24 * 30
MOST_DAYS: Final = 30
# The longest text of an address or network: a full IPv6 network with an IPv4 tail and a prefix.
LONGEST: Final = 49


def _plain(address: Address) -> Address:
    """The address a timeout compares: an IPv4-mapped IPv6 address as the IPv4 address it maps,
    an IPv6 zone (`fe80::1%eth0`) dropped."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.scope_id is not None:
            return ipaddress.IPv6Address(int(address))
    return address


@functools.lru_cache(maxsize=4096)
def client_ip(text: str) -> Address | None:
    """A connection's address as a timeout compares it; None when it is no IP address (a Unix
    socket, the test client's name): such a caller matches no timeout. Kept for the addresses seen
    last: workers poll from the same few, and a lookup costs a tenth of a parse."""
    try:
        return _plain(ipaddress.ip_address(text))
    except ValueError:
        return None


def stored_address(text: str) -> str | None:
    """A worker's last address as its row keeps it (canonical text), or None when it is no IP."""
    found = client_ip(text)
    return None if found is None else str(found)


def _invalid(text: str, why: str = "is not an IPv4 or IPv6 address or CIDR") -> HordeError:
    return HordeError(Rc.BadRequest, f"Invalid IP Address: {text[:LONGEST]!r} {why}.", param="ipaddr")


def _parsed(text: str) -> Network:
    """`text` as a network (a single address as its own /32 or /128), or BadRequest."""
    if not text or len(text) > LONGEST or not text.isascii() or "%" in text:
        raise _invalid(text)
    address_part, slash, prefix = text.partition("/")
    try:
        given = ipaddress.ip_address(address_part)
    except ValueError:
        raise _invalid(text) from None
    address = _plain(given)
    if not slash:
        return ipaddress.ip_network(address)
    if not (prefix.isdigit() and len(prefix) <= 3 and int(prefix) <= given.max_prefixlen):
        raise _invalid(text, f"has no prefix of 0 to {given.max_prefixlen}")
    length = int(prefix)
    if address is not given and address.version == 4:  # ::ffff:192.0.2.0/120 is 192.0.2.0/24
        if length < 96:
            raise _invalid(text, "reaches beyond the IPv4 addresses it maps")
        length -= 96
    return ipaddress.ip_network(f"{address}/{length}", strict=False)


def timed_network(text: str) -> Network:
    """What a timeout of `text` covers: its network, host bits cleared (`192.0.2.7/24` is
    192.0.2.0/24), a single IPv6 address widened to its /64. BadRequest for anything that is not an
    address or CIDR, or for a network wider than `WIDEST`."""
    network = _parsed(text)
    if network.version == 6 and network.prefixlen > IPV6_HOST_PREFIX:
        network = network.supernet(new_prefix=IPV6_HOST_PREFIX)
    widest = WIDEST[network.version]
    if network.prefixlen < widest:
        raise HordeError(
            Rc.BadRequest,
            f"{text} is wider than an IPv{network.version} /{widest}: a timeout of it would shut out "
            f"{network.num_addresses:,} addresses. Time out narrower networks.",
            param="ipaddr",
        )
    return network


def asked_network(text: str) -> Network:
    """An address or network to look timeouts up by (GET /operations/ipaddr/{ipaddr}): as given,
    not widened, any breadth (asking about a wide network changes nothing)."""
    return _parsed(text)


def shown(network: Network) -> str:
    """A network as listings show it: a single IPv4 address bare, anything else as a CIDR."""
    return str(network.network_address) if network.prefixlen == network.max_prefixlen else str(network)


def refusal(seconds: int) -> HordeError:
    """Upstream's `TimeoutIP` (403), its message naming the seconds left unless they are more than
    four days (upstream hides a long timeout's length)."""
    if seconds > 4 * 86400:
        said = "has been put into timeout"
    else:
        said = f"has been put into timeout for {seconds} more seconds"
    return HordeError(
        Rc.TimeoutIP,
        f"Due to abuse prevention, your IP address {said}. Please try again later, or contact the "
        "horde's moderators if you think this was an error.",
    )
