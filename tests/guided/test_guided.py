#!/usr/bin/env python3
"""Guided decoding through tritonserver with Triton's own Python client (gRPC streaming,
as TensorRT-LLM's clients send guided_decoding_guide_type and guided_decoding_guide).
tests/guided_test.go starts the server and runs this file; the environment names:

  GOLLM_GRPC_URL     tritonserver's gRPC address
  GOLLM_AUSTEN       the austen demo model (byte-level BPE, trained weights)
  GOLLM_LLAMA        the llama demo model (SentencePiece with byte fallback: the first
                     token's space is dropped from the text)
  GOLLM_TOKENIZERS   "model=path,model=path": each model's tokenizer.json
"""
import json
import os
import queue
import re
import unittest
from functools import partial

import jsonschema
import numpy as np
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer
from tritonclient.utils import np_to_triton_dtype

URL = os.environ["GOLLM_GRPC_URL"]
AUSTEN = os.environ["GOLLM_AUSTEN"]
LLAMA = os.environ["GOLLM_LLAMA"]
TOKENIZERS = {k: Tokenizer.from_file(v) for k, v in (kv.split("=", 1) for kv in os.environ["GOLLM_TOKENIZERS"].split(","))}

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["name", "age", "tags"],
}


def tensor(name, value):
    t = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    t.set_data_from_numpy(value)
    return t


def text(s):
    return np.array([[s]], dtype=object)


def i32(v):
    return np.array([[v]], dtype=np.int32)


def generate(model, inputs, want=("output_ids",)):
    """Streams one request; returns (per output, the responses' arrays in order), or
    raises the error the server sent."""
    client = grpcclient.InferenceServerClient(URL)
    results = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
    try:
        ts = [tensor(k, v) for k, v in inputs.items()]
        client.async_stream_infer(model, ts, outputs=[grpcclient.InferRequestedOutput(o) for o in want],
                                  enable_empty_final_response=True)
        out = {o: [] for o in want}
        while True:
            r = results.get(timeout=120)
            if isinstance(r, Exception):
                raise r
            for o in want:
                a = r.as_numpy(o)
                if a is not None:
                    out[o].append(a)
            if r.get_response().parameters["triton_final_response"].bool_param:
                return out
    finally:
        client.stop_stream()
        client.close()


def ids_of(out):
    return [int(t) for a in out["output_ids"] for t in a.reshape(-1)]


def guided(kind, guide=None):
    d = {"guided_decoding_guide_type": text(kind)}
    if guide is not None:
        d["guided_decoding_guide"] = text(guide)
    return d


class GuidedIDs(unittest.TestCase):
    """The ids path: token ids in, token ids out, decoded here."""

    def test_json_schema_answers_validate(self):
        tok = TOKENIZERS[AUSTEN]
        prompt = tok.encode("It is a truth universally acknowledged").ids
        for seed in range(8):
            out = generate(AUSTEN, {
                "input_ids": np.array([prompt], dtype=np.int32),
                "request_output_len": i32(60),
                "streaming": np.array([[True]], dtype=bool),
                "temperature": np.array([[1.0]], dtype=np.float32),
                "random_seed": np.array([[seed]], dtype=np.uint64),
                **guided("json_schema", json.dumps(SCHEMA)),
            })
            ids = ids_of(out)
            self.assertTrue(ids)
            answer = json.loads(tok.decode(ids))
            jsonschema.validate(answer, SCHEMA)

    def test_beams_follow_the_regex(self):
        tok = TOKENIZERS[AUSTEN]
        prompt = tok.encode("She said").ids
        out = generate(AUSTEN, {
            "input_ids": np.array([prompt], dtype=np.int32),
            "request_output_len": i32(12),
            "beam_width": i32(2),
            **guided("regex", r"(yes|no), (sir|madam)\."),
        })
        beams = out["output_ids"][-1][0]
        for beam in beams:
            s = tok.decode([int(t) for t in beam if t >= 0])
            self.assertRegex(s, r"^(yes|no), (sir|madam)\.$")


class GuidedText(unittest.TestCase):
    """The text path: text_input in, text_output out, as the generate endpoint's clients."""

    def run_text(self, model, prompt, kind, guide, n=40, seed=1):
        out = generate(model, {
            "text_input": text(prompt),
            "max_tokens": i32(n),
            "stream": np.array([[True]], dtype=bool),
            "temperature": np.array([[1.0]], dtype=np.float32),
            "random_seed": np.array([[seed]], dtype=np.uint64),
            **guided(kind, guide),
        }, want=("text_output",))
        return "".join(x.decode() for a in out["text_output"] for x in a.reshape(-1))

    def test_regex(self):
        for seed in range(4):
            s = self.run_text(AUSTEN, "Her age was", "regex", r"[1-9][0-9] years, [a-z]+ months", seed=seed)
            self.assertRegex(s, r"^[1-9][0-9] years, [a-z]+ months$")

    def test_ebnf_grammar(self):
        g = 'root ::= item (", " item)*\nitem ::= "tea" | "cake" | [0-9]+ " " ("cups" | "plates")'
        s = self.run_text(AUSTEN, "They brought", "ebnf_grammar", g, n=30)
        self.assertRegex(s, r"^(tea|cake|[0-9]+ (cups|plates))(, (tea|cake|[0-9]+ (cups|plates)))*$")

    def test_json_is_an_object_or_array(self):
        for seed in range(3):
            s = self.run_text(AUSTEN, "Mr. Darcy", "json", None, n=50, seed=seed)
            self.assertIn(type(json.loads(s)), (dict, list))

    def test_first_token_space_of_sentencepiece(self):
        # The llama demo's decoder drops the first token's leading space: the text
        # must match all the same (random weights, so any word the regex allows).
        for seed in range(6):
            s = self.run_text(LLAMA, "Llamas", "regex", r"[A-Z][a-z]{2,8}( [a-z]{1,8}){0,3}\.", n=24, seed=seed)
            self.assertRegex(s, r"^[A-Z][a-z]{2,8}( [a-z]{1,8}){0,3}\.$")
        s = self.run_text(LLAMA, "Llamas", "json_schema", json.dumps(SCHEMA), n=80)
        jsonschema.validate(json.loads(s), SCHEMA)


class GuidedErrors(unittest.TestCase):
    def expect(self, inputs, *parts):
        with self.assertRaises(Exception) as cm:
            generate(AUSTEN, {"text_input": text("Hi"), "max_tokens": i32(4), **inputs})
        for p in parts:
            self.assertIn(p, str(cm.exception))

    def test_refusals_name_the_input(self):
        self.expect(guided("structural_tag", "{}"), "guided_decoding_guide_type", "structural_tag", "not supported")
        self.expect(guided("yaml", "a"), "unknown guide type")
        self.expect(guided("json_schema", '{"type":"array","uniqueItems":true}'), "guided_decoding_guide", "uniqueItems")
        self.expect(guided("json_schema", "false"), "no JSON value satisfies the schema")
        self.expect(guided("regex", "(a|b)*a(a|b){30}"), "too complex")
        self.expect(guided("ebnf_grammar", "root ::= root \"a\" | \"b\""), "left recursion")

    def test_server_still_serves(self):
        s = GuidedText().run_text(AUSTEN, "It is", "regex", "[a-z]+", n=5)
        self.assertRegex(s, "^[a-z]+$")


if __name__ == "__main__":
    unittest.main(verbosity=2)
