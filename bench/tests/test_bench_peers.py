"""The benchmark's peers, without running them: a peer that cannot run leaves null figures
and a note naming why, and never fails the run; its process is stopped when it hangs."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bench import run
from bench.cpu import process_cpu_s as cpu_seconds
from bench.peers import percentiles


def _plan() -> run.Plan:
    return run.Plan(
        n=10, naive_n=1, reps=1, rates=[500], latency_s=1, scale=[0], dbos_n=1, rf3=False,
        peer_n=5, peer_latency_s=0.1,
    )  # fmt: skip


def test_a_peer_that_fails_is_null_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run, "PEERS", {"nosuch": ("bench.no_such_peer", ("r_nosuch",))})
    results = run.Results(plan={}, machine={})
    steps: list[str] = []
    run._measure_peers(_plan(), results, steps.append)
    assert steps == ["peer nosuch"]
    assert results.runs == {}
    assert any(n.startswith("nosuch: not measured: exited 1") for n in results.notes)
    figures = run._figures({"rss_bytes": [1.0], "r_matcher": [100.0]}, {})
    assert figures["r_nosuch"] is None
    ratios = run._peer_ratios(_plan(), figures)
    assert ratios["matcher_over_nosuch"] is None


def test_a_peer_that_says_it_is_unavailable_is_null_with_its_reason(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "restate-server"
    monkeypatch.setenv("BENCH_RESTATE_SERVER", str(missing))
    monkeypatch.setattr(run, "PEERS", {"restate": run.PEERS["restate"]})
    results = run.Results(plan={}, machine={})
    run._measure_peers(_plan(), results, lambda _: None)
    assert f"restate: not measured: no restate-server at {missing}" in results.notes


def test_a_hanging_peer_is_stopped_with_its_children(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child"
    script = tmp_path / "hang.py"
    script.write_text(
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    started = time.monotonic()
    with pytest.raises(run.PeerFailed, match="still running after 2s"):
        run._run_peer("hang", [], timeout=2)
    assert time.monotonic() - started < 30
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text()


def test_cpu_seconds_reads_proc() -> None:
    busy = time.process_time() + 0.05
    while time.process_time() < busy:
        pass
    assert cpu_seconds(os.getpid()) >= 0.04


def test_percentiles_in_milliseconds() -> None:
    found = percentiles([i / 1000 for i in range(1, 101)])
    assert found == pytest.approx({"p50_ms": 51.0, "p95_ms": 96.0, "p99_ms": 100.0})
