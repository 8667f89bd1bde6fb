"""Per-kernel time breakdown from `ncu --csv --metrics gpu__time_duration.sum` output.

    ncu --csv --metrics gpu__time_duration.sum --launch-skip N --launch-count M CMD > k.csv
    python3 bench/ncu_summary.py k.csv

Prints each kernel's launches, total and mean microseconds, and its share, largest first.
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name.replace("void ", "").replace("gollm::", "")


def main(path):
    tot, cnt = defaultdict(float), defaultdict(int)
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "nsecond")
        us = v / 1e3 if unit.startswith("n") else v if unit.startswith("u") else v * 1e3
        k = short(row["Kernel Name"])
        tot[k] += us
        cnt[k] += 1
    all_us = sum(tot.values())
    print(f"{'kernel':60s} {'n':>5s} {'total us':>10s} {'mean us':>9s} {'share':>6s}")
    for k in sorted(tot, key=tot.get, reverse=True):
        print(f"{k[:60]:60s} {cnt[k]:5d} {tot[k]:10.1f} {tot[k] / cnt[k]:9.2f} {tot[k] / all_us:6.1%}")
    print(f"{'all':60s} {sum(cnt.values()):5d} {all_us:10.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
