#!/usr/bin/env python3
"""Chat with a gollm model through the OpenAI server (`make serve`), with the official
openai package (scripts/deps.sh installs it into .deps/pyopenai):

    PYTHONPATH=.deps/pyopenai python3 examples/openai_chat.py "Will you dance, Mr. Darcy?"

GOLLM_OPENAI_URL overrides the server's address (default http://localhost:9000/v1),
GOLLM_MODEL the model (default austen, the demo model trained on Jane Austen).
"""
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("GOLLM_OPENAI_URL", "http://localhost:9000/v1"), api_key="unused")
model = os.environ.get("GOLLM_MODEL", "austen")
messages = [{"role": "user", "content": sys.argv[1] if len(sys.argv) > 1 else "Will you dance, Mr. Darcy?"}]

# austen's chat template opens the answer's quotation mark; the closing one ends it.
reply = client.chat.completions.create(model=model, messages=messages, max_tokens=48, seed=4, stop=['"'])
print(reply.choices[0].message.content)
print(reply.choices[0].finish_reason, reply.usage)

for chunk in client.chat.completions.create(model=model, messages=messages, max_tokens=48, seed=7, stop=['"'],
                                            stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
