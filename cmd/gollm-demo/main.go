// Command gollm-demo writes gollm's demo checkpoints, in Hugging Face's format with
// RANDOM weights, for demonstrating the serving path: a GPT-2 with GPT-2's real
// tokenizer, or a LLaMA-shaped model (grouped-query attention) with a real 32,000-token
// SentencePiece tokenizer in Llama 2's layout (Mistral 7B v0.1's, converted by
// demo/real_tokenizers.py from the file scripts/deps.sh installs; run from the checkout).
//
//	go run ./cmd/gollm-demo -out model_repository/gpt2/1 [-layers 4 -hidden 256 -heads 4 -positions 1024 -dtype float16 -seed 1]
//	go run ./cmd/gollm-demo -arch llama -out model_repository/llama/1 [-layers 4 -hidden 256 -heads 8 -kv-heads 2 -inner 704 -positions 2048 -dtype bfloat16 -seed 1]
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/schollz/progressbar/v3"

	"gollm/demo"
)

// barThreshold is the parameter count above which writing takes long enough (seconds)
// to deserve a progress bar; the default demos are far below it.
const barThreshold = 100_000_000

func main() {
	g, l := demo.DefaultOptions(), demo.DefaultLlamaOptions()
	arch := flag.String("arch", "gpt2", "gpt2 or llama")
	out := flag.String("out", "model_repository/gpt2/1", "checkpoint folder to write")
	layers := flag.Int("layers", 0, fmt.Sprintf("transformer blocks (default %d)", g.Layers))
	hidden := flag.Int("hidden", 0, fmt.Sprintf("model width (default %d)", g.Hidden))
	heads := flag.Int("heads", 0, fmt.Sprintf("attention heads (default %d for gpt2, %d for llama)", g.Heads, l.Heads))
	kvHeads := flag.Int("kv-heads", 0, fmt.Sprintf("llama: key/value heads (default %d)", l.KVHeads))
	inner := flag.Int("inner", 0, fmt.Sprintf("llama: the MLP's width, intermediate_size (default %d)", l.Inner))
	positions := flag.Int("positions", 0, fmt.Sprintf("maximum sequence length (default %d for gpt2, %d for llama)", g.Positions, l.Positions))
	dtype := flag.String("dtype", "", fmt.Sprintf("weight type: float16, float32 or bfloat16 (default %s for gpt2, %s for llama)", g.DType, l.DType))
	seed := flag.Uint64("seed", g.Seed, "random seed for the weights")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gollm-demo: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch *arch {
	case "gpt2":
		if *kvHeads != 0 || *inner != 0 {
			err = fmt.Errorf("-kv-heads and -inner are llama's")
			break
		}
		err = runGPT2(*out, demo.Options{Layers: *layers, Hidden: *hidden, Heads: *heads, Positions: *positions, DType: *dtype, Seed: *seed})
	case "llama":
		err = runLlama(*out, demo.LlamaOptions{Layers: *layers, Hidden: *hidden, Heads: *heads, KVHeads: *kvHeads,
			Inner: *inner, Positions: *positions, DType: *dtype, Seed: *seed})
	default:
		err = fmt.Errorf("-arch %q is neither gpt2 nor llama", *arch)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gollm-demo: %v\n", err)
		os.Exit(1)
	}
}

// progress returns a progress bar callback for checkpoints big enough to need one.
func progress(params int) func(done, total int) {
	if params <= barThreshold {
		return nil
	}
	bar := progressbar.NewOptions(params, progressbar.OptionSetDescription("weights"),
		progressbar.OptionSetWriter(os.Stderr), progressbar.OptionClearOnFinish())
	return func(done, _ int) { bar.Set(done) }
}

// weightsSize is model.safetensors' size in MB.
func weightsSize(out string) (float64, error) {
	st, err := os.Stat(filepath.Join(out, "model.safetensors"))
	if err != nil {
		return 0, err
	}
	return float64(st.Size()) / 1e6, nil
}

// runGPT2 writes the GPT-2 checkpoint and says what it wrote.
func runGPT2(out string, o demo.Options) error {
	o, err := o.WithDefaults()
	if err != nil {
		return err
	}
	params := o.NumParameters()
	o.Progress = progress(params)
	if err := demo.WriteGPT2Checkpoint(out, o); err != nil {
		return err
	}
	mb, err := weightsSize(out)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s:\n", out)
	fmt.Printf("  config.json        GPT-2: %d layers, hidden %d, %d heads, %d positions, vocabulary %d\n",
		o.Layers, o.Hidden, o.Heads, o.Positions, demo.VocabSize)
	fmt.Printf("  tokenizer.json     GPT-2's real byte-level BPE (50257 tokens, 50000 merges)\n")
	fmt.Printf("  tokenizer_config.json  a ChatML chat template (for the OpenAI server's chat endpoint)\n")
	fmt.Printf("  model.safetensors  %.1fM parameters, %s, %.1f MB\n", float64(params)/1e6, o.DType, mb)
	fmt.Printf("The weights are RANDOM (seed %d): the model runs like GPT-2 but its text is gibberish.\n", o.Seed)
	fmt.Printf("Point gpt_model_path at a real GPT-2 checkpoint folder for real text.\n")
	return nil
}

// runLlama writes the LLaMA-shaped checkpoint and says what it wrote.
func runLlama(out string, o demo.LlamaOptions) error {
	o, err := o.WithDefaults()
	if err != nil {
		return err
	}
	params := o.NumParameters()
	o.Progress = progress(params)
	if err := demo.WriteLlamaCheckpoint(out, o); err != nil {
		return err
	}
	mb, err := weightsSize(out)
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s:\n", out)
	fmt.Printf("  config.json        LLaMA: %d layers, hidden %d, %d heads sharing %d KV heads, MLP %d, %d positions, vocabulary %d\n",
		o.Layers, o.Hidden, o.Heads, o.KVHeads, o.Inner, o.Positions, demo.LlamaVocabSize)
	fmt.Printf("  tokenizer.json     Mistral 7B v0.1's real SentencePiece BPE with byte fallback, in Llama 2's layout\n")
	fmt.Printf("  tokenizer_config.json  add_bos_token, and an [INST] chat template\n")
	fmt.Printf("  model.safetensors  %.1fM parameters, %s, %.1f MB\n", float64(params)/1e6, o.DType, mb)
	fmt.Printf("The weights are RANDOM (seed %d): the model runs like a Llama but its text is gibberish.\n", o.Seed)
	return nil
}
