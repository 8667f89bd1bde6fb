package executor_test

import (
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	"gollm/engine"
	"gollm/engine/cpu"
	"gollm/executor"
	"gollm/model"
)

// Example runs greedy generation on the tiny test checkpoint with the CPU engine:
// one streaming request, its tokens printed as they arrive.
func Example() {
	m, err := model.LoadFloat32("../testdata/gpt2-tiny")
	if err != nil {
		fmt.Println(err)
		return
	}
	eng, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 16})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()

	ex, err := executor.New(eng, executor.Config{}, zap.NewNop())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ex.Shutdown()

	noEnd := int32(-1)
	id, err := ex.Enqueue(executor.Request{
		InputIDs:     []int32{464, 268, 758, 218},
		MaxNewTokens: 8,
		Streaming:    true,
		EndID:        &noEnd,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for done := false; !done; {
		rs, err := ex.AwaitResponses(&id, 10*time.Second)
		if err != nil {
			fmt.Println(err)
			return
		}
		for _, r := range rs {
			if r.Err != nil {
				fmt.Println("error:", r.Err)
				return
			}
			fmt.Println("tokens", r.Result.OutputTokenIDs, "final", r.Result.IsFinal)
			done = r.IsFinal()
		}
	}
	// Output:
	// tokens [611] final false
	// tokens [344] final false
	// tokens [445] final false
	// tokens [189] final false
	// tokens [793] final false
	// tokens [532] final false
	// tokens [188] final false
	// tokens [258] final true
}

// Example_logitsPostProcessor bans a token through a named logits post-processor (the
// seed's LogitsPostProcessorConfig) and, for a second request, through the batched one.
func Example_logitsPostProcessor() {
	m, err := model.LoadFloat32("../testdata/gpt2-tiny")
	if err != nil {
		fmt.Println(err)
		return
	}
	eng, err := cpu.NewFromModel(m, engine.KVConfig{NumBlocks: 64, TokensPerBlock: 16})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer eng.Close()

	ban := func(logits []float32, tok int32) { logits[tok] = float32(math.Inf(-1)) }
	ex, err := executor.New(eng, executor.Config{
		LogitsPostProcessors: map[string]executor.LogitsPostProcessor{
			// Never the token greedy decoding starts with here (611).
			"no-611": func(_ uint64, logits []float32, _ []int32, _ *uint64) { ban(logits, 611) },
		},
		LogitsPostProcessorBatched: func(_ []uint64, logits [][]float32, _ [][]int32, clients []*uint64) {
			for i := range logits {
				if clients[i] != nil {
					ban(logits[i], int32(*clients[i])) // the client ID names the token to ban
				}
			}
		},
	}, zap.NewNop())
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ex.Shutdown()

	noEnd, client := int32(-1), uint64(611)
	for _, req := range []executor.Request{
		{LogitsPostProcessorName: ""},
		{LogitsPostProcessorName: "no-611"},
		{LogitsPostProcessorName: executor.BatchedPostProcessorName, ClientID: &client},
	} {
		req.InputIDs, req.MaxNewTokens, req.EndID = []int32{464, 268, 758, 218}, 3, &noEnd
		req.Output.ExcludeInputFromOutput = true
		id, err := ex.Enqueue(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		rs, err := ex.AwaitResponses(&id, 10*time.Second)
		if err != nil || len(rs) != 1 || rs[0].Err != nil {
			fmt.Println(err, rs)
			return
		}
		fmt.Printf("%q: %v\n", req.LogitsPostProcessorName, rs[0].Result.OutputTokenIDs)
	}
	// Output:
	// "": [611 344 445]
	// "no-611": [279 513 205]
	// "batched": [279 513 205]
}
