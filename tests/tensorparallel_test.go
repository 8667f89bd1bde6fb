package tests

import (
	"strings"
	"testing"
	"time"

	"gollm/kserve"
	"gollm/tests/harness"
)

// TestTensorParallelSizeIsCheckedAndRefused loads the demo model (KIND_CPU) with
// tensor_parallel_size 2 (the CPU engine runs a model whole; Triton itself refuses a
// KIND_GPU instance on a machine without GPUs before the backend sees it, so the
// checkpoint's divisibility is tested in engines/) and -1, and with expert_parallel but
// no tensor parallelism: each load fails with its reason, the server stays up and the
// model loaded without the parameters serves.
func TestTensorParallelSizeIsCheckedAndRefused(t *testing.T) {
	s := harness.Start(t, harness.Options{Models: []harness.Model{{},
		{Name: "tpneg", Parameters: map[string]string{"tensor_parallel_size": "-1"}},
		{Name: "tp2", Parameters: map[string]string{"tensor_parallel_size": "2"}},
		{Name: "ep1", Parameters: map[string]string{"expert_parallel": "true"}}},
		Flags: []string{"--model-control-mode=explicit", "--load-model=" + modelName}})
	c := s.Client(t)
	ctx := testContext(t, 2*time.Minute)
	for name, says := range map[string]string{
		"tpneg": `parameter "tensor_parallel_size": -1: want an integer ≥ 1`,
		"tp2":   `parameter "tensor_parallel_size" 2 applies to KIND_GPU instances; the CPU engine runs a model whole`,
		"ep1":   `parameter "expert_parallel": spreads a mixture of experts' experts over the GPUs of a tensor-parallel instance, and needs tensor_parallel_size above 1 (it is 1)`,
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
