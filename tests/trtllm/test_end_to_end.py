"""Does what TensorRT-LLM's client scripts do with their default model names, against
gollm serving one checkpoint as "ensemble", "tensorrt_llm", "preprocessing" and
"postprocessing" (tests/trtllm_names_test.go starts the server and runs this).

- tools/inflight_batcher_llm/end_to_end_test.py: per prompt, preprocessing →
  tensorrt_llm → postprocessing by hand, then the ensemble on the same prompt, and the
  two texts must be equal (over HTTP, its default, and gRPC), with the log probabilities
  and logits it asks for; then many ensemble requests at once.
- inflight_batcher_llm/client/end_to_end_grpc_client.py: the ensemble over a gRPC stream
  with its default inputs.

The calls use the scripts' tensor names, dtypes and shapes; the code is this project's.
Beyond the scripts, it checks the preprocessing model's ids and the postprocessing
model's text against Hugging Face tokenizers, that bad words and bias words give the same
text by both routes, and that bad inputs get errors naming the tensor.

Environment: GOLLM_HTTP_URL and GOLLM_GRPC_URL (host:port), GOLLM_TOKENIZER (the gpt2
checkpoint's tokenizer.json), GOLLM_LLAMA_TOKENIZER (the llama demo's, served as
"preprocessing_llama"). Prints OK at the end.
"""

import os
import queue
import sys
from functools import partial

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

HTTP_URL = os.environ["GOLLM_HTTP_URL"]
GRPC_URL = os.environ["GOLLM_GRPC_URL"]
TOKENIZER = Tokenizer.from_file(os.environ["GOLLM_TOKENIZER"])
LLAMA_TOKENIZER = Tokenizer.from_file(os.environ["GOLLM_LLAMA_TOKENIZER"])
VOCAB = 50257  # the gpt2 demo's, the vocabSizePadded end_to_end_test.py assumes

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "Llamas 🦙 hum, and naïve café owners say 你好.",
    "def add(a, b):\n    return a + b\n",
]
OUTPUT_LENS = [12, 9, 16]


def tensor(mod, name, value):
    """An input of a numpy array, as the scripts' prepare_tensor."""
    t = mod.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
    t.set_data_from_numpy(value)
    return t


def text2d(s):
    return np.array([[s]], dtype=object)


def int2d(v):
    return np.array([[v]], dtype=np.int32)


def flag():
    return np.array([[True]], dtype=bool)


def check(cond, msg):
    if not cond:
        print("FAIL:", msg, flush=True)
        sys.exit(1)


def expect_error(fn, *parts):
    """fn must raise an InferenceServerException whose message holds every part."""
    try:
        fn()
    except InferenceServerException as e:
        msg = str(e)
        for p in parts:
            check(p in msg, f"error {msg!r} lacks {p!r}")
        print("  refused:", msg.splitlines()[0][:160], flush=True)
        return
    check(False, f"no error; wanted one with {parts}")


def by_hand(client, mod, prompt, n, logs=False, extra_pre=None):
    """preprocessing → tensorrt_llm → postprocessing, as end_to_end_test.py calls them."""
    pre_inputs = [
        tensor(mod, "QUERY", text2d(prompt)),
        tensor(mod, "BAD_WORDS_DICT", text2d("")),
        tensor(mod, "STOP_WORDS_DICT", text2d("")),
        tensor(mod, "REQUEST_OUTPUT_LEN", int2d(n)),
    ]
    if extra_pre:
        names = {t.name() for t in extra_pre}
        pre_inputs = [t for t in pre_inputs if t.name() not in names] + extra_pre
    pre = client.infer("preprocessing", pre_inputs)
    ids = pre.as_numpy("INPUT_ID")
    in_len = pre.as_numpy("REQUEST_INPUT_LEN")
    out_len = pre.as_numpy("REQUEST_OUTPUT_LEN")
    dec = pre.as_numpy("DECODER_INPUT_ID")
    end = pre.as_numpy("OUT_END_ID")
    pad = pre.as_numpy("OUT_PAD_ID")

    llm_inputs = [
        tensor(mod, "input_ids", ids),
        tensor(mod, "decoder_input_ids", dec),
        tensor(mod, "input_lengths", in_len),
        tensor(mod, "request_output_len", out_len),
        tensor(mod, "end_id", end),
        tensor(mod, "pad_id", pad),
    ]
    if extra_pre:
        # What the preprocessing model made of the words goes to the engine model.
        bad = pre.as_numpy("BAD_WORDS_IDS")
        bias = pre.as_numpy("EMBEDDING_BIAS")
        if bad.shape[2] > 0:
            llm_inputs.append(tensor(mod, "bad_words_list", bad))
        if bias.shape[1] > 0:
            llm_inputs.append(tensor(mod, "embedding_bias", bias))
    if logs:
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
            llm_inputs.append(tensor(mod, name, flag()))
    llm = client.infer("tensorrt_llm", llm_inputs)
    out_ids = llm.as_numpy("output_ids").astype(np.int32)
    seq_len = llm.as_numpy("sequence_length")

    post = client.infer("postprocessing", [
        tensor(mod, "TOKENS_BATCH", out_ids),
        tensor(mod, "SEQUENCE_LENGTH", seq_len),
    ])
    return pre, llm, post.as_numpy("OUTPUT")


def ensemble(client, mod, prompt, n, logs=False, extra=None):
    """The ensemble model, as end_to_end_test.py calls it."""
    inputs = [
        tensor(mod, "text_input", text2d(prompt)),
        tensor(mod, "max_tokens", int2d(n)),
        tensor(mod, "bad_words", text2d("")),
        tensor(mod, "stop_words", text2d("")),
    ]
    if extra:
        names = {t.name() for t in extra}
        inputs = [t for t in inputs if t.name() not in names] + extra
    outputs = [mod.InferRequestedOutput("text_output")]
    if logs:
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
            inputs.append(tensor(mod, name, flag()))
        for name in ("cum_log_probs", "output_log_probs", "context_logits", "generation_logits"):
            outputs.append(mod.InferRequestedOutput(name))
    return client.infer("ensemble", inputs, outputs=outputs)


def functionality(client, mod, label):
    print(f"{label}: preprocessing → tensorrt_llm → postprocessing against ensemble", flush=True)
    for prompt, n in zip(PROMPTS, OUTPUT_LENS):
        for logs in (False, True):
            pre, llm, text = by_hand(client, mod, prompt, n, logs)
            ids = pre.as_numpy("INPUT_ID")[0][: pre.as_numpy("REQUEST_INPUT_LEN")[0][0]].tolist()
            want = TOKENIZER.encode(prompt).ids
            check(ids == want, f"{prompt!r}: preprocessing ids {ids}, Hugging Face's {want}")
            eos = TOKENIZER.token_to_id("<|endoftext|>")
            check(pre.as_numpy("OUT_END_ID").tolist() == [[eos]] and pre.as_numpy("OUT_PAD_ID").tolist() == [[eos]],
                  f"end {pre.as_numpy('OUT_END_ID')}, pad {pre.as_numpy('OUT_PAD_ID')}; want the eos_token {eos}")
            out = llm.as_numpy("output_ids")[0][0][: llm.as_numpy("sequence_length")[0][0]].tolist()
            check(text[0].decode("utf-8") == TOKENIZER.decode(out, skip_special_tokens=True),
                  f"postprocessing {text[0]!r}, Hugging Face's decode {TOKENIZER.decode(out)!r}")

            res = ensemble(client, mod, prompt, n, logs)
            ens = res.as_numpy("text_output")
            check(text.shape == ens.shape == (1,), f"OUTPUT shape {text.shape}, text_output {ens.shape}; want (1,)")
            check((text == ens).all(), f"{prompt!r}: by hand {text!r}, ensemble {ens!r}")
            if logs:
                check(np.array_equal(llm.as_numpy("cum_log_probs"), res.as_numpy("cum_log_probs")),
                      "cum_log_probs differ between tensorrt_llm and ensemble")
                check(np.array_equal(llm.as_numpy("output_log_probs"), res.as_numpy("output_log_probs")),
                      "output_log_probs differ between tensorrt_llm and ensemble")
                ctx = res.as_numpy("context_logits")
                check(ctx.shape == (1, len(want), VOCAB), f"context_logits {ctx.shape}; want (1, {len(want)}, {VOCAB})")
                check(np.allclose(llm.as_numpy("context_logits"), ctx, rtol=1e-2, atol=1e-2), "context_logits differ")
                gen = res.as_numpy("generation_logits")
                check(gen.shape == (1, 1, len(out), VOCAB), f"generation_logits {gen.shape}; want (1, 1, {len(out)}, {VOCAB})")
                check(np.allclose(llm.as_numpy("generation_logits"), gen, rtol=1e-2, atol=1e-2), "generation_logits differ")
        print(f"  {prompt!r} → {text[0].decode('utf-8')!r}", flush=True)


def words_both_routes(client, mod):
    """Bad words and bias words through preprocessing change the text as the ensemble's
    bad_words and embedding_bias_words do."""
    print("bad words and bias words: both routes", flush=True)
    prompt, n = PROMPTS[0], 8
    _, llm, greedy = by_hand(client, mod, prompt, n)
    first = int(llm.as_numpy("output_ids")[0][0][0])
    word = TOKENIZER.decode([first])
    check(TOKENIZER.encode(word).ids == [first], f"the first token's text {word!r} does not tokenize back to {first}")

    bad = [tensor(mod, "BAD_WORDS_DICT", text2d(word))]
    pre, llm, text = by_hand(client, mod, prompt, n, extra_pre=bad)
    check(pre.as_numpy("BAD_WORDS_IDS").tolist() == [[[first], [1]]], f"BAD_WORDS_IDS {pre.as_numpy('BAD_WORDS_IDS')}")
    check(int(llm.as_numpy("output_ids")[0][0][0]) != first, f"{word!r} was banned but came first")
    ens = ensemble(client, mod, prompt, n, extra=[tensor(mod, "bad_words", text2d(word))]).as_numpy("text_output")
    check((text == ens).all() and text[0] != greedy[0], f"bad word {word!r}: by hand {text!r}, ensemble {ens!r}, greedy {greedy!r}")

    words = np.array([["zebra", " quantum"]], dtype=object)
    weights = np.array([[1000.0, 5.0]], dtype=np.float32)
    pre, _, text = by_hand(client, mod, prompt, n, extra_pre=[tensor(mod, "EMBEDDING_BIAS_WORDS", words),
                                                               tensor(mod, "EMBEDDING_BIAS_WEIGHTS", weights)])
    bias = pre.as_numpy("EMBEDDING_BIAS")
    check(bias.shape == (1, VOCAB), f"EMBEDDING_BIAS {bias.shape}")
    for w, wt in (("zebra", 1000.0), (" quantum", 5.0)):
        for i in TOKENIZER.encode(w).ids:
            check(bias[0][i] == wt, f"EMBEDDING_BIAS[{i}] {bias[0][i]}; want {wt} for {w!r}")
    ens = ensemble(client, mod, prompt, n, extra=[tensor(mod, "embedding_bias_words", words),
                                                   tensor(mod, "embedding_bias_weights", weights)]).as_numpy("text_output")
    check((text == ens).all() and "zebra" in text[0].decode("utf-8"), f"bias words: by hand {text!r}, ensemble {ens!r}")
    print(f"  banned {word!r}: {text[0].decode('utf-8')!r}", flush=True)


def batch_and_llama(client, mod):
    """A batch of two prompts through preprocessing (padded, one length each); the llama
    demo's tokenizer puts <s> first and names </s> as its end and pad token."""
    print("preprocessing: a batch, and the llama demo's tokenizer", flush=True)
    queries = np.array([[PROMPTS[0]], [PROMPTS[1]]], dtype=object)
    pre = client.infer("preprocessing", [tensor(mod, "QUERY", queries),
                                         tensor(mod, "REQUEST_OUTPUT_LEN", np.array([[4], [5]], dtype=np.int32))])
    lens = pre.as_numpy("REQUEST_INPUT_LEN")[:, 0].tolist()
    rows = pre.as_numpy("INPUT_ID")
    for i in range(2):
        check(rows[i][: lens[i]].tolist() == TOKENIZER.encode(PROMPTS[i]).ids, f"batch item {i}: {rows[i]}")
    check(pre.as_numpy("REQUEST_OUTPUT_LEN").tolist() == [[4], [5]], "REQUEST_OUTPUT_LEN not handed on")

    for prompt in PROMPTS:
        pre = client.infer("preprocessing_llama", [tensor(mod, "QUERY", text2d(prompt)), tensor(mod, "REQUEST_OUTPUT_LEN", int2d(4))])
        ids = pre.as_numpy("INPUT_ID")[0].tolist()
        want = LLAMA_TOKENIZER.encode(prompt).ids
        check(ids == want and ids[0] == 1, f"llama {prompt!r}: {ids}, Hugging Face's {want}")
        check(pre.as_numpy("OUT_END_ID").tolist() == [[2]] and pre.as_numpy("OUT_PAD_ID").tolist() == [[2]],
              f"llama end {pre.as_numpy('OUT_END_ID')}, pad {pre.as_numpy('OUT_PAD_ID')}; want </s> (2) for both")


def concurrent_ensemble():
    """end_to_end_test.py's test_performance: ensemble requests sent at once over HTTP."""
    print("ensemble: concurrent requests over HTTP", flush=True)
    client = httpclient.InferenceServerClient(HTTP_URL, concurrency=8)
    pending = []
    for i in range(16):
        prompt, n = PROMPTS[i % len(PROMPTS)], OUTPUT_LENS[i % len(OUTPUT_LENS)]
        inputs = [
            tensor(httpclient, "text_input", text2d(prompt)),
            tensor(httpclient, "max_tokens", int2d(n)),
            tensor(httpclient, "bad_words", text2d("")),
            tensor(httpclient, "stop_words", text2d("")),
        ]
        pending.append(client.async_infer("ensemble", inputs, outputs=[httpclient.InferRequestedOutput("text_output")],
                                          request_id=str(i)))
    for p in pending:
        check(p.get_result().as_numpy("text_output")[0], "an empty text_output")
    client.close()


def grpc_client_defaults():
    """end_to_end_grpc_client.py -p PROMPT with its defaults: the ensemble over a gRPC
    stream, not streaming, beam width 1, temperature 1.0, the prompt kept in the text."""
    print("end_to_end_grpc_client.py's request", flush=True)
    client = grpcclient.InferenceServerClient(GRPC_URL)
    results = queue.Queue()
    prompt = PROMPTS[0]

    def send(inputs):
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results))
        client.async_stream_infer("ensemble", inputs, outputs=[grpcclient.InferRequestedOutput("text_output")], request_id="")
        client.stop_stream()
        return results.get(timeout=60)

    inputs = {
        "text_input": text2d(prompt),
        "max_tokens": int2d(100),
        "stream": np.array([[False]], dtype=bool),
        "beam_width": int2d(1),
        "temperature": np.array([[1.0]], dtype=np.float32),
        "exclude_input_in_output": np.array([[False]], dtype=bool),
    }
    res = send([tensor(grpcclient, k, v) for k, v in inputs.items()])
    check(not isinstance(res, InferenceServerException), f"error: {res}")
    text = res.as_numpy("text_output")[0].decode("utf-8")
    check(text.startswith(prompt) and len(text) > len(prompt), f"text {text!r}: want the prompt, then more")
    print(f"  {text[:80]!r}…", flush=True)
    # -S (streaming) needs a decoupled ensemble; this one is not, and says so.
    inputs["stream"] = np.array([[True]], dtype=bool)
    res = send([tensor(grpcclient, k, v) for k, v in inputs.items()])
    check(isinstance(res, InferenceServerException) and "needs a decoupled model" in str(res), f"streaming: {res}")
    client.close()


def bad_inputs(client, mod):
    print("bad inputs", flush=True)
    q, n = tensor(mod, "QUERY", text2d("hello")), tensor(mod, "REQUEST_OUTPUT_LEN", int2d(4))
    expect_error(lambda: client.infer("preprocessing", [q, tensor(mod, "REQUEST_OUTPUT_LEN", int2d(0))]),
                 'input "REQUEST_OUTPUT_LEN": item 0 is 0; must be at least 1')
    latin1 = np.array([["caf\xe9".encode("latin-1")]], dtype=object)
    expect_error(lambda: client.infer("preprocessing", [tensor(mod, "QUERY", latin1), n]),
                 'input "QUERY": item 0, string 0 is not valid UTF-8 (byte offset 3)')
    expect_error(lambda: client.infer("preprocessing", [q, n, tensor(mod, "EMBEDDING_BIAS_WORDS", text2d("a"))]),
                 'inputs "EMBEDDING_BIAS_WORDS" and "EMBEDDING_BIAS_WEIGHTS" go together')
    expect_error(lambda: client.infer("preprocessing", [q, n, tensor(mod, "END_ID", int2d(VOCAB))]),
                 f'input "END_ID": item 0 is {VOCAB}, outside the vocabulary [0, {VOCAB})')
    # An input the model does not declare is Triton's to refuse, naming it.
    expect_error(lambda: client.infer("preprocessing", [q, n, tensor(mod, "IMAGE_URL", text2d("http://x"))]), "IMAGE_URL")
    toks = np.array([[[464, 2068, 7586]]], dtype=np.int32)
    expect_error(lambda: client.infer("postprocessing", [tensor(mod, "TOKENS_BATCH", toks),
                                                         tensor(mod, "SEQUENCE_LENGTH", np.array([[9]], dtype=np.int32))]),
                 'input "SEQUENCE_LENGTH": item 0, beam 0 is 9; want 0 to the 3 tokens of "TOKENS_BATCH"')
    expect_error(lambda: client.infer("postprocessing", [tensor(mod, "TOKENS_BATCH", np.array([[[464, -1]]], dtype=np.int32)),
                                                         tensor(mod, "SEQUENCE_LENGTH", np.array([[2]], dtype=np.int32))]),
                 'input "TOKENS_BATCH": item 0, beam 0: token id -1 at position 1 is negative')
    expect_error(lambda: client.infer("postprocessing", [tensor(mod, "TOKENS_BATCH", toks),
                                                         tensor(mod, "SEQUENCE_LENGTH", np.array([[3, 3]], dtype=np.int32))]),
                 'input "SEQUENCE_LENGTH": shape [1 2]; want [1, 1]')


def main():
    http = httpclient.InferenceServerClient(HTTP_URL)
    grpc = grpcclient.InferenceServerClient(GRPC_URL)
    functionality(http, httpclient, "HTTP (end_to_end_test.py's default)")
    functionality(grpc, grpcclient, "gRPC")
    words_both_routes(http, httpclient)
    batch_and_llama(grpc, grpcclient)
    concurrent_ensemble()
    grpc_client_defaults()
    bad_inputs(http, httpclient)
    http.close()
    grpc.close()
    print("\nOK", flush=True)


if __name__ == "__main__":
    main()
