#!/usr/bin/env python3
"""The official openai Python package against gollm's OpenAI server in front of a real
tritonserver. tests/openai_test.go starts both and runs this file; the environment
names them:

  GOLLM_OPENAI_URL   the server's /v1 URL
  GOLLM_METRICS_URL  tritonserver's /metrics URL
  GOLLM_MODEL        a model without a chat template (the demo weights alone)
  GOLLM_CHAT_MODEL   the demo checkpoint, with its chat template (tokenizer_config.json)
  GOLLM_AUSTEN_MODEL the austen demo model (trained weights, its own chat template and a
                     generation_config.json that samples at temperature 0.8, top-p 0.95)
  GOLLM_INTERVAL_MODEL GOLLM_MODEL's weights served with stream_interval 3

The gpt2 demo checkpoint's weights are random, so most tests check structure, counts and
consistency (greedy answers repeat; a stop string cuts an answer exactly where it
appears), not meaning; the austen tests check a trained model's chat end to end.
"""
import json
import math
import os
import re
import time
import unittest
import urllib.error
import urllib.request

import jsonschema
import openai

URL = os.environ["GOLLM_OPENAI_URL"]
METRICS = os.environ["GOLLM_METRICS_URL"]
MODEL = os.environ["GOLLM_MODEL"]
CHAT = os.environ["GOLLM_CHAT_MODEL"]
AUSTEN = os.environ["GOLLM_AUSTEN_MODEL"]
INTERVAL = os.environ["GOLLM_INTERVAL_MODEL"]

client = openai.OpenAI(base_url=URL, api_key="unused", max_retries=0, timeout=120)


def metric(name, model):
    """Sums a gollm_* metric over a model's instances."""
    text = urllib.request.urlopen(METRICS, timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and f'model="{model}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def post(path, body, headers=None):
    """POSTs raw bytes; returns (status, parsed JSON, headers)."""
    req = urllib.request.Request(URL + path, data=body, method="POST",
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read()), e.headers


CHAT_MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hello."}]


class Models(unittest.TestCase):
    def test_list_has_both_models(self):
        ids = [m.id for m in client.models.list().data]
        self.assertIn(MODEL, ids)
        self.assertIn(CHAT, ids)
        self.assertEqual(client.models.retrieve(CHAT).id, CHAT)

    def test_health(self):
        with urllib.request.urlopen(URL.removesuffix("/v1") + "/health", timeout=10) as r:
            self.assertEqual(r.status, 200)


class Completions(unittest.TestCase):
    def test_greedy_repeats_and_usage(self):
        a = client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=8, temperature=0)
        b = client.completions.create(model=MODEL, prompt="Hello, my name is", max_tokens=8, temperature=0)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertTrue(a.choices[0].text)
        self.assertEqual(a.choices[0].finish_reason, "length")
        self.assertEqual(a.usage.prompt_tokens, 5)  # GPT-2's tokenizer: Hello , my name is
        self.assertEqual(a.usage.completion_tokens, 8)
        self.assertEqual(a.usage.total_tokens, 13)
        self.assertTrue(a.id.startswith("cmpl-"))

    def test_stream_equals_non_stream(self):
        full = client.completions.create(model=MODEL, prompt="The sky", max_tokens=10, temperature=0)
        chunks = list(client.completions.create(model=MODEL, prompt="The sky", max_tokens=10, temperature=0,
                                                stream=True, stream_options={"include_usage": True}))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, full.choices[0].text)
        self.assertGreaterEqual(len([c for c in chunks if c.choices and c.choices[0].text]), 5)
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finals, ["length"])
        self.assertIsNotNone(chunks[-1].usage)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)
        self.assertEqual(chunks[-1].usage.prompt_tokens, full.usage.prompt_tokens)

    def test_stream_interval_chunks_carry_several_tokens(self):
        # INTERVAL is MODEL served with stream_interval 3: the first token alone, then three
        # a response; the stream must still be the same text, tokens and log-probabilities.
        full = client.completions.create(model=INTERVAL, prompt="The sky", max_tokens=10, temperature=0, logprobs=1)
        chunks = list(client.completions.create(model=INTERVAL, prompt="The sky", max_tokens=10, temperature=0,
                                                logprobs=1, stream=True, stream_options={"include_usage": True}))
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), full.choices[0].text)
        toks = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
        lps = [x for c in chunks if c.choices and c.choices[0].logprobs for x in c.choices[0].logprobs.token_logprobs]
        self.assertEqual(toks, full.choices[0].logprobs.tokens)
        for a, b in zip(lps, full.choices[0].logprobs.token_logprobs):
            self.assertAlmostEqual(a, b, places=4)
        with_text = [c for c in chunks if c.choices and c.choices[0].text]
        self.assertLessEqual(len(with_text), 4)  # 10 tokens: 1 + 3 + 3 + 3
        self.assertTrue(any(len(c.choices[0].logprobs.tokens) > 1 for c in with_text))
        self.assertEqual(chunks[-1].usage.completion_tokens, 10)

    def test_echo(self):
        r = client.completions.create(model=MODEL, prompt="Echo me", max_tokens=3, temperature=0, echo=True)
        plain = client.completions.create(model=MODEL, prompt="Echo me", max_tokens=3, temperature=0)
        self.assertEqual(r.choices[0].text, "Echo me" + plain.choices[0].text)

    def test_stop_string_split_across_tokens(self):
        full = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0)
        text = full.choices[0].text
        # A stop string from the middle of the answer that spans a token boundary:
        # the answer must end right before its first occurrence.
        lp = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0, logprobs=0)
        toks = lp.choices[0].logprobs.tokens
        self.assertEqual("".join(toks), text)
        boundary = len(toks[0]) + len(toks[1]) + len(toks[2])
        stop = text[boundary - 2:boundary + 2]
        want = text[:text.index(stop)]
        for stream in (False, True):
            if stream:
                chunks = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0,
                                                        stop=[stop, "never-appears"], stream=True))
                got = "".join(c.choices[0].text for c in chunks)
                reason = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
                self.assertEqual(reason, ["stop"])
            else:
                r = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0, stop=stop)
                got = r.choices[0].text
                self.assertEqual(r.choices[0].finish_reason, "stop")
                self.assertLess(r.usage.completion_tokens, 16)
            self.assertEqual(got, want, f"stream={stream} stop={stop!r}")
            self.assertNotIn(stop, got)

    def test_stop_string_with_logprobs_and_at_the_last_token(self):
        # The backend ends the sequence at the stop string and says why: the logprobs'
        # tokens are those whose text comes before it, and a stop string completed by the
        # max_tokens-th token is still "stop".
        lp = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0, logprobs=0)
        toks = lp.choices[0].logprobs.tokens
        text = lp.choices[0].text
        k = next(i for i in range(2, 14) if toks[i].strip() and text.index(toks[i]) == len("".join(toks[:i])))
        for stream in (False, True):
            kw = dict(model=MODEL, prompt="Once upon", temperature=0, logprobs=0, stop=[toks[k]])
            if stream:
                chunks = list(client.completions.create(max_tokens=16, stream=True, **kw))
                got = "".join(c.choices[0].text for c in chunks)
                got_toks = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
                reason = [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason]
            else:
                r = client.completions.create(max_tokens=16, **kw)
                got, got_toks, reason = r.choices[0].text, r.choices[0].logprobs.tokens, [r.choices[0].finish_reason]
            self.assertEqual(got, "".join(toks[:k]), f"stream={stream}")
            self.assertEqual(got_toks, toks[:k], f"stream={stream}")
            self.assertEqual(reason, ["stop"], f"stream={stream}")
            # The stop string's token is the last one max_tokens allows.
            at_last = client.completions.create(model=MODEL, prompt="Once upon", temperature=0, max_tokens=k + 1,
                                                stop=[toks[k]], stream=stream)
            if stream:
                at_last = list(at_last)
                reason = [c.choices[0].finish_reason for c in at_last if c.choices[0].finish_reason]
            else:
                reason = [at_last.choices[0].finish_reason]
            self.assertEqual(reason, ["stop"], f"stream={stream}: a stop string at max_tokens")

    def test_n_with_seed(self):
        r = client.completions.create(model=MODEL, prompt="Pick", max_tokens=12, n=3, temperature=1.0, seed=42)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2])
        texts = [c.text for c in r.choices]
        self.assertEqual(len(set(texts)), 3, texts)
        self.assertEqual(r.usage.completion_tokens, 36)
        again = client.completions.create(model=MODEL, prompt="Pick", max_tokens=12, n=3, temperature=1.0, seed=42)
        self.assertEqual(texts, [c.text for c in again.choices])
        # Choice i uses seed + i: choice 1 of seed 42 is choice 0 of seed 43.
        one = client.completions.create(model=MODEL, prompt="Pick", max_tokens=12, temperature=1.0, seed=43)
        self.assertEqual(one.choices[0].text, texts[1])

    def test_n_streaming(self):
        chunks = list(client.completions.create(model=MODEL, prompt="Pick", max_tokens=6, n=2, temperature=1.0,
                                                seed=7, stream=True))
        by = {0: "", 1: ""}
        for c in chunks:
            by[c.choices[0].index] += c.choices[0].text
        full = client.completions.create(model=MODEL, prompt="Pick", max_tokens=6, n=2, temperature=1.0, seed=7)
        self.assertEqual([by[0], by[1]], [c.text for c in full.choices])

    def test_logprobs(self):
        r = client.completions.create(model=MODEL, prompt="Numbers:", max_tokens=6, temperature=0, logprobs=3)
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 6)
        self.assertEqual("".join(lp.tokens), r.choices[0].text)
        for i, (tok, l, top) in enumerate(zip(lp.tokens, lp.token_logprobs, lp.top_logprobs)):
            self.assertLessEqual(l, 0)
            self.assertEqual(len(top), 3)
            # Greedy: the chosen token is the most likely one.
            best = max(top.values())
            self.assertAlmostEqual(l, best, places=5)
            self.assertIn(tok, top)
        self.assertEqual(lp.text_offset[0], 0)
        self.assertEqual(lp.text_offset[1], len(lp.tokens[0]))

    def test_logit_bias(self):
        # Bias one token up by 100: greedy decoding must then pick it every time.
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0,
                                      logit_bias={"464": 100})
        lp = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0,
                                       logit_bias={"464": 100}, logprobs=1)
        self.assertEqual(r.choices[0].text, "The" * 4)  # token 464 is "The"
        self.assertGreater(lp.choices[0].logprobs.token_logprobs[0], -0.01)

    def test_finish_reason_stop_at_the_end_token(self):
        # The end token (50256) biased up: the model ends at once, which is "stop" with
        # nothing generated, not "length".
        for stream in (False, True):
            if stream:
                chunks = list(client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                                        logit_bias={"50256": 100}, stream=True,
                                                        stream_options={"include_usage": True}))
                reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
                self.assertEqual(reasons, ["stop"])
                self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), "")
                self.assertEqual(chunks[-1].usage.completion_tokens, 0)
            else:
                r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0,
                                              logit_bias={"50256": 100})
                self.assertEqual(r.choices[0].finish_reason, "stop")
                self.assertEqual(r.choices[0].text, "")
                self.assertEqual(r.usage.completion_tokens, 0)

    def test_penalties(self):
        # Greedy decoding on the random demo weights repeats tokens; a presence or
        # frequency penalty of 2 must change the answer and repeat fewer of them.
        def tokens(**kw):
            r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=24, temperature=0, logprobs=0, **kw)
            self.assertEqual(r.choices[0].finish_reason, "length")
            return r.choices[0].logprobs.tokens

        def repeats(toks):
            return len(toks) - len(set(toks))

        plain = tokens()
        self.assertGreater(repeats(plain), 0, plain)
        for kw in (dict(presence_penalty=2), dict(frequency_penalty=2)):
            got = tokens(**kw)
            self.assertNotEqual(got, plain, kw)
            self.assertLess(repeats(got), repeats(plain), (kw, got))
        # A negative penalty favours what was seen: never fewer repeats than none.
        self.assertGreaterEqual(repeats(tokens(frequency_penalty=-2)), repeats(plain))

    def test_top_p(self):
        greedy = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
        # top_p 0 keeps the most likely token alone: greedy, whatever the temperature.
        r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1.5, top_p=0, seed=5)
        self.assertEqual(r.choices[0].text, greedy.choices[0].text)
        # A small nucleus at temperature 1 with a seed repeats itself and differs from
        # the unrestricted draw of the same seed (the random weights' distribution is flat).
        a = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1, top_p=0.05, seed=5)
        b = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1, top_p=0.05, seed=5)
        full = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=1, seed=5)
        self.assertEqual(a.choices[0].text, b.choices[0].text)
        self.assertNotEqual(a.choices[0].text, full.choices[0].text)

    def test_request_id_passed_through(self):
        status, body, headers = post("/completions", json.dumps(
            {"model": MODEL, "prompt": "x", "max_tokens": 1}).encode(), {"X-Request-Id": "my-req-17"})
        self.assertEqual(status, 200)
        self.assertEqual(body["id"], "cmpl-my-req-17")
        self.assertEqual(headers["X-Request-Id"], "my-req-17")


class Chat(unittest.TestCase):
    def test_chat_and_usage(self):
        r = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=5, temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertTrue(r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 5)
        # The SmolLM template around the two messages: the prompt is far longer than
        # the messages' words alone.
        self.assertGreater(r.usage.prompt_tokens, 20)
        same = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_completion_tokens=5, temperature=0)
        self.assertEqual(same.choices[0].message.content, r.choices[0].message.content)

    def test_chat_is_the_rendered_template(self):
        # The chat prompt is exactly the template's rendering: a completion of that
        # text gives the same greedy answer.
        rendered = ("<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nSay hello.<|im_end|>\n"
                    "<|im_start|>assistant\n")
        c = client.completions.create(model=CHAT, prompt=rendered, max_tokens=6, temperature=0)
        r = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=6, temperature=0)
        self.assertEqual(r.choices[0].message.content, c.choices[0].text)
        self.assertEqual(r.usage.prompt_tokens, c.usage.prompt_tokens)

    def test_stream(self):
        full = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=8, temperature=0)
        chunks = list(client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=8, temperature=0,
                                                     stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, full.choices[0].message.content)
        self.assertEqual(chunks[-1].usage.completion_tokens, 8)
        self.assertEqual(chunks[-1].usage.prompt_tokens, full.usage.prompt_tokens)
        self.assertTrue(all(c.object == "chat.completion.chunk" for c in chunks))

    def test_logprobs(self):
        r = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=4, temperature=0,
                                           logprobs=True, top_logprobs=5)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        self.assertEqual("".join(t.token for t in content), r.choices[0].message.content)
        for t in content:
            self.assertEqual(len(t.top_logprobs), 5)
            self.assertEqual(t.token, t.top_logprobs[0].token)  # greedy
            self.assertAlmostEqual(t.logprob, t.top_logprobs[0].logprob, places=5)
            lps = [a.logprob for a in t.top_logprobs]
            self.assertEqual(lps, sorted(lps, reverse=True))
            self.assertLess(sum(math.exp(x) for x in lps), 1.0 + 1e-6)
            self.assertEqual(bytes(t.bytes).decode("utf-8", "replace"), t.token)

    def test_stop_and_n(self):
        full = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=12, temperature=0)
        text = full.choices[0].message.content
        stop = text[5:9]
        r = client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, max_tokens=12, temperature=0,
                                           stop=[stop], n=2)
        self.assertEqual(len(r.choices), 2)
        for c in r.choices:
            self.assertEqual(c.message.content, text[:text.index(stop)])
            self.assertEqual(c.finish_reason, "stop")

    def test_no_template(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=MODEL, messages=CHAT_MSGS, max_tokens=2)
        self.assertIn("no chat template", str(cm.exception))

    def test_template_refusal(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=CHAT, messages=[], max_tokens=2)
        self.assertIn("messages", str(cm.exception))


class Austen(unittest.TestCase):
    MSGS = [{"role": "user", "content": "Will you dance with me, Mr. Darcy?"}]
    # austen's template: the user's words quoted, then the reply's quotation mark opened.
    RENDERED = '"Will you dance with me, Mr. Darcy?" said she.\n"'

    def test_chat_answers_and_ends_itself(self):
        r = client.chat.completions.create(model=AUSTEN, messages=self.MSGS, max_tokens=40, temperature=0)
        text = r.choices[0].message.content
        # The trained model closes the quotation and then emits its end token.
        self.assertEqual(r.choices[0].finish_reason, "stop", text)
        self.assertTrue(text.endswith('"'), text)
        self.assertLess(r.usage.completion_tokens, 40)
        self.assertGreater(len(text.split()), 2, text)
        c = client.completions.create(model=AUSTEN, prompt=self.RENDERED, max_tokens=40, temperature=0)
        self.assertEqual(c.choices[0].text, text)
        self.assertEqual(c.usage.prompt_tokens, r.usage.prompt_tokens)
        # The closing quotation mark as a stop string: the same words without it.
        s = client.chat.completions.create(model=AUSTEN, messages=self.MSGS, max_tokens=40, temperature=0, stop=['"'])
        self.assertEqual(s.choices[0].message.content, text[:text.index('"')])
        self.assertEqual(s.choices[0].finish_reason, "stop")

    def test_sampling_defaults_are_the_checkpoints(self):
        # No temperature: the backend samples with generation_config.json's 0.8 and 0.95,
        # the same draw as asking for them.
        kw = dict(model=AUSTEN, messages=self.MSGS, max_tokens=24, seed=11)
        default = client.chat.completions.create(**kw).choices[0].message.content
        explicit = client.chat.completions.create(temperature=0.8, top_p=0.95, **kw).choices[0].message.content
        greedy = client.chat.completions.create(temperature=0, **kw).choices[0].message.content
        self.assertEqual(default, explicit)
        self.assertNotEqual(default, greedy)


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "born": {"type": "string", "format": "date"},
        "height": {"type": "number", "minimum": 1, "maximum": 3},
        "married": {"type": "boolean"},
        "children": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "title": {"enum": ["Mr.", "Mrs.", "Miss", "Sir"]},
        "estate": {"type": ["object", "null"], "properties": {"county": {"type": "string", "maxLength": 16},
                                                            "acres": {"type": "integer", "minimum": 1}},
                   "required": ["county", "acres"], "additionalProperties": False},
    },
    "required": ["name", "age", "email", "born", "married", "children", "title", "estate"],
    "additionalProperties": False,
}


def raw_sse(body):
    """POSTs a streaming chat request; returns the parsed data events (without [DONE])."""
    req = urllib.request.Request(URL + "/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r.read().decode().split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[len("data: "):]))
    return events


class StructuredOutputs(unittest.TestCase):
    def test_100_json_schema_answers_validate(self):
        # The austen model has never seen JSON: the mask alone makes its answers valid.
        checker = jsonschema.FormatChecker()
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
        answers = []
        for seed in range(10):
            r = client.chat.completions.create(model=AUSTEN, messages=[{"role": "user", "content": "Describe Mr. Darcy."}],
                                               response_format=fmt, n=10, seed=10 * seed, max_tokens=160)
            for ch in r.choices:
                answers.append(ch.message.content)
                self.assertIn(ch.finish_reason, ("stop", "length"))
        self.assertEqual(len(answers), 100)
        for a in answers:
            jsonschema.validate(json.loads(a), PERSON, format_checker=checker)
        self.assertGreater(len(set(answers)), 90, "sampled answers should differ")
        print("\nan answer:", answers[0])

    def test_json_object_streamed(self):
        stream = client.chat.completions.create(model=AUSTEN, messages=[{"role": "user", "content": "Your estate?"}],
                                                response_format={"type": "json_object"}, stream=True, seed=3, max_tokens=80)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        self.assertIsInstance(json.loads(text), dict)

    def test_parse_with_pydantic_model(self):
        import pydantic

        class Visit(pydantic.BaseModel):
            host: str = pydantic.Field(max_length=20)
            guests: int = pydantic.Field(ge=1, le=12)
            ball: bool

        r = client.beta.chat.completions.parse(model=AUSTEN, messages=[{"role": "user", "content": "Plan a visit."}],
                                               response_format=Visit, seed=5, max_tokens=80)
        v = r.choices[0].message.parsed
        self.assertIsInstance(v, Visit)
        self.assertTrue(1 <= v.guests <= 12)

    def test_bad_schemas_are_400(self):
        def bad(fmt, *parts):
            with self.assertRaises(openai.BadRequestError) as cm:
                client.chat.completions.create(model=AUSTEN, messages=[{"role": "user", "content": "x"}], response_format=fmt)
            for p in parts:
                self.assertIn(p, str(cm.exception))
        bad({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "array", "uniqueItems": True}}}, "uniqueItems")
        bad({"type": "json_schema", "json_schema": {"name": "s", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}},
            "no JSON value satisfies the schema")
        bad({"type": "json_schema", "json_schema": {"name": "s", "strict": True,
                                                    "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}},
            "additionalProperties")
        deep = {"type": "object", "properties": {"a": {}}}
        for _ in range(100):
            deep = {"type": "array", "items": deep}
        bad({"type": "json_schema", "json_schema": {"name": "s", "schema": deep}}, "nests")
        # The server goes on serving.
        r = client.chat.completions.create(model=AUSTEN, messages=[{"role": "user", "content": "x"}], max_tokens=3)
        self.assertTrue(r.choices[0].message.content is not None)


class OpenAIShape(unittest.TestCase):
    def test_stream_chunks_are_shaped_as_openai_s(self):
        events = raw_sse({"model": AUSTEN, "messages": [{"role": "user", "content": "Hello."}], "max_tokens": 6,
                          "stream": True, "stream_options": {"include_usage": True}, "seed": 1})
        self.assertGreater(len(events), 2)
        for e in events[:-1]:
            self.assertIn("usage", e)
            self.assertIsNone(e["usage"])
            self.assertEqual(e["system_fingerprint"], events[0]["system_fingerprint"])
        self.assertTrue(events[0]["system_fingerprint"])
        last_content = events[-2]["choices"][0]
        self.assertIsNotNone(last_content["finish_reason"])
        if last_content["delta"].get("content") is None:
            self.assertEqual(last_content["delta"], {})
        self.assertEqual(events[-1]["choices"], [])
        self.assertIsNotNone(events[-1]["usage"])
        # Without include_usage the chunks carry no usage at all.
        for e in raw_sse({"model": AUSTEN, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 3, "stream": True}):
            self.assertNotIn("usage", e)

    def test_unknown_parameter_is_400(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=AUSTEN, messages=[{"role": "user", "content": "x"}], extra_body={"frobnicate": 1})
        self.assertIn("Unrecognized request argument supplied: frobnicate", str(cm.exception))

    def test_context_length_exceeded(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client.completions.create(model=AUSTEN, prompt="very " * 2000, max_tokens=5)
        self.assertEqual(cm.exception.code, "context_length_exceeded")

    def test_vllm_sampling_extras(self):
        msgs = [{"role": "user", "content": "Will you dance?"}]
        for seed in range(3):
            r = client.chat.completions.create(model=AUSTEN, messages=msgs, max_tokens=40, seed=seed,
                                               extra_body={"ignore_eos": True})
            self.assertEqual(r.usage.completion_tokens, 40)
            self.assertEqual(r.choices[0].finish_reason, "length")
            r = client.chat.completions.create(model=AUSTEN, messages=msgs, max_tokens=30, seed=seed,
                                               extra_body={"min_tokens": 25})
            self.assertGreaterEqual(r.usage.completion_tokens, 25)
        a = client.completions.create(model=AUSTEN, prompt="It is a truth", max_tokens=12, temperature=1.0, seed=9,
                                      extra_body={"top_k": 1})
        b = client.completions.create(model=AUSTEN, prompt="It is a truth", max_tokens=12, temperature=0)
        self.assertEqual(a.choices[0].text, b.choices[0].text, "top_k 1 is greedy")
        c = client.completions.create(model=AUSTEN, prompt="It is a truth", max_tokens=12, temperature=0,
                                      extra_body={"repetition_penalty": 5.0})
        self.assertNotEqual(b.choices[0].text, c.choices[0].text, "a strong repetition penalty changes a greedy answer")


TOOL_MODELS = dict(kv.split("=", 1) for kv in os.environ["GOLLM_TOOL_MODELS"].split(","))
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a town.",
    "parameters": {"type": "object", "properties": {"town": {"type": "string", "maxLength": 16}, "unit": {"enum": ["c", "f"]}},
                   "required": ["town", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The time somewhere.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 10}},
                   "required": ["zone"], "additionalProperties": False}}}
SPECS = {"get_weather": WEATHER, "get_time": TIME}
ASK = [{"role": "user", "content": "Is it raining in Bath?"}]


class Tools(unittest.TestCase):
    def check_calls(self, calls):
        self.assertTrue(calls)
        for tc in calls:
            self.assertTrue(tc.id)
            jsonschema.validate(json.loads(tc.function.arguments), SPECS[tc.function.name]["function"]["parameters"])

    def test_required_calls_round_trip_through_each_template(self):
        for fmt, model in TOOL_MODELS.items():
            for seed in range(3):
                r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], tool_choice="required",
                                                   seed=seed, max_tokens=150)
                ch = r.choices[0]
                self.assertEqual(ch.finish_reason, "tool_calls", fmt)
                self.check_calls(ch.message.tool_calls)
                # The calls and their results go back through the template.
                msgs = ASK + [{"role": "assistant", "content": None,
                               "tool_calls": [tc.model_dump(exclude_none=True) for tc in ch.message.tool_calls]}]
                calls_only = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], seed=seed,
                                                            max_tokens=4)
                msgs += [{"role": "tool", "tool_call_id": tc.id, "content": "Rain, and 12 degrees."} for tc in ch.message.tool_calls]
                r2 = client.chat.completions.create(model=model, messages=msgs, tools=[WEATHER, TIME], seed=seed, max_tokens=8)
                # The results are in the prompt, after the calls.
                self.assertGreater(r2.usage.prompt_tokens, calls_only.usage.prompt_tokens, fmt)

    def test_named_function_and_one_call(self):
        for fmt, model in TOOL_MODELS.items():
            r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER, TIME], seed=4, max_tokens=150,
                                               tool_choice={"type": "function", "function": {"name": "get_time"}},
                                               parallel_tool_calls=False)
            calls = r.choices[0].message.tool_calls
            self.check_calls(calls)
            self.assertEqual(len(calls), 1, fmt)
            self.assertEqual(calls[0].function.name, "get_time", fmt)

    def test_streamed_tool_call_deltas(self):
        for fmt, model in TOOL_MODELS.items():
            stream = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="required",
                                                    seed=6, max_tokens=150, stream=True)
            calls, finish = {}, None
            for chunk in stream:
                for ch in chunk.choices:
                    for d in ch.delta.tool_calls or []:
                        c = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                        c["id"] += d.id or ""
                        c["name"] += d.function.name or ""
                        c["arguments"] += d.function.arguments or ""
                    finish = ch.finish_reason or finish
            self.assertEqual(finish, "tool_calls", fmt)
            self.assertTrue(calls, fmt)
            for c in calls.values():
                self.assertEqual(c["name"], "get_weather")
                jsonschema.validate(json.loads(c["arguments"]), WEATHER["function"]["parameters"])

    def test_none_and_auto_answer_in_text(self):
        for model in TOOL_MODELS.values():
            r = client.chat.completions.create(model=model, messages=ASK, tools=[WEATHER], tool_choice="none", seed=1, max_tokens=12)
            self.assertIsNone(r.choices[0].message.tool_calls)
            self.assertIsInstance(r.choices[0].message.content, str)

    def test_template_without_tool_calls_is_refused(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=CHAT, messages=ASK, tools=[WEATHER])
        self.assertIn("writes no tool calls", str(cm.exception))


class Errors(unittest.TestCase):
    def test_unknown_model(self):
        with self.assertRaises(openai.NotFoundError) as cm:
            client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        self.assertEqual(cm.exception.status_code, 404)
        self.assertIn("no-such-model", str(cm.exception))
        with self.assertRaises(openai.NotFoundError):
            client.chat.completions.create(model="no-such-model", messages=CHAT_MSGS)

    def test_bad_json(self):
        for path in ("/completions", "/chat/completions"):
            status, body, _ = post(path, b'{"model": "gpt2", "prompt": ')
            self.assertEqual(status, 400)
            self.assertEqual(body["error"]["type"], "invalid_request_error")
            self.assertIn("not valid JSON", body["error"]["message"])
        status, body, _ = post("/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": "ten"}).encode())
        self.assertEqual(status, 400)
        self.assertIn("max_tokens", body["error"]["message"])

    def test_max_tokens_too_large(self):
        for stream in (False, True):
            with self.assertRaises(openai.BadRequestError) as cm:
                r = client.completions.create(model=MODEL, prompt="Hello", max_tokens=5000, stream=stream)
                list(r) if stream else None
            self.assertIn("maximum sequence length", str(cm.exception))
        with self.assertRaises(openai.BadRequestError) as cm:
            client.completions.create(model=MODEL, prompt="Hello", max_tokens=0)
        self.assertIn("max_tokens", str(cm.exception))

    def test_prompt_too_long_is_refused_once_for_every_choice(self):
        # A prompt longer than the model can take is refused by the frontend, once, in
        # bounded time, however many choices it asks for: Triton sees no request.
        triton_before = [metric(m, MODEL) for m in ("nv_inference_request_success", "nv_inference_request_failure")]
        for prompt in ("a" * (2 << 20), "Call me Ishmael. " * 400):
            for stream in (False, True):
                start = time.time()
                with self.assertRaises(openai.BadRequestError) as cm:
                    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, n=4, stream=stream)
                    list(r) if stream else None
                took = time.time() - start
                self.assertEqual(cm.exception.body["code"], "context_length_exceeded", str(cm.exception))
                self.assertEqual(cm.exception.body["param"], "prompt")
                self.assertLess(took, 2.0, f"refused after {took:.2f} s")
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "b" * (1 << 20)}], n=4)
        self.assertEqual(cm.exception.body["param"], "messages")
        triton_after = [metric(m, MODEL) for m in ("nv_inference_request_success", "nv_inference_request_failure")]
        self.assertEqual(triton_before, triton_after, "the refused prompts reached Triton")

    def test_bad_temperature(self):
        for t in (-0.5, 2.5):
            with self.assertRaises(openai.BadRequestError) as cm:
                client.chat.completions.create(model=CHAT, messages=CHAT_MSGS, temperature=t)
            self.assertIn("temperature", str(cm.exception))
            self.assertEqual(cm.exception.body["param"], "temperature")

    def test_other_bad_fields(self):
        cases = [
            (dict(top_p=1.5), "top_p"), (dict(n=0), "n"), (dict(presence_penalty=3), "presence_penalty"),
            (dict(stop=["a", "b", "c", "d", "e"]), "stop"), (dict(logit_bias={"99999999": 1}), "logit_bias"),
            (dict(logit_bias={"5": 500}), "logit_bias"), (dict(logprobs=9), "logprobs"),
        ]
        for kw, param in cases:
            with self.assertRaises(openai.BadRequestError, msg=str(kw)) as cm:
                client.completions.create(model=MODEL, prompt="x", max_tokens=2, **kw)
            self.assertIn(param, str(cm.exception), kw)

    def test_server_stays_up(self):
        r = client.completions.create(model=MODEL, prompt="still", max_tokens=2, temperature=0)
        self.assertEqual(r.usage.completion_tokens, 2)


class Cancellation(unittest.TestCase):
    def test_disconnect_frees_kv_blocks(self):
        before = metric("gollm_iterations", MODEL)
        stream = client.completions.create(model=MODEL, prompt="Tell me everything", max_tokens=1000,
                                           temperature=0, stream=True)
        got = 0
        for chunk in stream:
            got += 1
            if got == 5:
                break
        self.assertGreater(metric("gollm_kv_blocks_used", MODEL), 0)
        stream.close()  # the client goes away
        deadline = time.time() + 30
        while time.time() < deadline:
            if metric("gollm_kv_blocks_used", MODEL) == 0 and metric("gollm_requests_active", MODEL) == 0:
                break
            time.sleep(0.05)
        self.assertEqual(metric("gollm_kv_blocks_used", MODEL), 0)
        self.assertEqual(metric("gollm_requests_active", MODEL), 0)
        ran = metric("gollm_iterations", MODEL) - before
        # Cancelled, not finished: far fewer steps than the 1000 tokens asked for.
        self.assertLess(ran, 900, f"{ran} iterations ran: the request was not cancelled")


if __name__ == "__main__":
    unittest.main(verbosity=2)
