#!/usr/bin/env python3
"""Summarize `ncu --page raw --csv` output: per kernel, time, DRAM, occupancy,
issue activity and the largest warp stall reasons. Usage: ncu_raw_summary.py CSV"""
import csv
import sys

KEYS = ["gpu__time_duration.sum", "dram__bytes_read.sum",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed", "launch__grid_size",
        "launch__block_size", "launch__registers_per_thread",
        "sm__warps_active.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
        "lts__t_sector_hit_rate.pct"]


def main(path):
    rows = [r for r in csv.reader(open(path)) if len(r) > 10]
    if len(rows) < 3:
        print("ncu: no rows")
        return
    head, units = rows[0], rows[1]
    col = {n: i for i, n in enumerate(head)}
    for r in rows[2:]:
        print("---", r[col["Kernel Name"]][:100] if "Kernel Name" in col else "?")
        for k in KEYS:
            if k in col:
                print(f"  {k:58s} {r[col[k]]:>14s} {units[col[k]]}")
        stalls = []
        for n, i in col.items():
            if "issue_stalled" in n and n.endswith("per_warp_active.pct"):
                try:
                    stalls.append((float(r[i].replace(",", "")), n))
                except ValueError:
                    pass
        for v, n in sorted(stalls, reverse=True)[:8]:
            why = n.split("issue_stalled_")[1].split("_per_warp")[0]
            print(f"  stall {why:42s} {v:8.2f} % of active warp cycles")


if __name__ == "__main__":
    main(sys.argv[1])
