package triton

import (
	"errors"
	"fmt"
)

// Code is TRITONSERVER_Error_Code.
type Code int32

// The values of TRITONSERVER_Error_Code.
const (
	CodeUnknown Code = iota
	CodeInternal
	CodeNotFound
	CodeInvalidArg
	CodeUnavailable
	CodeUnsupported
	CodeAlreadyExists
	CodeCancelled
)

// codeNames are the names Triton prints for the codes.
var codeNames = [...]string{"Unknown", "Internal", "Not found", "Invalid argument",
	"Unavailable", "Unsupported", "Already exists", "Cancelled"}

// String returns the code's name as Triton writes it.
func (c Code) String() string {
	if c < 0 || int(c) >= len(codeNames) {
		return fmt.Sprintf("Code(%d)", int32(c))
	}
	return codeNames[c]
}

// Error is an error with a Triton error code. Errors that Triton returns come back as
// *Error; a Go error becomes a Triton error with CodeOf's code.
type Error struct {
	// Code travels to the client with the message.
	Code Code
	// Err is the underlying error; its text is the message.
	Err error
}

// Error returns the message.
func (e *Error) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Errorf returns an *Error with the given code and a formatted message (%w works).
func Errorf(code Code, format string, args ...any) error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// WithCode gives err a Triton error code; nil stays nil.
func WithCode(code Code, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Err: err}
}

// CodeOf returns the code of the outermost *Error in err's chain, or CodeInternal when
// there is none.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}
