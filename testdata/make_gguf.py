"""Write GGUF files from the project's own checkpoints with llama.cpp's `gguf` package, as
its convert_hf_to_gguf.py lays them out for the LLaMA family, for the tests:

    python3 testdata/make_gguf.py model SRC OUT TYPE... [--no-ref]
    python3 testdata/make_gguf.py spm TOKENIZER.model TOKENIZER_CONFIG.json OUT.gguf
    python3 testdata/make_gguf.py bpe TOKENIZER.json TOKENIZER_CONFIG.json PRE OUT.gguf

`model` converts the Hugging Face LLaMA checkpoint SRC (config.json, model.safetensors in
F32/F16/BF16, tokenizer.json — byte-level BPE, or SentencePiece-style BPE with byte
fallback — and tokenizer_config.json) into OUT/TYPE.gguf
for each TYPE of F32, F16, BF16, Q8_0 and Q4_K_M, and writes beside each the same weights
in safetensors form, OUT/TYPE-ref/: every tensor as the GGUF holds it, dequantized by
gguf's own code (llama.cpp's reference), un-permuted and renamed back, in float32. Q8_0 is
gguf's own quantizer; Q4_K and Q6_K, which gguf reads but does not write, are quantized
here (a plain min/max fit: the tests check the reading, not the quantizer). Q4_K_M
follows llama.cpp's mixture: Q4_K matrices, Q6_K for the embedding/LM head and, in
alternate layers, the value and MLP-down projections. --no-ref skips the safetensors
forms (bench/llamacpp.sh, whose models are large).

`spm` and `bpe` write tokenizer-only files (no tensors): a SentencePiece model's pieces,
scores and types as convert_hf_to_gguf.py's _set_vocab_sentencepiece reads them, or a
byte-level BPE tokenizer.json's tokens and merges with tokenizer.ggml.pre PRE; with the
chat template, special tokens and add_bos/add_eos of TOKENIZER_CONFIG.json.
"""
import json
import os
import struct
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as T


class Safetensors:
    """A safetensors file, memory-mapped; get() reads one tensor as float32."""

    def __init__(self, path):
        with open(path, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            self.header = {k: v for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
        self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
        self.path = path

    def names(self):
        return sorted(self.header)

    def shape(self, name):
        return tuple(self.header[name]["shape"])

    def get(self, name):
        info = self.header[name]
        b, e = info["data_offsets"]
        raw = self.data[b:e]
        if info["dtype"] == "F32":
            a = raw.view("<f4")
        elif info["dtype"] == "F16":
            a = raw.view("<f2").astype(np.float32)
        elif info["dtype"] == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{self.path}: tensor {name}: dtype {info['dtype']}")
        return a.reshape(info["shape"]).astype(np.float32)


def write_safetensors(path, tensors):
    """Float32 tensors (name → array) into a safetensors file."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
        blobs.append(a.tobytes())
    js = json.dumps(header).encode()
    js += b" " * (-len(js) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(js)))
        f.write(js)
        for b in blobs:
            f.write(b)


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows in rotary pairs."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute(w, heads):
    """The inverse of permute."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def bf16(a):
    """float32 → bfloat16 bits, rounding to nearest even."""
    u = a.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def q4_k(x):
    """Q4_K super-blocks of a [rows][cols] matrix (cols a multiple of 256), as uint8 rows."""
    rows, cols = x.shape
    b = x.reshape(-1, 8, 32).astype(np.float32)
    lo = np.minimum(b.min(axis=2), 0)
    scale = (b.max(axis=2) - lo) / 15
    mins = -lo
    d = scale.max(axis=1) / 63
    dmin = mins.max(axis=1) / 63
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] > 0, np.clip(np.round(scale / d[:, None]), 0, 63), 0).astype(np.uint8)
        m = np.where(dmin[:, None] > 0, np.clip(np.round(mins / dmin[:, None]), 0, 63), 0).astype(np.uint8)
    d16, dmin16 = d.astype(np.float16), dmin.astype(np.float16)
    ds = d16.astype(np.float32)[:, None] * sc
    dm = dmin16.astype(np.float32)[:, None] * m
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(ds[..., None] > 0, np.clip(np.round((b + dm[..., None]) / ds[..., None]), 0, 15), 0).astype(np.uint8)
    s = np.zeros((b.shape[0], 12), dtype=np.uint8)
    s[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    s[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    s[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((m[:, 4:8] & 0x0F) << 4)
    qs = (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(-1, 128)
    blocks = np.concatenate([d16.view(np.uint8).reshape(-1, 2), dmin16.view(np.uint8).reshape(-1, 2), s, qs], axis=1)
    return blocks.reshape(rows, -1)


def q6_k(x):
    """Q6_K super-blocks of a [rows][cols] matrix (cols a multiple of 256), as uint8 rows."""
    rows, cols = x.shape
    b = x.reshape(-1, 16, 16).astype(np.float32)
    idx = np.abs(b).argmax(axis=2)
    vmax = np.take_along_axis(b, idx[..., None], axis=2)[..., 0]
    scale = vmax / -32
    smax = np.take_along_axis(scale, np.abs(scale).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = smax / -128
    with np.errstate(divide="ignore", invalid="ignore"):
        sc = np.where(d[:, None] != 0, np.clip(np.round(scale / d[:, None]), -128, 127), 0).astype(np.int8)
    d16 = d.astype(np.float16)
    st = d16.astype(np.float32)[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(st[..., None] != 0, np.clip(np.round(b / st[..., None]) + 32, 0, 63), 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # position 128c + 32s + l
    ql = np.zeros((q.shape[0], 2, 2, 32), dtype=np.uint8)
    ql |= q[:, :, 0:2, :] & 0x0F
    ql |= (q[:, :, 2:4, :] & 0x0F) << 4
    qh = np.zeros((q.shape[0], 2, 32), dtype=np.uint8)
    for s in range(4):
        qh |= (q[:, :, s, :] >> 4) << (2 * s)
    blocks = np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d16.view(np.uint8).reshape(-1, 2)], axis=1)
    return blocks.reshape(rows, -1)


def encode(name, a, qtype):
    """(data, raw_dtype, dequantized float32) of a tensor stored as qtype."""
    if a.ndim == 1 or qtype == T.F32:
        a = a.astype(np.float32)
        return a, None, a
    if qtype == T.F16:
        h = a.astype(np.float16)
        return h, None, h.astype(np.float32)
    if qtype == T.BF16:
        raw = bf16(a)
        return raw.view(np.uint8).reshape(a.shape[0], -1), T.BF16, (raw.astype(np.uint32) << 16).view(np.float32)
    if qtype == T.Q8_0:
        raw = gguf.quants.quantize(a.astype(np.float32), T.Q8_0)
    elif qtype == T.Q4_K:
        raw = q4_k(a)
    elif qtype == T.Q6_K:
        raw = q6_k(a)
    else:
        raise SystemExit(f"{name}: no encoder for {qtype.name}")
    return raw, qtype, gguf.quants.dequantize(raw, qtype).reshape(a.shape).astype(np.float32)


def mixture(kind, name, layer):
    """The GGML type of tensor name under a file type."""
    if kind != "Q4_K_M":
        return {"F32": T.F32, "F16": T.F16, "BF16": T.BF16, "Q8_0": T.Q8_0}[kind]
    if name in ("token_embd.weight", "output.weight"):
        return T.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and layer % 2 == 0:
        return T.Q6_K
    return T.Q4_K


def add_spm_tokenizer(w, tok, tcfg):
    """A SentencePiece-style tokenizer.json (BPE with byte fallback, Llama 2's layout) as
    tokenizer.ggml.* (model llama): the pieces by id; as scores, each piece made by a merge
    the merge's rank negated (llama.cpp merges the pair whose piece scores highest, which
    is the file's merge order), the others below every merge; the types by what each
    piece is."""
    vocab = dict(tok["model"]["vocab"])
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for s, i in vocab.items():
        tokens[i] = s
        if i in added:
            types[i] = gguf.TokenType.CONTROL if added[i].get("special") else gguf.TokenType.USER_DEFINED
        elif len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            types[i] = gguf.TokenType.BYTE
        else:
            types[i] = gguf.TokenType.NORMAL
    unk = tok["model"].get("unk_token")
    if unk in vocab:
        types[vocab[unk]] = gguf.TokenType.UNKNOWN
        w.add_unk_token_id(vocab[unk])
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    merges = [m.split(" ") if isinstance(m, str) else m for m in tok["model"]["merges"]]
    scores = [-float(len(merges) + i) for i in range(n)]
    for rank, (left, right) in enumerate(merges):
        piece = vocab.get(left + right)
        if piece is not None and scores[piece] < -rank:
            scores[piece] = -float(rank)
    w.add_token_scores(scores)
    w.add_token_types(types)
    add_specials(w, tcfg, vocab, tok)


def add_bpe_tokenizer(w, tok, tcfg, pre):
    """A byte-level BPE tokenizer.json as tokenizer.ggml.* (model gpt2)."""
    vocab = dict(tok["model"]["vocab"])
    added = {t["id"]: t for t in tok.get("added_tokens", [])}
    for t in added.values():
        vocab[t["content"]] = t["id"]
    n = max(vocab.values()) + 1
    tokens = [f"[PAD{i}]" for i in range(n)]
    types = [gguf.TokenType.UNUSED] * n
    for s, i in vocab.items():
        tokens[i] = s
        types[i] = gguf.TokenType.NORMAL
    for i, t in added.items():
        types[i] = gguf.TokenType.CONTROL if t.get("special") else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    add_specials(w, tcfg, vocab, tok)


def token_name(t):
    return t["content"] if isinstance(t, dict) else t


def template_adds(tok):
    """Whether tokenizer.json's post-processor puts a special token before and after a
    text (gguf's SpecialVocab reads add_bos/add_eos from it where tokenizer_config.json
    does not say)."""
    pp = (tok or {}).get("post_processor") or {}
    procs = pp.get("processors", [pp]) if pp.get("type") == "Sequence" else [pp]
    for p in procs:
        if p.get("type") == "TemplateProcessing":
            single = p.get("single", [])
            return bool(single) and "SpecialToken" in single[0], bool(single) and "SpecialToken" in single[-1]
    return False, False


def add_specials(w, tcfg, vocab, tok=None):
    """BOS/EOS ids, add_bos/add_eos and the chat template of a tokenizer_config.json."""
    if tcfg.get("bos_token") is not None:
        w.add_bos_token_id(vocab[token_name(tcfg["bos_token"])])
    if tcfg.get("eos_token") is not None:
        w.add_eos_token_id(vocab[token_name(tcfg["eos_token"])])
    bos, eos = template_adds(tok)
    w.add_add_bos_token(bool(tcfg.get("add_bos_token", bos)))
    w.add_add_eos_token(bool(tcfg.get("add_eos_token", eos)))
    if tcfg.get("chat_template"):
        w.add_chat_template(tcfg["chat_template"])


def convert(src, out, kinds):
    ref_too = "--no-ref" not in kinds
    kinds = [k for k in kinds if k != "--no-ref"]
    cfg = json.load(open(os.path.join(src, "config.json")))
    tok = json.load(open(os.path.join(src, "tokenizer.json")))
    tcfg = json.load(open(os.path.join(src, "tokenizer_config.json")))
    ts = Safetensors(os.path.join(src, "model.safetensors"))
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    per = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for l in range(cfg["num_hidden_layers"]):
        for hf, gg in per.items():
            names[f"model.layers.{l}.{hf}.weight"] = f"blk.{l}.{gg}.weight"
    os.makedirs(out, exist_ok=True)
    for kind in kinds:
        w = gguf.GGUFWriter(os.path.join(out, f"{kind}.gguf"), "llama")
        w.add_name(f"{os.path.basename(os.path.normpath(src))} {kind}")
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_embedding_length(cfg["hidden_size"])
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_head_count(heads)
        w.add_head_count_kv(kv)
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
        w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
        w.add_rope_freq_base(theta)
        w.add_rope_dimension_count(head_dim)
        w.add_vocab_size(cfg["vocab_size"])
        if tok["model"].get("byte_fallback"):
            add_spm_tokenizer(w, tok, tcfg)
        else:
            add_bpe_tokenizer(w, tok, tcfg, "gpt2")
        ref = {}
        for hf in ts.names():
            if hf not in names:
                raise SystemExit(f"{src}: no GGUF name for {hf}")
            gg = names[hf]
            a = ts.get(hf)
            if gg.endswith("attn_q.weight"):
                a = permute(a, heads)
            elif gg.endswith("attn_k.weight"):
                a = permute(a, kv)
            layer = int(gg.split(".")[1]) if gg.startswith("blk.") else 0
            data, raw, back = encode(gg, a, mixture(kind, gg, layer))
            if raw is None:
                w.add_tensor(gg, data)
            else:
                w.add_tensor(gg, data, raw_dtype=raw)
            if not ref_too:
                continue
            if gg.endswith("attn_q.weight"):
                back = unpermute(back, heads)
            elif gg.endswith("attn_k.weight"):
                back = unpermute(back, kv)
            ref[hf] = back.reshape(ts.shape(hf))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if not ref_too:
            continue
        rdir = os.path.join(out, f"{kind}-ref")
        os.makedirs(rdir, exist_ok=True)
        rcfg = dict(cfg)
        rcfg["dtype"] = "float32"
        rcfg.pop("torch_dtype", None)
        json.dump(rcfg, open(os.path.join(rdir, "config.json"), "w"))
        write_safetensors(os.path.join(rdir, "model.safetensors"), ref)
        for f in ("tokenizer.json", "tokenizer_config.json"):
            with open(os.path.join(src, f), "rb") as a, open(os.path.join(rdir, f), "wb") as b:
                b.write(a.read())


def spm(model_path, tcfg_path, out):
    """A SentencePiece model's vocabulary as convert_hf_to_gguf.py writes it."""
    from sentencepiece import SentencePieceProcessor
    sp = SentencePieceProcessor()
    sp.LoadFromFile(model_path)
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.IdToPiece(i))
        scores.append(sp.GetScore(i))
        if sp.IsUnknown(i):
            types.append(gguf.TokenType.UNKNOWN)
        elif sp.IsControl(i):
            types.append(gguf.TokenType.CONTROL)
        elif sp.IsUnused(i):
            types.append(gguf.TokenType.UNUSED)
        elif sp.IsByte(i):
            types.append(gguf.TokenType.BYTE)
        else:
            types.append(gguf.TokenType.NORMAL)
    tcfg = json.load(open(tcfg_path))
    w = gguf.GGUFWriter(out, "llama")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(sp.unk_id())
    add_specials(w, tcfg, {t: i for i, t in enumerate(tokens)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


def bpe(tok_path, tcfg_path, pre, out):
    tok = json.load(open(tok_path))
    tcfg = json.load(open(tcfg_path))
    w = gguf.GGUFWriter(out, "llama")
    add_bpe_tokenizer(w, tok, tcfg, pre)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "model":
        convert(args[0], args[1], args[2:])
    elif cmd == "spm":
        spm(*args)
    elif cmd == "bpe":
        bpe(*args)
    else:
        raise SystemExit(__doc__)
