"""Ports for the stack's servers: chosen where no outgoing connection can take them before their server binds."""

from __future__ import annotations

import socket

from devstack.stack import readiness
from devstack.stack.readiness import LOOPBACK, free_port, listening_range


def _ephemeral() -> tuple[int, int]:
    low, high = (int(part) for part in readiness.EPHEMERAL_RANGE.read_text().split())
    return low, high


def test_a_free_port_is_never_in_the_range_outgoing_connections_use() -> None:
    low, high = _ephemeral()

    ports = {free_port() for _ in range(200)}

    assert not [port for port in ports if low <= port <= high]


def test_a_free_port_can_be_bound_by_a_server() -> None:
    port = free_port()

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.bind((LOOPBACK, port))
        server.listen()


def test_the_listening_range_lies_below_the_ephemeral_range_when_there_is_room(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(readiness, "EPHEMERAL_RANGE", tmp_path / "range")
    (tmp_path / "range").write_text("32768\t60999\n")
    assert listening_range() == (15000, 32767)

    (tmp_path / "range").write_text("1024\t50000\n")
    assert listening_range() == (50001, 65535)

    (tmp_path / "range").write_text("1024\t65535\n")
    assert listening_range() == (0, 0)
