"""A checkpoint (from any `poot_open_checkpoint` plugin) as the builder's WeightSource.

Tensor names are GGUF's; HF folders are mapped to them here. Dense tensors stay
as memory-mapped arrays; packed ones keep their sources and PackedWeight.
`RowLayout` reorders the q/k rows of a pair-ordered source (GGUF llama/mistral) into
rotate-half order once, so the traced step needs no permutation of activations, and
serves tensors stacked by rows (the q, k and v projections as one matrix).
"""
from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from poot.errors import CheckpointError, FormatError
from poot.formats import PackedWeight
from poot.ir.types import TensorType, WeightRef
from poot.models.families import FAMILIES, HF_FAMILIES, HF_TYPES
from poot.models.fused import GATE_UP, QKV, FusedParts, gguf_fused_name
from poot.models.gguf_meta import release_file_pages


@dataclass(frozen=True)
class DenseSpec:
    """A dense checkpoint tensor: its type and identity."""

    type: TensorType
    ref: WeightRef


@dataclass(frozen=True)
class PackedSpec:
    """A packed checkpoint tensor: its descriptor and the identity of each source."""

    weight: PackedWeight
    refs: tuple[WeightRef, ...]


class WeightSource(Protocol):
    """What the builder needs from a checkpoint: a spec per GGUF tensor name."""

    def has(self, name: str) -> bool: ...

    def spec(self, name: str) -> DenseSpec | PackedSpec: ...



#: HF name -> GGUF name ("{}": the layer)
_HF = [("model.embed_tokens.weight", "token_embd.weight"),
       ("model.norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight")] + [
    (f"model.layers.{{}}.{hf}", f"blk.{{}}.{g}") for hf, g in [
        ("input_layernorm.weight", "attn_norm.weight"),
        ("post_attention_layernorm.weight", "ffn_norm.weight"),
        *[(f"self_attn.{x}_proj.{kind}", f"attn_{x}.{kind}")
          for x in "qkv" for kind in ("weight", "bias")],
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.o_proj.bias", "attn_output.bias"),
        ("self_attn.sinks", "attn_sinks.weight"),
        ("mlp.router.weight", "ffn_gate_inp.weight"),
        ("mlp.router.bias", "ffn_gate_inp.bias"),
        # gpt-oss's expert stacks (dense ones are stored [E, K, N]: see _KN_STACKS)
        ("mlp.experts.gate_up_proj", "ffn_gate_up_exps.weight"),
        ("mlp.experts.gate_up_proj_bias", "ffn_gate_up_exps.bias"),
        ("mlp.experts.down_proj", "ffn_down_exps.weight"),
        ("mlp.experts.down_proj_bias", "ffn_down_exps.bias"),
        ("self_attn.qkv_proj.weight", QKV),
        ("mlp.gate_up_proj.weight", GATE_UP),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("block_sparse_moe.gate.weight", "ffn_gate_inp.weight"),
        ("mlp.gate.weight", "ffn_gate_inp.weight"),
        ("mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"),
        ("mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"),
        ("mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"),
        ("mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"),
        # DeepSeek: multi-head latent attention, the router's choice bias, shared experts
        ("self_attn.q_a_proj.weight", "attn_q_a.weight"),
        ("self_attn.q_a_layernorm.weight", "attn_q_a_norm.weight"),
        ("self_attn.q_b_proj.weight", "attn_q_b.weight"),
        ("self_attn.kv_a_proj_with_mqa.weight", "attn_kv_a_mqa.weight"),
        ("self_attn.kv_a_layernorm.weight", "attn_kv_a_norm.weight"),
        ("self_attn.kv_b_proj.weight", "attn_kv_b.weight"),
        ("mlp.gate.e_score_correction_bias", "exp_probs_b.bias"),
        *[(f"mlp.shared_experts.{x}_proj.weight", f"ffn_{x}_shexp.weight")
          for x in ("gate", "up", "down")]]]
#: per-expert HF tensors -> the GGUF stack [E, N, K] they are rows of
_HF_EXPERTS = [(re.compile(rf"model\.layers\.(\d+)\.{hf}\.weight"), f"blk.{{}}.{g}.weight")
               for hf, g in [
                   (r"block_sparse_moe\.experts\.(\d+)\.w1", "ffn_gate_exps"),
                   (r"block_sparse_moe\.experts\.(\d+)\.w3", "ffn_up_exps"),
                   (r"block_sparse_moe\.experts\.(\d+)\.w2", "ffn_down_exps"),
                   (r"mlp\.experts\.(\d+)\.gate_proj", "ffn_gate_exps"),
                   (r"mlp\.experts\.(\d+)\.up_proj", "ffn_up_exps"),
                   (r"mlp\.experts\.(\d+)\.down_proj", "ffn_down_exps")]]


def expert_name(hf: str) -> tuple[str, int] | None:
    """(GGUF stack name, expert index) of an HF per-expert tensor."""
    for pat, g in _HF_EXPERTS:
        m = pat.fullmatch(hf)
        if m:
            return g.format(m.group(1)), int(m.group(2))
    return None
#: Gemma 3's four norms per layer: its post_attention_layernorm follows the attention
_HF_SANDWICH = [(f"model.layers.{{}}.{hf}", f"blk.{{}}.{g}") for hf, g in [
    ("post_attention_layernorm.weight", "post_attention_norm.weight"),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight")]]


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(re.escape("{}"), r"(\d+)"))


_TABLES = {sandwich: [(_pattern(hf), _pattern(g), hf, g)
                      for hf, g in (_HF_SANDWICH + _HF if sandwich else _HF)]
           for sandwich in (False, True)}


def gguf_name(hf: str, sandwich: bool = False) -> str | None:
    """The GGUF name of an HF decoder tensor (packed ones keep a `.weight` suffix);
    `sandwich`: the family has four norms per layer (Gemma 3)."""
    base = re.sub(r"\.(qweight|weight_packed)$", ".weight", hf)
    for hf_pat, _, _, g in _TABLES[sandwich]:
        m = hf_pat.fullmatch(base)
        if m:
            return g.format(*m.groups())
    return None


def hf_name(gguf: str, sandwich: bool = False) -> str:
    """The HF name of a GGUF decoder tensor (for messages)."""
    for _, g_pat, hf, _ in _TABLES[sandwich]:
        m = g_pat.fullmatch(gguf)
        if m:
            return hf.format(*m.groups())
    return gguf


#: expert stacks a dense HF folder stores [E, K, N] (gpt-oss's gate_up_proj and down_proj;
#: its MXFP4 blocks are [E, N, K/32, 16]): served as GGUF's [E, N, K], transposed once
_KN_STACKS = re.compile(r"blk\.\d+\.ffn_(gate_up|down)_exps\.weight")
#: transformers 5's stacked experts of the other families (DeepSeek, Mixtral, Qwen-MoE):
#: gate_up_proj [E, 2I, H] holding gate's rows then up's, down_proj [E, H, I], as GGUF orders them;
#: llama.cpp's deepseek2 files may fuse them so too (ffn_gate_up_exps)
_GATE_UP_STACK = re.compile(r"(blk\.\d+\.)ffn_gate_up_exps\.weight")
#: llama.cpp's gpt-oss names the FFN's pre-norm post_attention_norm (its ffn_norm)
_GGUF_FFN_NORM = re.compile(r"^(blk\.\d+\.)post_attention_norm\.weight$")
#: norm tensors (GGUF names) that an HF (1 + w) family stores as w
_NORMS = re.compile(r"(blk\.\d+\.(attn_norm|ffn_norm|attn_[qk]_norm|post_attention_norm|"
                    r"post_ffw_norm)|output_norm)\.weight")


class CheckpointWeights:
    """WeightSource over an opened checkpoint; `arrays` maps const labels to source arrays.

    `config` names the family, which says how HF names map (Gemma 3's four norms) and
    whether HF norm weights are stored as w for a (1 + w) norm: those get 1 added once,
    here, under their own identity (GGUF files store 1 + w already). A family that fuses
    q|k|v and gate|up (Phi-3) serves their parts through poot.models.fused."""

    def __init__(self, checkpoint, config=None):
        self.checkpoint = checkpoint
        arch = getattr(config, "arch", None)
        meta = getattr(checkpoint, "metadata", None) or {}
        if arch is None and checkpoint.kind == "gguf":
            arch = meta.get("general.architecture")
        elif arch is None:
            arch = HF_TYPES.get(meta.get("model_type"))
        fam = FAMILIES.get(arch)
        hf_fam = fam or HF_FAMILIES.get(arch)
        # gpt-oss's HF stacks are [E, K, N]; another family's (or an unknown one's) as GGUF
        self.kn_stacks = hf_fam is None or hf_fam.moe == "gpt_oss"
        sandwich = bool(config is not None and config.sandwich_norms)
        self.norm_offset = 1.0 if checkpoint.kind != "gguf" and fam and fam.hf_norm_offset \
            else 0.0
        self.infos = {}
        self.experts: dict[str, dict[int, object]] = {}  # HF: stack name -> expert -> info
        for name, info in checkpoint.tensors.items():
            key = name if checkpoint.kind == "gguf" else gguf_name(name, sandwich)
            if key is not None and checkpoint.kind == "gguf" and fam and fam.fused:
                key = gguf_fused_name(key)
            if key is not None and checkpoint.kind == "gguf" and fam and fam.sinks:
                key = _GGUF_FFN_NORM.sub(r"\1ffn_norm.weight", key)
            if key is not None:
                self.infos[key] = info
            elif checkpoint.kind != "gguf" and (ex := expert_name(name)) is not None:
                self.experts.setdefault(ex[0], {})[ex[1]] = info
        # a fused gate|up expert stack of a family whose experts run apart (DeepSeek): each
        # half served as its own stack
        self.halves: dict[str, tuple[str, int]] = {}
        if (not self.kn_stacks if checkpoint.kind != "gguf"
                else fam is not None and fam.moe == "deepseek"):
            for key in [k for k in self.infos if _GATE_UP_STACK.fullmatch(k)]:
                p = _GATE_UP_STACK.fullmatch(key).group(1)
                self.halves[p + "ffn_gate_exps.weight"] = (key, 0)
                self.halves[p + "ffn_up_exps.weight"] = (key, 1)
        self.arrays: dict[str, np.ndarray] = {}
        self.fused = FusedParts(self.infos, stacked, config)

    def has(self, name: str) -> bool:
        return (name in self.infos or name in self.experts or name in self.fused
                or name in self.halves)

    def spec(self, name: str):
        if name in self.experts:
            return self._stack(name)
        if name in self.halves:
            return self._half(*self.halves[name])
        if name not in self.infos and name in self.fused:
            return self.fused.spec(name, self.spec(self.fused.alias[name][0]), self.arrays)
        info = self.infos.get(name)
        if info is None:
            raise CheckpointError(f"{self.checkpoint.path}: no tensor {name!r} "
                                  f"(is this a Llama-family checkpoint?)")
        if info.packed is not None:
            roles = [s.role for s in info.packed.sources()]
            refs = []
            for role, src in zip(roles, info.sources, strict=True):
                ref = info.ref if len(roles) == 1 else type(info.ref)(
                    info.ref.checkpoint, f"{info.ref.tensor}:{role}", f"{info.ref.payload}:{role}",
                    info.ref.format)
                refs.append(ref)
                self.arrays[ref.tensor] = src
            return PackedSpec(info.packed, tuple(refs))
        from poot.dtypes import DType
        from poot.ir.types import TensorType

        array, dtype, ref = info.sources[0], info.dtype, info.ref
        if len(info.shape) == 1 and dtype in (DType.F16, DType.BF16):
            # norm weights and biases meet f32 activations elementwise (only projections and
            # embeddings widen in their ops): widen these small vectors exactly, here
            array, dtype = np.asarray(array, np.float32), DType.F32
            ref = type(ref)(ref.checkpoint, ref.tensor, f"{ref.payload}:f32", "f32")
        if self.checkpoint.kind != "gguf" and self.kn_stacks and _KN_STACKS.fullmatch(name):
            ref = type(ref)(ref.checkpoint, f"{ref.tensor}~t", f"{ref.payload}~t", ref.format)
            if ref.tensor not in self.arrays:
                self.arrays[ref.tensor] = np.ascontiguousarray(np.swapaxes(array, 1, 2))
            array = self.arrays[ref.tensor]
            info_shape = array.shape
        else:
            info_shape = info.shape
        if self.norm_offset and _NORMS.fullmatch(name):
            array = np.asarray(array, np.float32) + np.float32(self.norm_offset)
            dtype = DType.F32
            ref = type(ref)(ref.checkpoint, f"{ref.tensor}+1", f"{ref.payload}+1", "f32")
        self.arrays[ref.tensor] = array
        return DenseSpec(TensorType(tuple(info_shape), dtype), ref)


    def _half(self, name: str, part: int) -> DenseSpec | PackedSpec:
        """Gate's (part 0) or up's (1) half of each expert's rows of the fused expert stack
        `name` [E, 2I, H] (packed: [E*2I, H]), made once under its own identity."""
        info = self.infos[name]
        half = ("gate", "up")[part]
        e, rows = info.shape[0], info.shape[1] // 2
        picked = (np.arange(e)[:, None] * 2 * rows + part * rows + np.arange(rows)).reshape(-1)

        def made(ref, source, role=None):
            tag = f":{role}" * (role is not None) + f":{half}"
            new = type(ref)(ref.checkpoint, ref.tensor + tag, ref.payload and
                            ref.payload + tag, ref.format)
            if new.tensor not in self.arrays:
                flat = np.asarray(source).reshape(e * 2 * rows, -1)
                self.arrays[new.tensor] = np.take(flat, picked, axis=0).reshape(
                    (e * rows,) + flat.shape[1:] if info.packed is not None
                    else (e, rows) + np.asarray(source).shape[2:])
            return new

        if info.packed is None:
            ref = made(info.ref, info.sources[0])
            return DenseSpec(TensorType(self.arrays[ref.tensor].shape, info.dtype), ref)
        weight = info.packed
        refs = []
        for src, row, spec in zip(info.sources, _row_sources(name, weight), weight.sources(),
                                  strict=True):
            whole = type(info.ref)(info.ref.checkpoint, f"{info.ref.tensor}:{spec.role}",
                                   f"{info.ref.payload}:{spec.role}", info.ref.format)
            if row:
                refs.append(made(info.ref, src, spec.role))
            else:
                self.arrays[whole.tensor] = src
                refs.append(whole)
        return PackedSpec(weight.with_rows(e * rows), tuple(refs))

    def _stack(self, name: str) -> DenseSpec:
        """An HF folder's per-expert matrices as one f32 stack [E, N, K], built once."""
        from poot.digest import blake2b
        from poot.dtypes import DType
        from poot.ir.types import TensorType, WeightRef

        parts = self.experts[name]
        if sorted(parts) != list(range(len(parts))):
            raise CheckpointError(f"{self.checkpoint.path}: experts of {name} are not "
                                  f"numbered 0..{len(parts) - 1}")
        infos = [parts[j] for j in range(len(parts))]
        if any(i.packed is not None for i in infos):
            raise CheckpointError(f"{self.checkpoint.path}: quantized experts ({name}) in an "
                                  f"HF folder are not supported; poot stacks dense experts")
        label = f"{name}~stack"
        if label not in self.arrays:
            self.arrays[label] = np.stack([np.asarray(i.sources[0], np.float32) for i in infos])
        payload = blake2b("|".join(str(i.ref.payload) for i in infos).encode(),
                                  digest_size=16).hexdigest()
        ref = WeightRef(infos[0].ref.checkpoint, label, payload, "f32")
        return DenseSpec(TensorType(self.arrays[label].shape, DType.F32), ref)


# -- q/k rows from GGUF's adjacent pairs to rotate-half order ---------------------------
#: the tensors llama.cpp's converter permutes (q/k projections and their biases)
_ROPE_ROWS = re.compile(r"blk\.\d+\.attn_[qk]\.(weight|bias)")


def half_rows(n: int, head_dim: int) -> np.ndarray:
    """The row order taking n = heads * head_dim q/k rows from adjacent (even, odd) pairs
    to rotate-half order, per head: row 2i -> i, row 2i+1 -> head_dim/2 + i (the inverse
    of llama.cpp's converter permutation)."""
    return np.arange(n).reshape(n // head_dim, head_dim // 2, 2).transpose(0, 2, 1).reshape(n)


def _row_sources(name: str, weight: PackedWeight) -> list[bool]:
    """PackedWeight.source_rows, refused with the tensor's name."""
    try:
        return weight.source_rows()
    except FormatError as e:
        raise CheckpointError(f"{name}: {e}, so its rows cannot be reordered or "
                              f"stacked") from None


#: the alignment of a materialized weight: GGUF's (32 bytes), so a runtime that adopts the
#: file's own tensors can adopt these too
WEIGHT_ALIGN = 32


def frozen_stack(sources: list[np.ndarray], orders: list) -> np.ndarray:
    """The rows of each source (`source[order]`, or in its own order where the order is
    None), one source after another, in a WEIGHT_ALIGN-aligned array that nothing can
    write: a frozen owner (no writable view of it exists), so a host runtime may use its
    bytes in place instead of copying them (poot_cpu's runtime does)."""
    sources = [np.asarray(x) for x in sources]
    first = sources[0]
    shape = (sum(len(x) for x in sources), *first.shape[1:])
    nbytes = math.prod(shape) * first.itemsize
    raw = np.empty(nbytes + WEIGHT_ALIGN, np.uint8)
    start = -raw.ctypes.data % WEIGHT_ALIGN
    out = raw[start:start + nbytes].view(first.dtype).reshape(shape)
    row = 0
    for x, order in zip(sources, orders, strict=True):
        part = out[row: row + len(x)]
        if order is None:
            part[...] = x
        else:
            np.take(x, order, axis=0, out=part)
        row += len(x)
    out.flags.writeable = False
    raw.flags.writeable = False
    return out


#: joins the names of tensors that a RowLayout serves stacked by rows as one tensor
STACK = "+"


def stacked(names) -> str:
    """The name under which a RowLayout serves the tensors `names` stacked by rows."""
    return STACK.join(names)


class RowLayout:
    """The WeightSource `inner` as the builder reads it.

    - With `head_dim` (a pair-ordered source: GGUF llama/mistral), its q/k rows in
      rotate-half order: the builder's only layout.
    - Tensors stacked by rows under `stacked(names)`: one [sum of N, K] tensor holding each
      part's rows in turn (q/k parts reordered as above), so that one contraction computes
      the q, k and v projections and row ranges of it compute each alone. A stack is served
      (`has`) only where its parts agree: all dense of one dtype, or all packed in one
      format whose every source holds rows; one K. A source that serves the stacked name
      itself (a synthetic one) is read as it is.

    Materialized tensors are made once per source and head_dim (the rest stays
    memory-mapped in `inner`) and get their own identity: label `<tensor>~half` for a
    reordered one, the parts' labels joined by STACK for a stack, payloads likewise, so
    weight caches never mix them with the stored bytes. `arrays` holds them by label.
    """

    arrays: dict[str, np.ndarray]

    def __init__(self, inner: WeightSource, head_dim: int | None = None):
        self.inner, self.head_dim = inner, head_dim
        # each traced step (prefill, decode, paged) wraps its source anew: they share the
        # materialized specs and arrays of this source and head_dim, which die with it
        self._specs, self.arrays = _MADE.setdefault(inner, {}).setdefault(head_dim, ({}, {}))

    def has(self, name: str) -> bool:
        if name in self._specs or self.inner.has(name):
            return True
        parts = name.split(STACK)
        return len(parts) > 1 and self._stackable(parts)

    def spec(self, name: str):
        if self.inner.has(name) and not self._reordered(name):
            return self.inner.spec(name)
        if name not in self._specs:
            self._specs[name] = self._made(name.split(STACK))
        return self._specs[name]

    def _reordered(self, name: str) -> bool:
        return bool(self.head_dim and _ROPE_ROWS.fullmatch(name))

    def _stackable(self, parts: list[str]) -> bool:
        if not all(self.inner.has(p) for p in parts):
            return False
        specs = [self.inner.spec(p) for p in parts]
        if all(isinstance(s, DenseSpec) for s in specs):
            return len({(s.type.dtype, s.type.shape[1:]) for s in specs}) == 1
        if not all(isinstance(s, PackedSpec) for s in specs) or len(
                {(s.weight.format, s.weight.attrs, s.weight.shape[1]) for s in specs}) != 1:
            return False
        try:
            return all(specs[0].weight.source_rows())
        except FormatError:
            return False

    def _made(self, names: list[str]) -> DenseSpec | PackedSpec:
        """The parts `names`, each in its order, as one materialized tensor."""
        specs = [self.inner.spec(x) for x in names]
        rows = [s.weight.shape[0] if isinstance(s, PackedSpec) else s.type.shape[0]
                for s in specs]
        orders = [half_rows(n, self.head_dim) if self._reordered(x) else None
                  for x, n in zip(names, rows, strict=True)]
        first = specs[0]
        if isinstance(first, DenseSpec):
            t = TensorType((sum(rows), *first.type.shape[1:]), first.type.dtype)
            return DenseSpec(t, self._rows([s.ref for s in specs], orders))
        held = _row_sources(stacked(names), first.weight)
        return PackedSpec(first.weight.with_rows(sum(rows)), tuple(
            self._rows([s.refs[j] for s in specs], orders) if row else first.refs[j]
            for j, row in enumerate(held)))

    def _rows(self, refs: list[WeightRef], orders: list) -> WeightRef:
        """One array of the rows of the refs' arrays (each in its order), under a new
        identity."""
        half = [o is not None for o in orders]
        labels = [r.tensor + "~half" * h for r, h in zip(refs, half, strict=True)]
        payloads = [r.payload and r.payload + f"~half{self.head_dim}" * h
                    for r, h in zip(refs, half, strict=True)]
        new = replace(refs[0], tensor=stacked(labels),
                      payload=stacked(payloads) if all(payloads) else None)
        sources = [self.inner.arrays[r.tensor] for r in refs]
        self.arrays[new.tensor] = frozen_stack(sources, orders)
        for source in sources:
            release_file_pages(source)     # only the materialized copy is read from now on
        return new


#: RowLayout's materialized (specs, arrays) by source and head_dim (never holding the source)
_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
