"""Write the tiny FP8 fixture checkpoints with the formats' own tools, and their golden
logits from transformers loading them back (dequantized, float32, on the CPU).

    python3 testdata/make_fp8_fixtures.py testdata

Needs torch, transformers (5.x) and compressed-tensors. One trained-looking LLaMA
(hidden 256, 4 heads of 64, 2 KV heads, FFN 384, 2 layers, vocab 1000; every projection
a multiple of 128 on both sides, so that 128×128 blocks tile it) is written twice:

  llama-fp8-tiny    transformers' fine-grained FP8: FineGrainedFP8Config (128×128 blocks,
                    dynamic activations, lm_head kept), each projection quantized by
                    transformers' own Fp8Quantize op: F8_E4M3 weights beside float32
                    weight_scale_inv [out/128][in/128]
  llama-fp8ct-tiny  compressed-tensors float-quantized: per-channel FP8 weights
                    (weight_scale [out][1]), dynamic per-token activations, lm_head
                    ignored; the scales from compressed-tensors' calculate_qparams and the
                    file from its ModelCompressor
  llama-fp8kv-tiny  the same, with an FP8 KV cache scheme (kv_cache_scheme: float8, one
                    static scale per tensor): each attention module's k_scale and v_scale
                    (compressed-tensors' KVCacheScaleType names), calibrated as a static
                    min-max observer would on the prompt: the largest key or value cached
                    over 448. compressed-tensors 0.20 cannot hook transformers 5's attention
                    (its forward takes `cache`, not `past_key_values`), so the scales are
                    measured here and stored under the names the library gives them

The unquantized tensors are bfloat16, as released FP8 checkpoints keep them. Golden files
as make_llama_fixtures.py writes them (prompt ids and logits, 16 greedy tokens and their
decode logits), from transformers' own load of each folder.
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
import transformers
from transformers import AutoModelForCausalLM, CompressedTensorsConfig, FineGrainedFP8Config, LlamaConfig, LlamaForCausalLM
from transformers.integrations.finegrained_fp8 import Fp8Quantize

from compressed_tensors.compressors import ModelCompressor
from compressed_tensors.quantization import (KVCacheScaleType, QuantizationArgs, QuantizationConfig,
                                             QuantizationScheme, apply_quantization_config)
from compressed_tensors.quantization.utils import calculate_qparams

out = sys.argv[1] if len(sys.argv) > 1 else "testdata"
prompt = torch.tensor([[17, 401, 3, 998, 250, 250, 12, 77, 640, 5, 31, 900]])


def base_model():
    torch.manual_seed(20261127)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=384, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=128,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
                      pad_token_id=None)
    cfg._attn_implementation = "eager"
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in pname or "lm_head" in pname:
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.copy_(p.shape[-1] ** -0.5 * torch.randn_like(p))
    return model


def is_proj(name):
    return name.endswith("_proj.weight")


def bf16_rest(sd):
    return {k: (v if v.dtype == torch.float8_e4m3fn or v.dtype == torch.float32 and k.endswith(("_scale", "_scale_inv"))
                else v.to(torch.bfloat16)).contiguous() for k, v in sd.items()}


def write_fine_grained(name):
    model = base_model()
    qc = FineGrainedFP8Config(weight_block_size=(128, 128), activation_scheme="dynamic",
                              modules_to_not_convert=["lm_head"])

    class Holder:
        quantization_config = qc

    op = Fp8Quantize(Holder())
    sd = {}
    for k, v in model.state_dict().items():
        sd.update(op._quantize_one(k, v.detach().clone()) if is_proj(k) else {k: v})
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.config.dtype = torch.bfloat16
    model.config.quantization_config = qc
    model.config.save_pretrained(d)
    save_file(bf16_rest(sd), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d


def kv_scales(model):
    """Per layer, the largest cached key and value of the prompt over e4m3's 448."""
    with torch.no_grad():
        cache = model(prompt, use_cache=True).past_key_values
    return [(float(layer.keys.abs().amax()) / 448, float(layer.values.abs().amax()) / 448) for layer in cache.layers]


def write_compressed_tensors(name, kv_cache=False):
    model = base_model()
    scales = kv_scales(model) if kv_cache else None
    weights = QuantizationArgs(num_bits=8, type="float", strategy="channel", symmetric=True, dynamic=False)
    acts = QuantizationArgs(num_bits=8, type="float", strategy="token", symmetric=True, dynamic=True)
    kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=False) if kv_cache else None
    qcfg = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=weights,
                                                                           input_activations=acts)},
                              ignore=["lm_head"], kv_cache_scheme=kv)
    apply_quantization_config(model, qcfg)
    with torch.no_grad():
        for mname, m in model.named_modules():
            if hasattr(m, "weight_scale"):
                w = m.weight.float()
                scale, _ = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), weights)
                m.weight_scale.data = scale.to(torch.float32)
    comp = ModelCompressor.from_pretrained_model(model, quantization_format="float-quantized")
    comp.compress_model(model)
    sd = {k: v for k, v in model.state_dict().items() if not k.endswith("zero_point")}
    for i, (ks, vs) in enumerate(scales or []):
        for kind, s in ((KVCacheScaleType.KEY, ks), (KVCacheScaleType.VALUE, vs)):
            sd["model.layers.%d.self_attn.%s" % (i, kind.value)] = torch.tensor([s], dtype=torch.float32)
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.config.dtype = torch.bfloat16
    model.config.save_pretrained(d)
    with open(os.path.join(d, "config.json")) as f:
        c = json.load(f)
    c.pop("quantization_config", None)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(c, f, indent=2, sort_keys=True)
    comp.update_config(d)
    if kv is not None:
        # The compressor reads the scheme off hooked attention modules, which there are
        # none of here (the docstring says why): the config's kv_cache_scheme is the one
        # applied, as the library serializes it.
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        c["quantization_config"]["kv_cache_scheme"] = kv.model_dump()
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2, sort_keys=True)
    save_file(bf16_rest(sd), os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d


def golden(name, d):
    # compressed-tensors' checkpoints stay compressed in transformers unless asked.
    kw = {"quantization_config": CompressedTensorsConfig(run_compressed=False)} if "fp8ct" in name or "fp8kv" in name else {}
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, **kw).eval()
    model.config._attn_implementation = "eager"
    for pname, p in model.named_parameters():
        assert p.dtype == torch.float32, (name, pname, p.dtype)
    with torch.no_grad():
        o = model(prompt, use_cache=True)
        prompt_logits = o.logits[0].clone()
        past = o.past_key_values
        tok = int(prompt_logits[-1].argmax())
        toks, steps = [], []
        for _ in range(16):
            toks.append(tok)
            o = model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
            past = o.past_key_values
            steps.append(o.logits[0, -1].clone())
            tok = int(o.logits[0, -1].argmax())
    save_file({
        "prompt_ids": prompt[0].to(torch.int32).contiguous(),
        "prompt_logits": prompt_logits.float().contiguous(),
        "greedy_tokens": torch.tensor(toks, dtype=torch.int32),
        "decode_logits": torch.stack(steps).float().contiguous(),
    }, os.path.join(out, name + "-golden.safetensors"),
        metadata={"transformers": transformers.__version__, "torch": torch.__version__})
    gaps = [float(s.topk(2).values[0] - s.topk(2).values[1]) for s in steps]
    print(name, "greedy", toks, "top2 gap min %.3f" % min(gaps))


for name, write in (("llama-fp8-tiny", write_fine_grained), ("llama-fp8ct-tiny", write_compressed_tensors),
                    ("llama-fp8kv-tiny", lambda n: write_compressed_tensors(n, kv_cache=True))):
    golden(name, write(name))
