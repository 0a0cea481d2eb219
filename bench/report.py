"""The benchmark's reports: JSON (the figures and ratios), a markdown table, and a PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

THROUGHPUT = ["r_kafka", "r_pg", "r_pipe", "r_naive", "r_matcher", "r_dbos"]
SCALE_OUT = ["r_matcher", "r_matcher_2_daemons", "r_matcher_3_daemons"]
# On a private 3-broker cluster, topics of three replicas; null when it did not start.
RF3 = ["r_kafka_rf3", "r_matcher_kafka_rf3"]
# The peers users would pick instead (bench/temporal_peer.py, bench/restate_peer.py); null
# when a peer could not run here.
PEERS = ["r_temporal", "r_temporal_sws", "r_restate", "r_restate_awakeable", "r_restate_early"]
PEER_PREFIXES = ("temporal_", "restate_")


def _spread(values: list[float], fmt: str) -> str:
    if len(values) < 2:
        return ""
    return f" ({format(min(values), fmt)} to {format(max(values), fmt)} over {len(values)} reps)"


def _throughput_rows(results: dict[str, Any], names: list[str]) -> list[str]:
    """A row per figure of ``names`` the results have, with its spread; null: not measured."""
    f, runs = results["figures"], results.get("runs", {})
    rows = []
    for name in names:
        if name not in f:
            continue  # results from before this figure was measured
        value = f[name]
        shown = (
            "not measured (see the notes)"
            if value is None
            else f"{value:,.0f} events/s{_spread(runs.get(name, []), ',.0f')}"
        )
        rows.append(f"| {name} | {shown} |")
    return rows


def _peer_rows(results: dict[str, Any]) -> list[str]:
    f = results["figures"]
    rows = _throughput_rows(results, PEERS)
    for key in sorted(k for k in f if k.startswith(PEER_PREFIXES) and f[k] is not None):
        if "_latency_" in key and key.endswith("_ms"):
            rows.append(f"| {key} | {f[key]:.1f} ms |")
        elif key.endswith("_sent_per_s"):
            rows.append(f"| {key} | {f[key]:,.0f} events/s sent |")
        elif key.endswith("_cores"):
            rows.append(f"| {key} | {f[key]:.2f} cores |")
        elif key.endswith("_cpu_s"):
            rows.append(f"| {key} | {f[key]:.2f} CPU-s |")
    return rows


def _cpu_rows(f: dict[str, Any]) -> list[str]:
    """Where the CPU went: per event in the throughput runs, in cores in the latency runs
    (see bench/cpu.py); a process left out was not on this machine."""
    rows = []
    for key in sorted(k for k in f if k.startswith("cpu_") and f[k] is not None):
        if key.endswith("_us_per_event"):
            rows.append(f"| {key} | {f[key]:,.0f} us of CPU per event |")
        elif key.endswith("_cores"):
            rows.append(f"| {key} | {f[key]:.2f} cores |")
    return rows


# What Postgres wrote and spent per event (bench/write_path.py): figure -> (label, format).
WRITE_PATH = {
    "wal_records_per_event": ("WAL records per event", ".1f"),
    "wal_bytes_per_event": ("WAL bytes per event (the records')", ",.0f"),
    "wal_lsn_bytes_per_event": ("WAL bytes per event (the insert position's move)", ",.0f"),
    "wal_fpi_bytes_per_event": ("of which full-page images", ",.0f"),
    "server_us_per_event": ("Postgres' time per event (top-level statements)", ",.1f"),
}


def _write_path_rows(results: dict[str, Any]) -> list[str]:
    """The write path's table, r_matcher beside the pipe's floor, with each figure's spread
    over the repetitions; empty for results from before it was measured."""
    measured = results.get("write_path") or {}
    if not measured:
        return []
    runs = results.get("runs", {})
    rows = ["", "| write path | r_matcher | r_pipe |", "|---|---|---|"]
    for name, (label, fmt) in WRITE_PATH.items():
        cells = []
        for phase in ("matcher", "pipe"):
            value = measured.get(phase, {}).get(name)
            spread = _spread(runs.get(f"write_path_{phase}_{name}", []), fmt)
            cells.append("not measured" if value is None else f"{value:{fmt}}{spread}")
        rows.append(f"| {label} | {' | '.join(cells)} |")
    return rows


def _ratio_row(results: dict[str, Any], name: str, value: float | None) -> str:
    if value is None:
        return f"| {name} | not measured (see the notes) |"
    return f"| {name} | {value:.2f}{_spread(results.get('ratio_runs', {}).get(name, []), '.2f')} |"


def _markdown(results: dict[str, Any]) -> str:
    f, r = results["figures"], results["ratios"]
    lines = [
        "| figure | value |",
        "|---|---|",
        *(f"| {name} | {f[name]:,.0f} events/s |" for name in THROUGHPUT),
        *(f"| {name} | {f[name]:,.0f} events/s |" for name in SCALE_OUT[1:] if name in f),
        *_throughput_rows(results, RF3),
        *_peer_rows(results),
    ]
    for key in sorted(k for k in f if k.startswith("latency_") and isinstance(f[k], float)):
        lines.append(f"| {key} | {f[key]:.1f} {'%' if key.endswith('_pct') else 'ms'} |")
    lines += _cpu_rows(f)
    for key in sorted(k for k in f if k.startswith("scale_")):
        unit = "ms" if key.endswith("_ms") else "events/s"
        lines.append(f"| {key} | {f[key]:,.1f} {unit} |")
    lines.append(f"| daemon peak RSS | {f['rss_peak_bytes'] / 2**20:.0f} MiB |")
    lines += _write_path_rows(results)
    lines += ["", "| ratio | value |", "|---|---|"]
    lines += [_ratio_row(results, k, v) for k, v in r.items()]
    lines += ["", "| target | met |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in results["targets"].items()]
    if results.get("write_path_targets"):
        lines += ["", "| write path target | met |", "|---|---|"]
        lines += [
            f"| {k} | {'yes' if v else 'NO'} |" for k, v in results["write_path_targets"].items()
        ]
    if results.get("phase_seconds"):
        lines += ["", "| phase | wall time |", "|---|---|"]
        lines += [f"| {k} | {v:,.0f} s |" for k, v in results["phase_seconds"].items()]
    if results.get("notes"):
        lines += ["", "Notes:", ""]
        lines += [f"- {note}" for note in results["notes"]]
    return "\n".join(lines) + "\n"


def _plot(results: dict[str, Any], path: Path) -> None:
    f = results["figures"]
    fig, (bars, cdf, scale) = plt.subplots(1, 3, figsize=(16, 4.8))
    scale_out = [n for n in SCALE_OUT[1:] if n in f]
    rf3 = [n for n in RF3 if f.get(n) is not None]
    peers = [n for n in PEERS if f.get(n) is not None]
    names = THROUGHPUT + scale_out + rf3 + peers
    colours = (
        ["#888"] * 4 + ["#2a7"] + ["#c55"] + ["#6b9"] * len(scale_out) + ["#57b"] * len(rf3)
        + ["#c55"] * len(peers)
    )  # fmt: skip
    labels = [
        n.replace("r_matcher_kafka_rf3", "matcher rf3")
        .replace("r_matcher_", "matcher x")
        .replace("_daemons", "")
        for n in names
    ]
    bars.bar(labels, [f[n] for n in names], color=colours)
    bars.set_ylabel("events/s (median)")
    bars.set_title("throughput")
    bars.tick_params(axis="x", rotation=30)
    for rate, samples in sorted(f.get("latency_samples_ms", {}).items(), key=lambda kv: int(kv[0])):
        ys = [(i + 1) / len(samples) for i in range(len(samples))]
        cdf.plot(samples, ys, label=f"{rate} events/s")
    cdf.set_xscale("log")
    cdf.set_xlabel("event published -> resume published (ms)")
    cdf.set_ylabel("fraction")
    cdf.set_title("latency CDF")
    cdf.legend()
    rows = sorted(
        int(k.split("_")[1]) for k in f if k.startswith("scale_") and k.endswith("_r_matcher")
    )
    scale.plot(rows, [f[f"scale_{n}_r_matcher"] for n in rows], marker="o")
    scale.set_xscale("symlog", linthresh=1000)
    scale.set_xlabel("waits and events already stored")
    scale.set_ylabel("r_matcher (events/s)")
    scale.set_ylim(bottom=0)
    scale.set_title("scale")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_reports(results: dict[str, Any], out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "results.json"
    json_path.write_text(json.dumps(results, indent=2) + "\n")
    (out_dir / "results.md").write_text(_markdown(results))
    _plot(results, out_dir / "results.png")
    return json_path.resolve()
