"""Real LLaMA-family tokenizers as Hugging Face tokenizer.json files, converted from the
files their publishers ship on PyPI (scripts/deps.sh puts them in .deps/realtok):

    python3 demo/real_tokenizers.py convert llama2|llama3 OUT
        writes OUT/tokenizer.json and OUT/tokenizer_config.json;
    python3 demo/real_tokenizers.py compare OUT TEXTS.json > result.json
        converts both into OUT/llama2 and OUT/llama3, checks each against its original
        (sentencepiece, tiktoken) on TEXTS.json and a few texts of its own, and prints
        what Hugging Face tokenizers makes of the texts with each, in hf_families.py's
        format (for real_tokenizers_test.go).

Run it with PYTHONPATH=.deps/realtok/py:.deps/py (sentencepiece's protobuf before
tritonclient's older one).

- llama2: Mistral 7B v0.1's SentencePiece model (mistral-common's tokenizer.model.v1:
  32,000 BPE pieces with byte fallback, the format of Llama 2 and TinyLlama) laid out as
  transformers' LlamaTokenizerFast writes it for those checkpoints: the Prepend("▁") +
  Replace(" ", "▁") normalizer, no pre-tokenizer, the Replace/ByteFallback/Fuse/Strip
  decoder, "<s> $A" post-processing, <unk> <s> </s> as special added tokens, and
  add_bos_token in tokenizer_config.json.
- llama3: Llama 3's tiktoken ranks (llama-models' llama3/tokenizer.model, 128,000 tokens)
  as byte-level BPE with ignore_merges, Llama 3's Split regex, its 256 special tokens by
  the names llama-models gives them (128000 <|begin_of_text|> …), and
  "<|begin_of_text|> $A" post-processing.

The files are derived here, at demo and test time, and never committed: their licences
(Apache-2.0 for Mistral's, the Llama 3 Community License for Meta's) are not gollm's.
"""
import ast
import base64
import json
import os
import random
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REALTOK = os.path.join(ROOT, ".deps", "realtok")
MISTRAL_V1 = os.path.join(REALTOK, "mistral_common", "data", "tokenizer.model.v1")
LLAMA3_RANKS = os.path.join(REALTOK, "llama_models", "llama3", "tokenizer.model")
LLAMA3_PY = os.path.join(REALTOK, "llama_models", "llama3", "tokenizer.py")
INSTALL = "scripts/deps.sh installs it (GOLLM_TEST_DEPS=1 for Llama 3's)"


def need(path):
    if not os.path.exists(path):
        sys.exit(f"real_tokenizers.py: {path} is missing: {INSTALL}")
    return path


# ---- Llama 2 layout from a SentencePiece BPE model -----------------------------------

def sentencepiece_model(path):
    """The ModelProto, after checking it is the kind this conversion is right for."""
    from sentencepiece import sentencepiece_model_pb2 as pb
    m = pb.ModelProto()
    with open(need(path), "rb") as f:
        m.ParseFromString(f.read())
    t, n = m.trainer_spec, m.normalizer_spec
    # What the Llama 2 layout stands for: BPE over characters with byte fallback, text
    # taken as it is apart from one "▁" in front (add_dummy_prefix) and spaces as "▁".
    want = {"model_type": (t.model_type, pb.TrainerSpec.BPE), "byte_fallback": (t.byte_fallback, True),
            "normalizer name": (n.name, "identity"), "add_dummy_prefix": (n.add_dummy_prefix, True),
            "remove_extra_whitespaces": (n.remove_extra_whitespaces, False),
            "treat_whitespace_as_suffix": (t.treat_whitespace_as_suffix, False),
            "unk/bos/eos ids": ((t.unk_id, t.bos_id, t.eos_id), (0, 1, 2))}
    for what, (got, expected) in want.items():
        if got != expected:
            sys.exit(f"real_tokenizers.py: {path}: {what} is {got!r}, not {expected!r}: not a Llama-2-format model")
    kinds = {pb.ModelProto.SentencePiece.NORMAL, pb.ModelProto.SentencePiece.BYTE,
             pb.ModelProto.SentencePiece.CONTROL, pb.ModelProto.SentencePiece.UNKNOWN}
    odd = [p.piece for p in m.pieces if p.type not in kinds]
    if odd:
        sys.exit(f"real_tokenizers.py: {path}: pieces of other types (user-defined, unused) are not converted: {odd[:5]}")
    return m


def pair_merges(tokens):
    """The merge list of a BPE that joins, among adjacent pairs, the one whose join is the
    best-ranked token (leftmost on ties), as SentencePiece (highest score) and tiktoken
    (lowest rank) both do: every split of a token into two tokens is a merge, ranked as
    the joined token. tokens are (token, rank) in id order, lower ranks first; splits of
    one token come in the order of their parts' ids, and tokens of equal rank keep their
    id order (a stable sort), which is how transformers' converters order them. Ranking
    merges by their join alone, not only the pair BPE of lower ranks would reach, keeps
    tokens that tiktoken never builds in two parts (Llama 3's ".:.:") reachable."""
    ids = {t: i for i, (t, _) in enumerate(tokens)}
    merges = []
    for token, rank in tokens:
        local = [(token[:k], token[k:], rank) for k in range(1, len(token))
                 if token[:k] in ids and token[k:] in ids]
        local.sort(key=lambda m: (ids[m[0]], ids[m[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: m[2])
    return [(left, right) for left, right, _ in merges]


def added(id_, content):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": True}


def special_token(content):
    """tokenizer_config.json's AddedToken object, as Llama 2's has them."""
    return {"__type": "AddedToken", "content": content, "lstrip": False, "normalized": False,
            "rstrip": False, "single_word": False}


def llama2(model_path=MISTRAL_V1):
    m = sentencepiece_model(model_path)
    pieces = [(p.piece, p.score) for p in m.pieces]
    # The converter gives <unk> <s> </s> score 0, as the model does; they are added
    # tokens (special, matched in text before anything else) besides vocabulary entries.
    unk, bos, eos = (m.pieces[i].piece for i in range(3))
    template = lambda with_pair: [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}] + (
        [{"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}] if with_pair else [])
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(0, unk), added(1, bos), added(2, eos)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing", "single": template(False), "pair": template(True),
                           "special_tokens": {bos: {"id": bos, "ids": [1], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": unk, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, (p, _) in enumerate(pieces)},
                  "merges": [f"{left} {right}" for left, right in pair_merges([(p, -score) for p, score in pieces])]},
    }
    config = {
        "add_bos_token": True, "add_eos_token": False,
        "bos_token": special_token(bos), "eos_token": special_token(eos), "unk_token": special_token(unk),
        "pad_token": None, "clean_up_tokenization_spaces": False, "legacy": False,
        "model_max_length": 32768, "sp_model_kwargs": {},
        "tokenizer_class": "LlamaTokenizer",
    }
    return doc, config


# ---- Llama 3 from tiktoken ranks ------------------------------------------------------

def byte_level_table():
    """GPT-2's byte→character table, through which byte-level vocabularies spell bytes."""
    printable = [b for b in range(256) if 0x21 <= b <= 0x7E or 0xA1 <= b <= 0xAC or 0xAE <= b <= 0xFF]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def tiktoken_ranks(path):
    ranks = {}
    with open(need(path), encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if sorted(ranks.values()) != list(range(len(ranks))):
        sys.exit(f"real_tokenizers.py: {path}: ranks are not 0..{len(ranks) - 1}")
    return ranks


def llama3_specials(path=LLAMA3_PY):
    """Llama 3's special token names and split pattern, read from llama-models' tokenizer.py
    (without importing it: it needs more packages than the conversion): the named tokens
    of its special_tokens list, then <|reserved_special_token_N|> up to 256 in all."""
    with open(need(path), encoding="utf-8") as f:
        src = f.read()
    tree = ast.parse(src)
    names, pattern, count = None, None, None
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            name = target.id if isinstance(target, ast.Name) else None
            if name == "special_tokens" and isinstance(node.value, ast.List):
                names = [ast.literal_eval(e) for e in node.value.elts]
            elif name == "pat_str":
                pattern = ast.literal_eval(node.value)
            elif name == "num_reserved_special_tokens":
                count = ast.literal_eval(node.value)
    # The reserved names continue the numbering of the two named reserved tokens.
    if not names or not pattern or count != 256 or "reserved_special_token_{2 + i}" not in src:
        sys.exit(f"real_tokenizers.py: {path} is not laid out as llama-models 0.3.0's (special_tokens, pat_str, 256 reserved)")
    names += [f"<|reserved_special_token_{2 + i}|>" for i in range(count - len(names))]
    return names, pattern


def llama3(ranks_path=LLAMA3_RANKS, py_path=LLAMA3_PY):
    ranks = tiktoken_ranks(ranks_path)
    names, pattern = llama3_specials(py_path)
    table = byte_level_table()
    spell = lambda b: "".join(table[x] for x in b)
    vocab = {spell(tok): rank for tok, rank in ranks.items()}
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    merges = [[spell(left), spell(right)] for left, right in pair_merges(by_rank)]
    base = len(ranks)
    bos = names[0]
    template = lambda with_pair: [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}] + (
        [{"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}] if with_pair else [])
    doc = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(base + i, name) for i, name in enumerate(names)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": template(False), "pair": template(True),
             "special_tokens": {bos: {"id": bos, "ids": [base], "tokens": [bos]}}}]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": merges},
    }
    config = {"bos_token": bos, "eos_token": "<|end_of_text|>", "clean_up_tokenization_spaces": True,
              "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    return doc, config


CONVERTERS = {"llama2": llama2, "llama3": llama3}


def write(name, out):
    doc, config = CONVERTERS[name]()
    os.makedirs(out, exist_ok=True)
    raw = json.dumps(doc, ensure_ascii=False, indent=1)
    for file, text in (("tokenizer.json", raw), ("tokenizer_config.json", json.dumps(config, indent=2))):
        tmp = os.path.join(out, file + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text + "\n")
        os.replace(tmp, os.path.join(out, file))
    return raw, config


# ---- checks against the originals -----------------------------------------------------

def check_llama2(folder, texts):
    """Hugging Face tokenizers on the converted file against sentencepiece on the model,
    for texts without the special tokens' spellings (sentencepiece reads "<s>" as text,
    the tokenizer.json as the token, by design of both)."""
    import sentencepiece as spm
    from tokenizers import Tokenizer
    sp = spm.SentencePieceProcessor(model_file=MISTRAL_V1)
    hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    bad, texts = [], [t for t in texts if not any(s in t for s in ("<s>", "</s>", "<unk>"))]
    for t in texts:
        want, got = sp.encode(t), hf.encode(t, add_special_tokens=False).ids
        if want != got:
            bad.append((t, want, got))
        # Decoding: sentencepiece's decode drops the dummy prefix's space, as the Strip
        # decoder does.
        elif sp.decode(want) != hf.decode(got):
            bad.append((t, sp.decode(want), hf.decode(got)))
    return bad, len(texts)


def check_llama3(folder, texts):
    """Hugging Face tokenizers on the converted file against tiktoken on the ranks, with
    llama-models' special tokens allowed anywhere in text."""
    import tiktoken
    from tokenizers import Tokenizer
    ranks = tiktoken_ranks(LLAMA3_RANKS)
    names, pattern = llama3_specials()
    enc = tiktoken.Encoding(name="llama3", pat_str=pattern, mergeable_ranks=ranks,
                            special_tokens={n: len(ranks) + i for i, n in enumerate(names)})
    hf = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    bad = []
    for t in texts:
        want, got = enc.encode(t, allowed_special="all"), hf.encode(t, add_special_tokens=False).ids
        if want != got:
            bad.append((t, want, got))
        elif enc.decode(want) != hf.decode(got, skip_special_tokens=False):
            bad.append((t, enc.decode(want), hf.decode(got, skip_special_tokens=False)))
    return bad, len(texts)


def compare(out, texts_path):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from hf_families import hf_results
    from tokenizers import Tokenizer
    texts = json.load(open(texts_path, encoding="utf-8"))
    rng = random.Random(20261124)
    result = {}
    for name, check in (("llama2", check_llama2), ("llama3", check_llama3)):
        folder = os.path.join(out, name)
        raw, config = write(name, folder)
        bad, checked = check(folder, texts)
        for t, want, got in bad[:10]:
            print(f"{name}: {t!r}: original {want}, converted {got}", file=sys.stderr)
        if bad:
            sys.exit(f"real_tokenizers.py: the converted {name} tokenizer.json differs from the original on {len(bad)} texts")
        print(f"{name}: the converted tokenizer.json encodes and decodes {checked} texts as the original does", file=sys.stderr)
        result[name] = hf_results(Tokenizer.from_str(raw), config, texts, rng)
    json.dump(result, sys.stdout, ensure_ascii=False)


def main():
    args = sys.argv[1:]
    if len(args) == 3 and args[0] == "convert" and args[1] in CONVERTERS:
        write(args[1], args[2])
    elif len(args) == 3 and args[0] == "compare":
        compare(args[1], args[2])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
