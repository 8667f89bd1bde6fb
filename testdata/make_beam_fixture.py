"""Write testdata/beam-golden.json: what Hugging Face transformers' beam search returns for
the tiny fixture checkpoints, in float32, for executor/beam_hf_test.go to compare gollm's
beam search (the batch manager on the CPU engine) against.

    python3 testdata/make_beam_fixture.py testdata

For each checkpoint and prompt, three searches of 8 new tokens:
  no_end     4 beams, no end token: the beams at the length limit, ranked by their sums
  end        4 beams, an end token that the no_end beams produce (so that hypotheses
             finish early), length_penalty 1, early_stopping False (transformers'
             heuristic)
  end_early  3 beams, the same end token, length_penalty 0.5, early_stopping True
Each records every returned sequence (generated tokens, the end token included where one
ended it) and transformers' sequence score (the sum of log-probabilities over
length ** length_penalty).
"""
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM

out = sys.argv[1] if len(sys.argv) > 1 else "testdata"
models = ["gpt2-tiny", "llama-tiny", "llama3-tiny", "qwen2-tiny", "mistral-tiny"]
prompts = [[5, 17, 300, 42, 7], [900, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
NEW = 8


def search(model, prompt, beams, eos, length_penalty, early_stopping):
    ids = torch.tensor([prompt])
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    with torch.no_grad():
        o = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=beams,
                           num_return_sequences=beams, max_new_tokens=NEW, min_new_tokens=0,
                           length_penalty=length_penalty, early_stopping=early_stopping,
                           output_scores=True, return_dict_in_generate=True, eos_token_id=eos,
                           pad_token_id=0, top_k=None, top_p=None, temperature=None,
                           repetition_penalty=None, no_repeat_ngram_size=None)
    seqs = []
    for i in range(beams):
        toks = o.sequences[i, len(prompt):].tolist()
        if eos is not None and eos in toks:
            toks = toks[: toks.index(eos) + 1]
        seqs.append({"tokens": toks, "score": float(o.sequences_scores[i])})
    return seqs


cases = []
for name in models:
    model = AutoModelForCausalLM.from_pretrained(os.path.join(out, name), dtype=torch.float32)
    model.eval()
    for p in prompts:
        plain = search(model, p, 4, None, 1.0, False)
        # An end token the search meets: the third token of the second beam.
        eos = plain[1]["tokens"][2]
        cases.append({"model": name, "prompt": p, "case": "no_end", "beams": 4, "end_id": -1,
                      "length_penalty": 1.0, "early_stopping": 0, "max_new_tokens": NEW, "sequences": plain})
        cases.append({"model": name, "prompt": p, "case": "end", "beams": 4, "end_id": eos,
                      "length_penalty": 1.0, "early_stopping": 0, "max_new_tokens": NEW,
                      "sequences": search(model, p, 4, eos, 1.0, False)})
        cases.append({"model": name, "prompt": p, "case": "end_early", "beams": 3, "end_id": eos,
                      "length_penalty": 0.5, "early_stopping": 1, "max_new_tokens": NEW,
                      "sequences": search(model, p, 3, eos, 0.5, True)})
with open(os.path.join(out, "beam-golden.json"), "w") as f:
    json.dump({"transformers": transformers.__version__, "torch": torch.__version__, "cases": cases}, f, indent=1)
print(f"wrote {len(cases)} cases with transformers {transformers.__version__}")
