"""`poot info MODEL`: architecture, tensors by storage format, memory."""
from __future__ import annotations

from collections import Counter


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("info", help="architecture, tensors by format and memory of a model")
    p.add_argument("model", help=MODEL_HELP)


def run(args) -> int:
    from poot.models.loader import open_model

    ckpt, config = open_model(args.model)
    by_format: Counter = Counter()
    nbytes: Counter = Counter()
    for info in ckpt.tensors.values():
        key = info.packed.format if info.packed is not None else str(info.dtype)
        by_format[key] += 1
        nbytes[key] += info.nbytes
    print(f"model        {ckpt.path}")
    print(f"checkpoint   {ckpt.kind}, {len(ckpt.tensors)} tensors")
    c = config
    print(f"architecture {c.arch}: {c.layers} layers, dim {c.dim}, heads {c.heads} "
          f"(kv {c.kv_heads}), head dim {c.head_dim}, ffn {c.ffn}, vocab {c.vocab}")
    print(f"rope         base {c.rope_base:g}, dims {c.rot}, scaling {c.rope_scaling}, "
          f"rows {c.rope_layout}; norm eps {c.norm_eps:g}; tied head {c.tied}; "
          f"q/k/v bias {c.qkv_bias}; context {c.max_seq}")
    print(f"block        {c.act} FFN; q/k norm {c.qk_norm}; norms per layer "
          f"{4 if c.sandwich_norms else 2}; embedding scale {c.embed_scale:g}")
    if c.mla is not None:
        from poot.models.deepseek import describe

        print("\n".join(describe(c)))
    elif c.experts:
        print(f"experts      {c.experts} of hidden size {c.expert_ffn}, top {c.experts_used} per "
              f"token ({'renormalized' if c.norm_topk else 'softmax over all'})"
              + (f", shared expert {c.shared_ffn} under a sigmoid gate" if c.shared_ffn else "")
              + (f"; biases, SwiGLU clamped at {c.swiglu_limit:g} (alpha {c.swiglu_alpha:g})"
                 if c.swiglu_limit is not None else ""))
    if c.attn_sinks:
        print(f"sinks        a learned logit per head in each softmax; o bias {c.out_bias}")
    if c.window:
        slide = [i for i in range(c.layers) if c.is_sliding(i)]
        local = f", RoPE base {c.rope_base_local:g}" if c.rope_base_local else ""
        print(f"attention    sliding window {c.window} on {len(slide)} of {c.layers} layers"
              f"{local}; global layers {[i for i in range(c.layers) if i not in slide]}")
    print("tensors by storage format:")
    for key, n in by_format.most_common():
        print(f"  {key:16s} {n:5d} tensors {nbytes[key] / 2**20:10.1f} MiB")
    print(f"weights total {sum(nbytes.values()) / 2**20:.1f} MiB (kept packed, memory-mapped)")
    return 0
