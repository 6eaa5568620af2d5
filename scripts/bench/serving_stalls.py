#!/usr/bin/env python3
"""Lays the lanes' slow records beside the helper threads' slow jobs (issue 25): reads the
`omps-ctl stats` snapshots the serving benchmark writes ($OUT/serving-stats.txt) and
prints, per snapshot interval, every lane record and helper job slower than a threshold
with when it started (CLOCK_MONOTONIC ms, from `max_at_ns`), so that a stall of every lane
at once shows which helper (releaser, unpinner, compile thread) was in the driver then.

    python3 scripts/bench/serving_stalls.py serving-stats.txt [--ms 20]
"""
import argparse
import re


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("stats")
    ap.add_argument("--ms", type=float, default=20.0, help="slower than this (ms)")
    a = ap.parse_args()
    blocks = open(a.stats).read().split("=== t ")[1:]
    lane = re.compile(r"^lane (\S+) .* max_ns (\d+) max_op (\d+)(?: max_at_ns (\d+))?")
    helper = re.compile(r"^helper (\S+) .* max_ns (\d+) max_at_ns (\d+) max_what (\d+)")
    for blk in blocks:
        t = blk.split()[0]
        rows = []
        for line in blk.splitlines():
            m = lane.match(line)
            if m and int(m.group(2)) > a.ms * 1e6:
                at = int(m.group(4) or 0) / 1e6
                rows.append((at, f"lane {m.group(1)}: op {m.group(3)} {int(m.group(2)) / 1e6:.0f} ms from {at:.1f}"))
            m = helper.match(line)
            if m and int(m.group(2)) > a.ms * 1e6:
                at = int(m.group(3)) / 1e6
                rows.append((at, f"helper {m.group(1)}: job {m.group(4)} {int(m.group(2)) / 1e6:.0f} ms from {at:.1f}"))
        if rows:
            print(f"t {t} s:")
            for _, r in sorted(rows):
                print("   ", r)


if __name__ == "__main__":
    main()
