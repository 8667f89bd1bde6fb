package main

import (
	"errors"
	"testing"
	"time"

	"go.uber.org/zap"
)

func TestDepartureDue(t *testing.T) {
	gone := errors.New("the server is shutting down")
	newDep := func(grace time.Duration, answer *error, asked *int) *departure {
		return &departure{
			probe: func() error { *asked++; return *answer },
			grace: grace,
			log:   zap.NewNop(),
		}
	}
	t0 := time.Unix(1000, 0)

	t.Run("an idle instance does not ask Triton", func(t *testing.T) {
		var answer error
		asked := 0
		d := newDep(0, &answer, &asked)
		if l := d.due(t0, false); l != nil || asked != 0 {
			t.Fatalf("due = %v after %d questions, want nil after none", l, asked)
		}
	})

	t.Run("a busy instance asks at most every departureCheck", func(t *testing.T) {
		var answer error
		asked := 0
		d := newDep(0, &answer, &asked)
		for i := range 10 {
			if l := d.due(t0.Add(time.Duration(i)*time.Millisecond), true); l != nil {
				t.Fatalf("due = %v while the model is served", l)
			}
		}
		if asked != 1 {
			t.Fatalf("asked %d times in 10 ms, want 1", asked)
		}
		d.due(t0.Add(departureCheck), true)
		if asked != 2 {
			t.Fatalf("asked %d times after departureCheck, want 2", asked)
		}
	})

	t.Run("without grace the requests end when the departure is seen", func(t *testing.T) {
		answer := gone
		asked := 0
		d := newDep(0, &answer, &asked)
		l := d.due(t0, true)
		if l == nil || !errors.Is(l.err, gone) {
			t.Fatalf("due = %v, want the departure", l)
		}
		if d.left() != l {
			t.Errorf("left() = %v, want %v", d.left(), l)
		}
		// Seen once is enough: no more questions, and it stays due.
		if l2 := d.due(t0.Add(time.Second), false); l2 != l || asked != 1 {
			t.Errorf("later due = %v after %d questions, want the same departure after 1", l2, asked)
		}
	})

	t.Run("with grace the requests go on until it has passed", func(t *testing.T) {
		answer := gone
		asked := 0
		d := newDep(2*time.Second, &answer, &asked)
		if l := d.due(t0, true); l != nil {
			t.Fatalf("due = %v at once, want nil during the grace", l)
		}
		if d.left() == nil {
			t.Fatal("left() = nil: new requests would still be accepted")
		}
		if l := d.due(t0.Add(1999*time.Millisecond), true); l != nil {
			t.Fatalf("due = %v before the grace passed", l)
		}
		if l := d.due(t0.Add(2*time.Second), true); l == nil {
			t.Fatal("due = nil once the grace passed")
		}
	})
}
