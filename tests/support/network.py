"""Hosts on a real network on one machine, for the topology test (tests/deploy/).

Each host is a network namespace (`ip netns add`) joined by a veth pair to a Linux bridge in
the root namespace, with a 10.x address on a /24 of the run's own. The root namespace holds
the bridge's first address: the services every host needs (redis-server, PostgreSQL) listen
there, and the browser, which runs in the root namespace, reaches the hosts through it. A
process runs on a host under `ip netns exec`, which execs it, so its pid is the process's own.

Without root (CAP_NET_ADMIN) or iproute2, the hosts fall back to distinct loopback addresses
127.0.0.x in the root namespace: the same processes and addresses, but no network between them.

Names carry the test process's pid, so two runs never share a namespace or interface; every
namespace, veth and bridge made here is removed by `Topology.remove`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field

from tests.support.processes import free_port

FORCE_LOOPBACK = "TANDEM_TOPOLOGY_LOOPBACK"  # set to 1 to take the fallback on purpose
WEB_PORT = 8000  # every namespaced host has its own address, so they can share a port


@dataclass(frozen=True)
class Host:
    """One machine of the topology: its address, and its namespace (None on loopback)."""

    name: str
    address: str
    netns: str | None

    def command(self, argv: list[str]) -> list[str]:
        """argv run on this host."""
        return ["ip", "netns", "exec", self.netns, *argv] if self.netns else list(argv)

    def port(self) -> int:
        """A port for a server on this host: a fixed one in its own namespace, else a free one."""
        return WEB_PORT if self.netns else free_port()


def ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, text=True, timeout=30)


def used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks this machine already routes or holds addresses in."""
    output = subprocess.run(
        ["ip", "-4", "-o", "addr", "show"], check=True, capture_output=True, text=True
    ).stdout
    networks = [ipaddress.ip_interface(line.split()[3]).network for line in output.splitlines()]
    routes = subprocess.run(
        ["ip", "-4", "route", "show", "table", "all"], capture_output=True, text=True
    ).stdout
    for line in routes.splitlines():
        destination = line.split()[0] if line.split() else ""
        if destination[:1].isdigit():
            networks.append(ipaddress.ip_network(destination, strict=False))
    return networks


def free_subnet(seed: int) -> ipaddress.IPv4Network:
    """A 10.x.y.0/24 that overlaps nothing on this machine, chosen from `seed` (the pid)."""
    used = used_networks()
    for step in range(256 * 256):
        index = (seed + step) % (256 * 256)
        candidate = ipaddress.ip_network(f"10.{index >> 8}.{index & 0xFF}.0/24")
        if not any(candidate.overlaps(network) for network in used):
            return candidate
    raise RuntimeError("no free 10.x.y.0/24 on this machine")


def can_make_namespaces() -> str | None:
    """None when namespaces can be made here; else why not (the fallback's reason)."""
    if os.environ.get(FORCE_LOOPBACK) == "1":
        return f"{FORCE_LOOPBACK}=1"
    if shutil.which("ip") is None:
        return "`ip` (iproute2) is not installed"
    if os.geteuid() != 0:
        return "not root (no CAP_NET_ADMIN)"
    return None


@dataclass
class Topology:
    """A bridge and namespaced hosts (or the loopback fallback); `remove` undoes all of it."""

    tag: str = field(default_factory=lambda: f"{os.getpid():07d}")  # fixed width: no prefixes
    hosts: dict[str, Host] = field(default_factory=dict)
    fallback_reason: str | None = None
    subnet: ipaddress.IPv4Network | None = None
    bridge: str | None = None
    _made_namespaces: list[str] = field(default_factory=list)

    @property
    def namespaced(self) -> bool:
        return self.bridge is not None

    @property
    def service_address(self) -> str:
        """Where the shared services listen: the bridge's address in the root namespace."""
        return str(next(self.subnet.hosts())) if self.namespaced else "127.0.0.1"

    @property
    def clients(self) -> str:
        """The network the hosts connect from (for PostgreSQL's pg_hba.conf)."""
        return str(self.subnet) if self.namespaced else "127.0.0.0/8"

    def describe(self) -> str:
        hosts = ", ".join(f"{h.name} {h.address}" for h in self.hosts.values())
        if self.namespaced:
            return f"network namespaces on bridge {self.bridge} ({self.subnet}): {hosts}"
        return f"loopback addresses, no namespaces ({self.fallback_reason}): {hosts}"

    def make(self, names: list[str]) -> Topology:
        """The bridge and one host per name; on a failure, whatever was made is removed."""
        self.fallback_reason = can_make_namespaces()
        if self.fallback_reason is None:
            try:
                self._make_namespaces(names)
            except subprocess.CalledProcessError as error:
                self.remove()
                self.fallback_reason = f"`{' '.join(error.cmd)}` failed: {error.stderr.strip()}"
        if not self.namespaced:
            self.hosts = {
                name: Host(name, f"127.0.0.{index}", None)
                for index, name in enumerate(names, start=2)
            }
        return self

    def _make_namespaces(self, names: list[str]) -> None:
        self.subnet = free_subnet(int(self.tag))
        addresses = self.subnet.hosts()
        bridge_address = next(addresses)
        self.bridge = f"tdb{self.tag}"
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{bridge_address}/{self.subnet.prefixlen}", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")
        for index, name in enumerate(names):
            netns, outer, inner = f"tandem-{self.tag}-{name}", f"tdv{self.tag}{index}", "eth0"
            address = next(addresses)
            ip("netns", "add", netns)
            self._made_namespaces.append(netns)
            ip("link", "add", outer, "type", "veth", "peer", "name", f"tdp{self.tag}{index}")
            ip("link", "set", f"tdp{self.tag}{index}", "netns", netns)
            ip("link", "set", outer, "master", self.bridge)
            ip("link", "set", outer, "up")
            ip("-n", netns, "link", "set", f"tdp{self.tag}{index}", "name", inner)
            ip("-n", netns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", inner)
            ip("-n", netns, "link", "set", inner, "up")
            ip("-n", netns, "link", "set", "lo", "up")
            self.hosts[name] = Host(name, str(address), netns)

    def remove(self) -> None:
        """Delete the namespaces (their veth ends go with them, and so the pairs) and the bridge.

        The processes running in them must have been stopped first: a namespace outlives its
        name while a process is still in it.
        """
        for netns in reversed(self._made_namespaces):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, timeout=30)
        self._made_namespaces.clear()
        for index in range(len(self.hosts) + 1):  # a veth made before its namespace failed
            outer = f"tdv{self.tag}{index}"
            subprocess.run(["ip", "link", "del", outer], capture_output=True, timeout=30)
        if self.bridge is not None:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, timeout=30)
            self.bridge = None

    def leftovers(self) -> list[str]:
        """Namespaces and links of this run still present (empty after `remove`)."""
        netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
        names = [line.split()[0] for line in netns.splitlines() if line.strip()]
        names += [line.split(":")[1].strip().split("@")[0] for line in links.splitlines()]
        mine = (f"tandem-{self.tag}-", f"tdb{self.tag}", f"tdv{self.tag}", f"tdp{self.tag}")
        return [name for name in names if name.startswith(mine)]
