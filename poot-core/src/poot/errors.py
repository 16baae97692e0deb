"""Every error poot raises on purpose. One base class, one subclass per kind.

A refusal names what was refused (op, dtype, backend, device, value, file)
so that a user can act on the message without reading poot's code.
"""
from __future__ import annotations


class PootError(Exception):
    """Base of every typed poot error."""


# -- the IR ------------------------------------------------------------------
class IRError(PootError):
    """A graph, an eqn or an operand is malformed."""


class ShapeError(IRError):
    """An op's operand shapes do not fit its type rule."""


class DtypeError(IRError):
    """An op's operand dtypes do not fit its type rule, or a dtype is unknown."""


class GraphError(IRError):
    """A whole-graph check failed (SSA, order, undefined or foreign operand, outputs)."""


class EditRefused(GraphError):
    """A GraphEdit commit would lose a witness, export or state pair, or change the result."""


class TraceError(PootError):
    """The tracer was asked for something it cannot record (e.g. a compiler-only op)."""


class ParseError(IRError):
    """The text form of a graph could not be parsed."""


# -- backends and capabilities ----------------------------------------------
class LoweringError(PootError):
    """A target cannot lower an eqn. Carries op, dtype, backend and device."""

    def __init__(self, message: str, *, op: str = "", dtype: str = "", backend: str = "",
                 device: str = ""):
        self.op, self.dtype, self.backend, self.device = op, dtype, backend, device
        self.reason = message
        where = ", ".join(
            f"{k}={v}" for k, v in
            (("op", op), ("dtype", dtype), ("backend", backend), ("device", device)) if v
        )
        super().__init__(f"{message} [{where}]" if where else message)

    def on(self, backend: str, device: str) -> LoweringError:
        """The same refusal naming the backend and device it was raised for."""
        return type(self)(self.reason, op=self.op, dtype=self.dtype,
                          backend=self.backend or backend, device=self.device or device)


class DtypeLowering(LoweringError):
    """The device cannot use this dtype the way the op needs (e.g. SPIR-V Select on F16)."""


class UnsupportedOp(LoweringError):
    """The backend has no lowering for this op (or composite) at all."""


class LimitExceeded(LoweringError):
    """A kernel would exceed a device limit (binding size, workgroup size, shared memory)."""


class DeviceUnavailable(PootError):
    """A backend or device is not there (no driver, no adapter, unknown name)."""


class UnknownBackend(DeviceUnavailable):
    """No installed backend has this name."""


class MissingPackage(PootError, ImportError):
    """An optional Python package is not installed (or fails to import). The message names
    it and the pip command that installs it (see poot.optional)."""


class IncompatiblePlugin(PootError):
    """An installed plugin was built for a poot-core version range the installed poot-core
    is not in."""


# -- runtime -------------------------------------------------------------------
class BindError(PootError):
    """A value bound to a plan input does not fit it (shape, dtype, missing)."""


class SlotRangeError(BindError):
    """A slot value lies outside the range its slot kind declares."""


class CapacityError(PootError):
    """A KV pool or cache has no room for what was asked."""


# -- weights and checkpoints ---------------------------------------------------
class FormatError(PootError):
    """A packed weight format is unknown or its sources do not fit it."""


class CheckpointError(PootError):
    """A checkpoint file is missing, truncated, corrupted or unsupported."""


class ConfigError(CheckpointError):
    """A metadata or config value has the wrong type, lies out of range, or contradicts the
    tensors present. Carries the file, the key and the value (see poot.checked)."""

    def __init__(self, message: str, *, file: str = "", key: str = "", value: object = None):
        self.file, self.key, self.value = file, key, value
        super().__init__(message)


class ShardError(PootError):
    """A model cannot be split over the asked number of tensor-parallel ranks. Carries the
    dimension that does not split (`dim`: "heads", "kv_heads", "ffn", "vocab", or the value
    the sharding pass could not place) and the degree."""

    def __init__(self, message: str, *, dim: str, ranks: int):
        self.dim, self.ranks = dim, ranks
        super().__init__(f"{message} [dim={dim}, ranks={ranks}]")


class OutOfRange(PootError):
    """An index read at evaluation time lies outside the tensor it indexes."""


# -- models ------------------------------------------------------------------------------
class TokenizerError(PootError, ValueError):
    """Text or token ids the tokenizer cannot take (e.g. an id outside the vocabulary)."""


class ChatTemplateError(PootError, ValueError):
    """The messages do not fit the model's chat template (the template said why)."""


class SamplingError(PootError, ValueError):
    """A sampler setting is out of range, or the logits cannot be sampled (NaN, all -inf)."""


# -- serving ---------------------------------------------------------------------------------
class RequestError(PootError, ValueError):
    """A request's parameter is out of range (max_tokens, max_seq, ...), or an HTTP request
    `poot serve` refuses: malformed, too long for the model, or arriving while the queue is
    full. Carries the HTTP status (400 unless said) and OpenAI's error fields."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error"):
        self.status, self.param, self.code, self.type = status, param, code, type
        super().__init__(message)


class ImageError(RequestError):
    """An image given to a vision model cannot be used: missing, not an image Pillow reads,
    corrupt or truncated, a mode with no RGB form, or more pixels than poot decodes (a
    decompression bomb). Names the file; a 400 in a server."""
