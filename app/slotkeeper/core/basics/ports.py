"""Binding a port: the one place where the platforms' rules differ.

Linux refuses to bind an address and port another socket listens on, including the wildcard one
(0.0.0.0:P against 127.0.0.1:P and back), whatever the options. Windows and macOS do not: there
127.0.0.1:P binds while another program listens on 0.0.0.0:P, and clients of 127.0.0.1 then reach
whichever socket the system prefers. On Windows SO_REUSEADDR goes further: a socket binds even a
listener's own address when that one set it too. So:

- ``listen_options``: Windows takes SO_EXCLUSIVEADDRUSE (and never SO_REUSEADDR), macOS no
  SO_REUSEADDR (which on BSD lets a socket bind a more or less specific address than a listener's);
  Linux keeps SO_REUSEADDR, which there only lets a server bind past closed connections' TIME_WAIT;
- ``listening_socket`` / ``listen_on``: the front door's sockets, checked for a listener the bind
  let through (a connection attempt to the address, made before ours listens, can only reach
  someone else);
- ``port_in_use``: the strict rule every "is the port free" check follows on every platform: the
  port is taken when binding the host fails, or binding the wildcard address fails, or a
  connection to 127.0.0.1:P (or the host) is accepted.

Light on purpose (the standard library's socket): the head start uses it before the rest of
Slotkeeper is imported.
"""

from __future__ import annotations

import errno
import os
import socket
import sys

# winsock2.h: #define SO_EXCLUSIVEADDRUSE ((int)(~SO_REUSEADDR)), SO_REUSEADDR being 4. Python's socket
# module has it on Windows only; the value lets the tests that fake Windows run anywhere.
SO_EXCLUSIVEADDRUSE: int = getattr(socket, "SO_EXCLUSIVEADDRUSE", -5)
# A connection to a listener on this machine is accepted by the system at once; a refused one
# takes about two seconds on Windows (it retries), so the probe waits this long and no longer.
CONNECT_PROBE_SECONDS = 0.25
BACKLOG = 128  # as aiohttp's TCPSite

# A bind refused because something else holds the port (Windows says WSAEACCES when another
# socket's SO_EXCLUSIVEADDRUSE refuses it); other errors (an address this machine does not have)
# are about the address, not the port.
_IN_USE = frozenset({errno.EADDRINUSE, errno.EACCES, getattr(errno, "WSAEADDRINUSE", 10048),
                     getattr(errno, "WSAEACCES", 10013)})

Option = tuple[int, int, int]  # setsockopt's level, option, value


def listen_options() -> list[Option]:
    """The options a listening socket takes on this platform, before its bind."""
    if sys.platform == "win32":
        return [(socket.SOL_SOCKET, SO_EXCLUSIVEADDRUSE, 1)]
    if sys.platform == "darwin":
        return []
    return [(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)]


def _probe_options() -> list[Option]:
    """The options of a bind that only asks whether the port is free: as a listener's, but past
    closed connections' TIME_WAIT on macOS too (it is not a program on the port; one that listens is
    found by the connection attempts)."""
    if sys.platform == "darwin":
        return [(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)]
    return listen_options()


def _bind_host(host: str) -> str:
    """The address ``host`` binds: "" is every interface, as aiohttp reads it; "localhost" is
    checked at 127.0.0.1."""
    if host == "":
        return "0.0.0.0"
    if host == "localhost":
        return "127.0.0.1"
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


def _is_wildcard(address: str) -> bool:
    return address in ("0.0.0.0", "::")


def _bind_refusal(family: socket.AddressFamily, address: tuple, options: list[Option]) -> OSError | None:
    """Why a socket with ``options`` cannot bind ``address`` now, or None (it could)."""
    try:
        sock = _bound(family, socket.SOCK_STREAM, 0, address, options)
    except OSError as exc:
        return exc
    sock.close()
    return None


def _accepts(address: str, port: int) -> bool:
    """True when a connection to ``address:port`` is accepted: something listens there."""
    try:
        with socket.create_connection((address, port), timeout=CONNECT_PROBE_SECONDS) as s:
            # Linux connects a socket to itself when the port it picks for it is the one asked for
            # and nothing listens there: that is no listener.
            return s.getsockname()[:2] != s.getpeername()[:2]
    except OSError:  # refused, timed out, unreachable
        return False


def _probe_addresses(address: str) -> list[str]:
    """Where a client of ``address`` may connect: 127.0.0.1 always, and the address itself (a
    wildcard address is reached over loopback)."""
    wanted = ["127.0.0.1"]
    if address == "::":
        wanted.append("::1")
    elif not _is_wildcard(address):
        wanted.append(address)
    return list(dict.fromkeys(wanted))


def someone_listens(host: str, port: int) -> bool:
    """True when a connection to 127.0.0.1:``port`` or ``host``:``port`` is accepted."""
    return any(_accepts(a, port) for a in _probe_addresses(_bind_host(host)))


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` is taken by the strict rule: binding the host fails, or binding the
    wildcard address (of the host's family) fails, or a connection to 127.0.0.1 or the host is
    accepted. Past connections' TIME_WAIT does not count. OSError when the host's address itself
    cannot be bound (not this machine's, not an address at all)."""
    address = _bind_host(host)
    family = _family(address)
    options = _probe_options()
    refusal = _bind_refusal(family, (address, port), options)
    if refusal is not None:
        if refusal.errno in _IN_USE:
            return True
        raise refusal
    wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
    if wildcard != address:
        refusal = _bind_refusal(family, (wildcard, port), options)
        if refusal is not None and refusal.errno in _IN_USE:
            return True
    return someone_listens(address, port)


def addresses(host: str, port: int) -> list[tuple]:
    """The addresses a server listening on ``host`` binds, as asyncio's create_server (and so
    aiohttp's TCPSite) resolves them: (family, type, proto, address)."""
    infos = socket.getaddrinfo(host or None, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    return list(dict.fromkeys((family, kind, proto, address) for family, kind, proto, _, address in infos))


def listening_socket(family: int, kind: int, proto: int, address: tuple,
                     backlog: int = BACKLOG) -> socket.socket:
    """A socket listening on ``address`` (non-blocking, for an event loop) with this platform's
    options; OSError (EADDRINUSE) when another program listens there, even where the bind let it
    through."""
    return _listening([(family, kind, proto, address)], backlog)[0]


def listen_on(host: str, port: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """Listening sockets on every address ``host`` names (one for an address, two for "localhost",
    IPv4's and IPv6's for ""), each as ``listening_socket`` makes it; OSError when one cannot listen
    (then none is left open)."""
    infos = [info for info in addresses(host, port) if _supported(info[0])]
    if not infos:
        raise OSError(errno.EADDRNOTAVAIL, f"no address of {host!r} can be used here")
    return _listening(infos, backlog)


def _supported(family: int) -> bool:
    """False for a family this machine lacks (IPv6 turned off): asyncio skips its addresses too."""
    try:
        socket.socket(family, socket.SOCK_STREAM).close()
    except OSError:
        return False
    return True


def _listening(infos: list[tuple], backlog: int) -> list[socket.socket]:
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, address in infos:
            socks.append(_bound_listener(family, kind, proto, address))
        for _, _, _, (host, port, *_) in infos:
            # Ours are bound but none listens yet: whoever accepts is another program on the port.
            if port != 0 and someone_listens(host, port):
                raise OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE))
        for sock in socks:
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in socks:
            sock.close()
        raise
    return socks


def _bound_listener(family: int, kind: int, proto: int, address: tuple) -> socket.socket:
    try:
        return _bound(family, kind, proto, address, listen_options())
    except OSError as exc:
        if not (sys.platform == "darwin" and exc.errno in _IN_USE and address[1] != 0
                and not someone_listens(address[0], address[1])):
            raise
    # Without SO_REUSEADDR macOS refuses an address for a while after its connections closed
    # (TIME_WAIT): with nobody listening there, a restart binds with it.
    return _bound(family, kind, proto, address, [(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)])


def _bound(family: int, kind: int, proto: int, address: tuple, options: list[Option]) -> socket.socket:
    """A socket bound to ``address`` with ``options``; OSError when it cannot be made or bound."""
    sock = socket.socket(family, kind, proto)
    try:
        for option in options:
            sock.setsockopt(*option)
        if family == socket.AF_INET6:  # as asyncio: an IPv6 socket is not also IPv4's
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock
