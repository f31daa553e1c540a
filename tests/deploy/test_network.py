"""The topology's network itself (tests/support/network.py): made, reachable, removed."""

from __future__ import annotations

import ipaddress
import subprocess

import pytest

from tests.support.network import Topology, can_make_namespaces, free_subnet, used_networks


def test_the_subnet_overlaps_no_network_of_this_machine():
    subnet = free_subnet(12345)
    assert subnet.subnet_of(ipaddress.ip_network("10.0.0.0/8")) and subnet.prefixlen == 24
    assert not any(subnet.overlaps(network) for network in used_networks())


def test_a_topology_is_made_and_removed_whole():
    if reason := can_make_namespaces():
        pytest.skip(f"no network namespaces here: {reason}")
    topology = Topology().make(["one", "two"])
    try:
        assert topology.namespaced, topology.fallback_reason
        one, two = topology.hosts["one"], topology.hosts["two"]
        made = topology.leftovers()
        assert {one.netns, two.netns, topology.bridge} <= set(made), made
        # Each host holds only its own address: the others are across the bridge.
        addresses = subprocess.run(
            one.command(["ip", "-4", "-o", "addr", "show"]), capture_output=True, text=True
        ).stdout
        assert one.address in addresses and two.address not in addresses
        assert topology.service_address not in addresses
    finally:
        topology.remove()
    assert topology.leftovers() == []


def test_the_loopback_fallback_gives_distinct_addresses(monkeypatch):
    monkeypatch.setenv("TANDEM_TOPOLOGY_LOOPBACK", "1")
    topology = Topology().make(["one", "two"])
    assert not topology.namespaced and topology.fallback_reason
    assert [host.address for host in topology.hosts.values()] == ["127.0.0.2", "127.0.0.3"]
    assert topology.hosts["one"].command(["true"]) == ["true"]
    assert "loopback" in topology.describe()
    topology.remove()
