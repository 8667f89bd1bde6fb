package tests

import (
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// TestTensorParallelSizeIsCheckedAndRefused loads the demo model with
// tensor_parallel_size 3 (its 4 heads do not split over 3) and 2 (it splits, but this
// build serves one GPU an instance): each load fails with its reason, the server stays
// up and the model loaded without the parameter serves.
func TestTensorParallelSizeIsCheckedAndRefused(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{},
		{Name: "tp3", Parameters: map[string]string{"tensor_parallel_size": "3"}},
		{Name: "tp2", Parameters: map[string]string{"tensor_parallel_size": "2"}}},
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	for name, says := range map[string]string{
		"tp3": `parameter "tensor_parallel_size": tensor_parallel_size 3 does not divide the model's 4 attention heads (num_attention_heads, n_head)`,
		"tp2": `parameter "tensor_parallel_size" 2: this build serves a model on one GPU an instance; tensor parallelism is not available yet`,
	} {
		_, err := c.RepositoryModelLoad(ctx, &kserve.RepositoryModelLoadRequest{ModelName: name})
		if err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("load %s: %v; want it to say %q", name, err, says)
		}
	}
	res, err := streamInfer(ctx, c, inferRequest(modelName, "after", tokenInputs(tokenPrompt, 4, true)))
	if err != nil || res.errMsg != "" || len(res.tokens) != 4 {
		t.Fatalf("the served model after the refused loads: %v, %v, %q", res.tokens, err, res.errMsg)
	}
}
