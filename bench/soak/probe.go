package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// series is one line of a Prometheus text page: a name, its labels and a value.
type series struct {
	// name selects the family on /metrics.
	name string
	// labels tell the series of a family apart.
	labels map[string]string
	// value is its value.
	value float64
}

// parseMetrics reads a Prometheus text exposition, keeping the series whose name has one
// of the prefixes. Comments and malformed lines are skipped.
func parseMetrics(r io.Reader, prefixes ...string) ([]series, error) {
	var out []series
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		keep := false
		for _, p := range prefixes {
			keep = keep || strings.HasPrefix(line, p)
		}
		if !keep {
			continue
		}
		s, ok := parseSeries(line)
		if ok {
			out = append(out, s)
		}
	}
	return out, sc.Err()
}

// parseSeries parses `name{a="x",b="y"} value [timestamp]`.
func parseSeries(line string) (series, bool) {
	s := series{labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i < 0 {
		return s, false
	} else {
		s.name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		end := strings.LastIndex(rest, "}")
		if end < 0 {
			return s, false
		}
		for _, kv := range splitLabels(rest[1:end]) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return s, false
			}
			uv, err := strconv.Unquote(v)
			if err != nil {
				return s, false
			}
			s.labels[k] = uv
		}
		rest = rest[end+1:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return s, false
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return s, false
	}
	s.value = v
	return s, true
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// scrape fetches url's metrics page and keeps gollm's series and Triton's GPU memory.
func scrape(ctx context.Context, hc *http.Client, url string) ([]series, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return parseMetrics(resp.Body, "gollm_", "nv_gpu_memory_used_bytes")
}

// sum adds the values of name's series whose labels include match (model="austen", say);
// ok is false when there is none.
func sum(ss []series, name string, match map[string]string) (total float64, ok bool) {
next:
	for _, s := range ss {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
		ok = true
	}
	return total, ok
}

// findServer finds the tritonserver process serving gRPC on port: one whose command line
// says --grpc-port=port (or none, for Triton's default 8001).
func findServer(port int) (int, error) {
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if filepath.Base(args[0]) != "tritonserver" {
			continue
		}
		p := 8001
		for _, a := range args[1:] {
			if v, ok := strings.CutPrefix(a, "--grpc-port="); ok {
				p, _ = strconv.Atoi(v)
			}
		}
		if p == port {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			found = append(found, pid)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("no tritonserver process with gRPC port %d on this machine; give -pid", port)
	case 1:
		return found[0], nil
	}
	return 0, fmt.Errorf("tritonserver processes %v all serve gRPC port %d; give -pid", found, port)
}
