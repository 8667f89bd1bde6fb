package main

import (
	"errors"
	"io/fs"
	"testing"
)

func TestCgroupLimitFrom(t *testing.T) {
	files := map[string]string{
		"/cg/kubepods/pod1/memory.max":                   "2147483648\n",
		"/cg/unlimited/memory.max":                       "max\n",
		"/cg/memory/docker/abc/memory.limit_in_bytes":    "1073741824\n",
		"/cg/memory/nolimit/memory.limit_in_bytes":       "9223372036854771712\n",
		"/cg/memory.max":                                 "4294967296\n",
		"/cg/memory/memory.limit_in_bytes":               "garbage\n",
		"/cg/memory/docker/zero/memory.limit_in_bytes":   "0\n",
		"/cg/memory/docker/spaced/memory.limit_in_bytes": "  536870912  \n",
	}
	read := func(p string) ([]byte, error) {
		if v, ok := files[p]; ok {
			return []byte(v), nil
		}
		return nil, fs.ErrNotExist
	}
	for _, tc := range []struct {
		name, proc string
		want       int64
		file       string
	}{
		{"cgroup v2 with a limit", "0::/kubepods/pod1\n", 2 << 30, "/cg/kubepods/pod1/memory.max"},
		{"cgroup v2 without a limit", "0::/unlimited\n", 0, ""},
		{"cgroup v2 falls back to the root's file", "0::/elsewhere\n", 4 << 30, "/cg/memory.max"},
		{"cgroup v1 with a limit", "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n", 1 << 30, "/cg/memory/docker/abc/memory.limit_in_bytes"},
		{"cgroup v1 without a limit", "11:memory:/nolimit\n", 0, ""},
		{"cgroup v1 with a zero limit reads as none", "11:memory:/docker/zero\n", 0, ""},
		{"surrounding spaces are ignored", "11:memory:/docker/spaced\n", 512 << 20, "/cg/memory/docker/spaced/memory.limit_in_bytes"},
		{"no memory controller", "12:cpu,cpuacct:/x\n", 0, ""},
		{"unreadable text", "nonsense", 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, file := cgroupLimitFrom(tc.proc, "/cg", read)
			if got != tc.want || file != tc.file {
				t.Errorf("got %d from %q, want %d from %q", got, file, tc.want, tc.file)
			}
		})
	}
	if got, _ := cgroupLimitFrom("0::/\n", "/none", func(string) ([]byte, error) { return nil, errors.New("no") }); got != 0 {
		t.Errorf("unreadable files: got %d, want 0", got)
	}
}
