"""Where a bookie listens and which address it advertises, from ``listeningInterface``,
``advertisedAddress``, ``bookieBindAddress`` and ``httpServerHost``, resolved in one place.

Rules (BookKeeper's, with Vellum's loopback defaults):
- ``listeningInterface`` names a network interface (``eth0``, ``lo``); its IPv4 address is where
  the bookie port binds and, unless ``advertisedAddress`` is set, the address it advertises
  (BookKeeper binds the bookie address when the interface is set). ``default`` means unset;
- the advertised address (the host part of the bookie id) is ``advertisedAddress``, else the
  interface's address, else 127.0.0.1;
- the bookie port binds ``bookieBindAddress`` when set, else the interface's address, else the
  advertised address, which must then be an address of this host;
- a bookie that advertises an address other hosts can use but binds loopback could never be
  reached from them: that configuration is refused at start, with the keys to change;
- the admin HTTP server binds ``httpServerHost`` when set, else the bookie port's address.

Invariants: every refusal is a ``ConfigError`` naming the keys involved and the fix; the only
I/O is reading interface addresses (``SIOCGIFADDR``) and test binds of an address (port 0).
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import logging
import socket
import struct
from dataclasses import dataclass

from vellum.config import ServerConfig
from vellum.errors import ConfigError

log = logging.getLogger(__name__)

_SIOCGIFADDR = 0x8915  # linux/sockios.h: get an interface's (first) IPv4 address
WILDCARDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ListenAddresses:
    """The resolved addresses of one bookie."""

    bind_host: str  #: the bookie port's bind address
    advertised_host: str  #: the host part of the bookie id (what clients connect to)
    http_host: str  #: the admin HTTP server's bind address


def interface_address(name: str) -> str:
    """The IPv4 address of network interface ``name`` (``listeningInterface``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError as e:
            known = ", ".join(n for _, n in socket.if_nameindex())
            if e.errno == errno.ENODEV:
                raise ConfigError(f"listeningInterface={name}: no such network interface on this host "
                                  f"(there are: {known})") from None
            if e.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"listeningInterface={name}: the interface has no IPv4 address; give it one "
                                  f"or name another interface (there are: {known})") from None
            raise ConfigError(f"listeningInterface={name}: cannot read its address: {e}") from None
    return socket.inet_ntoa(packed[20:24])


def _addresses(host: str, key: str) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ConfigError(f"{key}={host}: cannot resolve it: {e}") from None
    return list(dict.fromkeys(str(i[4][0]) for i in infos))


def is_loopback(host: str, key: str) -> bool:
    """Does ``host`` (an address or a name, the value of ``key``) stand for this host's
    loopback only?"""
    if host in WILDCARDS:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return all(ipaddress.ip_address(a.split("%", 1)[0]).is_loopback for a in _addresses(host, key))


def is_local_address(host: str, key: str) -> bool:
    """Can a socket of this host bind ``host`` (the value of ``key``: is it one of this host's
    addresses)?"""
    for addr in _addresses(host, key):
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as s:
            try:
                s.bind((addr, 0))
                return True
            except OSError as e:
                if e.errno != errno.EADDRNOTAVAIL:
                    raise
    return False


def _interface(config: ServerConfig) -> str:
    name = config.listening_interface.strip()
    return "" if name == "default" else name


def advertised_host(config: ServerConfig) -> str:
    """The host part of the bookie id: ``advertisedAddress``, else the address of
    ``listeningInterface``, else 127.0.0.1."""
    if config.advertised_address:
        return config.advertised_address
    iface = _interface(config)
    return interface_address(iface) if iface else "127.0.0.1"


def resolve_listen_addresses(config: ServerConfig) -> ListenAddresses:
    """Where this bookie binds and what it advertises (see the module docstring); refuses
    the combinations no client on another host could ever reach."""
    iface = _interface(config)
    iface_ip = interface_address(iface) if iface else ""
    advertised = config.advertised_address or iface_ip or "127.0.0.1"
    routable = not is_loopback(advertised, "advertisedAddress")
    if config.bookie_bind_address:
        bind = config.bookie_bind_address
        if iface_ip and bind not in (iface_ip, *WILDCARDS):
            raise ConfigError(f"bookieBindAddress={bind} and listeningInterface={iface} (address {iface_ip}) "
                              "disagree on where the bookie listens: set only one of them")
        if routable and is_loopback(bind, "bookieBindAddress"):
            raise ConfigError(
                f"bookieBindAddress={bind} is a loopback address but advertisedAddress={advertised} is not: "
                f"clients on other hosts would connect to {advertised} and time out. Remove bookieBindAddress "
                f"(the bookie then binds {advertised}), set it to 0.0.0.0 (every interface) or to the local "
                "address that traffic for the advertised address arrives at, or set listeningInterface")
    elif iface_ip:
        bind = iface_ip
    else:
        if not is_local_address(advertised, "advertisedAddress"):
            raise ConfigError(
                f"advertisedAddress={advertised} is not an address of this host, so the bookie cannot listen "
                "there: set bookieBindAddress to the local address that traffic for it arrives at "
                "(0.0.0.0 = every interface), or listeningInterface to that network interface")
        bind = advertised
    if not routable and not is_loopback(bind, "bookieBindAddress"):
        log.warning("the bookie listens on %s but advertises the loopback address %s: clients on other hosts "
                    "cannot use it; set advertisedAddress (or listeningInterface)", bind or "0.0.0.0", advertised)
    http = config.http_server_host or bind
    if routable and config.http_server_enabled and is_loopback(http, "httpServerHost"):
        log.warning("httpServerHost=%s: the admin HTTP API is reachable from this host only, while the bookie "
                    "advertises %s (tools on other hosts cannot reach it)", http, advertised)
    return ListenAddresses(bind_host=bind, advertised_host=advertised, http_host=http)
