package batchmanager

import (
	"slices"
	"testing"
)

// TestStreamIntervalGathersTokens checks Config.StreamInterval: a streaming request's
// first token comes alone, then every response that is not the last carries exactly
// the interval's tokens, the final one what is left, and together they are the tokens
// of a request streamed token by token.
func TestStreamIntervalGathersTokens(t *testing.T) {
	for _, every := range []int{1, 3, 4} {
		eng := newFake(64, 4)
		_, c := start(t, eng, Config{StreamInterval: every})
		var reqs []*InferenceRequest
		for i, n := range []int{1, 2, 5, 9, 10, 13} {
			reqs = append(reqs, &InferenceRequest{ID: uint64(i + 1), InputIDs: []int32{int32(2 + i), 7, 9},
				MaxNewTokens: n, PadID: -1, Streaming: true})
		}
		c.add(reqs...)
		c.wait(t, len(reqs))
		for _, r := range reqs {
			got, err := c.tokensOf(t, r.ID)
			if err != nil {
				t.Fatalf("interval %d, request %d: %v", every, r.ID, err)
			}
			if want := fakeGenerate(r.InputIDs, r.MaxNewTokens, 50, 128, -1, nil); !slices.Equal(got, want) {
				t.Errorf("interval %d, request %d: got %v, want %v", every, r.ID, got, want)
			}
			rs := c.responses(r.ID)
			for k, res := range rs {
				n := len(res.out.Tokens)
				switch {
				case res.final:
					if k != len(rs)-1 || n > every {
						t.Errorf("interval %d, request %d: final response %d of %d has %d tokens", every, r.ID, k, len(rs), n)
					}
				case k == 0 && n != 1:
					t.Errorf("interval %d, request %d: first response has %d tokens, want 1", every, r.ID, n)
				case k > 0 && n != every:
					t.Errorf("interval %d, request %d: response %d has %d tokens, want %d", every, r.ID, k, n, every)
				}
			}
			// 1 + ⌈(n-1)/every⌉ responses at most (the final one may be empty after the last full one).
			if most := 2 + (r.MaxNewTokens-1+every-1)/every; len(rs) > most {
				t.Errorf("interval %d, request %d: %d responses for %d tokens, want at most %d", every, r.ID, len(rs), r.MaxNewTokens, most)
			}
		}
	}
	if _, err := New(newFake(8, 8), Config{StreamInterval: -1}, newClient().callbacks(), nil); err == nil {
		t.Error("New accepted a negative StreamInterval")
	}
}
