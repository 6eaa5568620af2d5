#!/usr/bin/env python3
"""The harness's plumbing on a machine without a GPU: run.py with a fake roles program
(`--roles`) natively, and the fair measure's sampling of a process's memory.

    python3 scripts/sched/test_run.py
"""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "measures"))
sys.path.insert(0, str(HERE))
import fair  # noqa: E402

# Answers each role as roles.cu would, at once.
FAKE = """#!/bin/sh
case "$1" in
fair) echo "FAIR 0.0$$ 0.00$$" ;;
tiny) echo "TINY ok 200.0" ;;
startup) echo "STARTUP 5.0" ;;
*) echo "unknown role $1" >&2; exit 2 ;;
esac
"""


class Harness(unittest.TestCase):
    def run_fake(self, only):
        with tempfile.TemporaryDirectory() as d:
            roles = Path(d) / "roles"
            roles.write_text(FAKE)
            roles.chmod(0o755)
            r = subprocess.run([sys.executable, str(HERE / "run.py"), "--modes", "native", "--only", only,
                                "--roles", str(roles), "--out", str(Path(d) / "out")],
                               capture_output=True, text=True, timeout=120)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("FAILED", r.stdout)
            return r.stdout

    def test_fair_reports_every_native_count(self):
        out = self.run_fake("fair")
        for n in fair.NS["native"]:
            row = [line for line in out.splitlines() if line.startswith(f"| fair | native | {n} |")]
            self.assertEqual(len(row), 1, out)
            cells = [c.strip() for c in row[0].split("|")]
            fastest, med, slowest = (float(x) for x in cells[4].split(" / "))
            self.assertTrue(fastest <= med <= slowest, row)
            self.assertGreaterEqual(float(cells[5]), 1.0)
            # Natively there is no server to sample.
            self.assertEqual(cells[9], "-")

    def test_scale_still_runs(self):
        out = self.run_fake("scale")
        self.assertIn("| scale | native |", out)

    def test_report_gives_ratios_and_memory(self):
        mem = {"peak": {"VmRSS": 900 << 10, "RssAnon": 300 << 10, "RssShmem": 500 << 10, "RssFile": 100 << 10},
               "most": {}, "hwm": 950 << 10}
        row = {"own": (0.01, 0.02, 0.05), "start": (0.03, 0.2), "late": 3, "mem": mem, "idle": 200 << 10}
        lines = fair.report({"mps": {48: dict(row, mem=None)}, "omps": {48: row, 1024: row}})
        text = "\n".join(lines)
        self.assertIn("| fair | omps | 1024 | 0.010 / 0.020 / 0.050 | 2.5 | 0.030 / 0.200 | 3 | "
                      "900 (300 / 500 / 100) | 950 | 200 |", text)
        self.assertIn("| fair | omps / MPS | 48 | median 1.00x, slowest 1.00x |", text)

    def test_sampler_reads_a_process_memory(self):
        pid = os.getpid()
        s = fair.Sampler(lambda: [pid])
        s.start()
        block = bytearray(64 << 20)  # touched: 64 MiB more resident
        for i in range(0, len(block), 4096):
            block[i] = 1
        got = s.finish()
        self.assertIsNotNone(got)
        self.assertGreaterEqual(got["most"]["RssAnon"], 64 << 10)
        self.assertGreaterEqual(got["hwm"], got["peak"]["VmRSS"])
        for k in ("RssAnon", "RssShmem", "RssFile"):
            self.assertIn(k, got["peak"])
        del block

    def test_sampler_without_a_server(self):
        s = fair.Sampler(lambda: [])
        s.start()
        self.assertIsNone(s.finish())


if __name__ == "__main__":
    unittest.main()
