"""LoRA adapters in PEFT's format, several resident at once beside one copy of the base.

An adapter folder holds `adapter_config.json` (peft_type LORA; r, lora_alpha, target_modules)
and `adapter_model.safetensors` (per targeted module `base_model.model.<module>.lora_A.weight`
[r, K] and `.lora_B.weight` [N, r]). A targeted projection y = x W^T gains
scale * (x A^T) B^T, scale = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).

`Adapters` stacks every loaded adapter per base weight, as S-LoRA and Punica do: A^T as
[S, K, R] and scale * B^T as [S, R, N] (R the largest rank; a smaller rank is zero-padded,
which adds nothing). Stack row 0 is all zeros: adapter index 0 means "no adapter", and the
adapters loaded are 1..S-1 in load order. The step takes one index per sequence through the
`adapter` slot (role `lora.adapter`, declared by this module through the `poot_slot_roles`
hook); each token's update is two IndexedMatMuls gathered by its sequence's index, so one
batched step serves sequences with different adapters and the base weights are never merged
or copied.

A projection the base stores fused by rows (Phi-3's qkv_proj and gate_up_proj) takes its
adapter exactly: its update scale * (x A^T) B^T splits by B's rows into one update per part
(q, k, v; gate, up), each the shared A with its rows of B, so the builder adapts the parts
it computes one by one.

Refused by name: config keys poot does not implement (use_dora, rank_pattern, alpha_pattern,
modules_to_save, bias other than "none", fan_in_fan_out, layers_to_transform,
target_parameters, ...), modules other than the attention and MLP projections, routed
experts' weights (per expert or stacked: the experts run as IndexedMatMuls over their
stack, which take no per-row adapter), DeepSeek's kv_b_proj (absorbed, never applied as
x W^T), and tensors whose rank or shape does not fit.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from poot import ops
from poot.checked import Values, load_json
from poot.contract import hookimpl
from poot.digest import blake2b
from poot.dtypes import DType
from poot.errors import CheckpointError, ConfigError, IRError
from poot.ir.types import SlotKind, WeightRef

OWNER = "poot.models.lora"
#: the slot role of the per-sequence adapter index (0: no adapter)
ROLE = "lora.adapter"
#: the step's slot name
SLOT = "adapter"
CONFIG, TENSORS = "adapter_config.json", "adapter_model.safetensors"
_PREFIX = "base_model.model."
#: HF module suffixes a LoRA may target here (the projections traced through `ops.linear`)
_SUPPORTED = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
              "qkv_proj", "gate_up_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa")
#: projections poot computes in another form than x W^T, so that no low-rank update of
#: their input applies: DeepSeek's kv_b is absorbed into the latent attention's query and
#: output (poot.models.deepseek)
_ABSORBED = ("kv_b_proj",)
#: a routed expert's module (Mixtral's block_sparse_moe.experts.N, the others'
#: mlp.experts.N, or the stack mlp.experts itself); shared_experts are dense projections
_EXPERT = re.compile(r"(^|.*\.)experts(\.\d+)?\.[^.]+")
#: config keys read, or ignored because they change nothing at inference: training-only
#: settings, bookkeeping, initialization schemes (the saved A and B are what was trained)
_KNOWN = {"peft_type", "r", "lora_alpha", "target_modules", "use_rslora", "bias", "use_dora",
          "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out",
          "layers_to_transform", "layers_pattern", "lora_dropout", "task_type",
          "base_model_name_or_path", "revision", "inference_mode", "init_lora_weights",
          "auto_mapping", "peft_version", "exclude_modules", "layer_replication",
          "megatron_core", "qalora_group_size", "eva_config", "corda_config"}
#: keys poot does not implement: refused unless unset (null, false, {}, []); any other key
#: not in _KNOWN is refused the same way
_REFUSED = ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save", "fan_in_fan_out",
            "layers_to_transform", "layers_pattern", "layer_replication", "exclude_modules",
            "use_qalora", "lora_bias", "target_parameters", "trainable_token_indices",
            "alora_invocation_tokens", "arrow_config", "loftq_config", "megatron_config",
            "ensure_weight_tying")


@hookimpl
def poot_slot_roles():
    return [SlotKind(ROLE, DType.I32, 0, None, owner=OWNER)]


def adapter_role() -> SlotKind:
    """The `lora.adapter` role, which must have been declared through the plugin hook."""
    from poot.plugin import manager

    role = manager().slot_roles().get(ROLE)
    if role is None:
        raise IRError(f"slot role {ROLE!r} is not declared: its owner {OWNER} is not a "
                      f"registered plugin, so no graph may take an adapter index")
    return role


@dataclass(frozen=True)
class Adapter:
    """One PEFT LoRA adapter: per GGUF weight name, (A [r, K], B [N, r]) as float32."""

    name: str
    path: Path
    rank: int
    scale: float
    weights: dict[str, tuple[np.ndarray, np.ndarray]]


def _unset(value) -> bool:
    return value is None or value is False or value == {} or value == [] or value == ""


def read_config(folder: Path) -> tuple[int, float, list[str] | str]:
    """(rank, scale, target_modules) of `folder/adapter_config.json`, or a typed refusal."""
    file = folder / CONFIG
    if not file.is_file():
        raise CheckpointError(f"{folder} is not a PEFT adapter folder: it has no {CONFIG}")
    v = Values(load_json(file), file)
    peft = v.text("peft_type", "LORA")
    if peft != "LORA":
        v.fail("peft_type", peft, "is not LORA (the only adapter type poot implements)")
    for key in _REFUSED:
        if not _unset(v.values.get(key)):
            v.fail(key, v.values[key], "is set; poot does not implement it")
    init = v.values.get("init_lora_weights", True)
    if init not in (True, False, "gaussian", "eva"):
        v.fail("init_lora_weights", init, "rewrites the base weights as it initializes the "
                                          "adapter (PiSSA, OLoRA, CorDA, LoftQ); poot runs "
                                          "adapters over the stock base only")
    bias = v.text("bias", "none")
    if bias != "none":
        v.fail("bias", bias, "is not 'none'; poot does not implement trained biases")
    for key, value in v.values.items():
        if key not in _KNOWN and not _unset(value):
            v.fail(key, value, "is a config key poot does not implement")
    rank = v.integer("r", lo=1, hi=4096)
    alpha = v.number("lora_alpha", positive=True)
    scale = alpha / (math.sqrt(rank) if v.flag("use_rslora", False) else rank)
    targets = v.values.get("target_modules")
    if isinstance(targets, str):
        try:
            re.compile(targets)
        except re.error as exc:
            v.fail("target_modules", targets, f"is not a regular expression ({exc})")
    else:
        targets = v.text_list("target_modules")
    return rank, scale, targets


def _targeted(module: str, targets: list[str] | str) -> bool:
    """PEFT's rule: a regular expression matches the whole module name; a list entry
    matches the name or its last dotted parts; "all-linear" every projection."""
    if isinstance(targets, str):
        return targets == "all-linear" or re.fullmatch(targets, module) is not None
    return any(module == t or module.endswith("." + t) for t in targets)


def load_adapter(path: str | Path, base, *, sandwich: bool = False,
                 name: str | None = None) -> Adapter:
    """Read the PEFT adapter folder `path` and check it against `base` (the model's
    WeightSource): every tensor names a targeted projection the base has, with the config's
    rank and the base's shape. Errors name the file and the key."""
    from poot.models.weights import gguf_name
    from poot.plugin import manager

    folder = Path(path)
    rank, scale, targets = read_config(folder)
    file = folder / TENSORS
    if not file.is_file():
        raise CheckpointError(f"{folder} has no {TENSORS} (adapters in .bin files are not "
                              f"read: convert them to safetensors)")
    ckpt = manager().open_checkpoint(str(file))
    parts: dict[str, dict[str, np.ndarray]] = {}
    for key, info in ckpt.tensors.items():
        m = re.fullmatch(r"(.+)\.lora_([AB])\.weight", key)
        if m is None or not m.group(1).startswith(_PREFIX):
            raise CheckpointError(f"{file}: tensor {key!r} is not a LoRA A or B matrix "
                                  f"(poot reads {_PREFIX}<module>.lora_A/lora_B.weight only)")
        module = m.group(1)[len(_PREFIX):]
        if _EXPERT.fullmatch(module):
            raise CheckpointError(f"{file}: tensor {key!r} adapts {module}, a routed expert's "
                                  f"weight ({_expert_stack(module, sandwich)} of the base); "
                                  f"poot adapts the attention and dense MLP projections "
                                  f"(shared experts included), not routed experts")
        if module.endswith(_ABSORBED):
            raise CheckpointError(f"{file}: tensor {key!r} adapts {module}, which multi-head "
                                  f"latent attention absorbs into its query and output (it "
                                  f"never projects the latent); poot adapts q_proj, q_a_proj, "
                                  f"q_b_proj, kv_a_proj_with_mqa and o_proj there")
        if not module.endswith(_SUPPORTED):
            raise CheckpointError(f"{file}: tensor {key!r} adapts {module}, which is not one "
                                  f"of the projections poot adapts ({', '.join(_SUPPORTED)})")
        if not _targeted(module, targets):
            raise ConfigError(f"{file}: tensor {key!r} adapts {module}, which target_modules "
                              f"{targets!r} of {folder / CONFIG} does not name",
                              file=str(file), key=key)
        if info.packed is not None or info.dtype not in (DType.F32, DType.F16, DType.BF16):
            raise CheckpointError(f"{file}: tensor {key!r} is {info.packed or info.dtype}; "
                                  f"LoRA matrices must be f32, f16 or bf16")
        parts.setdefault(module, {})[m.group(2)] = np.asarray(info.sources[0], np.float32)
    if not parts:
        raise CheckpointError(f"{file} holds no LoRA tensors")
    weights = {}
    for module, ab in sorted(parts.items()):
        for half in "AB":
            if half not in ab:
                raise CheckpointError(f"{file}: {_PREFIX}{module}.lora_{half}.weight is "
                                      f"missing (its pair is there)")
        target = gguf_name(module + ".weight", sandwich)
        if target is None or not base.has(target):
            raise CheckpointError(f"{file}: {module} is not a weight of the base model")
        a, b = ab["A"], ab["B"]
        n, k = _base_shape(base, target)
        for half, arr, want in (("A", a, (rank, k)), ("B", b, (n, rank))):
            if arr.shape != want:
                raise ConfigError(
                    f"{file}: {_PREFIX}{module}.lora_{half}.weight is {list(arr.shape)}, not "
                    f"{list(want)} (rank r = {rank} of {CONFIG}; the base's {target} is "
                    f"[{n}, {k}])", file=str(file), key=f"{_PREFIX}{module}.lora_{half}.weight",
                    value=list(arr.shape))
        if not (np.isfinite(a).all() and np.isfinite(b).all()):
            raise CheckpointError(f"{file}: {_PREFIX}{module} holds a NaN or infinity")
        parts = _fused_parts(base, target)
        if parts and (parts[0][1] != 0 or parts[-1][2] != n):
            raise CheckpointError(f"{file}: {module} is fused in the base, but its parts "
                                  f"({', '.join(p for p, _, _ in parts)}) do not cover its "
                                  f"{n} rows")
        for part, start, end in parts or [(target, 0, n)]:
            weights[part] = (a, np.ascontiguousarray(b[start:end]))
    return Adapter(name or folder.name, folder, rank, scale, weights)


def _fused_parts(base, target: str) -> list[tuple[str, int, int]]:
    """The parts (name, first row, end row) the base computes of the fused tensor `target`
    one by one, in row order; [] where `target` is not fused."""
    alias = getattr(getattr(base, "fused", None), "alias", {})
    return sorted(((part, start, end) for part, (fused, start, end) in alias.items()
                   if fused == target and start is not None), key=lambda p: p[1])


def _expert_stack(module: str, sandwich: bool) -> str:
    """The base's stacked tensor an expert module's weight belongs to (for messages)."""
    from poot.models.weights import expert_name, gguf_name

    hf = module + ".weight"
    found = expert_name(hf)
    if found is not None:
        return f"expert {found[1]} of {found[0]}"
    return gguf_name(module, sandwich) or gguf_name(hf, sandwich) or "a stacked expert tensor"


def _base_shape(base, target: str) -> tuple[int, int]:
    spec = base.spec(target)
    shape = spec.weight.shape if hasattr(spec, "weight") else spec.type.shape
    return int(shape[0]), int(shape[1])


class Adapters:
    """Adapters resident at once, stacked per base weight; index 0 is no adapter."""

    def __init__(self, adapters: list[Adapter]):
        names = [a.name for a in adapters]
        dup = sorted({x for x in names if names.count(x) > 1})
        if dup:
            raise ConfigError(f"adapter names must differ; {dup} is given twice", key="lora")
        self.adapters = list(adapters)
        self.index = {a.name: i + 1 for i, a in enumerate(adapters)}
        self.rows = len(adapters) + 1       # the slot's bound: indices 0..rows-1
        self.arrays: dict[str, np.ndarray] = {}
        self.stacks: dict[str, tuple[WeightRef, WeightRef]] = {}
        rank = max(a.rank for a in adapters)
        for target in sorted({t for a in adapters for t in a.weights}):
            self.stacks[target] = self._stack(target, rank)

    def _stack(self, target: str, rank: int) -> tuple[WeightRef, WeightRef]:
        a0, b0 = next(ad.weights[target] for ad in self.adapters if target in ad.weights)
        k, n = a0.shape[1], b0.shape[0]
        at = np.zeros((self.rows, k, rank), np.float32)
        bt = np.zeros((self.rows, rank, n), np.float32)
        for i, ad in enumerate(self.adapters, start=1):
            if target in ad.weights:
                a, b = ad.weights[target]
                at[i, :, :ad.rank] = a.T
                bt[i, :ad.rank, :] = (np.float32(ad.scale) * b).T
        refs = []
        for half, arr in (("a", at), ("b", bt)):
            label = f"lora:{target}:{half}"
            digest = blake2b(arr.view(np.uint8), digest_size=16).hexdigest()
            self.arrays[label] = arr
            refs.append(WeightRef("lora", label, payload=digest, format="float32"))
        return refs[0], refs[1]

    def lookup(self, name: str | None) -> int:
        """The index of the adapter `name` (None: 0, no adapter)."""
        if name is None:
            return 0
        if name not in self.index:
            raise ConfigError(f"no adapter named {name!r} is loaded; loaded: "
                              f"{', '.join(self.index) or 'none'}", key="lora", value=name)
        return self.index[name]

    def update(self, y, x, target: str, rows):
        """Inside a traced step: y (= x W^T of `target`) plus each row's low-rank update,
        gathered by `rows` [N] (the row's adapter index)."""
        if target not in self.stacks:
            return y
        a_ref, b_ref = self.stacks[target]
        at = ops.const(self.arrays[a_ref.tensor].shape, DType.F32, a_ref)
        bt = ops.const(self.arrays[b_ref.tensor].shape, DType.F32, b_ref)
        return ops.add(y, ops.indexed_matmul(ops.indexed_matmul(x, at, rows), bt, rows))

    def rows_of(self, batch: int, tokens: int):
        """Inside a traced step: the `adapter` slot [B] and its index per token [B*T]."""
        idx = ops.slot(adapter_role(), (batch,), SLOT, bound=self.rows)
        per_token = ops.broadcast_to(ops.reshape(idx, (batch, 1)), (batch, tokens))
        return ops.reshape(per_token, (batch * tokens,))


def load_adapters(specs: list[tuple[str | None, str]], base, config) -> Adapters:
    """`Adapters` of (name or None, folder) pairs, each checked against the base; an unnamed
    adapter is called by its folder's name."""
    return Adapters([load_adapter(path, base, sandwich=config.sandwich_norms, name=name)
                     for name, path in specs])


def parse_named(spec: str) -> tuple[str | None, str]:
    """`NAME=PATH` (or a bare PATH) of the --lora option."""
    name, sep, path = spec.partition("=")
    if sep and name and not Path(spec).exists():
        return name, path
    return None, spec


__all__ = ["ROLE", "SLOT", "Adapter", "Adapters", "adapter_role", "load_adapter",
           "load_adapters", "parse_named", "read_config"]
