package openai

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"gollm/kserve"
)

// APIError is an error in OpenAI's shape, with its HTTP status.
type APIError struct {
	// Status goes out as the HTTP status.
	Status int
	// Type is OpenAI's error type (invalid_request_error, not_found_error, ...).
	Type string
	// Message says what is wrong.
	Message string
	// Param names the request field at fault, if one is.
	Param string
	// Code is OpenAI's error code (model_not_found, ...), if any.
	Code string
}

// Error returns the message.
func (e *APIError) Error() string { return e.Message }

// errorBody is the JSON of an error response.
type errorBody struct {
	// Error wraps the error, as OpenAI's body does.
	Error errorJSON `json:"error"`
}

// errorJSON is OpenAI's error object.
type errorJSON struct {
	// Message says what is wrong.
	Message string `json:"message"`
	// Type is OpenAI's error type (invalid_request_error, server_error).
	Type string `json:"type"`
	// Param names the field at fault, or null.
	Param *string `json:"param"`
	// Code is the error's code, or null.
	Code *string `json:"code"`
}

// invalid is a 400 naming the field at fault.
func invalid(param, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param, Message: fmt.Sprintf(format, args...)}
}

// modelNotFound is the 404 for an unknown model.
func modelNotFound(name string) *APIError {
	return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model", Code: "model_not_found",
		Message: fmt.Sprintf("the model %q does not exist or is not ready; GET /v1/models lists those served", name)}
}

// notServing turns a 404 for a model into a 503 when Triton itself is not ready: a
// request that arrives while the server shuts down (or before it has started) finds its
// models gone, which is no fault of the client's and worth a retry elsewhere.
func notServing(ctx context.Context, client kserve.GRPCInferenceServiceClient, api *APIError) *APIError {
	if api == nil || api.Status != http.StatusNotFound {
		return api
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if r, err := client.ServerReady(ctx, &kserve.ServerReadyRequest{}); err == nil && r.GetReady() {
		return api
	}
	return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error",
		Message: "Triton is not ready (shutting down or starting): " + api.Message}
}

// fromTriton turns an error of a Triton call into an APIError: a request Triton or the
// backend refused is the client's fault (400), an unreachable server is 503, the rest 500.
func fromTriton(what string, err error) *APIError {
	var api *APIError
	if errors.As(err, &api) {
		return api
	}
	st, _ := status.FromError(err)
	msg := fmt.Sprintf("%s: %s", what, st.Message())
	switch st.Code() {
	case codes.InvalidArgument, codes.OutOfRange, codes.FailedPrecondition:
		return &APIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Message: msg}
	case codes.NotFound:
		return &APIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "model_not_found", Message: msg}
	case codes.Unavailable, codes.DeadlineExceeded:
		return &APIError{Status: http.StatusServiceUnavailable, Type: "server_error", Message: msg}
	}
	return &APIError{Status: http.StatusInternalServerError, Type: "server_error", Message: fmt.Sprintf("%s: %v", what, err)}
}

// writeError writes e as OpenAI's error JSON.
func writeError(w http.ResponseWriter, e *APIError) {
	body := errorBody{Error: errorJSON{Message: e.Message, Type: e.Type}}
	if e.Param != "" {
		body.Error.Param = &e.Param
	}
	if e.Code != "" {
		body.Error.Code = &e.Code
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(e.Status)
	_ = json.NewEncoder(w).Encode(body)
}
