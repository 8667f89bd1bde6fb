#!/usr/bin/env python3
"""Writes expected.json: each chat template of this folder rendered by Python's Jinja2
the way Hugging Face transformers' apply_chat_template renders it (a sandboxed
environment with trim_blocks and lstrip_blocks, raise_exception, tojson without ASCII
escapes, the special tokens as strings), for the conversations below. The Go tests
render the same with the frontend's Jinja engine and compare. Run: python3 gen.py
"""
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = pathlib.Path(__file__).parent

CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello, who are you?"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Name a colour.  "},
    ],
    "multi_turn": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And times 3? Ünïcödé ✓"},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Bye\nnow"},
    ],
    "two_users": [
        {"role": "user", "content": "one"},
        {"role": "user", "content": "two"},
    ],
}


class Raised(Exception):
    """What raise_exception raises."""


def raise_exception(message):
    raise Raised(message)


def special(v):
    """A special token as a string: plain, or the AddedToken object form."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                       extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    cases = []
    for path in sorted(HERE.glob("*.json")):
        if path.name == "expected.json":
            continue
        cfg = json.loads(path.read_text())
        tmpl = cfg["chat_template"]
        if isinstance(tmpl, list):
            tmpl = {t["name"]: t["template"] for t in tmpl}["default"]
        compiled = env.from_string(tmpl)
        tokens = {k: special(cfg[k]) for k in ("bos_token", "eos_token", "unk_token", "pad_token") if cfg.get(k) is not None}
        for conv_name, messages in CONVERSATIONS.items():
            for gen in (True, False):
                case = {"config": path.name, "conversation": conv_name, "messages": messages,
                        "add_generation_prompt": gen}
                try:
                    case["output"] = compiled.render(messages=messages, add_generation_prompt=gen, **tokens)
                except Raised as e:
                    case["error"] = str(e)
                cases.append(case)
    (HERE / "expected.json").write_text(json.dumps(cases, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases")


if __name__ == "__main__":
    main()
