"""Benchmark: the HTML report of a 1,000-gate run -- render time and file size.

    python scripts/bench_report.py [--gates 1000] [--log-bytes 20000]

Runs a real release check of GATES gates (layered, each printing LOG_BYTES of
output, every 25th failing), then re-renders its report in-process several
times and prints the best render time and index.html's size, against the
targets (under 1 s, under 5 MB), and against writing run.json alone (the
floor: serialising the same record).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

from dagrunner.report.html import render_html
from dagrunner.report.rundir import read_run_dir


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gates", type=int, default=1000)
    parser.add_argument("--log-bytes", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dagrunner-bench-report-") as tmp:
        root = Path(tmp)
        lines = ["[governor]", 'sample_interval = "100ms"', "[env]", 'pass = ["PATH"]']
        for i in range(args.gates):
            needs = f'needs = ["g{i - 40:04d}"]' if i >= 40 else ""
            code = "exit 1" if i % 25 == 24 else "true"
            lines += [
                f"[gates.g{i:04d}]",
                f"run = \"head -c {args.log_bytes} /dev/zero | tr '\\\\0' x; echo; {code}\"",
                'memory = "1M"',
                needs,
            ]
        (root / "m.toml").write_text("\n".join(lines) + "\n")
        run_dir = root / "run"
        env = {**os.environ, "DAGRUNNER_CACHE_DIR": str(root / "cache")}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dagrunner",
                "release-check",
                "m.toml",
                "--quiet",
                "--report-dir",
                str(run_dir),
            ],
            cwd=root,
            env=env,
            check=False,
            stdout=subprocess.DEVNULL,
        )
        record = read_run_dir(run_dir)
        best = float("inf")
        html = ""
        for _ in range(args.repeat):
            start = time.perf_counter()
            html = render_html(record, run_dir)
            best = min(best, time.perf_counter() - start)
        floor = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            orjson.dumps(record.to_json(), option=orjson.OPT_INDENT_2)
            floor = min(floor, time.perf_counter() - start)
        size = len(html.encode())
        logs = sum(p.stat().st_size for p in (run_dir / "logs").iterdir())
        print(f"{len(record.gates)} gates, {logs / 1e6:.1f} MB of logs on disk")
        print(
            f"render index.html  {best:7.3f}s   target < 1 s: {'met' if best < 1 else 'MISSED'}"
            f"   ({best / floor:.1f}x serialising run.json, {floor:.3f}s)"
        )
        print(
            f"index.html size    {size / 1e6:7.2f} MB  target < 5 MB: {'met' if size < 5e6 else 'MISSED'}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
