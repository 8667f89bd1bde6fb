// Command gollm-demo writes gollm's demo checkpoint: a GPT-2 in Hugging Face's format
// with GPT-2's real tokenizer and RANDOM weights, for demonstrating the serving path.
//
//	go run ./cmd/gollm-demo -out model_repository/gpt2/1 [-layers 4 -hidden 256 -heads 4 -positions 1024 -dtype float16 -seed 1]
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
// to deserve a progress bar; the default demo is far below it.
const barThreshold = 100_000_000

func main() {
	d := demo.DefaultOptions()
	out := flag.String("out", "model_repository/gpt2/1", "checkpoint folder to write")
	layers := flag.Int("layers", d.Layers, "transformer blocks (n_layer)")
	hidden := flag.Int("hidden", d.Hidden, "model width (n_embd)")
	heads := flag.Int("heads", d.Heads, "attention heads (n_head)")
	positions := flag.Int("positions", d.Positions, "maximum sequence length (n_positions)")
	dtype := flag.String("dtype", d.DType, "weight type: float16, float32 or bfloat16")
	seed := flag.Uint64("seed", d.Seed, "random seed for the weights")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "gollm-demo: unexpected arguments %q\n", flag.Args())
		flag.Usage()
		os.Exit(2)
	}
	o := demo.Options{Layers: *layers, Hidden: *hidden, Heads: *heads, Positions: *positions, DType: *dtype, Seed: *seed}
	if err := run(*out, o); err != nil {
		fmt.Fprintf(os.Stderr, "gollm-demo: %v\n", err)
		os.Exit(1)
	}
}

// run writes the checkpoint and says what it wrote.
func run(out string, o demo.Options) error {
	o, err := o.WithDefaults()
	if err != nil {
		return err
	}
	params := o.NumParameters()
	if params > barThreshold {
		bar := progressbar.NewOptions(params, progressbar.OptionSetDescription("weights"),
			progressbar.OptionSetWriter(os.Stderr), progressbar.OptionClearOnFinish())
		o.Progress = func(done, _ int) { bar.Set(done) }
	}
	if err := demo.WriteGPT2Checkpoint(out, o); err != nil {
		return err
	}
	st, err := os.Stat(filepath.Join(out, "model.safetensors"))
	if err != nil {
		return err
	}
	fmt.Printf("wrote %s:\n", out)
	fmt.Printf("  config.json        GPT-2: %d layers, hidden %d, %d heads, %d positions, vocabulary %d\n",
		o.Layers, o.Hidden, o.Heads, o.Positions, demo.VocabSize)
	fmt.Printf("  tokenizer.json     GPT-2's real byte-level BPE (50257 tokens, 50000 merges)\n")
	fmt.Printf("  tokenizer_config.json  a ChatML chat template (for the OpenAI server's chat endpoint)\n")
	fmt.Printf("  model.safetensors  %.1fM parameters, %s, %.1f MB\n", float64(params)/1e6, o.DType, float64(st.Size())/1e6)
	fmt.Printf("The weights are RANDOM (seed %d): the model runs like GPT-2 but its text is gibberish.\n", o.Seed)
	fmt.Printf("Point gpt_model_path at a real GPT-2 checkpoint folder for real text.\n")
	return nil
}
