#!/usr/bin/env python3
"""Chat with a gollm model through the OpenAI server (`make serve`), with the official
openai package (scripts/deps.sh installs it into .deps/pyopenai):

    PYTHONPATH=.deps/pyopenai python3 examples/openai_chat.py "Hello!"

GOLLM_OPENAI_URL overrides the server's address (default http://localhost:9000/v1).
"""
import os
import sys

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("GOLLM_OPENAI_URL", "http://localhost:9000/v1"), api_key="unused")
question = sys.argv[1] if len(sys.argv) > 1 else "Hello!"

reply = client.chat.completions.create(
    model="gpt2", messages=[{"role": "user", "content": question}], max_tokens=8, seed=1)
print("answer:", repr(reply.choices[0].message.content), reply.choices[0].finish_reason, reply.usage)

print("stream:", end="")
for chunk in client.chat.completions.create(
        model="gpt2", messages=[{"role": "user", "content": question}], max_tokens=8, seed=1, stream=True):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()
