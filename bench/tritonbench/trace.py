"""Summarize a GOLLM_ITER_TRACE file (backend/profile.go): one row per burst of work.

    python3 bench/tritonbench/trace.py TRACE...

A burst is a run of iterations and sends with no idle gap over 1 ms (one tritonbench repetition).
Per burst: iterations, wall from the first iteration's start to the last response sent,
the median decode iteration (no context tokens) and its engine step (the rest is the batch
manager's and the backend's), the median gap between iterations,
the senders' busy time per response, the responses a sender took per wake-up (about the
requests it serves per iteration when it keeps up; more when they queue behind it), and
how far the last response trailed the last iteration (the senders' backlog).
"""
import statistics
import sys


def bursts(recs, idle_us=1000):
    out, cur, last = [], [], None
    for r in recs:
        if last is not None and r[1] - last > idle_us:
            out.append(cur)
            cur = []
        cur.append(r)
        last = max(last or 0, r[2])
    if cur:
        out.append(cur)
    return out


def main():
    for path in sys.argv[1:]:
        recs = []
        for line in open(path):
            if line.startswith("#"):
                continue
            f = line.split()
            # Traces before the engine_us column have five fields.
            eng = float(f[5]) if len(f) > 5 else -1.0
            recs.append((f[0], float(f[1]), float(f[2]), int(f[3]), int(f[4]), eng))
        recs.sort(key=lambda r: r[1])
        print(f"== {path}")
        print("iters  wall_ms  ctx_iters  decode_iter_us  decode_engine_us  gap_us  max_batch  sender_us/resp  resp/wake  backlog_ms  executes  admit_us  ctx_engine_us  first_ms")
        for bu in bursts(recs):
            it = [r for r in bu if r[0] == "I"]
            se = [r for r in bu if r[0] == "S"]
            ar = [r for r in bu if r[0] == "A"]
            admit = []
            for a in ar:
                nxt = [r[1] for r in it if r[1] >= a[2]]
                if nxt:
                    admit.append(min(nxt) - a[2])
            if not it:
                continue
            dec = [r[2] - r[1] for r in it if r[4] == 0]
            deng = [r[5] for r in it if r[4] == 0]
            gaps = [it[i + 1][1] - it[i][2] for i in range(len(it) - 1)]
            nresp = sum(r[3] for r in se)
            busy = sum(r[2] - r[1] for r in se)
            end = max(r[2] for r in bu)
            print("%5d  %7.1f  %9d  %14.1f  %16.1f  %6.1f  %9d  %14.2f  %9.1f  %10.2f  %8d  %8.1f  %13.1f  %8.2f" % (
                len(it), (end - it[0][1]) / 1e3, sum(1 for r in it if r[4] > 0),
                statistics.median(dec) if dec else -1, statistics.median(deng) if deng else -1,
                statistics.median(gaps) if gaps else -1,
                max(r[3] for r in it), busy / nresp if nresp else -1, nresp / len(se) if se else -1,
                (max(r[2] for r in se) - it[-1][2]) / 1e3 if se else -1,
                len(ar), statistics.median(admit) if admit else -1,
                sum(r[5] for r in it if r[4] > 0),
                (min(r[2] for r in se) - ar[0][1]) / 1e3 if ar and se else -1))


if __name__ == "__main__":
    main()
