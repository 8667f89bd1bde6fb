package executor_test

import (
	"fmt"
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
