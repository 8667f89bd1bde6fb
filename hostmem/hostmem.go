// Package hostmem says how much of the host's memory the process may still take: the
// kernel's MemAvailable and, in a container, what its cgroup's memory limit leaves. A
// load that needs more is refused before it allocates, instead of ending in the OOM
// killer, which takes every model of the server with it.
package hostmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Memory is what the process may still take, as far as it can be read; a field it
// could not read is 0 (-1 for Available).
type Memory struct {
	// Available is MemAvailable of /proc/meminfo, in bytes: free memory and what the
	// kernel can reclaim without swapping; -1 when unknown.
	Available int64
	// Limit is the process's cgroup memory limit in bytes; 0 for none.
	Limit int64
	// Used is the cgroup's usage less its inactive file pages (which the kernel
	// reclaims before it kills), in bytes; valid when Limit is set.
	Used int64
	// LimitFile is the file Limit was read from.
	LimitFile string
}

// Headroom is what the process may still take, in bytes: the lesser of MemAvailable
// and the cgroup limit's remainder; -1 when neither is known.
func (m Memory) Headroom() int64 {
	h := m.Available
	if m.Limit > 0 {
		left := max(m.Limit-m.Used, 0)
		if h < 0 || left < h {
			h = left
		}
	}
	return h
}

// String says where the headroom comes from, for messages.
func (m Memory) String() string {
	var parts []string
	if m.Available >= 0 {
		parts = append(parts, "MemAvailable "+GiB(m.Available))
	}
	if m.Limit > 0 {
		parts = append(parts, fmt.Sprintf("cgroup limit %s (%s), %s in use", GiB(m.Limit), m.LimitFile, GiB(m.Used)))
	} else {
		parts = append(parts, "no cgroup memory limit")
	}
	return strings.Join(parts, "; ")
}

// GiB writes a byte count in GiB.
func GiB(b int64) string { return fmt.Sprintf("%.2f GiB", float64(b)/(1<<30)) }

// Read reads the process's memory headroom now.
func Read() Memory {
	m := Memory{Available: -1}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, ok := field(b, "MemAvailable:"); ok {
			m.Available = kb << 10
		}
	}
	proc, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return m
	}
	m.Limit, m.Used, m.LimitFile = cgroupFrom(string(proc), "/sys/fs/cgroup", os.ReadFile)
	return m
}

// CgroupLimit returns the memory limit of the process's cgroup and the file it was
// read from, or 0 when there is none (or it cannot be read).
func CgroupLimit() (int64, string) {
	m := Read()
	return m.Limit, m.LimitFile
}

// cgroupFrom reads the memory limit and usage for the cgroup membership in procCgroup
// (the text of /proc/self/cgroup) below root; read reads a file. usage is memory.current
// (v2) or memory.usage_in_bytes (v1) less the inactive file pages of memory.stat.
func cgroupFrom(procCgroup, root string, read func(string) ([]byte, error)) (limit, used int64, file string) {
	type candidate struct{ dir, limit, usage, inactive string }
	var cands []candidate
	for _, line := range strings.Split(procCgroup, "\n") {
		// hierarchy-ID:controllers:path
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			for _, d := range []string{filepath.Join(root, parts[2]), root} {
				cands = append(cands, candidate{d, "memory.max", "memory.current", "inactive_file"})
			}
		case hasController(parts[1], "memory"):
			for _, d := range []string{filepath.Join(root, "memory", parts[2]), filepath.Join(root, "memory")} {
				cands = append(cands, candidate{d, "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"})
			}
		}
	}
	for _, c := range cands {
		b, err := read(filepath.Join(c.dir, c.limit))
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, 0, ""
		}
		n, err := strconv.ParseInt(v, 10, 64)
		// cgroup v1 writes "no limit" as a page-rounded MaxInt64.
		if err != nil || n <= 0 || n >= 1<<60 {
			return 0, 0, ""
		}
		if b, err := read(filepath.Join(c.dir, c.usage)); err == nil {
			used, _ = strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		}
		if b, err := read(filepath.Join(c.dir, "memory.stat")); err == nil {
			if inactive, ok := field(b, c.inactive+" "); ok {
				used = max(used-inactive, 0)
			}
		}
		return n, used, filepath.Join(c.dir, c.limit)
	}
	return 0, 0, ""
}

// field finds the line that starts with name and returns its first number.
func field(text []byte, name string) (int64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name)
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return 0, false
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		return n, err == nil
	}
	return 0, false
}

// hasController says whether a cgroup v1 controller list ("cpu,cpuacct") names c.
func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}
