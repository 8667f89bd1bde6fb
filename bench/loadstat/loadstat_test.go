package loadstat

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	l, err := Parse("load_c0_n1024_i128_o128")
	if err != nil {
		t.Fatal(err)
	}
	if l.InFlight() != 1024 || l.Workload() != "maxload_i128_o128" {
		t.Errorf("max load: in flight %d, workload %q", l.InFlight(), l.Workload())
	}
	l, err = Parse("load_c64_n256_i2048_o128")
	if err != nil {
		t.Fatal(err)
	}
	if l.InFlight() != 64 || l.Workload() != "load_c64_i2048_o128" || l.Requests != 256 {
		t.Errorf("c64: %+v, workload %q", l, l.Workload())
	}
	for _, bad := range []string{"load_c65_n64_i1_o2", "load_c1_n0_i1_o2", "load_c1_n4_i0_o2", "load_c1_n4_i1_o1", "load_x", "load_c1_n9999999_i1_o2"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestSummarize(t *testing.T) {
	t0 := time.Unix(100, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	s := Summarize([]Request{
		// first token after 10 ms, then 4 ms gaps of one token each
		{Offered: t0, Times: []time.Time{ms(10), ms(14), ms(18)}, Tokens: []int{1, 1, 1}},
		// offered later: its TTFT counts from its offer; a response of two tokens
		// after 8 ms is two gaps of 4 ms
		{Offered: ms(20), Times: []time.Time{ms(50), ms(58)}, Tokens: []int{1, 2}},
	})
	if s.Tokens != 6 || s.Wall != 58*time.Millisecond {
		t.Errorf("tokens %d, wall %v; want 6, 58ms", s.Tokens, s.Wall)
	}
	if len(s.TTFT) != 2 || s.TTFT[0] != 0.010 || s.TTFT[1] != 0.030 {
		t.Errorf("TTFT %v, want [0.01 0.03]", s.TTFT)
	}
	if len(s.ITL) != 4 {
		t.Fatalf("ITL %v, want four gaps", s.ITL)
	}
	for _, g := range s.ITL {
		if g < 0.00399 || g > 0.00401 {
			t.Errorf("ITL %v, want 4 ms each", s.ITL)
		}
	}
	rows := s.Rows(Load{Concurrency: 0, Requests: 2, In: 1, Out: 3}, map[string]any{"impl": "x"})
	if len(rows) != 7 || rows[0]["metric"] != "tokens_per_s" || rows[0]["impl"] != "x" {
		t.Errorf("rows %v", rows)
	}
	if v := rows[0]["value"].(float64); v < 103 || v > 104 {
		t.Errorf("tokens_per_s %v, want 6/0.058", v)
	}
	if p := Percentile([]float64{1, 2, 3, 4}, 50); p != 2 {
		t.Errorf("p50 of 1..4 = %v, want 2", p)
	}
}
