"""harness.free_port: a port for a server started next, outside the kernel's ephemeral range (an
outgoing connection cannot take it before the server binds it) and never handed out twice."""

from __future__ import annotations

import socket
from pathlib import Path

from multislice_local import harness


def test_ports_are_below_the_ephemeral_range_bindable_and_never_given_twice() -> None:
    low = harness._ephemeral_low()
    ports = [harness.free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    assert all(1024 <= p < low for p in ports), [p for p in ports if p >= low]
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # still free to bind


def test_the_range_is_read_from_the_kernel(tmp_path: Path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t60999\n")
    assert harness._ephemeral_low(str(f)) == 40000
    assert harness._ephemeral_low(str(tmp_path / "absent")) == 32768
