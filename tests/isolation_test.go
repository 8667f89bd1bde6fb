package tests

// One request must never hurt another (issue 32): a request whose sampling can choose no
// token fails alone; a giant text prompt is refused at once, in bounded memory, while
// other requests go on.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http/httptest"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"gollm/kserve"
	"gollm/openai"
	"gollm/tests/harness"
)

// runningStreams starts n greedy streaming requests of want tokens each, without an end
// token, and returns once every one has streamed its first token; wait then reads them
// to their end and returns each one's tokens and error message.
func runningStreams(t *testing.T, ctx context.Context, s *harness.Server, n, want int) (wait func() ([][]int32, []string)) {
	t.Helper()
	tokens, errs := make([][]int32, n), make([]string, n)
	started := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		conn, err := s.Dial()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		stream, err := kserve.NewGRPCInferenceServiceClient(conn).ModelStreamInfer(ctx)
		if err != nil {
			t.Fatal(err)
		}
		id := fmt.Sprintf("bystander-%d", i)
		in := append(tokenInputs([]int32{464, 2068, int32(100 + i)}, want, true), int32s("end_id", []int64{1, 1}, -1))
		if err := stream.Send(inferRequest(modelName, id, in)); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			first := true
			for {
				msg, err := stream.Recv()
				if err != nil {
					errs[i] = err.Error()
					break
				}
				if m := msg.GetErrorMessage(); m != "" {
					errs[i] = m
					break
				}
				ids, _, _, _ := outputInt32(msg.GetInferResponse(), "output_ids")
				tokens[i] = append(tokens[i], ids...)
				if first && len(ids) > 0 {
					first = false
					started <- i
				}
				if isFinal(msg.GetInferResponse()) {
					break
				}
			}
			if first {
				started <- i
			}
			if err := closeStream(stream); err != nil && errs[i] == "" {
				errs[i] = err.Error()
			}
		})
	}
	for range n {
		select {
		case <-started:
		case <-ctx.Done():
			t.Fatal("the bystanders did not start")
		}
	}
	return func() ([][]int32, []string) {
		wg.Wait()
		return tokens, errs
	}
}

// closeStream ends a stream whose request has had its final response the way clients
// should (README, Known limits): half-closed, then read to its end. A stream cancelled
// instead may keep tritonserver 2.51's model alive for good.
func closeStream(stream kserve.GRPCInferenceService_ModelStreamInferClient) error {
	if err := stream.CloseSend(); err != nil {
		return err
	}
	if msg, err := stream.Recv(); err != io.EOF {
		return fmt.Errorf("after the final response: got %v, %v; want the end of the stream", msg, err)
	}
	return nil
}

// onlyBut is an embedding bias of -Inf for every token but keep.
func onlyBut(vocab int, keep ...int32) []float32 {
	bias := make([]float32, vocab)
	for i := range bias {
		bias[i] = float32(math.Inf(-1))
	}
	for _, k := range keep {
		bias[k] = 0
	}
	return bias
}

// words is a bad_words_list of the given words ([1, 2, L]: their tokens one after
// another, then each word's end offset, padded with -1).
func words(name string, ws ...[]int32) tensor {
	var toks, offs []int32
	for _, w := range ws {
		toks = append(toks, w...)
		offs = append(offs, int32(len(toks)))
	}
	for len(offs) < len(toks) {
		offs = append(offs, -1)
	}
	return int32s(name, []int64{1, 2, int64(len(toks))}, append(toks, offs...)...)
}

func TestOneRequestsFailureIsItsOwn(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	V := ck.cfg.VocabSize
	end := ck.cfg.EOSIDs[0]
	c := s.Client(t)
	ctx := testContext(t, 3*time.Minute)
	waitMetric(t, ctx, s, metricKVBlocksUsed, 0, 30*time.Second)
	freeIdle := mustMetric(t, ctx, s, metricKVBlocksFree)

	prompt := []int32{464, 2068, 7586}
	every := make([][]int32, V)
	for i := range every {
		every[i] = []int32{int32(i)}
	}
	for _, tc := range []struct {
		name  string
		extra []tensor
		says  string
	}{
		{"a request whose bad words leave no token after its prompt fails alone, at its first token",
			// Only token 11 is left by the bias, and the prompt ends with 7586, after which
			// 11 is a bad word: admission cannot tell, sampling can.
			[]tensor{float32s("embedding_bias", []int64{1, int64(V)}, onlyBut(V, 11)...), words("bad_words_list", []int32{7586, 11})},
			"generated token 1: cpu: sequence"},
		{"an embedding bias of -Inf everywhere is refused at admission",
			[]tensor{float32s("embedding_bias", []int64{1, int64(V)}, onlyBut(V)...)},
			"embedding_bias is -Inf for every one of the 50257 tokens"},
		{"bad words that list every token are refused at admission",
			[]tensor{words("bad_words_list", every...)},
			"bad_words forbid all 50257 tokens"},
		{"min_length with a bias that leaves only the end token is refused at admission",
			[]tensor{float32s("embedding_bias", []int64{1, int64(V)}, onlyBut(V, end)...), int32s("min_length", []int64{1, 1}, 4)},
			fmt.Sprintf("min_length 4 forbids the end tokens [%d] at first", end)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const bystanders, n = 6, 40
			wait := runningStreams(t, ctx, s, bystanders, n)
			// The bystanders are mid-generation: the poisoned request's step is theirs too.
			res, err := streamInfer(ctx, c, inferRequest(modelName, "poisoned", append(tokenInputs(prompt, 8, true), tc.extra...)))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(res.errMsg, tc.says) || len(res.tokens) != 0 {
				t.Errorf("the poisoned request: %d tokens, error %q; want one naming %q", len(res.tokens), res.errMsg, tc.says)
			}
			tokens, errs := wait()
			for i := range bystanders {
				if errs[i] != "" || len(tokens[i]) != n {
					t.Errorf("bystander %d: %d of %d tokens, error %q", i, len(tokens[i]), n, errs[i])
				}
			}
			waitMetric(t, ctx, s, metricKVBlocksUsed, 0, 30*time.Second)
			waitMetric(t, ctx, s, metricActiveRequests, 0, 30*time.Second)
			if free := mustMetric(t, ctx, s, metricKVBlocksFree); free != freeIdle {
				t.Errorf("%s = %v afterwards, want %v", metricKVBlocksFree, free, freeIdle)
			}
		})
	}
}

func TestGiantTextPromptsAreRefusedAtOnce(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 3*time.Minute)
	maxLen := ck.cfg.MaxPositions
	if b := ck.tok.MaxTokenBytes(); b != 128 {
		t.Fatalf("the demo tokenizer's MaxTokenBytes is %d, want GPT-2's 128", b)
	}
	for _, tc := range []struct {
		name  string
		text  string
		says  string
		limit time.Duration
	}{
		// 20 MB of one letter: 45.7 s and 5.8 GB before, with every other request waiting.
		{"20 MB, refused by its size", strings.Repeat("a", 20<<20),
			fmt.Sprintf("20971520 bytes of text cannot fit the model's maximum sequence length %d", maxLen), time.Second},
		// Under the size bound, but far more tokens than fit: tokenization stops past them.
		{"100 KB of words, refused once past the tokens that fit", strings.Repeat("Call me Ishmael. ", 6000),
			fmt.Sprintf("the prompt is more than %d tokens", maxLen-4), 5 * time.Second},
		// One word of max_seq_len × 128 bytes: its bytes alone say it needs too many tokens.
		{"128 KiB in one word, refused without its BPE", strings.Repeat("x", 128<<10), "the prompt is more than", 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rssBefore, err := s.RSS()
			if err != nil {
				t.Fatal(err)
			}
			// Short requests run and arrive all along; none may wait on the giant.
			const bystanders, n = 4, 24
			wait := runningStreams(t, ctx, s, bystanders, n)
			conn, err := s.Dial()
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			// Short requests, one after another from the moment the giant is sent until it
			// is answered: each is answered in step time (before, they waited as long as
			// the giant's tokenization).
			done := make(chan struct{})
			var shorts []time.Duration
			var shortErrs []string
			var swg sync.WaitGroup
			swg.Go(func() {
				short := s.Client(t)
				for {
					t0 := time.Now()
					r, err := streamInfer(ctx, short, inferRequest(modelName, "short", append(tokenInputs(tokenPrompt, 4, true), int32s("end_id", []int64{1, 1}, -1))))
					shorts = append(shorts, time.Since(t0))
					if err != nil || r.errMsg != "" || len(r.tokens) != 4 {
						shortErrs = append(shortErrs, fmt.Sprintf("%d tokens, %v %q", len(r.tokens), err, r.errMsg))
					}
					select {
					case <-done:
						return
					default:
					}
				}
			})
			start := time.Now()
			res, err := streamInfer(ctx, kserve.NewGRPCInferenceServiceClient(conn),
				inferRequest(modelName, "giant", []tensor{text("text_input", tc.text), int32s("max_tokens", []int64{1, 1}, 4), boolean("stream", true)}))
			took := time.Since(start)
			close(done)
			swg.Wait()
			if err != nil {
				t.Fatal(err)
			}
			for i, d := range shorts {
				if d > 5*time.Second {
					t.Errorf("short request %d beside the giant took %v", i, d)
				}
			}
			if len(shortErrs) > 0 {
				t.Errorf("short requests beside the giant failed: %v", shortErrs)
			}
			if !strings.Contains(res.errMsg, `input "text_input": `) || !strings.Contains(res.errMsg, tc.says) {
				t.Errorf("error %q, want one naming text_input and saying %q", res.errMsg, tc.says)
			}
			if took > tc.limit {
				t.Errorf("refused after %v, want within %v", took, tc.limit)
			}
			tokens, errs := wait()
			for i := range bystanders {
				if errs[i] != "" || len(tokens[i]) != n {
					t.Errorf("bystander %d: %d of %d tokens, error %q", i, len(tokens[i]), n, errs[i])
				}
			}
			rssAfter, err := s.RSS()
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("refused in %v; %d short requests beside it took %v; RSS %d MiB before, %d MiB after", took, len(shorts), shorts, rssBefore>>20, rssAfter>>20)
			// The server holds the request's bytes a few times over (gRPC frame, Triton's
			// request, the backend's copy): a little more than that, never gigabytes.
			if grew := rssAfter - rssBefore; grew > 8*int64(len(tc.text))+64<<20 {
				t.Errorf("RSS grew by %d MiB for a %d MiB prompt", grew>>20, len(tc.text)>>20)
			}
		})
	}
}

// TestLogprobsKeepNoLogitsRows: 32 streams of 300 tokens, each with the top 5
// log-probabilities per token, leave the server's memory where it was (before, the
// batch manager kept every position's whole logits row until the request ended, and
// stale references kept them live after: RSS 906 MB → 5.2 GB, 2.1 GB of Go heap until
// the model was unloaded).
func TestLogprobsKeepNoLogitsRows(t *testing.T) {
	s := harness.Start(t, harness.Options{})
	ctx := testContext(t, 10*time.Minute)
	const streams, n, k = 32, 300, 5
	run := func(tokens, topK int) []string {
		errs := allAtOnce(s, streams, func(i int, c kserve.GRPCInferenceServiceClient) error {
			in := append(tokenInputs([]int32{464, 2068, int32(200 + i)}, tokens, true), int32s("end_id", []int64{1, 1}, -1))
			if topK >= 0 {
				in = append(in, int32s("return_top_logprobs", []int64{1, 1}, int32(topK)))
			}
			stream, err := c.ModelStreamInfer(ctx)
			if err != nil {
				return err
			}
			if err := stream.Send(inferRequest(modelName, fmt.Sprintf("lp-%d", i), in)); err != nil {
				return err
			}
			got := 0
			for {
				msg, err := stream.Recv()
				if err != nil {
					return err
				}
				if m := msg.GetErrorMessage(); m != "" {
					return fmt.Errorf("error response %s", m)
				}
				r := msg.GetInferResponse()
				ids, _, _, _ := outputInt32(r, "output_ids")
				got += len(ids)
				if topK >= 0 && len(ids) > 0 {
					lps, _, _ := outputFP32(r, "token_logprobs")
					tops, shape, _ := outputFP32(r, "top_logprobs")
					if len(lps) != len(ids) || len(tops) != len(ids)*topK || len(shape) != 3 || shape[2] != int64(topK) {
						return fmt.Errorf("%d tokens with %d token_logprobs and top_logprobs %v", len(ids), len(lps), shape)
					}
				}
				if isFinal(r) {
					break
				}
			}
			if got != tokens {
				return fmt.Errorf("%d tokens, want %d", got, tokens)
			}
			return closeStream(stream)
		})
		var out []string
		for i, err := range errs {
			if err != nil {
				out = append(out, fmt.Sprintf("stream %d: %v", i, err))
			}
		}
		return out
	}
	// settled waits for the backend to be idle and to have returned its freed memory
	// (2 s after its last request), then for the RSS to stop falling.
	settled := func() int64 {
		waitMetric(t, ctx, s, metricKVBlocksUsed, 0, time.Minute)
		waitMetric(t, ctx, s, metricActiveRequests, 0, time.Minute)
		time.Sleep(3 * time.Second) // the backend's idle release comes 2 s after its last request
		last := int64(0)
		for range 40 {
			time.Sleep(500 * time.Millisecond)
			rss, err := s.RSS()
			if err != nil {
				t.Fatal(err)
			}
			if last != 0 && rss >= last-(1<<20) && rss <= last+(1<<20) {
				return rss
			}
			last = rss
		}
		return last
	}
	// Idle is after the same streams without log-probabilities: the engine's buffers
	// are sized for the batch, and the KV blocks they use (the pool hands out the same
	// ones again) have been touched.
	if errs := run(n, -1); len(errs) > 0 {
		t.Fatalf("warm-up: %v", errs)
	}
	idle := settled()
	var peak int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			if rss, err := s.RSS(); err == nil {
				peak = max(peak, rss)
			}
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
		}
	})
	start := time.Now()
	errs := run(n, k)
	took := time.Since(start)
	close(stop)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d streams failed: %v", len(errs), errs)
	}
	after := settled()
	t.Logf("%d streams × %d tokens with the top %d log-probabilities in %v (%.0f tokens/s): RSS idle %d MiB, peak %d MiB, after %d MiB",
		streams, n, k, took.Round(time.Millisecond), float64(streams*n)/took.Seconds(), idle>>20, peak>>20, after>>20)
	// What the burst took goes back: at most a tenth of it stays, or a tenth of the idle
	// figure where the burst was small (a few MiB of heap and pool buffers settle higher).
	if stay := max(0.1*float64(idle), 0.1*float64(peak-idle)); float64(after-idle) > stay {
		t.Errorf("RSS %d MiB after the run, more than %d MiB over its idle %d MiB (peak %d MiB)",
			after>>20, int64(stay)>>20, idle>>20, peak>>20)
	}
}

// TestStalledReadersDoNotStarveOthers: as many OpenAI streaming clients as the model has
// batch slots send a long request and stop reading (a tiny receive window, nothing
// read). Their events fill the connections' buffers, gollm-openai's writes to them time
// out, and their requests are stopped in Triton: the slots and KV blocks come back while
// the stalled connections stay open, and other clients get their tokens. Before, the
// stalled requests generated to max_tokens, holding every slot (64 such streams left 8
// other clients with 0 tokens in 120 s).
func TestStalledReadersDoNotStarveOthers(t *testing.T) {
	const slots, stalledTokens = 4, 1000
	srv := harness.Start(t, harness.Options{Models: []harness.Model{{MaxBatchSize: slots}}})
	conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	api := openai.New(openai.Config{Triton: kserve.NewGRPCInferenceServiceClient(conn), ModelRepository: srv.RepoDir,
		WriteTimeout: 2 * time.Second, Log: zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))})
	hs := httptest.NewUnstartedServer(api)
	hs.Listener = openai.LimitSendBuffer(hs.Listener, 4<<10)
	hs.Start()
	defer hs.Close()
	ctx := testContext(t, 5*time.Minute)
	iterBefore := mustMetric(t, ctx, srv, "gollm_iterations")

	body := func(maxTokens int) []byte {
		b, _ := json.Marshal(map[string]any{"model": modelName, "prompt": "It is a truth universally acknowledged",
			"max_tokens": maxTokens, "temperature": 0, "stream": true})
		return b
	}
	for i := range slots {
		d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 2048) })
			return errors.Join(err, serr)
		}}
		c, err := d.DialContext(ctx, "tcp", hs.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b := body(stalledTokens)
		if _, err := fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: gollm\r\nContent-Type: application/json\r\nContent-Length: %d\r\nX-Request-Id: stalled-%d\r\n\r\n%s", len(b), i, b); err != nil {
			t.Fatal(err)
		}
		// Nothing is ever read from c.
	}
	waitMetric(t, ctx, srv, metricActiveRequests, slots, 30*time.Second)

	const others, otherTokens = 4, 8
	start := time.Now()
	errs := make([]error, others)
	var wg sync.WaitGroup
	for i := range others {
		wg.Go(func() {
			var b map[string]any
			_ = json.Unmarshal(body(otherTokens), &b)
			events, err := sseEvents(ctx, hs.Client(), hs.URL+"/v1/completions", b)
			if err == nil && (len(events) != otherTokens+2 || events[len(events)-1] != "[DONE]") {
				err = fmt.Errorf("%d events, want %d tokens, the finish and [DONE]: %v", len(events), otherTokens, events)
			}
			errs[i] = err
		})
	}
	wg.Wait()
	took := time.Since(start)
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	// The stalled requests were stopped, their connections still open.
	waitMetric(t, ctx, srv, metricActiveRequests, 0, 30*time.Second)
	waitMetric(t, ctx, srv, metricKVBlocksUsed, 0, 30*time.Second)
	ran := mustMetric(t, ctx, srv, "gollm_iterations") - iterBefore
	t.Logf("%d other clients got their %d tokens in %v; %v iterations ran", others, otherTokens, took.Round(time.Millisecond), ran)
	if ran >= stalledTokens {
		t.Errorf("%v iterations ran: the stalled requests generated to their %d tokens", ran, stalledTokens)
	}
}

// TestLongTextPromptIsTokenizedOffExecute: a text prompt over 8 KiB that fits is
// tokenized on the model's pool rather than in Execute, and served as the same prompt:
// the backend counts the checkpoint tokenizer's tokens, and generates.
func TestLongTextPromptIsTokenizedOffExecute(t *testing.T) {
	s := sharedServer(t)
	ck := demoCheckpoint(t)
	ctx := testContext(t, 2*time.Minute)
	prompt := strings.Repeat(" information", 760) // 9,120 bytes, one token a word
	want := len(ck.tok.EncodePrompt(prompt))
	if len(prompt) <= 8<<10 || want+4 > ck.cfg.MaxPositions {
		t.Fatalf("a prompt of %d bytes and %d tokens does not test the pool", len(prompt), want)
	}
	stream, err := s.Client(t).ModelStreamInfer(ctx)
	if err != nil {
		t.Fatal(err)
	}
	in := []tensor{text("text_input", prompt), int32s("max_tokens", []int64{1, 1}, 4), boolean("stream", true),
		boolean("return_num_input_tokens", true), int32s("end_id", []int64{1, 1}, -1)}
	if err := stream.Send(inferRequest(modelName, "long", in)); err != nil {
		t.Fatal(err)
	}
	got, inputTokens := 0, -1
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m := msg.GetErrorMessage(); m != "" {
			t.Fatalf("error response %s", m)
		}
		r := msg.GetInferResponse()
		ids, _, _, _ := outputInt32(r, "output_ids")
		got += len(ids)
		if v, _, ok, _ := outputInt32(r, "num_input_tokens"); ok && len(v) == 1 {
			inputTokens = int(v[0])
		}
		if isFinal(r) {
			break
		}
	}
	if err := closeStream(stream); err != nil {
		t.Fatal(err)
	}
	if got != 4 || inputTokens != want {
		t.Errorf("%d tokens generated, num_input_tokens %d; want 4 and the tokenizer's %d", got, inputTokens, want)
	}
}
