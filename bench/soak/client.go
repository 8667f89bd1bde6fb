package main

// The soak's gRPC client: the only file of this command that names the KServe stubs, so
// that moving them changes one import.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/kserve"
)

// client sends the soak's requests to one tritonserver.
type client struct {
	// conn is the gRPC connection, shared by every worker.
	conn *grpc.ClientConn
	// c shares its connection.
	c kserve.GRPCInferenceServiceClient
}

// dial connects to addr (host:port).
func dial(addr string) (*client, error) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &client{conn: conn, c: kserve.NewGRPCInferenceServiceClient(conn)}, nil
}

// close closes the connection.
func (cl *client) close() error { return cl.conn.Close() }

// waitReady polls the model's readiness until it is ready or wait passes.
func (cl *client) waitReady(model string, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := cl.c.ModelReady(ctx, &kserve.ModelReadyRequest{Name: model})
		cancel()
		if err == nil && r.GetReady() {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("model %s not ready after %v (last error: %v)", model, wait, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// outcome is what one request saw.
type outcome struct {
	// tokens counts the generated tokens received.
	tokens int
	// first is when the first response with tokens came (zero if none).
	first time.Time
	// err is the request's failure, nil on success.
	err error
}

// generate sends one text request on a stream of its own and reads it to its final
// response, as Triton's clients do (half-close, then read to the end).
func (cl *client) generate(ctx context.Context, model, id, prompt string, maxTokens int, streaming bool, seed uint64) outcome {
	var o outcome
	s, err := cl.c.ModelStreamInfer(ctx)
	if err != nil {
		o.err = fmt.Errorf("open stream: %w", err)
		return o
	}
	req := &kserve.ModelInferRequest{ModelName: model, Id: id, Parameters: map[string]*kserve.InferParameter{
		"triton_enable_empty_final_response": {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: true}},
	}}
	add := func(name, dtype string, raw []byte) {
		req.Inputs = append(req.Inputs, &kserve.ModelInferRequest_InferInputTensor{Name: name, Datatype: dtype, Shape: []int64{1, 1}})
		req.RawInputContents = append(req.RawInputContents, raw)
	}
	add("text_input", "BYTES", append(binary.LittleEndian.AppendUint32(nil, uint32(len(prompt))), prompt...))
	add("max_tokens", "INT32", binary.LittleEndian.AppendUint32(nil, uint32(maxTokens)))
	add("random_seed", "UINT64", binary.LittleEndian.AppendUint64(nil, seed))
	flag := byte(0)
	if streaming {
		flag = 1
	}
	add("stream", "BOOL", []byte{flag})
	req.Outputs = []*kserve.ModelInferRequest_InferRequestedOutputTensor{{Name: "output_ids"}, {Name: "sequence_length"}}
	if err := s.Send(req); err != nil {
		o.err = fmt.Errorf("send: %w", err)
		return o
	}
	for {
		msg, err := s.Recv()
		if err != nil {
			o.err = fmt.Errorf("receive: %w", err)
			return o
		}
		if e := msg.GetErrorMessage(); e != "" {
			o.err = errors.New(e)
			_ = s.CloseSend()
			return o
		}
		r := msg.GetInferResponse()
		if n := generated(r); n > 0 {
			if o.first.IsZero() {
				o.first = time.Now()
			}
			o.tokens += n
		}
		if r.GetParameters()["triton_final_response"].GetBoolParam() {
			break
		}
	}
	if err := s.CloseSend(); err != nil {
		o.err = fmt.Errorf("close send: %w", err)
		return o
	}
	if _, err := s.Recv(); err != io.EOF {
		o.err = fmt.Errorf("after the final response: %v", err)
	}
	return o
}

// generated is the number of tokens a response carries (its sequence_length).
func generated(r *kserve.ModelInferResponse) int {
	for i, out := range r.GetOutputs() {
		if out.GetName() != "sequence_length" || i >= len(r.GetRawOutputContents()) {
			continue
		}
		raw := r.GetRawOutputContents()[i]
		if len(raw) >= 4 {
			return int(int32(binary.LittleEndian.Uint32(raw)))
		}
	}
	return 0
}
