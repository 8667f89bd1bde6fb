// Command arbench times tensor parallelism's all-reduce alone over GPUs 0..N-1, the
// custom one beside NCCL in the same process, and prints one JSON object per figure
// (BENCH.md's fields less date, commit and machine, which tests/gpu/tpar_check.sh adds):
//
//	arbench -lib libgollm_cuda.so -tp 2,4 -bytes 2048,8192,...,8388608
//
// A message of B bytes is rows × hidden fp16 values (hidden 4096, or B/2 below 8 KB); each
// rank holds its partial sums in fp32, as a projection leaves them. Four methods:
// gollm-custom-ar (the custom all-reduce fused with the residual add and RMSNorm, fp16 on
// the wire), gollm-custom-ar-2shot (the same in two shots: each rank sums its slice of
// the rows, then gathers the others' fp32 sums), nccl-f32 (ncclAllReduce of the fp32 sums then the residual add and RMSNorm's
// kernel: the step without the custom one) and nccl-fp16 (ncclAllReduce of the B bytes
// alone). Each is a CUDA graph of -iters calls replayed -reps times after one untimed
// replay; the figure is the median over the replays of the slowest rank's time a call,
// in nanoseconds. Every configuration is first checked against the host's sums.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"

	"gollm/bridge/cuda"
)

func main() {
	lib := flag.String("lib", "", "libgollm_cuda.so (default: the library search)")
	tps := flag.String("tp", "2,4", "rank counts, comma-separated (GPUs 0..n-1)")
	sizes := flag.String("bytes", "2048,8192,32768,131072,262144,524288,1048576,2097152,8388608", "message sizes in bytes (fp16 payload)")
	dtype := flag.String("dtype", "float16", "float16 or bfloat16")
	iters := flag.Int("iters", 200, "calls in the timed graph")
	reps := flag.Int("reps", 5, "timed replays")
	flag.Parse()
	if err := run(*lib, *tps, *sizes, *dtype, *iters, *reps); err != nil {
		fmt.Fprintln(os.Stderr, "arbench:", err)
		os.Exit(1)
	}
}

func ints(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want positive integers", list)
		}
		out = append(out, n)
	}
	return out, nil
}

func run(lib, tps, sizes, dtype string, iters, reps int) error {
	ways, err := ints(tps)
	if err != nil {
		return err
	}
	bytes, err := ints(sizes)
	if err != nil {
		return err
	}
	short := map[string]string{"float16": "fp16", "bfloat16": "bf16"}[dtype]
	if short == "" {
		return fmt.Errorf("dtype %q: want float16 or bfloat16", dtype)
	}
	enc := json.NewEncoder(os.Stdout)
	for _, n := range ways {
		devices := make([]int, n)
		for i := range devices {
			devices[i] = i
		}
		c, err := cuda.NewAllReduceComm(devices, lib)
		if err != nil {
			return err
		}
		for _, b := range bytes {
			hidden := 4096
			if b < 2*hidden {
				hidden = b / 2
			}
			if hidden%8 != 0 || b%(2*hidden) != 0 {
				c.Close()
				return fmt.Errorf("%d bytes: not rows of a hidden width that is a multiple of 8", b)
			}
			rows := b / (2 * hidden)
			for _, m := range []struct {
				method cuda.AllReduceMethod
				impl   string
			}{{cuda.AllReduceCustom, "gollm-custom-ar"}, {cuda.AllReduceTwoShot, "gollm-custom-ar-2shot"},
				{cuda.AllReduceNCCLF32, "nccl-f32"}, {cuda.AllReduceNCCL, "nccl-" + short}} {
				res, err := c.Run(cuda.AllReduceParams{Method: m.method, DType: dtype, Rows: rows, Hidden: hidden,
					Iters: iters, Reps: reps, Check: m.method != cuda.AllReduceNCCL})
				if err != nil {
					c.Close()
					return err
				}
				if (m.method == cuda.AllReduceCustom || m.method == cuda.AllReduceTwoShot) && !res.Custom {
					fmt.Fprintf(os.Stderr, "arbench: tp %d: no custom all-reduce: %s\n", n, res.Reason)
					continue
				}
				fmt.Fprintf(os.Stderr, "arbench: tp %d, %d bytes (%d×%d), %s: %.2f µs a call; h off the host's sums by %.3g, xn by %.3g, %d elements differ between ranks\n",
					n, b, rows, hidden, m.impl, res.PerCall.Seconds()*1e6, res.MaxErrH, res.MaxErrXn, res.RanksDiffer)
				if err := enc.Encode(map[string]any{"model": "allreduce", "dtype": short,
					"workload": fmt.Sprintf("allreduce_%db_tp%d", b, n), "impl": m.impl, "tp": n, "bytes": b,
					"metric": "ns_per_iteration", "value": float64(res.PerCall.Nanoseconds()),
					"max_err_h": res.MaxErrH, "max_err_xn": res.MaxErrXn, "ranks_differ": res.RanksDiffer}); err != nil {
					c.Close()
					return err
				}
			}
		}
		c.Close()
	}
	return nil
}
