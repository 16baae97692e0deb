"""`poot doctor`: what this installation is made of and what it can run. Python, every
installed poot package and the packages each declares (missing ones with the command that
installs them), the plugins, each backend's devices or why it has none, the C compiler and
OpenMP (the cpu backend's), and the caches (poot's, and huggingface_hub's models)."""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

#: the backend packages the poot project ships, by backend name (`pip install 'poot[NAME]'`)
BACKEND_PACKAGES = {"cuda": "poot-backend-cuda", "rocm": "poot-backend-rocm",
                    "wgpu": "poot-backend-wgpu", "vulkan": "poot-backend-vulkan",
                    "cpu": "poot-backend-cpu"}


def add_parser(sub):
    sub.add_parser("doctor", help="Python, installed poot packages and their dependencies, "
                   "devices found (and why others were not), caches and their sizes")


def requirement_lines(dist) -> list[str]:
    """One line per requirement of `dist`: the installed version, or what is wrong."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import InvalidRequirement, Requirement

    from poot.optional import extra_of, install_command

    lines = []
    for text in dist.requires or ():
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        extra = extra_of(req)
        if req.marker and not req.marker.evaluate({"extra": extra or ""}):
            continue  # a platform marker that does not apply here
        where = f" [{extra}]" if extra else ""
        try:
            have = version(req.name)
        except PackageNotFoundError:
            lines.append(f"{req.name}{req.specifier}{where}: missing ({install_command(req.name)})")
            continue
        ok = req.specifier.contains(have, prereleases=True)
        lines.append(f"{req.name}{req.specifier}{where}: {have}"
                     + ("" if ok else f" OUTSIDE {req.specifier}"))
    return lines


def size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return ""  # pragma: no cover


def packages_section() -> list[str]:
    from importlib.metadata import distribution

    from poot.versions import core_version, installed

    out = [f"poot {core_version()} (running from {Path(__import__('poot').__file__).parent})",
           "packages:"]
    found = installed()
    for name, ver in found.items():
        out.append(f"  {name} {ver}")
        out += [f"    {line}" for line in requirement_lines(distribution(name))]
    absent = [f"{b} ({p})" for b, p in BACKEND_PACKAGES.items() if p not in found]
    if absent:
        out.append(f"  backends not installed: {', '.join(absent)}; install one with "
                   f"pip install 'poot[NAME]'")
    return out


def backends_section() -> list[str]:
    from poot.cli.backends import software_note
    from poot.plugin import manager, probe, select_backend

    m = manager()
    out = ["backends:"]
    for b in sorted(m.backends().values(), key=lambda b: (-b.priority, b.name)):
        plugin = m.backend_plugins.get(b.name, "")
        out.append(f"  {b.name} (priority {b.priority}, {m.distributions.get(plugin, plugin)})")
        devices, why = probe(b)
        if not devices:
            out.append(f"    no device: {why}")
        for d in devices:
            out.append(f"    device {d}{software_note(b, d)}")
    for name, err in sorted(m.broken.items()):
        out.append(f"  plugin {name} failed to load: {err}")
    try:
        chosen, dev = select_backend()
        out.append(f"  `poot run` picks: {chosen.name} on {dev}")
    except Exception as exc:  # doctor reports, it does not stop
        out.append(f"  `poot run` picks nothing: {type(exc).__name__}: {exc}")
    return out


#: a C program that needs OpenMP's flag, header and runtime, and says how many threads ran
OPENMP_PROBE = """#include <omp.h>
#include <stdio.h>
int main(void) {
  int n = 0;
#pragma omp parallel
  {
#pragma omp atomic
    n++;
  }
  printf("%d", n);
  return n > 0 ? 0 : 1;
}
"""


def toolchain_section() -> list[str]:
    """The C compiler and OpenMP, which the cpu backend builds every plan with: the
    compiler's version, then a small OpenMP program compiled and run."""
    import shutil
    import subprocess
    import tempfile

    cc = os.environ.get("CC") or "gcc"
    path = shutil.which(cc)
    if path is None:
        return [f"C compiler: {cc!r} is not on PATH; the cpu backend needs gcc with OpenMP "
                f"(apt-get install gcc, or set $CC)"]
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
        version = (out.stdout.splitlines() or ["?"])[0].strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [f"C compiler: {path} does not run: {exc}"]
    lines = [f"C compiler: {version} ({path}{', from $CC' if 'CC' in os.environ else ''})"]
    with tempfile.TemporaryDirectory(prefix="poot-doctor-") as tmp:
        src, exe = Path(tmp) / "omp.c", Path(tmp) / "omp"
        src.write_text(OPENMP_PROBE)
        try:
            built = subprocess.run([path, "-fopenmp", str(src), "-o", str(exe)],
                                   capture_output=True, text=True, timeout=120)
            if built.returncode != 0:
                why = (built.stderr.strip().splitlines() or ["no message"])[-1]
                return lines + [f"OpenMP: {cc} -fopenmp fails ({why}); the cpu backend needs "
                                f"it (apt-get install gcc libgomp1)"]
            ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return lines + [f"OpenMP: the probe did not run: {exc}"]
    if ran.returncode != 0:
        return lines + [f"OpenMP: the probe built but failed (exit {ran.returncode}: "
                        f"{ran.stderr.strip()[-200:]})"]
    return lines + [f"OpenMP: works ({ran.stdout.strip()} threads; OMP_NUM_THREADS sets "
                    f"them)"]


def caches_section() -> list[str]:
    from poot.paths import cache_dir

    root = cache_dir()
    if not root.is_dir():
        return [f"cache {root}: not created yet"]
    subdirs = sorted(p for p in root.iterdir() if p.is_dir())
    out = [f"cache {root}: {human(size(root))}"]
    out += [f"  {p.name:12s} {human(size(p)):>10s}" for p in subdirs]
    return out


def hub_section() -> list[str]:
    """huggingface_hub's cache (where `poot pull ORG/NAME` puts models): its model repos."""
    from poot.errors import PootError
    from poot.models import hf_hub

    root = hf_hub.hub_cache()
    try:
        repos = hf_hub.cached_repos()
    except PootError as exc:  # huggingface_hub missing: doctor reports, it does not stop
        return [f"Hub cache {root}: not read ({exc})"]
    except Exception as exc:  # a cache huggingface_hub cannot scan
        return [f"Hub cache {root}: not read ({type(exc).__name__}: {exc})"]
    if not repos:
        return [f"Hub cache {root}: no models"]
    out = [f"Hub cache {root}: {human(sum(r.bytes for r in repos))} in {len(repos)} models"]
    out += [f"  {r.repo_id} ({', '.join(r.revisions)}) {human(r.bytes):>10s}" for r in repos]
    return out


def run(args) -> int:
    lines = [f"python {platform.python_version()} ({sys.executable}) on "
             f"{platform.platform()}"]
    lines += packages_section() + backends_section() + toolchain_section() + caches_section() \
        + hub_section()
    print("\n".join(lines))
    return 0
