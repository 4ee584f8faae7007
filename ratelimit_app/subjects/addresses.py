"""The client's address: REMOTE_ADDR, or behind trusted proxies the right-most untrusted X-Forwarded-For
hop; grouped by RATELIMIT_IPV4_PREFIX and RATELIMIT_IPV6_PREFIX as the `ip` key counts it."""

from __future__ import annotations

import ipaddress
import logging
from typing import NamedTuple

from ..conf import get_setting
from ..lru import byte_bounded_cache

logger = logging.getLogger("ratelimit_app")

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
UNIX_SOCKET = "unix"  # in RATELIMIT_TRUSTED_PROXIES: the server's own socket (REMOTE_ADDR empty) is a proxy


class TrustedProxies(NamedTuple):
    networks: tuple[IPNetwork, ...]
    unix: bool  # the server's own socket: REMOTE_ADDR is empty and the proxy is on this machine


_trusted: TrustedProxies | None = None  # forgotten whenever a setting changes
_warned_no_address = False


def forget_settings() -> None:
    """Forget the trusted proxies and the grouped addresses (RATELIMIT_IPV4_PREFIX, RATELIMIT_IPV6_PREFIX)."""
    global _trusted
    _direct_ip.cache_clear()
    _trusted = None


def forget_warning() -> None:
    """Say again, at the next request without an address, that ip policies skip such requests."""
    global _warned_no_address
    _warned_no_address = False


# --- the `ip` key part ---------------------------------------------------------------------------


def read_ip(request) -> str | None:
    """The `ip` key part's value, 'ip:<address or network>', or None for a request without an address."""
    remote = request.META.get("REMOTE_ADDR")
    if remote and not _trusted_proxies().networks:
        value = _direct_ip(remote)  # no proxy is believed: the address is REMOTE_ADDR's (the common case)
    else:
        address = client_ip(request)
        value = None if address is None else f"ip:{address}"
    if value is None:
        _warn_no_address(request)
    return value


@byte_bounded_cache()  # the same clients come back
def _direct_ip(remote: str) -> str | None:
    """The `ip` value of a request from `remote` (REMOTE_ADDR) when no proxy is trusted."""
    address = parse_address(remote)
    return None if address is None else f"ip:{_grouped(address, _prefix_of(address))}"


def _warn_no_address(request) -> None:
    global _warned_no_address
    if _warned_no_address:
        return
    _warned_no_address = True  # once per process: loud enough to be seen, never a flood
    logger.warning(
        "ratelimit: an ip policy met a request with no usable client address (REMOTE_ADDR=%r, "
        "X-Forwarded-For=%r); ip policies do not apply to such requests. Behind a unix socket, add "
        "'unix' to RATELIMIT_TRUSTED_PROXIES so that the proxy's X-Forwarded-For is used.",
        request.META.get("REMOTE_ADDR"), request.META.get("HTTP_X_FORWARDED_FOR", "")[:100],
    )


# --- trusted proxies -----------------------------------------------------------------------------


def _trusted_proxies() -> TrustedProxies:
    """RATELIMIT_TRUSTED_PROXIES, read once: its networks, and whether it holds 'unix'."""
    global _trusted
    if _trusted is None:
        entries = [_proxy_entry(entry) for entry in get_setting("RATELIMIT_TRUSTED_PROXIES")]
        networks = tuple(entry for entry in entries if entry is not None and entry != UNIX_SOCKET)
        _trusted = TrustedProxies(networks, UNIX_SOCKET in entries)
    return _trusted


def _proxy_entry(entry: object) -> IPNetwork | str | None:
    """A network, 'unix', or None for an entry that is neither (skipped; system check E003)."""
    if str(entry).strip().lower() == UNIX_SOCKET:
        return UNIX_SOCKET
    try:
        return ip_network(entry)
    except (ValueError, TypeError):
        return None


def invalid_trusted_proxies() -> list[str]:
    """The entries of RATELIMIT_TRUSTED_PROXIES that are neither an address, a network nor 'unix'."""
    return [repr(entry) for entry in get_setting("RATELIMIT_TRUSTED_PROXIES") if _proxy_entry(entry) is None]


def _is_trusted(address, networks) -> bool:
    return any(address in network for network in networks)


# --- addresses and networks as written -----------------------------------------------------------


def unmapped(address: IPAddress) -> IPAddress:
    """An IPv4-mapped IPv6 address (::ffff:203.0.113.7, how a dual-stack socket reports an IPv4 client)
    as the IPv4 address it carries: every client address is counted and matched in this form."""
    if address.version == 6 and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def ip_network(value: object) -> IPNetwork:
    """An address or network as written (host bits ignored), in the form unmapped() gives addresses:
    an IPv4-mapped one (::ffff:203.0.113.0/120) is the IPv4 network it carries. ValueError otherwise."""
    network = ipaddress.ip_network(value.strip() if isinstance(value, str) else value, strict=False)
    if network.version == 6 and network.prefixlen >= 96 and network.network_address.ipv4_mapped is not None:
        return ipaddress.IPv4Network((network.network_address.ipv4_mapped, network.prefixlen - 96))
    return network


@byte_bounded_cache()
def parse_address(text: str) -> IPAddress | None:
    """An address as REMOTE_ADDR or an X-Forwarded-For hop writes it (a port, brackets, a zone id
    allowed), unmapped; None when it is not one."""
    text = text.strip()
    if text.startswith("["):  # "[2001:db8::1]:443"
        text = text[1 : text.find("]")] if "]" in text else text[1:]
    elif text.count(":") == 1:  # "203.0.113.7:5678"
        text = text.partition(":")[0]
    # a zone id ('%eth0') names the server's interface, not the client: '%1', '%2'... are one client
    text = text.partition("%")[0]
    try:
        return unmapped(ipaddress.ip_address(text))
    except ValueError:
        return None


# --- the client's address ------------------------------------------------------------------------


def client_address(request) -> IPAddress | None:
    """REMOTE_ADDR, or behind trusted proxies the right-most untrusted X-Forwarded-For address.

    An empty REMOTE_ADDR is the server's unix socket: a trusted proxy when RATELIMIT_TRUSTED_PROXIES
    holds 'unix', otherwise no address at all.
    """
    remote_text = request.META.get("REMOTE_ADDR") or ""
    networks, unix = _trusted_proxies()
    if remote_text:
        remote = parse_address(remote_text)
        if remote is None or not networks or not _is_trusted(remote, networks):
            return remote  # a client that is not a trusted proxy cannot choose its address by a header
    elif not unix:
        return None
    else:
        remote = None  # the local socket: trusted, but it has no address of its own to fall back on
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop for hop in forwarded.split(",") if hop.strip()]
    last_trusted = remote
    for hop in reversed(hops):
        address = parse_address(hop)
        if address is None:
            return last_trusted  # garbage from the client's side: count the request against the proxy
        if not _is_trusted(address, networks):
            return address
        last_trusted = address
    return last_trusted


def client_ip(request) -> str | None:
    """The client's address as counted: IPv6 grouped by RATELIMIT_IPV6_PREFIX, IPv4 by RATELIMIT_IPV4_PREFIX."""
    address = client_address(request)
    if address is None:
        return None
    return _grouped(address, _prefix_of(address))


def _prefix_of(address: IPAddress) -> int:
    return get_setting("RATELIMIT_IPV6_PREFIX" if address.version == 6 else "RATELIMIT_IPV4_PREFIX")


@byte_bounded_cache(entry_bytes=512)  # an address, a prefix and the network's text
def _grouped(address: IPAddress, prefix: int) -> str:
    if prefix >= address.max_prefixlen:
        return str(address)
    return str(ipaddress.ip_network(f"{address}/{prefix}", strict=False))
