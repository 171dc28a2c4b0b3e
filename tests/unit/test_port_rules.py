"""Binding a port (core/basics/ports.py): each platform's listening options, recorded on a faked
platform, and the strict "is the port taken" rule, on real loopback sockets. Windows and macOS let
127.0.0.1:P bind while another program listens on 0.0.0.0:P; that bind is faked to succeed here
(Linux refuses it), so the connection probe is what must catch the other program."""

from __future__ import annotations

import asyncio
import errno
import socket
import sys

import pytest

from slotkeeper.core.basics import ports
from slotkeeper.core.engine.door.frontdoor import DoorPolicy, FrontDoor
from slotkeeper.core.engine.lifecycle.launching import claim_address
from slotkeeper.core.server import headstart
from slotkeeper.core.server.supervisor import port_user

REAL_SOCKET = socket.socket
REUSE = (socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


def free_port() -> int:
    with REAL_SOCKET() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[int, int, int]]:
    """The socket options every new socket is given (SO_EXCLUSIVEADDRUSE recorded only where this
    system lacks it)."""
    calls: list[tuple[int, int, int]] = []

    class Recording(REAL_SOCKET):
        def setsockopt(self, level, option, value, *rest):
            if level == socket.SOL_SOCKET:
                calls.append((level, option, value))
            if option == ports.SO_EXCLUSIVEADDRUSE and not hasattr(socket, "SO_EXCLUSIVEADDRUSE"):
                return
            super().setsockopt(level, option, value, *rest)

    monkeypatch.setattr(socket, "socket", Recording)
    return calls


@pytest.fixture
def listener():
    """Another program listening on ``address`` (0.0.0.0 or 127.0.0.1) at a free port."""
    opened: list[socket.socket] = []

    def listen(address: str) -> int:
        s = REAL_SOCKET()
        s.bind((address, 0))
        s.listen()
        opened.append(s)
        return s.getsockname()[1]

    yield listen
    for s in opened:
        s.close()


@pytest.fixture
def binds_succeed(monkeypatch):
    """Every bind succeeds, as Windows' and macOS's do for 127.0.0.1:P beside a listener on
    0.0.0.0:P (a bind Linux refuses gets a port of its own instead)."""
    class LaxBind(REAL_SOCKET):
        def bind(self, address):
            try:
                super().bind(address)
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                super().bind((address[0], 0, *address[2:]))

    monkeypatch.setattr(socket, "socket", LaxBind)


@pytest.mark.parametrize(("platform", "expected"), [
    ("win32", [(socket.SOL_SOCKET, ports.SO_EXCLUSIVEADDRUSE, 1)]),
    ("darwin", []),
    ("linux", [REUSE]),
])
def test_each_platform_listens_with_its_own_options(monkeypatch, recorded, platform, expected):
    monkeypatch.setattr(sys, "platform", platform)
    for make in (lambda: ports.listening_socket(*ports.addresses("127.0.0.1", free_port())[0]),
                 lambda: claim_address("127.0.0.1", free_port())):  # the front door's claim before the engine
        sock = make()
        assert sock is not None
        sock.close()
        assert recorded == expected, platform
        recorded.clear()
    if platform != "linux":
        assert REUSE not in recorded  # never SO_REUSEADDR on Windows and macOS


def test_exclusive_use_is_windows_own_value():
    # winsock2.h: SO_EXCLUSIVEADDRUSE is ((int)(~SO_REUSEADDR)), SO_REUSEADDR being 4 there.
    assert ports.SO_EXCLUSIVEADDRUSE == getattr(socket, "SO_EXCLUSIVEADDRUSE", -5) == ~4


def test_the_probes_do_not_wait_on_past_connections_on_macos(monkeypatch, recorded):
    """A closed connection's TIME_WAIT is no program on the port: the "is it free" binds take
    SO_REUSEADDR on macOS (the connection probe finds listeners)."""
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not ports.port_in_use("127.0.0.1", free_port())
    assert recorded and all(call == REUSE for call in recorded)


@pytest.mark.parametrize("other", ["0.0.0.0", "127.0.0.1"])
def test_a_listener_takes_the_port_even_where_the_bind_would_succeed(listener, binds_succeed, other):
    port = listener(other)
    assert ports.port_in_use("127.0.0.1", port)
    assert ports.port_in_use("0.0.0.0", port)
    # ... in every check that asks
    assert port_user("127.0.0.1", port) is not None  # the supervisor's, the engine's, the private port's
    assert not headstart._port_free(port)
    # and a free port is free (the probe is not always "taken")
    assert not ports.port_in_use("127.0.0.1", free_port())
    assert port_user("127.0.0.1", free_port()) is None
    assert headstart._port_free(free_port())


@pytest.mark.parametrize("other", ["0.0.0.0", "127.0.0.1"])
def test_the_door_will_not_listen_beside_another_program(listener, binds_succeed, other):
    port = listener(other)
    with pytest.raises(OSError) as refused:
        ports.listening_socket(*ports.addresses("127.0.0.1", port)[0])
    assert refused.value.errno == errno.EADDRINUSE
    assert claim_address("127.0.0.1", port) is None
    door = FrontDoor(None, _Prompts(), lambda: ("http://127.0.0.1:9", "k"), DoorPolicy())  # type: ignore[arg-type]
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1 port {port}"):
        asyncio.run(door.start("127.0.0.1", port))
    assert not door.running


def test_the_wildcard_counts(monkeypatch):
    """Binding the host may succeed while binding the wildcard address fails (Linux, for a listener
    on another address): taken."""
    port = free_port()

    def refusal(family, address, options):
        return OSError(errno.EADDRINUSE, "in use") if address[0] == "0.0.0.0" else None

    monkeypatch.setattr(ports, "_bind_refusal", refusal)
    assert ports.port_in_use("127.0.0.1", port)


def test_an_address_not_of_this_machine_is_not_a_busy_port():
    with pytest.raises(OSError):
        ports.port_in_use("192.0.2.1", free_port())  # TEST-NET-1: nobody's
    assert port_user("192.0.2.1", free_port()).startswith("cannot use 192.0.2.1:")


def test_macos_binds_past_time_wait_when_nobody_listens(monkeypatch, recorded):
    """Without SO_REUSEADDR macOS refuses an address while its closed connections wait (TIME_WAIT):
    with nobody listening there, the door binds with it rather than call the port busy."""
    monkeypatch.setattr(sys, "platform", "darwin")
    real_bound = ports._bound

    def bound(family, kind, proto, address, options):
        if REUSE not in options:
            raise OSError(errno.EADDRINUSE, "Address already in use")
        return real_bound(family, kind, proto, address, options)

    monkeypatch.setattr(ports, "_bound", bound)
    sock = ports.listening_socket(*ports.addresses("127.0.0.1", free_port())[0])
    sock.close()
    assert recorded == [REUSE]


def test_macos_does_not_bind_past_a_listener(monkeypatch, listener):
    monkeypatch.setattr(sys, "platform", "darwin")
    port = listener("127.0.0.1")
    with pytest.raises(OSError):
        ports.listening_socket(*ports.addresses("127.0.0.1", port)[0])


def test_every_interface_listens_without_refusing_itself():
    """Host "" is 0.0.0.0 and :: (where there is IPv6): all bound before any listens, so the probe
    never meets our own socket."""
    port = free_port()
    socks = ports.listen_on("", port)
    try:
        assert {s.getsockname()[1] for s in socks} == {port}
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        for s in socks:
            s.close()


def test_the_door_listens_on_its_own_sockets():
    port = free_port()
    door = FrontDoor(None, _Prompts(), lambda: ("http://127.0.0.1:9", "k"), DoorPolicy())  # type: ignore[arg-type]

    async def run() -> None:
        await door.start("127.0.0.1", port)
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            assert ports.port_in_use("127.0.0.1", port)
        finally:
            await door.stop()

    asyncio.run(run())
    assert not ports.port_in_use("127.0.0.1", port)


class _Prompts:
    """The front door's prompt tokens, never asked here."""

    def open(self) -> None:
        pass

    async def close(self) -> None:
        pass
