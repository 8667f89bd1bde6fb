"""FP8 on the GPU against transformers on the same FP8 checkpoint (issue 34).

    python3 tests/gpu/fp8_check.py --bin gollm-gpucheck --lib libgollm_cuda.so --json OUT.json

Writes a fine-grained FP8 checkpoint (LLaMA, hidden 1024, 4 layers, 16 heads of 64, 4 KV
heads, FFN 2816, vocab 32000; random weights spread as check.py's, every projection
quantized by transformers' own Fp8Quantize in 128×128 blocks, the rest bfloat16), runs
gollm-gpucheck on it in float16 (8 prompts of 1 to 200 tokens, each alone, 16 greedy
steps each: the FP8 projections kept in FP8; prompts of more than 8 rows on cuBLASLt's
W8A8 GEMMs, which round the projections' inputs to e4m3 a row at a time in groups of 128
columns, scale amax / 448; prompts of up to 8 rows and decode steps on fp8.cuh's
weight-only kernels), and compares the logits with transformers on the same checkpoint
fed gollm's tokens:
  ref  transformers dequantized to float32 (the checkpoint's exact weights), the inputs of
       its q/k/v/o/gate/up/down projections rounded as gollm rounds them, at the prompt's
       positions where gollm's prompt step takes W8A8 (the rounding is a row's own, so one
       forward over prompt and generated tokens gives what gollm's steps give);
  deq  the same without the rounding: eq, a row's distance between ref and deq, is what
       the rounding itself moves it;
       gollm is judged as bridge/cuda's w8a8Rows judges the GPU against the CPU engine: the
       two cannot round alike (their activations differ by the compute type before each
       rounding, which moves some elements across an e4m3 boundary, and after a layer or
       two the roundings are all but independent), so each row's relative L2 from ref must
       stay within 2e-2 + 3 × the larger of its eq and eq's rms, the rms over the rows
       within 2e-2 + 1.5 × eq's rms (rows without W8A8 anywhere before them have eq 0: 2e-2,
       the weight-only bar); gollm's greedy tokens must be ref's argmax wherever ref's
       top-2 gap exceeds 1e-2 + 2 × the largest logit move of the row's rounding
       (|ref − deq|);
  fp8  transformers' own FP8 path on this GPU (FP8Linear: activations quantized per
       128-block, W8A8), reported beside where its kernels load, with its own distance
       from ref.
Prints PASS/FAIL lines and a JSON row per comparison into --json.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, FineGrainedFP8Config, LlamaConfig, LlamaForCausalLM
try:
    from transformers.integrations.finegrained_fp8 import Fp8Quantize
except ImportError:  # an older transformers: the same 128×128 block quantization by hand
    Fp8Quantize = None

STEPS = 16
LENGTHS = [1, 7, 16, 33, 64, 100, 128, 200]
# cuda/fp8.cuh's kFp8GemvRows: steps of more rows take the W8A8 GEMMs.
FP8_GEMV_ROWS = 8
PROJS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def make_checkpoint(d):
    if os.path.exists(os.path.join(d, "model.safetensors")):
        return
    torch.manual_seed(34)
    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                      num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=2048,
                      rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, 0.1)
        model.get_output_embeddings().weight.normal_(0.0, 0.1)
    qc = FineGrainedFP8Config(weight_block_size=(128, 128), activation_scheme="dynamic",
                              modules_to_not_convert=["lm_head"])

    class Holder:
        quantization_config = qc

    op = Fp8Quantize(Holder()) if Fp8Quantize else None
    if op is None:
        print("note: this transformers has no Fp8Quantize; quantizing its way by hand")
    sd = {}
    for k, v in model.state_dict().items():
        if k.endswith("_proj.weight"):
            sd.update(op._quantize_one(k, v.detach().clone()) if op else quantize_blocks(k, v.detach().float()))
        else:
            sd[k] = v.to(torch.bfloat16)
    os.makedirs(d, exist_ok=True)
    model.config.dtype = torch.bfloat16
    model.config.quantization_config = qc
    model.config.save_pretrained(d)
    save_file({k: v.contiguous() for k, v in sd.items()}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})


def quantize_blocks(k, w):
    """transformers' Fp8Quantize: one scale a 128×128 block, its largest magnitude over 448."""
    r, c = w.shape
    b = w.reshape(r // 128, 128, c // 128, 128)
    amax = b.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    q = (b / scale[:, None, :, None]).clamp(-448, 448).to(torch.float8_e4m3fn).reshape(r, c)
    return {k: q, k[:-len("weight")] + "weight_scale_inv": scale.float()}


def quant_rows(x):
    """gollm's W8A8 input rounding (fp8_quant_rows_kernel, the CPU engine's quantFP8Row):
    each row in groups of 128 columns, x · (448 / amax) to the nearest e4m3 (saturating),
    times amax / 448."""
    shape = x.shape
    g = x.float().reshape(*shape[:-1], shape[-1] // 128, 128)
    amax = g.abs().amax(dim=-1, keepdim=True)
    safe = torch.where(amax > 0, amax, torch.ones_like(amax))
    q = (g * (448.0 / safe)).clamp(-448, 448).to(torch.float8_e4m3fn).float() * (safe / 448.0)
    return torch.where(amax > 0, q, g).reshape(shape).to(x.dtype)


class W8A8Inputs:
    """Forward pre-hooks on the projections: the inputs at positions [0, rows) rounded as
    gollm's W8A8 GEMMs round them (rows: the prompt's length where its step takes them,
    else 0)."""

    def __init__(self, model):
        self.rows = 0
        self.handles = [m.register_forward_pre_hook(self.hook) for n, m in model.named_modules()
                        if n.rsplit(".", 1)[-1] in PROJS]
        if not self.handles:
            raise RuntimeError("no projection modules to hook")

    def hook(self, _mod, args):
        if self.rows == 0:
            return None
        x = args[0].clone()
        x[:, :self.rows] = quant_rows(x[:, :self.rows])
        return (x,) + tuple(args[1:])


def logits(model, prompts, gen, w8a8=None):
    out = []
    with torch.no_grad():
        for p, g in zip(prompts, gen):
            if w8a8 is not None:
                w8a8.rows = len(p) if len(p) > FP8_GEMV_ROWS else 0
            ids = torch.tensor([p + g[:STEPS]], device="cuda")
            out.append(model(ids).logits[0].float().cpu())
    return out


def rel_rows(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm(dim=-1) / b.norm(dim=-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--lib", default="")
    ap.add_argument("--work", default="/tmp/gollm-fp8check")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    ckpt = os.path.join(args.work, "llama-fp8-1024")
    t0 = time.time()
    make_checkpoint(ckpt)
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 32000, (n,), generator=g).tolist() for n in LENGTHS]
    pfile = os.path.join(args.work, "prompts.json")
    with open(pfile, "w") as f:
        json.dump({"prompts": prompts}, f)
    out = os.path.join(args.work, "gollm.safetensors")
    cmd = [args.bin, "-ckpt", ckpt, "-dtype", "float16", "-prompts", pfile, "-out", out, "-steps", str(STEPS),
           "-logit-prompts", str(len(prompts))]
    if args.lib:
        cmd += ["-lib", args.lib]
    res = subprocess.run(cmd, capture_output=True, text=True)
    print(res.stdout[-2000:], res.stderr[-3000:], flush=True)
    if res.returncode != 0:
        print("FAIL gollm-gpucheck on the FP8 checkpoint")
        sys.exit(1)
    # The arena: embeddings and LM head 131 MB in fp16, the projections 45 MB in FP8
    # (+1.4 MB of scales) where fp16 would take 90 MB.
    mb = re.search(r"weights ([0-9.]+) MB", res.stdout)
    in_fp8 = mb is not None and float(mb.group(1)) < 200
    print(f"{'PASS' if in_fp8 else 'FAIL'} the FP8 projections stay in FP8 on the GPU "
          f"(arena {mb.group(1) if mb else '?'} MB; fp16 would be 221 MB, FP8 177 MB)")
    gout = load_file(out)
    gen = gout["single.tokens"].long().tolist()
    torch.backends.cuda.matmul.allow_tf32 = False
    ref_model = AutoModelForCausalLM.from_pretrained(
        ckpt, dtype=torch.float32, attn_implementation="eager",
        quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128), dequantize=True,
                                                 modules_to_not_convert=["lm_head"])).cuda().eval()
    deq = logits(ref_model, prompts, gen)
    ref = logits(ref_model, prompts, gen, W8A8Inputs(ref_model))
    del ref_model
    torch.cuda.empty_cache()
    fp8, fp8_err = None, ""
    try:
        m = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, device_map="cuda").eval()
        kinds = {type(mod).__name__ for mod in m.modules()}
        print("transformers' FP8 model holds", sorted(k for k in kinds if "8" in k or "FP" in k))
        fp8 = logits(m, prompts, gen)
        del m
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 — reported, not fatal: the check is gollm's
        fp8_err = f"{type(e).__name__}: {e}"[:300]
    worst = {"prompt": 0.0, "decode": 0.0}
    worst_deq = {"prompt": 0.0, "decode": 0.0}
    es, eqs = [], []  # every row's distance from ref, and its eq
    worst_fp8 = {"prompt": 0.0, "decode": 0.0}
    hf8 = 0.0
    agree = total = 0
    for i, p in enumerate(prompts):
        P = len(p)
        r = ref[i]
        ep = rel_rows(gout[f"single.prompt_logits.{i}"], r[:P])
        ed = rel_rows(gout[f"single.decode_logits.{i}"], r[P:P + STEPS])
        worst["prompt"] = max(worst["prompt"], float(ep.max()))
        worst["decode"] = max(worst["decode"], float(ed.max()))
        es.append(torch.cat([ep, ed]))
        d = deq[i]
        eqs.append(rel_rows(r[:P + STEPS], d[:P + STEPS]))
        worst_deq["prompt"] = max(worst_deq["prompt"], float(rel_rows(gout[f"single.prompt_logits.{i}"], d[:P]).max()))
        worst_deq["decode"] = max(worst_deq["decode"], float(rel_rows(gout[f"single.decode_logits.{i}"], d[P:P + STEPS]).max()))
        if fp8 is not None:
            f = fp8[i]
            worst_fp8["prompt"] = max(worst_fp8["prompt"], float(rel_rows(gout[f"single.prompt_logits.{i}"], f[:P]).max()))
            worst_fp8["decode"] = max(worst_fp8["decode"], float(rel_rows(gout[f"single.decode_logits.{i}"], f[P:P + STEPS]).max()))
            hf8 = max(hf8, float(rel_rows(f, r).max()))
        # gollm's k-th token is the argmax of the row before it.
        for k in range(STEPS):
            row = r[P - 1 + k]
            top = row.topk(2)
            moved = float((row - d[P - 1 + k]).abs().max())
            if float(top.values[0] - top.values[1]) > 1e-2 + 2 * moved:
                total += 1
                agree += int(int(top.indices[0]) == gen[i][k])
    tol = 2e-2
    e, eq = torch.cat(es), torch.cat(eqs)
    rms, rmsq = float(e.pow(2).mean().sqrt()), float(eq.pow(2).mean().sqrt())
    lim = tol + 3 * torch.maximum(eq, torch.full_like(eq, rmsq))
    over = int((e > lim).sum())
    ok = rms <= tol + 1.5 * rmsq and over == 0 and agree == total and in_fp8
    rows = [{"check": "fp8 gollm vs transformers fp32-dequantized, W8A8 inputs rounded alike",
             "prompt_relL2_max": round(worst["prompt"], 5), "decode_relL2_max": round(worst["decode"], 5),
             "relL2_rms": round(rms, 5), "rounding_relL2_rms": round(rmsq, 5), "rows_over_bar": over,
             "rows": int(e.numel()), "tokens_agree": f"{agree}/{total}", "tol": tol, "pass": ok},
            {"check": "fp8 gollm vs transformers fp32-dequantized, inputs unrounded",
             "prompt_relL2_max": round(worst_deq["prompt"], 5), "decode_relL2_max": round(worst_deq["decode"], 5)}]
    print(f"{'PASS' if ok else 'FAIL'} FP8 checkpoint: gollm vs transformers (fp32, dequantized, the W8A8 "
          f"prompts' inputs rounded as gollm's) relL2 rms {rms:.2e} over {e.numel()} rows (bar {tol} + 1.5 × the "
          f"rounding's own rms {rmsq:.2e}), worst prompt {worst['prompt']:.2e}, decode {worst['decode']:.2e}, "
          f"{over} rows over their bar (2e-2 + 3 × max(own rounding, its rms)); greedy tokens agree "
          f"{agree}/{total} where the top-2 gap exceeds 1e-2 + 2 × the rounding's move")
    print(f"INFO without that rounding (what W8A8 itself moves): prompt relL2 {worst_deq['prompt']:.2e}, "
          f"decode {worst_deq['decode']:.2e}")
    if fp8 is not None:
        rows.append({"check": "fp8 gollm vs transformers' own FP8 (W8A8)",
                     "prompt_relL2_max": round(worst_fp8["prompt"], 5),
                     "decode_relL2_max": round(worst_fp8["decode"], 5),
                     "transformers_fp8_vs_fp32_relL2_max": round(hf8, 5)})
        print(f"INFO transformers' own FP8 path: gollm differs by {worst_fp8['prompt']:.2e} (prompt), "
              f"{worst_fp8['decode']:.2e} (decode); transformers FP8 itself differs from fp32 by {hf8:.2e}")
    else:
        print(f"INFO transformers' own FP8 path did not run here: {fp8_err}")
    print(f"fp8_check.py: {time.time() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
