"""The install matrix: poot as a user gets it, from built wheels in fresh virtual environments.

1. Builds an sdist of every package from a copy of its folder, then its wheel from that sdist
   (so a file the sdist forgets breaks the wheel), in one build environment.
2. Checks the metadata: `twine check`, then names, one version for every package, the
   licence, the readme, the entry points and the poot-core range of each plugin.
3. Installs each combination into a fresh venv from those wheels (the poot packages) and PyPI
   (their dependencies, through pip's cache): every dependency is installed for real (no
   --no-deps, no shared site-packages, no checkout on sys.path), so a dependency a package
   forgets to declare fails here.
4. In each combination runs `poot --version`, `poot backends`, `poot info smollm2` and a
   4-token `poot run smollm2`, and checks each output, or the one-line error that names what
   to install. Any traceback fails the matrix.

Chains of combinations share a venv (core -> core + quant; cpu -> poot; cuda -> poot[all]):
installing more into a venv gives what a fresh install of the union gives. Two chains run
at once. Usage: python3 scripts/install_matrix.py [--keep DIR] (models must be pulled into
$POOT_CACHE first, as scripts/test.sh does).
"""
from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: folder -> distribution, in build order
PACKAGES = {"poot-core": "poot-core", "poot-quant": "poot-quant",
            "poot-backend-cpu": "poot-backend-cpu", "poot-backend-cuda": "poot-backend-cuda",
            "poot-backend-rocm": "poot-backend-rocm", "poot-backend-wgpu": "poot-backend-wgpu",
            "poot-backend-vulkan": "poot-backend-vulkan", "poot-meta": "poot"}
#: distribution -> the (group, name) of the entry point it declares (None: it declares none):
#: a backend in `poot.backends` (imported when asked for), other plugins in `poot`
ENTRY_POINTS = {"poot-core": None, "poot": None, "poot-quant": ("poot", "quant"),
                **{f"poot-backend-{b}": ("poot.backends", b)
                   for b in ("cpu", "cuda", "rocm", "wgpu", "vulkan")}}
PIP = [sys.executable, "-m", "pip"]
PROMPT = "The capital of France is"
NEEDS_MODELS = "pip install 'poot-core[models]'"


@dataclass
class Expect:
    """What one command must show: exit status 0, `out` in stdout and `err` in stderr, or
    exit status 2 and one line on stderr containing `error`."""
    out: tuple[str, ...] = ()
    err: tuple[str, ...] = ()
    error: str | None = None


@dataclass
class Combo:
    name: str
    install: list[str]                 # wheel names (distributions) and extras to install
    backends: Expect
    info: Expect
    run: Expect
    extra_checks: list[tuple[list[str], Expect]] = field(default_factory=list)


ANSWER = Expect(out=(PROMPT + " ",), err=("decode: 4 tokens",))  # the text, then the stats
INFO = Expect(out=("architecture llama", "weights total"))


def combos() -> list[list[Combo]]:
    """The chains of combinations; each chain shares one venv."""
    cant_run = Expect(error=NEEDS_MODELS)
    return [  # the longest chain first: two run at once
        [Combo("cuda alone", ["poot-backend-cuda"], Expect(out=("cuda (priority",)),
               cant_run, cant_run),
         Combo("everything: poot[all]", ["poot[all]"],
               Expect(out=tuple(f"{b} (priority" for b in
                                ("cuda", "rocm", "vulkan", "wgpu", "cpu", "reference"))),
               INFO, ANSWER, [(["doctor"], Expect(out=("packages:", "backends:", "cache ")))])],
        [Combo("core alone", ["poot-core"], Expect(out=("reference (priority 0",)),
               cant_run, cant_run),
         # SmolLM2's byte-level BPE vocabulary needs no `tokenizers` (poot.models.bpe)
         Combo("core + quant", ["poot-quant"], Expect(out=("reference (priority 0",)),
               INFO, ANSWER)],
        [Combo("cpu alone", ["poot-backend-cpu"], Expect(out=("cpu (priority", "device cpu:0")),
               cant_run, cant_run),
         Combo("poot (cpu)", ["poot"], Expect(out=("cpu (priority",)), INFO, ANSWER)],
        [Combo("wgpu alone", ["poot-backend-wgpu"], Expect(out=("wgpu (priority",)),
               cant_run, cant_run)],
        [Combo("vulkan alone", ["poot-backend-vulkan"], Expect(out=("vulkan (priority",)),
               cant_run, cant_run)],
        [Combo("rocm alone", ["poot-backend-rocm"], Expect(out=("rocm (priority",)),
               cant_run, cant_run)],
    ]


class Failed(Exception):
    pass


def sh(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def must(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    r = sh(cmd, **kw)
    if r.returncode != 0:
        raise Failed(f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


# -- 1. build ------------------------------------------------------------------------------------
def build(work: Path) -> Path:
    """sdist and wheel of every package into work/dist, two at a time; returns it. The
    build environment is made once (the packages' build requirement, setuptools>=77)."""
    env = work / "build-env"
    must([sys.executable, "-m", "venv", "--without-pip", str(env)])
    must(PIP + ["--python", str(env / "bin" / "python"), "install", "--quiet", "--no-compile",
                "setuptools>=77", "build>=1.2"])
    dist = work / "dist"

    def one(folder: str) -> None:
        src = work / "src" / folder
        shutil.copytree(ROOT / folder, src, symlinks=False, ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info", "build", "dist", "tests", "bench", "benchmarks"))
        # --skip-dependency-check: the build environment has them (one hook call fewer)
        must([str(env / "bin" / "python"), "-m", "build", "--no-isolation",
              "--skip-dependency-check", "--outdir", str(dist), str(src)])

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(one, PACKAGES))
    return dist


# -- 2. metadata --------------------------------------------------------------------------------
def check_metadata(dist: Path) -> None:
    must([sys.executable, "-m", "twine", "check", "--strict", *map(str, sorted(dist.iterdir()))])
    version = re.search(r'__version__ = "([^"]+)"',
                        (ROOT / "poot-core/src/poot/__init__.py").read_text()).group(1)
    wheels = sorted(dist.glob("*.whl"))
    if len(wheels) != len(PACKAGES) or len(list(dist.glob("*.tar.gz"))) != len(PACKAGES):
        raise Failed(f"expected a wheel and an sdist of each of {len(PACKAGES)} packages, got "
                     f"{sorted(p.name for p in dist.iterdir())}")
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            info = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = email.parser.Parser().parsestr(z.read(info).decode())
            eps = next((z.read(n).decode() for n in z.namelist()
                        if n.endswith(".dist-info/entry_points.txt")), "")
            licences = [n for n in z.namelist() if "/licenses/" in n]
        name = meta["Name"]
        problems = []
        if name not in ENTRY_POINTS:
            problems.append("an unknown name")
        if meta["Version"] != version:
            problems.append(f"version {meta['Version']}, not poot's {version}")
        if meta["License-Expression"] != "Apache-2.0" or not licences:
            problems.append("no Apache-2.0 licence expression and file")
        if meta["Description-Content-Type"] != "text/markdown" or len(meta.get_payload()) < 200:
            problems.append("no Markdown readme")
        if meta["Requires-Python"] != ">=3.11":
            problems.append(f"Requires-Python {meta['Requires-Python']}")
        want = ENTRY_POINTS.get(name)
        if want is not None and not re.search(
                rf"\[{re.escape(want[0])}\]\s*\n{want[1]}\s*=", eps):
            problems.append(f"no `{want[0]}` entry point {want[1]!r}")
        if name == "poot-core" and "poot = poot.cli:main" not in eps:
            problems.append("no `poot` command")
        requires = meta.get_all("Requires-Dist") or []
        core = [r for r in requires if r.startswith("poot-core") and "extra" not in r]
        if name not in ("poot-core", "poot") and not any("<" in r for r in core):
            problems.append(f"no poot-core range in {core}")
        if problems:
            raise Failed(f"{whl.name}: {'; '.join(problems)}")
    print(f"metadata: {len(wheels)} wheels and sdists pass twine check; one version {version}, "
          f"Apache-2.0, Markdown readmes, entry points, poot-core ranges", flush=True)


# -- 3. installing ------------------------------------------------------------------------------
def wheel_of(dist: Path, requirement: str) -> str:
    """`poot[all]` -> '/.../poot-0.1.0-py3-none-any.whl[all]'."""
    name, _, extras = requirement.partition("[")  # extras keeps its closing bracket
    found = list(dist.glob(f"{name.replace('-', '_')}-*.whl"))
    if len(found) != 1:
        raise Failed(f"no single wheel of {name} in {dist}: {found}")
    return f"{found[0]}[{extras}" if extras else str(found[0])


# -- 4. the combinations ------------------------------------------------------------------------
def check(label: str, r: subprocess.CompletedProcess, want: Expect) -> str:
    text = r.stdout + r.stderr
    if "Traceback (most recent call last)" in text:
        raise Failed(f"{label}: a traceback\n{text}")
    if want.error is not None:
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        if r.returncode != 2 or len(lines) != 1 or not lines[0].startswith("poot: error:") \
                or want.error not in lines[0]:
            raise Failed(f"{label}: wanted exit 2 and one line naming {want.error!r}, got "
                         f"exit {r.returncode}:\n{text}")
        return lines[0]
    if r.returncode != 0 or not all(s in r.stdout for s in want.out) \
            or not all(s in r.stderr for s in want.err):
        raise Failed(f"{label}: wanted exit 0, {want.out} in its output and {want.err} on "
                     f"stderr, got exit {r.returncode}:\n{text}")
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""


def run_chain(work: Path, dist: Path, chain: list[Combo]) -> list[str]:
    venv = work / "venvs" / re.sub(r"\W+", "-", chain[0].name)
    must([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py, poot = venv / "bin" / "python", venv / "bin" / "poot"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    cwd = work / "venvs"  # never the checkout
    log = []
    for combo in chain:
        t0 = time.perf_counter()
        # --no-compile: byte-compiling every installed file is most of an install's CPU;
        # what a command imports is compiled when it runs
        must(PIP + ["--python", str(py), "install", "--quiet", "--no-compile", "--find-links",
                    str(dist), *[wheel_of(dist, r) for r in combo.install]], env=env)
        where = must([str(py), "-c", "import poot; print(poot.__file__)"], env=env,
                     cwd=cwd).stdout.strip()
        if not where.startswith(str(venv)):
            raise Failed(f"{combo.name}: poot imported from {where}, not the venv")
        t1 = time.perf_counter()
        version = check(f"{combo.name}: poot --version", sh([str(poot), "--version"], env=env,
                                                             cwd=cwd), Expect(out=("poot-core",)))
        steps = [(["backends"], combo.backends), (["info", "smollm2"], combo.info),
                 (["run", "smollm2", "--prompt", PROMPT, "--max-tokens", "4"], combo.run),
                 *combo.extra_checks]
        seen = []
        for args, want in steps:
            r = sh([str(poot), *args], env=env, cwd=cwd, timeout=600)
            seen.append(f"    poot {args[0]}: {check(f'{combo.name}: poot {args[0]}', r, want)}")
        log.append(f"{combo.name}: install {t1 - t0:.0f} s, commands "
                   f"{time.perf_counter() - t1:.0f} s; {version}\n" + "\n".join(seen))
        print(log[-1], flush=True)
    return log


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    if args.keep:
        shutil.rmtree(args.keep, ignore_errors=True)
        args.keep.mkdir(parents=True)
    work = args.keep or Path(tempfile.mkdtemp(prefix="poot-matrix-"))
    try:
        dist = build(work)
        t_build = time.perf_counter()
        check_metadata(dist)
        print(f"built {len(PACKAGES)} wheels and sdists in {t_build - t0:.0f} s", flush=True)
        chains = combos()
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda c: run_chain(work, dist, c), chains))
    except Failed as exc:
        print(f"install matrix FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    n = sum(len(c) for c in chains)
    print(f"install matrix: {n} combinations passed in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
