"""The benchmark harness itself runs (tiny sizes): a schema or SQL change that breaks one
of its measurements is caught here, not twenty minutes into `make bench`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.support.services import Services

# The smoke benchmark's own command is bounded at 600 s.
pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_produces_every_figure(services: Services, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MATCHER_")}
    env.update(
        MATCHER_KAFKA_BOOTSTRAP_SERVERS=services.kafka_bootstrap_servers,
        MATCHER_DATABASE_URL=services.database_url,
    )
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--smoke", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    path = Path(done.stdout.strip().splitlines()[-1])
    results = json.loads(path.read_text())
    figures = results["figures"]
    for name in (
        "r_kafka", "r_pg", "r_pipe", "r_naive", "r_matcher", "r_dbos",
        "r_matcher_2_daemons", "r_matcher_3_daemons", "rss_peak_bytes",
    ):  # fmt: skip
        assert figures[name] > 0, name
    assert results["ratios"]["matcher_over_pipe"] > 0
    # The resume worker on the daemon's resumes, and its latency beside the daemon.
    assert figures["r_worker"] > 0
    assert figures["r_matcher_fan_in"] > 0
    assert results["ratios"]["worker_over_matcher"] > 0
    assert 0 < figures["worker_latency_200_p50_ms"] <= figures["worker_latency_200_p99_ms"]
    assert figures["worker_latency_200_e2e_p99_ms"] > figures["worker_latency_200_p50_ms"]
    # At scale, each stored run was paired with an empty run beside it.
    assert len(results["ratio_runs"]["scale_2000_over_0"]) == 1
    assert results["ratios"]["scale_2000_over_0"] == results["ratio_runs"]["scale_2000_over_0"][0]
    assert len(results["runs"]["scale_0_r_matcher"]) == 1
    # The latency's stages, and the Kafka floor beside it, at the smoke run's one rate.
    for stage in ("", "stored_", "published_"):
        assert figures[f"latency_200_{stage}p99_ms"] > 0, stage
    assert 0 < figures["latency_kafka_200_p50_ms"] < figures["latency_200_p50_ms"]
    # The pipe's floor (bench/pipe.py) in windows alternating with matcher's, each pair's
    # ratio kept; its process's CPU is reported as the daemon's.
    assert 0 < figures["latency_kafka_200_p50_ms"] < figures["latency_pipe_200_p50_ms"]
    assert figures["latency_pipe_200_p99_ms"] >= figures["latency_pipe_200_p50_ms"]
    assert figures["cpu_latency_pipe_200_daemon_cores"] > 0
    assert len(results["ratio_runs"]["latency_200_p99_over_pipe"]) == 1
    assert results["ratios"]["latency_200_p99_over_pipe"] > 0
    # Where the CPU went (bench/cpu.py): every process of the run, the servers found by
    # the ports they listen on.
    for process in ("daemon", "postgres", "kafka", "bench"):
        assert figures[f"cpu_latency_200_{process}_cores"] > 0, process
    for process in ("daemon", "postgres"):
        assert figures[f"cpu_matcher_{process}_us_per_event"] > 0, process
    for process in ("postgres", "client"):
        assert figures[f"cpu_pipe_{process}_us_per_event"] > 0, process
    # /proc counts CPU in 10 ms ticks, and the smoke run's throughput runs (1,200 records,
    # a fraction of a second) may cost the broker, or the benchmark polling for the last
    # resume, less than one: zero is a true reading there.
    for figure in ("cpu_pipe_kafka", "cpu_matcher_kafka", "cpu_matcher_bench"):
        assert figures[f"{figure}_us_per_event"] >= 0, figure
    # How long the machine kept tasks waiting (bench/pressure.py), where the kernel says.
    if Path("/proc/pressure/io").exists():
        assert figures["latency_200_io_stall_ms"] >= 0
        assert figures["scale_2000_io_stall_ms"] >= 0
        assert 0 <= figures["latency_200_cpu_wait_pct"] <= 101  # a share of the window
        assert "latency_200_cpu_wait_pct |" in (tmp_path / "results.md").read_text()
    # Measured after one unrecorded window (the smoke plan's most) that read the broker's
    # JIT compiler threads (bench/jit.py), which every measured window reads too.
    assert results["runs"]["warm_up_windows_200"] == [1.0]
    assert any("1 unrecorded warm-up window" in note for note in results["notes"])
    assert 0 <= figures["latency_200_kafka_jit_pct"] <= 100 * (os.cpu_count() or 1)
    # The hypervisor's share of the machine's CPU meanwhile (/proc/stat, any Linux).
    assert 0 <= figures["latency_200_cpu_steal_pct"] <= 100
    _check_write_path(results, (tmp_path / "results.md").read_text(), services.database_url)
    assert "us of CPU per event" in (tmp_path / "results.md").read_text()
    assert (tmp_path / "results.md").read_text().startswith("| figure |")
    assert (tmp_path / "results.png").stat().st_size > 10_000


def _check_write_path(results: dict[str, Any], markdown: str, url: str) -> None:
    """What Postgres wrote and spent per event (bench/write_path.py), the daemon's and the
    pipe's: an event's inbox row alone is several WAL records and most of a kilobyte. The
    server's time needs pg_stat_statements preloaded; without it, a note says so."""
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW shared_preload_libraries").fetchone()
    timed = row is not None and "pg_stat_statements" in row[0]
    if not timed:
        assert any("server_us_per_event not measured" in note for note in results["notes"])
    for phase in ("matcher", "pipe"):
        measured = results["write_path"][phase]
        assert measured["wal_records_per_event"] > 3, phase
        assert measured["wal_bytes_per_event"] > 500, phase
        assert measured["wal_lsn_bytes_per_event"] > 500, phase
        assert measured["wal_fpi_bytes_per_event"] >= 0, phase
        assert not timed or measured["server_us_per_event"] > 0, phase
    matcher, pipe = results["write_path"]["matcher"], results["write_path"]["pipe"]
    assert matcher["wal_records_per_event"] > pipe["wal_records_per_event"]
    assert len(results["write_path_targets"]) == 3
    assert "| WAL records per event |" in markdown
