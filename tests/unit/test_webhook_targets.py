"""Where a webhook may point (webhooks/targets.py) and how a delivery reaches the address it
checked (webhooks/delivery.py `pinned`): every non-public address and every IPv6 form carrying
one is refused, public ones are not; the settings open http and private targets; the request to an
address keeps the name as Host and TLS server name."""

from __future__ import annotations

import ipaddress
import re

import httpx
import pytest

from horde_lite.core.errors import HordeError
from horde_lite.inputs import WEBHOOK_PATTERN
from horde_lite.settings import WebhookSettings
from horde_lite.webhooks.delivery import pinned
from horde_lite.webhooks.targets import check_url, literal_address, refusal

REFUSED = {
    "127.0.0.1": "loopback",
    "127.255.0.9": "loopback",
    "::1": "loopback",
    "0.0.0.0": "unspecified",
    "::": "unspecified",
    "10.0.0.1": "private",
    "172.16.5.4": "private",
    "192.168.1.1": "private",
    "fc00::1": "private",
    "169.254.169.254": "link-local",
    "fe80::1": "link-local",
    "224.0.0.251": "multicast",
    "ff02::1": "multicast",
    "240.0.0.1": "reserved",
    "255.255.255.255": "reserved",
    "100.64.0.1": "not public",
    "192.0.2.1": "private",  # documentation
    "::ffff:127.0.0.1": "carries the loopback address 127.0.0.1",
    "::ffff:10.0.0.1": "carries the private address 10.0.0.1",
    "2002:7f00:1::1": "carries the loopback address 127.0.0.1",
    "2002:a9fe:a9fe::": "carries the link-local address 169.254.169.254",
    "64:ff9b::7f00:1": "carries the loopback address 127.0.0.1",
    "2001:0:4136:e378:8000:63bf:80ff:fffe": "carries the loopback address 127.0.0.1",  # Teredo
}
PUBLIC = (
    "8.8.8.8",
    "1.1.1.1",
    "93.184.215.14",
    "2001:4860:4860::8888",
    "2606:4700:4700::1111",
    "2002:808:808::",
)


@pytest.mark.parametrize(("address", "reason"), REFUSED.items())
def test_every_non_public_address_is_refused(address: str, reason: str) -> None:
    why = refusal(ipaddress.ip_address(address))
    assert why is not None
    assert reason in why


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_not(address: str) -> None:
    assert refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("host", "address"),
    [("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.0.0.1", "127.0.0.1"), ("::1", "::1"),
     ("example.com", None), ("10.example", None), ("deadbeef", None)],
)  # fmt: skip
def test_literal_addresses_in_every_form_the_resolver_reads(host: str, address: str | None) -> None:
    found = literal_address(host)
    assert (None if found is None else str(found)) == address


def _refused(url: str, settings: WebhookSettings) -> str:
    with pytest.raises(HordeError) as refused:
        check_url(url, settings)
    return refused.value.message


def test_settings_open_http_and_private_targets() -> None:
    default, local = WebhookSettings(), WebhookSettings(allow_http=True, allow_private=True)
    assert "https endpoint" in _refused("http://example.com/", default)
    assert "loopback" in _refused("https://127.0.0.1:8080/", default)
    assert check_url("http://127.0.0.1:8080/hook", local) == "http://127.0.0.1:8080/hook"
    assert check_url("https://[::1]/", local) == "https://[::1]/"
    assert "https endpoint" in _refused("ws://example.com/", local)  # http and https only
    assert "names no host" in _refused("http:///hook", local)


@pytest.mark.parametrize(
    "url",
    ["https://a", "https://example.com", "https://a-b.example.co:8443/path?q=1&r=[2]#frag",
     "https://Z9/%7Euser/{x}/|\\^`", "https://x.y/" + "!" * 1000],
)  # fmt: skip
def test_what_the_schema_promises_is_accepted(url: str) -> None:
    assert re.match(WEBHOOK_PATTERN, url)
    assert check_url(url, WebhookSettings()) == url


def test_a_pinned_request_reaches_the_address_and_keeps_the_name() -> None:
    url = httpx.URL("https://user:pw@hooks.example.com:8443/h?x=1")
    target, headers, extensions = pinned(url, ipaddress.ip_address("2001:db8::5"))
    assert str(target) == "https://user:pw@[2001:db8::5]:8443/h?x=1"
    assert headers["Host"] == "hooks.example.com:8443"
    assert extensions == {"sni_hostname": "hooks.example.com"}  # the certificate is checked for it
    plain, headers, extensions = pinned(
        httpx.URL("http://hooks.example.com/h"), ipaddress.ip_address("192.0.2.7")
    )
    assert (str(plain), headers["Host"], extensions) == ("http://192.0.2.7/h", "hooks.example.com", {})
    literal, _, extensions = pinned(httpx.URL("https://8.8.8.8/h"), ipaddress.ip_address("8.8.8.8"))
    assert (str(literal), extensions) == ("https://8.8.8.8/h", {})  # verified against the address itself
