package triton

/*
#include <stdlib.h>
#include "api.h"
*/
import "C"

import (
	"path/filepath"
	"strings"
	"unsafe"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// logLevel maps a zap level onto Triton's: Debug is VERBOSE, DPanic and above ERROR.
func logLevel(l zapcore.Level) LogLevel {
	switch {
	case l <= zapcore.DebugLevel:
		return LogVerbose
	case l == zapcore.InfoLevel:
		return LogInfo
	case l == zapcore.WarnLevel:
		return LogWarn
	default:
		return LogError
	}
}

// logEnabled asks Triton whether it logs at level (it follows --log-verbose, --log-info
// … and changes made through the logging API while it runs).
func logEnabled(level LogLevel) bool {
	return bool(C.gt_TRITONSERVER_LogIsEnabled(C.int(level)))
}

// logMessage writes one line into Triton's log.
func logMessage(level LogLevel, file string, line int, msg string) {
	cfile := C.CString(file)
	cmsg := C.CString(msg)
	_ = goError(C.gt_TRITONSERVER_LogMessage(C.int(level), cfile, C.int(line), cmsg))
	C.free(unsafe.Pointer(cfile))
	C.free(unsafe.Pointer(cmsg))
}

// NewLogger returns a zap logger that writes into Triton's log at Triton's verbosity:
// Debug goes to VERBOSE (shown with --log-verbose=1), Info, Warn and Error to their
// namesakes; each line carries the caller's file and line. Resolve must have succeeded.
func NewLogger() *zap.Logger {
	return zap.New(NewCore(logEnabled, logMessage), zap.AddCaller())
}

// Core is a zapcore.Core that writes through a Triton-style log function.
type Core struct {
	// enabled says whether a Triton log level is on.
	enabled func(LogLevel) bool
	// write writes one message.
	write func(level LogLevel, file string, line int, msg string)
	// enc encodes the fields (context and per-entry) after the message.
	enc zapcore.Encoder
}

// NewCore returns a core over the given level check and write functions (Triton's, in
// NewLogger; tests pass their own).
func NewCore(enabled func(LogLevel) bool, write func(level LogLevel, file string, line int, msg string)) *Core {
	enc := zapcore.NewConsoleEncoder(zapcore.EncoderConfig{
		// Only the message and fields: Triton writes the time, level and place.
		MessageKey:     "msg",
		LineEnding:     "\n",
		EncodeDuration: zapcore.StringDurationEncoder,
		EncodeTime:     zapcore.ISO8601TimeEncoder,
	})
	return &Core{enabled: enabled, write: write, enc: enc}
}

// Enabled reports whether Triton logs entries of level l.
func (c *Core) Enabled(l zapcore.Level) bool { return c.enabled(logLevel(l)) }

// With returns a core that adds fields to every entry.
func (c *Core) With(fields []zapcore.Field) zapcore.Core {
	enc := c.enc.Clone()
	for _, f := range fields {
		f.AddTo(enc)
	}
	return &Core{enabled: c.enabled, write: c.write, enc: enc}
}

// Check adds the core to ce when the entry's level is enabled.
func (c *Core) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

// Write writes an entry: the message, then the fields as JSON.
func (c *Core) Write(e zapcore.Entry, fields []zapcore.Field) error {
	buf, err := c.enc.EncodeEntry(zapcore.Entry{Message: e.Message}, fields)
	if err != nil {
		return err
	}
	msg := strings.TrimSuffix(buf.String(), "\n")
	buf.Free()
	if e.LoggerName != "" {
		msg = e.LoggerName + ": " + msg
	}
	if e.Stack != "" {
		msg += "\n" + e.Stack
	}
	file, line := "gollm", 0
	if e.Caller.Defined {
		// Triton prints file:line; the package folder and file name are enough.
		file = filepath.Join(filepath.Base(filepath.Dir(e.Caller.File)), filepath.Base(e.Caller.File))
		line = e.Caller.Line
	}
	c.write(logLevel(e.Level), file, line, msg)
	return nil
}

// Sync does nothing: Triton's log writes through at once.
func (c *Core) Sync() error { return nil }
