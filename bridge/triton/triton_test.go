package triton

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"go.uber.org/zap"
)

func TestCompatibleVersions(t *testing.T) {
	tests := []struct {
		name         string
		major, minor uint32
		wantErr      string
	}{
		{"the same version is accepted", 1, 19, ""},
		{"a later minor is accepted", 1, 25, ""},
		{"an earlier minor is refused", 1, 18, "backend API version is 1.18; gollm needs 1.19"},
		{"another major is refused", 2, 19, "backend API version is 2.19"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := compatible("backend", tt.major, tt.minor, 1, 19)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("got %v, want no error", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tt.wantErr)
			}
			if CodeOf(err) != CodeUnsupported {
				t.Errorf("code %v, want %v", CodeOf(err), CodeUnsupported)
			}
		})
	}
}

func TestErrorCodes(t *testing.T) {
	t.Run("a plain Go error is internal", func(t *testing.T) {
		if c := CodeOf(errors.New("x")); c != CodeInternal {
			t.Errorf("got %v", c)
		}
	})
	t.Run("a wrapped coded error keeps its code and message", func(t *testing.T) {
		err := fmt.Errorf("load: %w", Errorf(CodeInvalidArg, "input %q: bad", "x"))
		if c := CodeOf(err); c != CodeInvalidArg {
			t.Errorf("code %v", c)
		}
		if err.Error() != `load: input "x": bad` {
			t.Errorf("message %q", err.Error())
		}
	})
	t.Run("WithCode keeps nil nil and unwraps to the cause", func(t *testing.T) {
		if WithCode(CodeCancelled, nil) != nil {
			t.Error("nil became an error")
		}
		cause := errors.New("gone")
		err := WithCode(CodeCancelled, cause)
		if !errors.Is(err, cause) || CodeOf(err) != CodeCancelled {
			t.Errorf("got %v (%v)", err, CodeOf(err))
		}
	})
	t.Run("codes and types have Triton's names", func(t *testing.T) {
		for _, c := range []struct{ got, want string }{
			{CodeCancelled.String(), "Cancelled"},
			{TypeInt32.String(), "INT32"},
			{TypeBytes.String(), "BYTES"},
			{TypeBF16.String(), "BF16"},
			{KindGPU.String(), "KIND_GPU"},
			{DataType(99).String(), "DataType(99)"},
		} {
			if c.got != c.want {
				t.Errorf("got %q, want %q", c.got, c.want)
			}
		}
		if TypeFP32.Size() != 4 || TypeUint64.Size() != 8 || TypeBool.Size() != 1 || TypeBytes.Size() != 0 {
			t.Error("wrong element sizes")
		}
	})
}

// logLine is one call of the write function.
type logLine struct {
	level LogLevel
	file  string
	line  int
	msg   string
}

func TestCore(t *testing.T) {
	var lines []logLine
	verbose := false
	core := NewCore(func(l LogLevel) bool { return l != LogVerbose || verbose },
		func(level LogLevel, file string, line int, msg string) {
			lines = append(lines, logLine{level, file, line, msg})
		})
	log := zap.New(core, zap.AddCaller()).With(zap.String("model", "gpt2"))

	log.Debug("hidden")
	if len(lines) != 0 {
		t.Fatalf("debug logged while Triton's verbose log is off: %v", lines)
	}
	verbose = true
	log.Debug("shown", zap.Int("n", 3))
	log.Info("info")
	log.Warn("warn")
	log.Error("error", zap.Error(errors.New("boom")))
	want := []struct {
		level LogLevel
		msg   string
	}{
		{LogVerbose, `shown	{"model": "gpt2", "n": 3}`},
		{LogInfo, `info	{"model": "gpt2"}`},
		{LogWarn, `warn	{"model": "gpt2"}`},
		{LogError, `error	{"model": "gpt2", "error": "boom"}`},
	}
	if len(lines) != len(want) {
		t.Fatalf("got %d lines, want %d: %v", len(lines), len(want), lines)
	}
	for i, w := range want {
		if lines[i].level != w.level || lines[i].msg != w.msg {
			t.Errorf("line %d: got level %d %q, want level %d %q", i, lines[i].level, lines[i].msg, w.level, w.msg)
		}
		if lines[i].file != "triton/triton_test.go" || lines[i].line == 0 {
			t.Errorf("line %d: caller %s:%d, want triton/triton_test.go and a line", i, lines[i].file, lines[i].line)
		}
	}
}
