"""The guard of the servers the project runs locally (rollout.app.webguard): which Host names a
server answers to for each address it may listen on, and which Origin is another site."""

from __future__ import annotations

import socket

from rollout.app.webguard import foreign_origin, host_allowed, listen_names


def test_the_names_a_server_answers_to_follow_the_address_it_listens_on():
    loop = listen_names("127.0.0.1")
    assert {"127.0.0.1", "localhost", "::1"} <= loop
    assert host_allowed("localhost:8765", loop, "127.0.0.1") and host_allowed("[::1]:8765", loop, "127.0.0.1")
    assert host_allowed("127.0.0.2:8765", loop, "127.0.0.1")  # another loopback address: not a name, cannot be rebound
    assert not host_allowed("evil.example:8765", loop, "127.0.0.1") and not host_allowed("10.0.0.1:8765", loop, "127.0.0.1")
    assert not host_allowed("a b", loop, "127.0.0.1") and host_allowed(None, loop, "127.0.0.1")  # unparseable; HTTP/1.0

    wild = listen_names("0.0.0.0")
    assert host_allowed("192.168.1.5:8765", wild, "192.168.1.5")  # the address the connection arrived at
    assert host_allowed(f"{socket.gethostname()}:8765", wild, "192.168.1.5") and host_allowed("localhost:8765", wild, "192.168.1.5")
    assert not host_allowed("192.168.1.6:8765", wild, "192.168.1.5") and not host_allowed("evil.example:8765", wild, "192.168.1.5")
    assert host_allowed("10.0.0.1:8765", wild, "::ffff:10.0.0.1")  # a dual-stack socket's IPv4 peer

    named = listen_names("viewer.lan")
    assert host_allowed("VIEWER.lan:8765", named, "10.0.0.1") and not host_allowed("localhost:8765", named, "10.0.0.1")


def test_an_origin_is_foreign_unless_it_is_the_servers_own():
    assert not foreign_origin(None, "127.0.0.1:8765")
    assert not foreign_origin("http://127.0.0.1:8765", "127.0.0.1:8765") and not foreign_origin("http://LOCALHOST", "localhost:80")
    for origin in ("http://evil.example", "http://127.0.0.1:8766", "https://127.0.0.1:8765", "null", "http://localhost:8765"):
        assert foreign_origin(origin, "127.0.0.1:8765"), origin
