#!/usr/bin/env python3
"""Plots a soak's CSV (node/scripts/soak.py): per member, RSS (MiB), open
file descriptors and the data directory (MiB) against the hours run, as
one PNG of three panels.

  python3 -m venv /tmp/plot && /tmp/plot/bin/pip install matplotlib==3.10.7
  /tmp/plot/bin/python node/scripts/soak_plot.py soak.csv docs/benchmarks/soak.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    source, target = sys.argv[1:3]
    rows = list(csv.DictReader(open(source)))
    members = sorted({r["member"] for r in rows})
    panels = [("rss_kib", "RSS (MiB)", 1024), ("fds", "open descriptors", 1),
              ("data_bytes", "data directory (MiB)", 1024 * 1024)]
    figure, axes = plt.subplots(len(panels), 1, figsize=(8, 7), sharex=True)
    for axis, (measure, label, scale) in zip(axes, panels):
        for member in members:
            mine = [r for r in rows if r["member"] == member]
            axis.plot([int(r["elapsed_s"]) / 3600 for r in mine],
                      [float(r[measure]) / scale for r in mine], label=f"member {member}", linewidth=1)
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(alpha=0.3)
    axes[0].legend(loc="lower right")
    axes[-1].set_xlabel("hours")
    figure.suptitle("Soak: 3 members, leases over 2 000 keys of 1 s windows, leader changes, backups")
    figure.tight_layout()
    figure.savefig(target, dpi=100)


if __name__ == "__main__":
    main()
