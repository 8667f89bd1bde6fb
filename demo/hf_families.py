"""Build small tokenizers in the configurations the LLaMA family ships, and record what
Hugging Face `tokenizers` makes of a list of texts with each (run by hf_families_test.go):

    python3 demo/hf_families.py OUT TEXTS.json CORPUS.txt > result.json

Each tokenizer is trained on CORPUS.txt with `tokenizers` and then given the exact
pipeline of a real checkpoint's tokenizer.json (normalizer, pre-tokenizer, decoder,
post-processor, added tokens), so that its files exercise the same code paths as the real
ones without shipping their vocabularies:

- sp-llama2: SentencePiece-style BPE with byte fallback (<0x00>..<0xFF> in the vocab), the
  Prepend("▁") + Replace(" ", "▁") normalizer, no pre-tokenizer, the Replace/ByteFallback/
  Fuse/Strip decoder, "<s> $A" post-processing (Llama 2, TinyLlama, Mistral v0.1);
- sp-metaspace: the same vocabulary with the Metaspace pre-tokenizer and decoder
  (prepend_scheme "first"), as later Mistral files have it, and add_bos_token in
  tokenizer_config.json instead of a template;
- llama3: byte-level BPE with ignore_merges, Llama 3's Split regex, and
  "<|begin_of_text|> $A" post-processing;
- qwen2: NFC normalizer, Qwen2's Split regex, no BOS, ChatML specials and a non-special
  added token with lstrip/rstrip;
- o200k: byte-level BPE with tiktoken's o200k split regex, the encoding Phi-4-mini's 200k
  vocabulary extends (letters split by case, combining marks kept with their letters,
  contraction suffixes on words), and Phi-4-mini's chat markers;
- smollm: Digits(individual_digits) + GPT-2's ByteLevel regex.

Writes OUT/<name>/tokenizer.json (and tokenizer_config.json) and prints, per tokenizer,
the ids of each text without and with special tokens, and the decodes (special tokens kept
and skipped) of those ids and of random id lists.
"""
import json
import os
import random
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# tiktoken's o200k split (Phi-4-mini's vocabulary extends o200k): letters split by case,
# marks kept with their letters, a contraction suffix on the word, slashes after punctuation.
O200K_SPLIT = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])


def sentencepiece_style(corpus):
    """A Llama-2-format BPE: <unk> <s> </s>, the 256 byte tokens, then trained pieces."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer = trainers.BpeTrainer(vocab_size=1200, limit_alphabet=120, show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    added = [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for c, i in (("<unk>", 0), ("<s>", 1), ("</s>", 2))]
    return vocab, trained["merges"], added


def sp_llama2(corpus):
    vocab, merges, added = sentencepiece_style(corpus)
    doc = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>"}
    return doc, config


def sp_metaspace(corpus):
    doc, _ = sp_llama2(corpus)
    meta = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": False}
    doc["normalizer"] = None
    doc["pre_tokenizer"] = meta
    doc["decoder"] = meta
    doc["post_processor"] = None
    config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>"}
    return doc, config


def byte_level(corpus, pre, normalizer=None, vocab_size=1500):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def specials(tok, names, special=True, **flags):
    base = tok.get_vocab_size()
    doc = json.loads(tok.to_str())
    for i, name in enumerate(names):
        entry = {"id": base + i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                 "normalized": False, "special": special}
        entry.update(flags)
        doc["added_tokens"].append(entry)
    return doc


def llama3(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok = byte_level(corpus, pre)
    doc = specials(tok, ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"])
    doc["model"]["ignore_merges"] = True
    bos = doc["added_tokens"][0]["id"]
    doc["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                  {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [bos], "tokens": ["<|begin_of_text|>"]}}}]}
    return doc, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}


def qwen2(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = byte_level(corpus, pre, normalizers.NFC())
    doc = specials(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    base = doc["added_tokens"][-1]["id"] + 1
    doc["added_tokens"].append({"id": base, "content": "<tool_call>", "single_word": False, "lstrip": True,
                                "rstrip": True, "normalized": False, "special": False})
    doc["added_tokens"].append({"id": base + 1, "content": "[word]", "single_word": True, "lstrip": False,
                                "rstrip": False, "normalized": False, "special": False})
    doc["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return doc, {"add_bos_token": False, "bos_token": None, "eos_token": "<|im_end|>"}


def o200k(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(O200K_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok = byte_level(corpus, pre)
    doc = specials(tok, ["<|endoftext|>", "<|system|>", "<|end|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|/tool|>"])
    doc["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return doc, {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>", "add_bos_token": False}


def smollm(corpus):
    pre = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)])
    tok = byte_level(corpus, pre)
    doc = specials(tok, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return doc, {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}


FAMILIES = {"sp-llama2": sp_llama2, "sp-metaspace": sp_metaspace, "llama3": llama3, "qwen2": qwen2, "o200k": o200k,
            "smollm": smollm}


def hf_results(tok, config, texts, rng):
    """What Hugging Face tokenizers makes of texts with tok (and its tokenizer_config.json,
    config): each text's ids without and with special tokens, the ids a prompt gets, and
    the decodes (special tokens kept and skipped) of those ids and of random id lists."""
    size = tok.get_vocab_size(with_added_tokens=True)
    plain = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    with_special = [tok.encode(t, add_special_tokens=True).ids for t in texts]
    # Random id lists: byte tokens and pieces in any order, specials among them.
    random_ids = [[rng.randrange(size) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    random_ids += [[rng.randrange(3, 259) for _ in range(rng.randrange(1, 6))] for _ in range(100)]
    lists = with_special + random_ids
    # What a prompt gets: tokenizer_config.json's add_bos_token/add_eos_token where it
    # has them (transformers' Llama tokenizers), else the post-processor; a prompt
    # that already starts with the BOS token gets no second one (gollm's rule, for
    # chat templates that write it).
    prompt = []
    for ids, full in zip(plain, with_special):
        if "add_bos_token" in config or "add_eos_token" in config:
            bos = [tok.token_to_id(token_name(config["bos_token"]))] if config.get("add_bos_token") else []
            eos = [tok.token_to_id(token_name(config["eos_token"]))] if config.get("add_eos_token") else []
        else:
            at = next((i for i in range(len(full) - len(ids) + 1) if full[i:i + len(ids)] == ids), 0)
            bos, eos = full[:at], full[at + len(ids):]
        if bos and ids[:len(bos)] == bos:
            bos = []
        prompt.append(bos + ids + eos)
    return {
        "plain": plain,
        "prompt": prompt,
        "decode_lists": lists,
        "decode_keep": [tok.decode(ids, skip_special_tokens=False) for ids in lists],
        "decode_skip": [tok.decode(ids, skip_special_tokens=True) for ids in lists],
    }


def token_name(token):
    """A tokenizer_config.json token: a string, or an AddedToken object with content."""
    return token["content"] if isinstance(token, dict) else token


def main():
    out, texts_path, corpus_path = sys.argv[1:4]
    texts = json.load(open(texts_path, encoding="utf-8"))
    corpus = [line for line in open(corpus_path, encoding="utf-8").read().split("\n") if line] + texts
    rng = random.Random(20261123)
    result = {}
    for name, build in FAMILIES.items():
        doc, config = build(corpus)
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        raw = json.dumps(doc, ensure_ascii=False)
        with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
            f.write(raw)
        with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f)
        result[name] = hf_results(Tokenizer.from_str(raw), config, texts, rng)
    json.dump(result, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
