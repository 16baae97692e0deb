"""Reading AMD GPU code objects: the target and, per kernel, LDS, registers, wavefront.

hiprtc gives an ELF code object; `hipcc --genco` gives a clang offload bundle that
holds one ELF per target (its layout: the magic "__CLANG_OFFLOAD_BUNDLE__", a
little-endian u64 entry count, then per entry u64 offset, u64 size, u64 id length
and the id, e.g. "hipv4-amdgcn-amd-amdhsa--gfx90a"). The ELF's NT_AMDGPU_METADATA
note (owner "AMDGPU", type 32) is MessagePack: amdhsa.target and amdhsa.kernels,
each kernel with .group_segment_fixed_size (static LDS), .vgpr_count, .sgpr_count,
.wavefront_size, .private_segment_fixed_size (scratch) and spill counts.
pyelftools reads the ELF and msgpack the note; the bundle is parsed here (a few
fixed fields, no library reads it).
"""
from __future__ import annotations

import io
import struct
from dataclasses import dataclass

from poot.errors import PootError
from poot.optional import require

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
ELF_MAGIC = b"\x7fELF"
NT_AMDGPU_METADATA = 32


class CodeObjectError(PootError):
    """Bytes that are not a readable AMD GPU code object (or bundle of them)."""


@dataclass(frozen=True)
class KernelInfo:
    name: str
    lds_bytes: int
    vgprs: int
    sgprs: int
    agprs: int
    wavefront: int
    scratch_bytes: int
    spills: int
    max_workgroup: int

    def __str__(self) -> str:
        return (f"{self.name}: LDS {self.lds_bytes} B, {self.vgprs} VGPRs, {self.sgprs} SGPRs"
                f"{f', {self.agprs} AGPRs' if self.agprs else ''}, wave{self.wavefront}, "
                f"scratch {self.scratch_bytes} B, {self.spills} spills")


@dataclass(frozen=True)
class CodeObject:
    target: str                       # e.g. amdgcn-amd-amdhsa--gfx90a
    kernels: tuple[KernelInfo, ...]

    @property
    def gfx(self) -> str:
        """The architecture name: gfx90a (target features such as :xnack- dropped)."""
        return self.target.rsplit("-", 1)[-1].split(":")[0]

    def kernel(self, name: str) -> KernelInfo:
        for k in self.kernels:
            if k.name == name:
                return k
        raise CodeObjectError(f"code object for {self.target} has no kernel {name!r} "
                              f"(it has {', '.join(k.name for k in self.kernels)})")


def unbundle(data: bytes) -> dict[str, bytes]:
    """The ELF code objects of a clang offload bundle by entry id (device entries only;
    the host entry is empty for --genco). A bare ELF is returned as {"": data}."""
    if data[:4] == ELF_MAGIC:
        return {"": data}
    if not data.startswith(BUNDLE_MAGIC):
        raise CodeObjectError("neither an ELF code object nor a clang offload bundle")
    at = len(BUNDLE_MAGIC)
    try:
        (count,) = struct.unpack_from("<Q", data, at)
        at += 8
        if count > 4096:
            raise CodeObjectError(f"offload bundle claims {count} entries")
        out = {}
        for _ in range(count):
            offset, size, id_len = struct.unpack_from("<QQQ", data, at)
            at += 24
            entry = data[at:at + id_len].decode()
            at += id_len
            if offset + size > len(data) or id_len > 4096:
                raise CodeObjectError(f"offload bundle entry {entry!r} runs past the end")
            if "amdgcn" in entry:
                out[entry] = data[offset:offset + size]
    except struct.error as e:
        raise CodeObjectError(f"truncated offload bundle: {e}") from None
    return out


def read(data: bytes) -> list[CodeObject]:
    """Every code object in `data` (an ELF, or a bundle of one per target)."""
    return [read_elf(elf) for elf in unbundle(data).values()]


def read_elf(elf: bytes) -> CodeObject:
    msgpack = require("msgpack")
    ELFError = require("elftools.common.exceptions", "pyelftools").ELFError
    ELFFile = require("elftools.elf.elffile", "pyelftools").ELFFile

    try:
        f = ELFFile(io.BytesIO(elf))
        notes = [n for sec in f.iter_sections() if sec.header.sh_type == "SHT_NOTE"
                 for n in sec.iter_notes()]
    except (ELFError, ValueError, struct.error) as e:
        raise CodeObjectError(f"unreadable code object ELF: {e}") from None
    for n in notes:
        if n["n_name"] == "AMDGPU" and n["n_type"] == NT_AMDGPU_METADATA:
            desc = n["n_desc"]
            meta = msgpack.unpackb(desc if isinstance(desc, bytes) else desc.encode("latin-1"),
                                   raw=False)
            return CodeObject(str(meta["amdhsa.target"]),
                              tuple(_kernel(k) for k in meta.get("amdhsa.kernels", ())))
    raise CodeObjectError("code object has no AMDGPU metadata note (code object v3+)")


def _kernel(k: dict) -> KernelInfo:
    return KernelInfo(str(k[".name"]), int(k[".group_segment_fixed_size"]),
                      int(k[".vgpr_count"]), int(k[".sgpr_count"]), int(k.get(".agpr_count", 0)),
                      int(k[".wavefront_size"]), int(k[".private_segment_fixed_size"]),
                      int(k.get(".vgpr_spill_count", 0)) + int(k.get(".sgpr_spill_count", 0)),
                      int(k.get(".max_flat_workgroup_size", 0)))
