package tests

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBadInput(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	c := s.Client(t)
	prompt := tokenPrompt
	maxLen := ck.cfg.MaxPositions
	vocab := int32(ck.cfg.VocabSize)
	lengths := func(n int32) tensor { return int32s("input_lengths", []int64{1, 1}, n) }
	outLen := func(n int32) tensor { return int32s("request_output_len", []int64{1, 1}, n) }
	ids := func(v ...int32) tensor { return int32s("input_ids", []int64{1, int64(len(v))}, v...) }

	cases := []struct {
		// name reads as a sentence.
		name string
		// inputs are sent as they are.
		inputs []tensor
		// tensor must be named in the error message.
		tensor string
		// detail, when set, must be in the error message too.
		detail string
	}{
		{"a request without input_ids or text_input is refused", []tensor{lengths(5), outLen(4), boolean("streaming", true)}, "input_ids", ""},
		{"FP32 input_ids are refused", []tensor{float32s("input_ids", []int64{1, 5}, 1, 2, 3, 4, 5), lengths(5), outLen(4)}, "input_ids", ""},
		{"an empty prompt is refused", []tensor{int32s("input_ids", []int64{1, 0}), lengths(0), outLen(4)}, "input_ids", ""},
		{"a token id equal to the vocabulary size is refused", []tensor{ids(15496, vocab, 11), lengths(3), outLen(4)}, "input_ids", ""},
		{"a negative token id is refused", []tensor{ids(15496, -1, 11), lengths(3), outLen(4)}, "input_ids", ""},
		{"request_output_len 0 is refused", []tensor{ids(prompt...), lengths(int32(len(prompt))), outLen(0)}, "request_output_len", ""},
		{"request_output_len -3 is refused", []tensor{ids(prompt...), lengths(int32(len(prompt))), outLen(-3)}, "request_output_len", ""},
		{"request_output_len beyond the maximum sequence length is refused", []tensor{ids(prompt...), lengths(int32(len(prompt))), outLen(int32(maxLen))}, "request_output_len", ""},
		{"a batch of 2 is refused", []tensor{
			int32s("input_ids", []int64{2, 3}, 15496, 11, 616, 15496, 11, 616),
			int32s("input_lengths", []int64{2, 1}, 3, 3), int32s("request_output_len", []int64{2, 1}, 4, 4),
		}, "input_ids", ""},
		{"an empty text_input is refused", []tensor{text("text_input", ""), int32s("max_tokens", []int64{1, 1}, 4)}, "text_input", ""},
		{"a text_input that is not UTF-8 is refused at its first bad byte", []tensor{
			text("text_input", "caf\xc3 \xff\xfe not utf-8 \x80\xc3\x28"), int32s("max_tokens", []int64{1, 1}, 4),
		}, "text_input", "not valid UTF-8: byte offset 3"},
	}
	good := greedyTokens(t, ck.dir, prompt, 4)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t, time.Minute)
			res, err := streamInfer(ctx, c, inferRequest(modelName, "bad", tc.inputs))
			if err != nil {
				t.Fatalf("want an error response, got a failed stream: %v", err)
			}
			if res.errMsg == "" {
				t.Fatalf("want an error response naming %s, got tokens %v", tc.tensor, res.tokens)
			}
			if !strings.Contains(res.errMsg, tc.tensor) {
				t.Errorf("error %q does not name %s", res.errMsg, tc.tensor)
			}
			if !strings.Contains(res.errMsg, tc.detail) {
				t.Errorf("error %q does not say %q", res.errMsg, tc.detail)
			}
			t.Logf("error: %s", res.errMsg)
			// The server keeps serving.
			res, err = streamInfer(ctx, c, inferRequest(modelName, "good", tokenInputs(prompt, 4, true)))
			if err != nil || res.errMsg != "" || !slices.Equal(res.tokens, good) {
				t.Fatalf("the next good request: tokens %v, %v, error %q; want %v", res.tokens, err, res.errMsg, good)
			}
		})
	}

	t.Run("the generate endpoint refuses a text_input that is not UTF-8", func(t *testing.T) {
		ctx := testContext(t, time.Minute)
		// Raw bytes: encoding/json would replace the invalid ones.
		body := []byte("{\"text_input\": \"caf\xc3 \xff\xfe not utf-8 \x80\xc3\x28\", \"max_tokens\": 4}")
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.HTTPURL()+"/v2/models/"+modelName+"/generate", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := s.HTTP().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "text_input") || !strings.Contains(string(b), "byte offset 3") {
			t.Errorf("got %s %s, want 400 naming text_input and byte offset 3", resp.Status, b)
		}
	})
}
