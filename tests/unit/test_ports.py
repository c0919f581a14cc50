"""Ports for the local stacks are picked outside the kernel's ephemeral range
(:mod:`rollout.devtools.local.ports`), where no ``bind(0)`` (Ray's gRPC servers among them) can
take them between the pick and the server's own bind."""

from __future__ import annotations

import socket

from rollout.devtools.local import ports


def test_the_range_is_from_the_floor_to_the_ephemeral_ranges_start(tmp_path):
    f = tmp_path / "range"
    f.write_text("32768\t60999\n")
    assert ports.unassigned_range(str(f)) == (ports.PORT_RANGE_FLOOR, 32768)
    f.write_text("15000 60999\n")  # an ephemeral range below the floor: nothing to pick from
    assert ports.unassigned_range(str(f)) is None
    assert ports.unassigned_range(str(tmp_path / "missing")) is None


def test_free_port_is_outside_the_ephemeral_range_and_bindable():
    span = ports.unassigned_range()
    picked = {ports.free_port() for _ in range(20)}
    if span is not None:
        assert all(span[0] <= p < span[1] for p in picked), (span, sorted(picked))
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when picked (nothing here took it since)


def test_a_taken_range_falls_back_to_the_oss_choice(monkeypatch):
    monkeypatch.setattr(ports, "_bindable", lambda host, port: False)
    span = ports.unassigned_range()
    port = ports.free_port()
    assert span is None or port >= span[1], (span, port)  # the OS's choice: the ephemeral range
