"""Per-kernel time breakdown from `ncu --csv` output.

    ncu --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        --cache-control all --clock-control none CMD > k.csv
    python3 bench/ncu_summary.py k.csv                 # every kernel profiled
    python3 bench/ncu_summary.py --step last k.csv     # the last step only
    python3 bench/ncu_summary.py --step prompt k.csv   # the last step with context attention

Every gollm step starts with embedding_layernorm_kernel, so --step cuts the launches
there: `last` is the final step of the run (a decode step, in a decode workload), `prompt`
the last step that ran attention_context (a prompt step). Prints each kernel's launches,
total and mean microseconds, share, and DRAM bytes over time where those were measured,
largest first.
"""
import argparse
import csv
import re
from collections import defaultdict

STEP_START = "embedding_layernorm_kernel"


def short(name):
    name = re.sub(r"\(.*", "", name)
    name = re.sub(r"<.*", "", name)
    return name.replace("void ", "").replace("gollm::", "")


def read(path):
    """Launches in order: (kernel, {metric: value in ns or bytes})."""
    launches = {}
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for row in csv.DictReader(lines):
        key = int(row["ID"])
        k = launches.setdefault(key, (short(row["Kernel Name"]), {}))
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "")
        scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "byte": 1, "Kbyte": 1e3,
                 "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
        k[1][row["Metric Name"]] = v * scale
    return [launches[i] for i in sorted(launches)]


def steps(launches):
    out, cur = [], []
    for k in launches:
        if k[0] == STEP_START and cur:
            out.append(cur)
            cur = []
        cur.append(k)
    if cur:
        out.append(cur)
    return out


def summary(launches):
    tot, cnt, byt = defaultdict(float), defaultdict(int), defaultdict(float)
    for k, m in launches:
        tot[k] += m.get("gpu__time_duration.sum", 0) / 1e3
        cnt[k] += 1
        byt[k] += m.get("dram__bytes_read.sum", 0) + m.get("dram__bytes_write.sum", 0)
    all_us = sum(tot.values())
    print(f"{'kernel':52s} {'n':>5s} {'total us':>10s} {'mean us':>9s} {'share':>6s} {'MB':>8s} {'GB/s':>7s}")
    for k in sorted(tot, key=tot.get, reverse=True):
        bw = byt[k] / (tot[k] * 1e3) if tot[k] else 0
        print(f"{k[:52]:52s} {cnt[k]:5d} {tot[k]:10.1f} {tot[k] / cnt[k]:9.2f} {tot[k] / all_us:6.1%}"
              f" {byt[k] / 1e6:8.2f} {bw:7.0f}")
    all_b = sum(byt.values())
    print(f"{'all':52s} {sum(cnt.values()):5d} {all_us:10.1f} {'':9s} {'':6s} {all_b / 1e6:8.2f}"
          f" {all_b / (all_us * 1e3) if all_us else 0:7.0f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step", choices=["all", "last", "prompt"], default="all")
    args = ap.parse_args()
    launches = read(args.csv)
    if args.step == "last":
        launches = steps(launches)[-1]
    elif args.step == "prompt":
        ps = [s for s in steps(launches) if any(k[0].startswith("attention_context") for k in s)]
        if not ps:
            raise SystemExit("no step with attention_context")
        launches = ps[-1]
    summary(launches)


if __name__ == "__main__":
    main()
