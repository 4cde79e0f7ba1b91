"""Settings that cannot work are refused at start, naming the field (never a traceback from a client later)."""

from __future__ import annotations

import pytest

from tracker.settings import SettingsError, load_settings


@pytest.mark.parametrize("servers", ["host:notaport", "host", "localhost:9092,:9", "k-0:0", "k-0:65536"])
def test_bootstrap_servers_that_are_not_host_port_are_refused(servers: str) -> None:
    with pytest.raises(SettingsError, match=r"bootstrap_servers: .* is not host:port"):
        load_settings(None, {"kafka": {"bootstrap_servers": servers}})


@pytest.mark.parametrize("servers", ["kafka-0:9092", "k-0:9092, k-1:9092", "[::1]:9092", "10.0.0.1:9093"])
def test_bootstrap_servers_as_host_port_lists_are_accepted(servers: str) -> None:
    assert load_settings(None, {"kafka": {"bootstrap_servers": servers}}).kafka.bootstrap_servers == servers
