"""What every benchmark shares: machine description, load average, percentiles, results file."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Sequence

from tests.harness.controlplane import free_port  # noqa: F401  (re-exported: one free_port for tests and benchmarks)

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"


def load_average() -> str:
    """``uptime``'s 1/5/15-minute load averages: other work on the machine skews every number."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        mem_gib = round(int(Path("/proc/meminfo").read_text().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {"host": socket.gethostname(), "cpu": cpu, "cpus": os.cpu_count(), "memory_gib": mem_gib,
            "python": platform.python_version(), "platform": platform.platform(),
            "load_average_at_start": load_average(),
            "started_at": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}


def describe_machine(m: dict[str, Any]) -> str:
    return (f"machine: {m['cpu']}, {m['cpus']} CPUs, {m['memory_gib']} GiB; Python {m['python']}; "
            f"load average {m['load_average_at_start']} (1/5/15 min) at {m['started_at']}")


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def _status_mib(pid: int, field: str) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def peak_rss_mib(pid: int) -> float | None:
    """Peak resident set size of a process (``VmHWM``), MiB."""
    return _status_mib(pid, "VmHWM")


def cpu_seconds(pid: int) -> float | None:
    """CPU time a process has used so far, user + system, seconds (``/proc/PID/stat`` fields 14
    and 15, in clock ticks; proc(5)); None when the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "(comm)", which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float | None:
    """Resident set size of a process now (``VmRSS``), MiB."""
    return _status_mib(pid, "VmRSS")


def start_server(argv: list[str], port: int, log_path: Path, timeout: float = 180) -> subprocess.Popen[bytes]:
    """Start a server process and wait until ``GET /healthz`` answers."""
    log = open(log_path, "wb")
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[2]} exited ({proc.returncode}): {log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as r:
                if r.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise TimeoutError(f"{argv} not healthy after {timeout} s")


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def write_results(name: str, data: dict[str, Any], out: Path | None = None) -> Path:
    """Write ``data`` as JSON to ``out`` or ``benchmarks/results/<name>.json``; return the path."""
    path = out or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def python() -> str:
    return sys.executable
