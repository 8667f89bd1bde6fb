package hostmem

import (
	"errors"
	"io/fs"
	"testing"
)

func TestCgroupFrom(t *testing.T) {
	files := map[string]string{
		"/cg/kubepods/pod1/memory.max":                   "2147483648\n",
		"/cg/kubepods/pod1/memory.current":               "1073741824\n",
		"/cg/kubepods/pod1/memory.stat":                  "anon 1\nfile 2\nactive_file 3\ninactive_file 268435456\n",
		"/cg/unlimited/memory.max":                       "max\n",
		"/cg/memory/docker/abc/memory.limit_in_bytes":    "1073741824\n",
		"/cg/memory/docker/abc/memory.usage_in_bytes":    "536870912\n",
		"/cg/memory/docker/abc/memory.stat":              "inactive_file 1\ntotal_inactive_file 134217728\n",
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
		name, proc  string
		limit, used int64
		file        string
	}{
		{"cgroup v2 with a limit, its usage less inactive file pages", "0::/kubepods/pod1\n", 2 << 30, 768 << 20, "/cg/kubepods/pod1/memory.max"},
		{"cgroup v2 without a limit", "0::/unlimited\n", 0, 0, ""},
		{"cgroup v2 falls back to the root's file", "0::/elsewhere\n", 4 << 30, 0, "/cg/memory.max"},
		{"cgroup v1 with a limit, its usage less inactive file pages", "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n", 1 << 30, 384 << 20, "/cg/memory/docker/abc/memory.limit_in_bytes"},
		{"cgroup v1 without a limit", "11:memory:/nolimit\n", 0, 0, ""},
		{"cgroup v1 with a zero limit reads as none", "11:memory:/docker/zero\n", 0, 0, ""},
		{"surrounding spaces are ignored", "11:memory:/docker/spaced\n", 512 << 20, 0, "/cg/memory/docker/spaced/memory.limit_in_bytes"},
		{"no memory controller", "12:cpu,cpuacct:/x\n", 0, 0, ""},
		{"unreadable text", "nonsense", 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			limit, used, file := cgroupFrom(tc.proc, "/cg", read)
			if limit != tc.limit || used != tc.used || file != tc.file {
				t.Errorf("got %d, %d used, from %q; want %d, %d used, from %q", limit, used, file, tc.limit, tc.used, tc.file)
			}
		})
	}
	if limit, _, _ := cgroupFrom("0::/\n", "/none", func(string) ([]byte, error) { return nil, errors.New("no") }); limit != 0 {
		t.Errorf("unreadable files: got %d, want 0", limit)
	}
}

func TestHeadroom(t *testing.T) {
	for _, tc := range []struct {
		name string
		m    Memory
		want int64
	}{
		{"MemAvailable alone", Memory{Available: 10 << 30}, 10 << 30},
		{"the cgroup's remainder when smaller", Memory{Available: 10 << 30, Limit: 4 << 30, Used: 1 << 30}, 3 << 30},
		{"MemAvailable when smaller", Memory{Available: 2 << 30, Limit: 4 << 30, Used: 1 << 30}, 2 << 30},
		{"a cgroup over its limit leaves nothing", Memory{Available: 2 << 30, Limit: 1 << 30, Used: 3 << 30}, 0},
		{"nothing known", Memory{Available: -1}, -1},
		{"only the cgroup known", Memory{Available: -1, Limit: 4 << 30, Used: 1 << 30}, 3 << 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.m.Headroom(); got != tc.want {
				t.Errorf("Headroom() = %d, want %d", got, tc.want)
			}
		})
	}
	if m := Read(); m.Available <= 0 {
		t.Errorf("Read() = %+v: no MemAvailable on this Linux machine", m)
	}
}
