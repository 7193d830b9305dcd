"""Network attacks from sandboxed code: nothing outside the sandbox is reachable.

The sandbox runs with ``--network none``: its network namespace has a loopback of its own and
nothing else. Each test puts a real listener where the attack aims (the host's loopback, the
tunnel's own ports, an address in a network namespace the test creates) and asserts that the
sandbox neither reaches it nor gets a route to it. Only loopback addresses and 198.18.0.0/15
addresses inside a namespace created here are ever targeted.
"""

from __future__ import annotations

import secrets
import socket
import subprocess
from collections.abc import Iterator

import anyio
import pytest
from bridge_harness import Bridge
from listeners import CountingListener

pytestmark = [pytest.mark.anyio, pytest.mark.podman]

NETNS_ADDRESS = "198.18.0.1"
LISTENER = r"""
import socket, sys, select
kind, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
sock = socket.socket(family, socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
sock.bind((host, port))
if kind == "tcp":
    sock.listen(16)
print("listening", flush=True)
hits = 0
while select.select([sock, sys.stdin], [], [])[0] != [sys.stdin]:
    if kind == "tcp":
        sock.accept()[0].close()
    else:
        sock.recvfrom(65536)
    hits += 1
print("hits", hits, flush=True)
"""


class Listener(CountingListener):
    """A TCP or UDP listener (optionally in a network namespace)."""

    def __init__(self, kind: str, host: str, port: int, netns: str | None = None) -> None:
        super().__init__(LISTENER, kind, host, str(port), netns=netns)


def free_port(host: str = "127.0.0.1", kind: int = socket.SOCK_STREAM) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, kind) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def netns() -> Iterator[str]:
    """A network namespace of our own with 198.18.0.1 on its loopback; removed afterwards."""
    name = f"kbx-{secrets.token_hex(4)}"
    subprocess.run(["ip", "netns", "add", name], check=True, timeout=30)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True, timeout=30)
        subprocess.run(
            ["ip", "-n", name, "addr", "add", f"{NETNS_ADDRESS}/32", "dev", "lo"], check=True, timeout=30
        )
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False, timeout=30)


CONNECT = r"""
import errno, socket
FAMILIES = {"inet": socket.AF_INET, "inet6": socket.AF_INET6}
KINDS = {"tcp": socket.SOCK_STREAM, "udp": socket.SOCK_DGRAM}
def attempt(family, kind, host, port):
    try:
        s = socket.socket(FAMILIES[family], KINDS[kind])
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
    s.settimeout(3)
    try:
        if kind == "tcp":
            s.connect((host, port))
            return "connected"
        s.sendto(b"x" * 64, (host, port))
        return "sent"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
    finally:
        s.close()
def listening_here():
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return sorted(ports)
verdict = {"results": [[*t, attempt(*t)] for t in TARGETS], "own_listeners": listening_here()}
"""


def connect_code(targets: list[tuple[str, str, str, int]]) -> str:
    return f"TARGETS = {targets!r}\n" + CONNECT


async def test_tcp_and_udp_to_an_outside_address_have_no_route(bridge: Bridge, netns: str) -> None:
    port = 8765
    tcp = Listener("tcp", NETNS_ADDRESS, port, netns)
    udp = Listener("udp", NETNS_ADDRESS, port, netns)
    try:
        targets = [("inet", "tcp", NETNS_ADDRESS, port), ("inet", "udp", NETNS_ADDRESS, port)]
        verdict = await bridge.probe(connect_code(targets), "net-out")
    finally:
        tcp_hits, udp_hits = tcp.hits(), udp.hits()
        tcp.stop()
        udp.stop()
    assert [r[-1] for r in verdict["results"]] == ["ENETUNREACH", "ENETUNREACH"], verdict
    assert (tcp_hits, udp_hits) == (0, 0)


async def test_the_hosts_loopback_is_not_the_sandboxs(bridge: Bridge) -> None:
    tcp_port, udp_port = free_port(), free_port(kind=socket.SOCK_DGRAM)
    tcp6_port = free_port("::1")
    listeners = [
        Listener("tcp", "127.0.0.1", tcp_port),
        Listener("udp", "127.0.0.1", udp_port),
        Listener("tcp", "::1", tcp6_port),
    ]
    try:
        targets = [
            ("inet", "tcp", "127.0.0.1", tcp_port),
            ("inet", "udp", "127.0.0.1", udp_port),
            ("inet6", "tcp", "::1", tcp6_port),
        ]
        verdict = await bridge.probe(connect_code(targets), "net-loopback")
    finally:
        hits = [listener.hits() for listener in listeners]
        for listener in listeners:
            listener.stop()
    outcomes = [r[-1] for r in verdict["results"]]
    # The sandbox's 127.0.0.1 is its own: nothing listens there, a datagram goes nowhere.
    assert outcomes[0] == "ECONNREFUSED" and outcomes[1] == "sent", verdict
    assert outcomes[2] in ("ECONNREFUSED", "EADDRNOTAVAIL", "EAFNOSUPPORT"), verdict
    assert hits == [0, 0, 0]


async def test_the_tunnels_ports_are_not_reachable_from_the_sandbox(bridge: Bridge) -> None:
    await bridge.run("1", "net-tunnel")
    info = bridge.connection("net-tunnel")
    ports = [info[f"{channel}_port"] for channel in ("shell", "control", "stdin", "iopub", "hb")]
    targets = [("inet", "tcp", "127.0.0.1", port) for port in ports]
    verdict = await bridge.probe(connect_code(targets), "net-tunnel")
    for _, _, _, port, outcome in verdict["results"]:
        # A port number the sandbox's own kernel happens to use is its own socket, not the host's.
        assert outcome == "ECONNREFUSED" or port in verdict["own_listeners"], verdict


async def test_only_loopback_exists_and_ipv6_has_no_route(bridge: Bridge) -> None:
    code = r"""
import socket
import os
routes6 = []
if os.path.exists("/proc/net/ipv6_route"):
    routes6 = [line.split()[-1] for line in open("/proc/net/ipv6_route").read().splitlines()]
routes4 = [line.split()[0] for line in open("/proc/net/route").read().splitlines()[1:]]
interfaces = [name for _, name in socket.if_nameindex()]
verdict = {"interfaces": interfaces, "routes4": routes4, "routes6": sorted(set(routes6))}
"""
    verdict = await bridge.probe(code, "net-ifaces")
    assert verdict["interfaces"] == ["lo"]
    assert verdict["routes4"] == []
    assert set(verdict["routes6"]) <= {"lo"}


async def test_raw_and_packet_sockets_are_refused(bridge: Bridge) -> None:
    code = r"""
import errno, socket
def try_socket(*args):
    try:
        socket.socket(*args).close()
        return "created"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc))
verdict = {
    "raw4": try_socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP),
    "raw6": try_socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6),
    "rawtcp": try_socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP),
    "packet": try_socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300),
    "ping": try_socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP),
}
"""
    verdict = await bridge.probe(code, "net-raw")
    assert verdict == {
        "raw4": "EPERM",
        "raw6": "EPERM",
        "rawtcp": "EPERM",
        "packet": "EPERM",
        "ping": "EACCES",
    }, verdict


async def test_dns_resolution_fails_without_leaving_the_sandbox(bridge: Bridge) -> None:
    code = r"""
import socket, time
start = time.monotonic()
try:
    socket.getaddrinfo("kernelbridge-test.invalid", 80)
    outcome = "resolved"
except socket.gaierror as exc:
    outcome = "gaierror"
local = socket.getaddrinfo("localhost", 80)[0][4][0]
verdict = {"outcome": outcome, "seconds": time.monotonic() - start, "local": local}
"""
    with anyio.fail_after(120):
        verdict = await bridge.probe(code, "net-dns")
    assert verdict["outcome"] == "gaierror"
    assert verdict["local"] in ("127.0.0.1", "::1")
