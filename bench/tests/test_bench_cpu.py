"""The benchmark's CPU meter finds servers by their port and counts every process of a
forking server, the exited ones too."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench import cpu

# A parent that runs a child burning about half a second of CPU, waits for it (so the
# child's CPU moves into the parent's cutime), says so, and idles until told to exit.
_FORKING_PARENT = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c",
    "import time\\nend = time.process_time() + 0.5\\nwhile time.process_time() < end: pass"])
print("reaped", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def listening() -> Iterator[int]:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield int(server.getsockname()[1])


def test_a_listening_port_leads_to_its_process(listening: int) -> None:
    assert cpu.listening_pid(listening) == os.getpid()


def test_a_port_nobody_listens_on_leads_nowhere() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        unused = int(probe.getsockname()[1])  # bound, never listening
        assert cpu.listening_pid(unused) is None


@pytest.mark.timeout(60)
def test_a_forking_server_counts_the_children_it_has_reaped() -> None:
    with subprocess.Popen(
        [sys.executable, "-c", _FORKING_PARENT],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as parent:  # fmt: skip
        assert parent.stdout is not None
        assert parent.stdin is not None
        assert parent.stdout.readline().strip() == "reaped"
        # The parent itself idled: nearly all of this is its exited child's.
        assert cpu.tree_cpu_s(parent.pid) >= 0.4
        assert cpu.process_cpu_s(parent.pid) < 0.4
        parent.stdin.write("\n")
        parent.stdin.flush()
        parent.wait(timeout=30)


def test_a_live_child_is_counted_with_its_parent() -> None:
    # This process is the parent of the child while the child still runs.
    with subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE
    ) as child:
        assert child.pid in cpu._children(os.getpid())
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_a_window_is_the_difference_and_leaves_out_what_went_away() -> None:
    values = {"a": 1.0, "b": 5.0}
    now = [100.0]

    def gone() -> float:
        if now[0] > 100.0:
            raise OSError("no such process")
        return 2.0

    meter = cpu.Meter({"a": lambda: values["a"], "b": lambda: values["b"], "c": gone},
                      lambda: now[0])  # fmt: skip
    meter.start()
    values["a"], values["b"], now[0] = 3.0, 5.5, 104.0
    window = meter.stop()
    assert window.cpu_s == {"a": 2.0, "b": 0.5}
    assert window.cores() == {"a": 0.5, "b": 0.125}
    assert window.us_per_event(1000) == {"a": 2000.0, "b": 500.0}


def test_a_meter_stopped_before_it_started_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="before it was started"):
        cpu.Meter({}, lambda: 0.0).stop()


@pytest.mark.parametrize(
    ("address", "port"),
    [
        ("postgresql://matcher@127.0.0.1:43249/matcher", 43249),
        ("127.0.0.1:40935", 40935),
        ("broker-1:19092,broker-2:19093", 19092),
        ("postgresql://db.internal/matcher", 5432),
    ],
)
def test_the_port_of_an_address(address: str, port: int) -> None:
    assert cpu.port_of(address, 5432) == port
