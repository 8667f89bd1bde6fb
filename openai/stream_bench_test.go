package openai

import (
	"context"
	"encoding/binary"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"gollm/kserve"
)

// tokenTriton is fakeTriton with streams: every request gets tokens responses of one
// token each (" Darcy", id 7), then an empty final one, as gollm's backend streams.
type tokenTriton struct {
	fakeTriton
	tokens int
}

// ModelStreamInfer answers with a fake stream.
func (f *tokenTriton) ModelStreamInfer(ctx context.Context, _ ...grpc.CallOption) (grpc.BidiStreamingClient[kserve.ModelInferRequest, kserve.ModelStreamInferResponse], error) {
	return &tokenStream{ctx: ctx, left: f.tokens}, nil
}

// tokenStream is one request's responses.
type tokenStream struct {
	grpc.ClientStream
	ctx  context.Context
	left int
	done bool
}

func (s *tokenStream) Send(*kserve.ModelInferRequest) error { return nil }
func (s *tokenStream) CloseSend() error                     { return nil }
func (s *tokenStream) Context() context.Context             { return s.ctx }
func (s *tokenStream) Header() (metadata.MD, error)         { return nil, nil }
func (s *tokenStream) Trailer() metadata.MD                 { return nil }

// text and ids are one token's outputs.
var (
	benchText = func() []byte {
		b := binary.LittleEndian.AppendUint32(nil, 6)
		return append(b, " Darcy"...)
	}()
	benchIDs = binary.LittleEndian.AppendUint32(nil, 7)
)

func (s *tokenStream) Recv() (*kserve.ModelStreamInferResponse, error) {
	if s.done {
		return nil, io.EOF
	}
	final := s.left == 0
	r := &kserve.ModelInferResponse{Parameters: map[string]*kserve.InferParameter{
		"triton_final_response": {ParameterChoice: &kserve.InferParameter_BoolParam{BoolParam: final}}}}
	if final {
		s.done = true
	} else {
		s.left--
		r.Outputs = []*kserve.ModelInferResponse_InferOutputTensor{{Name: outTextOutput}, {Name: outOutputIDs}}
		r.RawOutputContents = [][]byte{benchText, benchIDs}
	}
	return &kserve.ModelStreamInferResponse{InferResponse: r}, nil
}

// BenchmarkStreamedToken is gollm-openai's whole per-token work for a streamed
// completion over a fake Triton: a response read and decoded, a piece, a chunk built,
// encoded, framed and written. ns/op and allocs/op are per token.
func BenchmarkStreamedToken(b *testing.B) {
	const tokens = 256
	s := New(Config{Triton: &tokenTriton{tokens: tokens}})
	body := `{"model": "m", "prompt": "It is", "max_tokens": 256, "stream": true}`
	b.ReportAllocs()
	for b.Loop() {
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/completions", strings.NewReader(body)))
		if !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
			b.Fatalf("stream did not end: %s", rec.Body.String())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tokens, "ns/token")
}
