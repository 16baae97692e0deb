"""Mutation fuzzing of everything that turns a file into a model, through a fork server.

    python3 tests/fuzz/fuzz.py --inputs 10000            # the long run (docs/reliability.md)
    python3 tests/fuzz/fuzz.py --inputs 200 --targets ir # a short run of one target
    python3 tests/fuzz/fuzz.py --targets gguf --replay 1234   # input 1234 again, in-process

Targets (each mutates the small valid inputs of seeds.py, structure-aware and byte-wise):
  gguf         a GGUF file: metadata values re-typed, re-sized, nested, dropped; tensors
               dropped or re-shaped; header bytes flipped, overwritten, cut
  safetensors  an HF folder's model.safetensors: its JSON header's entries and bytes
  hf           an HF folder's side files: config.json, tokenizer.json, tokenizer_config.json,
               generation_config.json, the shard index, chat_template.jinja
  ir           the text form of graphs (poot.ir.parse)

The parent imports poot once, builds the seeds, runs each target once on its seed, then forks
one child per input (copy-on-write: a few ms, not a fresh interpreter). A child limits its
address space (--memory-mb above what the parent had mapped) and is killed after --timeout
seconds. Outcomes: ok (accepted), typed (a PootError), untyped (any other exception, or a
signal), timeout, memory (MemoryError). Inputs are a pure function of (--seed, target, index),
so any input can be replayed. The exit status is 1 when anything but ok/typed happened.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

# before numpy/tokenizers start threads that a fork would copy mid-lock
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
os.environ["TOKENIZERS_PARALLELISM"] = "false"

sys.path.insert(0, str(Path(__file__).parent))
import numpy as np  # noqa: E402
import seeds  # noqa: E402

OUTCOMES = ("ok", "typed", "untyped", "timeout", "memory")
_EXIT = {"ok": 0, "typed": 10, "untyped": 11, "memory": 12}


# -- hostile values --------------------------------------------------------------------------
INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 8, 255, 256, 65535, 1 << 16, (1 << 31) - 1, 1 << 31,
                    (1 << 32) - 1, 1 << 32, 1 << 40, 10**9, (1 << 63) - 1, 1 << 63,
                    (1 << 64) - 1]
TEXTS = ["", "x", "llama", "gpt2", "../x", "/etc/passwd", "a b", "\u2581", "<|im_end|>",
         "{{ x }}", "{% for %}", "%", "\x00", "é" * 50, "x" * 5000]


def hostile_json(rng: random.Random, depth: int = 0):
    """A JSON value chosen to hurt: wrong types, extremes, deep nesting, bad paths."""
    r = rng.random()
    if r < 0.2:
        return rng.choice(INTERESTING_INTS) * rng.choice([1, -1])
    if r < 0.3:
        return rng.choice([0.0, -0.5, 1e-300, 1e308, 2.5, float("inf"), float("-inf"),
                           float("nan")])
    if r < 0.45:
        return rng.choice(TEXTS)
    if r < 0.55:
        return rng.choice([None, True, False])
    if r < 0.7 and depth < 3:
        return [hostile_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if r < 0.8 and depth < 3:
        return {rng.choice(TEXTS): hostile_json(rng, depth + 1) for _ in range(rng.randint(0, 3))}
    if r < 0.9:
        return DEEP  # replaced by deeply nested text after dumping
    return rng.choice([[], {}, [None], {"a": None}])


DEEP = "\x01DEEP\x01"


def dump_json(value, rng: random.Random) -> bytes:
    text = json.dumps(value)
    while json.dumps(DEEP) in text:
        d = rng.choice([65, 500, 5000, 200_000])
        o, c = rng.choice([("[", "]"), ('{"a":', "}")])
        text = text.replace(json.dumps(DEEP), o * d + "1" + c * d, 1)
    return text.encode()


def mutate_json(value, rng: random.Random):
    """A copy of `value` with one to three nodes replaced, deleted or added."""
    value = json.loads(json.dumps(value))
    for _ in range(rng.randint(1, 3)):
        parent, key = None, None
        node = value
        for _step in range(rng.randint(0, 4)):  # walk down a random path
            if isinstance(node, dict) and node:
                parent, key = node, rng.choice(list(node))
            elif isinstance(node, list) and node:
                parent, key = node, rng.randrange(len(node))
            else:
                break
            node = parent[key]
        if parent is None:
            if isinstance(value, dict) and value and rng.random() < 0.7:
                parent, key = value, rng.choice(list(value))
            else:
                return hostile_json(rng) if rng.random() < 0.3 else value
        op = rng.random()
        if op < 0.7:
            parent[key] = hostile_json(rng)
        elif op < 0.85:
            del parent[key]
        elif isinstance(parent, dict):
            parent[rng.choice(TEXTS)] = hostile_json(rng)
        else:
            parent.insert(key, hostile_json(rng))
    return value


def mutate_bytes(data: bytes, rng: random.Random, hot: int | None = None) -> bytes:
    """Flips, overwrites with interesting integers, inserts, deletes, duplicates, truncates;
    offsets biased into the first `hot` bytes (a header) where given."""
    b = bytearray(data)

    def at() -> int:
        span = min(len(b), hot) if hot and rng.random() < 0.8 else len(b)
        return rng.randrange(max(span, 1))

    for _ in range(rng.randint(1, 4)):
        if not b:
            b += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
            continue
        op = rng.random()
        i = at()
        if op < 0.3:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.45:
            b[i] = rng.randrange(256)
        elif op < 0.7:
            size = rng.choice([1, 2, 4, 8])
            v = rng.choice(INTERESTING_INTS) % (1 << (8 * size))
            b[i:i + size] = v.to_bytes(size, "little")
        elif op < 0.8:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op < 0.9:
            del b[i:i + rng.randint(1, 16)]
        elif op < 0.95:
            j = at()
            b[i:i] = b[j:j + rng.randint(1, 32)]
        else:
            del b[i:]
    return bytes(b)


# -- targets ---------------------------------------------------------------------------------
class Target:
    name = ""

    def prepare(self, work: Path) -> None:
        """Build the seed(s) once, in the parent."""

    def make(self, rng: random.Random, into: Path) -> Path:
        """Write one mutated input under `into`; the path to run on."""
        raise NotImplementedError

    def run(self, path: Path) -> None:
        raise NotImplementedError


def _open_and_trace(path: Path) -> None:
    """What `poot run` does with a checkpoint before its first step."""
    from poot.models.chat import render_chat_for
    from poot.models.llama import build_decoder
    from poot.models.loader import open_model
    from poot.models.tokenizer import Tokenizer
    from poot.models.weights import CheckpointWeights

    ckpt, config = open_model(str(path), max_seq=16)
    tok = Tokenizer.from_gguf_metadata(ckpt.metadata, str(path)) if ckpt.kind == "gguf" \
        else Tokenizer.from_hf_folder(ckpt.path)
    if tok.chat_template:
        text = render_chat_for(tok, [{"role": "user", "content": "the cat in 12"}])
    else:
        text = "the cat in 12"
    tok.decode(tok.encode(text))
    if tok.vocab_size <= config.vocab:
        build_decoder(config, CheckpointWeights(ckpt), tokens=1)


class GGUFTarget(Target):
    name = "gguf"

    def prepare(self, work: Path) -> None:
        self.kvs = seeds.llama_kvs()
        self.tensors = seeds.llama_tensors(len(seeds.byte_vocab()[0]))
        self.seed = seeds.gguf_bytes(self.kvs, self.tensors)
        self.header = self.seed.index(b"\0" * 16)  # roughly where the tensor data starts

    def hostile_kv(self, rng: random.Random):
        t = rng.random()
        if t < 0.35:
            vtype = rng.choice([seeds.U8, seeds.I8, seeds.U16, seeds.I16, seeds.U32, seeds.I32,
                                seeds.U64, seeds.I64])
            bits = {0: 8, 1: 8, 2: 16, 3: 16, 4: 32, 5: 32, 10: 64, 11: 64}[vtype]
            v = rng.choice(INTERESTING_INTS) % (1 << bits)
            if vtype in (seeds.I8, seeds.I16, seeds.I32, seeds.I64) and v >= 1 << (bits - 1):
                v -= 1 << bits
            return vtype, v
        if t < 0.5:
            return rng.choice([seeds.F32, seeds.F64]), rng.choice(
                [0.0, -1.0, 2.5, 1e30, float("inf"), float("nan"), 1e-40])
        if t < 0.6:
            return seeds.BOOL, rng.random() < 0.5
        if t < 0.7:
            return seeds.STRING, rng.choice(TEXTS)
        if t < 0.8:
            etype = rng.choice([seeds.STRING, seeds.U32, seeds.I32, seeds.F32, seeds.BOOL])
            n = rng.choice([0, 1, 2, 5, 263, 300])
            items = [rng.choice(TEXTS) if etype == seeds.STRING else
                     (rng.random() < 0.5 if etype == seeds.BOOL else
                      (float(rng.choice(INTERESTING_INTS[:12])) if etype == seeds.F32
                       else abs(rng.choice(INTERESTING_INTS[:12])))) for _ in range(n)]
            return seeds.ARRAY, (etype, items)
        depth = rng.choice([1, 2, 8, 9, 50, 3000])
        return seeds.ARRAY, struct.pack("<IQ", seeds.ARRAY, 1) * (depth - 1) + \
            struct.pack("<IQi", seeds.I32, 1, 7)

    def make(self, rng: random.Random, into: Path) -> Path:
        path = into / "m.gguf"
        mode = rng.random()
        if mode < 0.45:
            data = self.seed
        else:
            kvs, tensors = list(self.kvs), dict(self.tensors)
            for _ in range(rng.randint(1, 3)):
                op = rng.random()
                i = rng.randrange(len(kvs))
                if op < 0.6:
                    kvs[i] = (kvs[i][0], *self.hostile_kv(rng))
                elif op < 0.7:
                    del kvs[i]
                elif op < 0.8:
                    kvs.append((rng.choice(["llama.attention.key_length", "llama.vocab_size",
                                            "llama.rope.scaling.type", "general.alignment",
                                            "llama.rope.scaling.factor", "tokenizer.ggml.scores",
                                            "tokenizer.ggml.unknown_token_id", kvs[i][0]]),
                                *self.hostile_kv(rng)))
                elif op < 0.9:
                    name = rng.choice(list(tensors))
                    del tensors[name]
                else:
                    name = rng.choice(list(tensors))
                    shape = [max(1, d + rng.choice([-8, -1, 1, 8, 16])) for d in
                             tensors[name].shape]
                    if rng.random() < 0.3:
                        name = f"blk.{rng.choice([2, 7, 99])}.attn_q.weight"
                    tensors[name] = np.zeros(shape, np.float32)
            data = seeds.gguf_bytes(kvs, tensors)
            if mode < 0.8:
                path.write_bytes(data)
                return path
        path.write_bytes(mutate_bytes(data, rng, hot=self.header))
        return path

    def run(self, path: Path) -> None:
        from poot.models.gguf_meta import read_gguf_metadata

        read_gguf_metadata(path)
        _open_and_trace(path)


class SafetensorsTarget(Target):
    name = "safetensors"

    def prepare(self, work: Path) -> None:
        self.folder = seeds.tiny_hf_folder(work / "st-seed", shards=1)
        data = (self.folder / "model.safetensors").read_bytes()
        (n,) = struct.unpack("<Q", data[:8])
        self.header, self.body = json.loads(data[8:8 + n]), data[8 + n:]

    def make(self, rng: random.Random, into: Path) -> Path:
        folder = into / "st"
        _link_folder(self.folder, folder, skip={"model.safetensors"})
        mode = rng.random()
        if mode < 0.6:
            header = dict(self.header)
            for _ in range(rng.randint(1, 3)):
                if not header:
                    break
                name = rng.choice(list(header))
                entry = header[name]
                if isinstance(entry, dict) and rng.random() < 0.8:
                    field = rng.choice(["dtype", "shape", "data_offsets"])
                    entry = dict(entry)
                    choices = {"dtype": ["F16", "BF16", "I8", "U8", "F64", "F8_E4M3", 7, None],
                               "shape": [[], [0], [-1, 16], [1 << 40, 1 << 40], [16.5],
                                         ["16"], [263, 16, 1], [16, 263]],
                               "data_offsets": [[0, 0], [1, 0], [0, 1 << 62], [-5, 3], [0],
                                                [0, 1, 2], ["0", "4"]]}[field]
                    entry[field] = rng.choice(choices) if rng.random() < 0.7 \
                        else hostile_json(rng)
                    header[name] = entry
                else:
                    header = mutate_json(header, rng)
                    if not isinstance(header, dict):
                        break
            text = dump_json(header, rng)
            data = struct.pack("<Q", len(text)) + text + self.body
        else:
            text = json.dumps(self.header).encode()
            data = struct.pack("<Q", len(text)) + text + self.body
            data = mutate_bytes(data, rng, hot=8 + len(text))
        (folder / "model.safetensors").write_bytes(data)
        return folder

    def run(self, path: Path) -> None:
        _open_and_trace(path)


SIDE_FILES = ["config.json", "tokenizer_config.json", "generation_config.json",
              "model.safetensors.index.json", "tokenizer.json", "chat_template.jinja"]


class HFTarget(Target):
    name = "hf"

    def prepare(self, work: Path) -> None:
        self.folder = seeds.tiny_hf_folder(work / "hf-seed", shards=2)
        (self.folder / "chat_template.jinja").write_text(seeds.CHAT_TEMPLATE)
        self.json = {n: json.loads((self.folder / n).read_text()) for n in SIDE_FILES
                     if n.endswith(".json")}

    def make(self, rng: random.Random, into: Path) -> Path:
        folder = into / "hf"
        names = rng.sample(SIDE_FILES, rng.choice([1, 1, 1, 2]))
        _link_folder(self.folder, folder, skip=set(names))
        for name in names:
            src = (self.folder / name).read_bytes()
            if name.endswith(".json") and rng.random() < 0.75:
                value = self.json[name]
                if name == "tokenizer_config.json" and rng.random() < 0.3:
                    value = {k: v for k, v in value.items() if k != "chat_template"}
                data = dump_json(mutate_json(value, rng), rng)
            else:
                data = mutate_bytes(src, rng)
            (folder / name).write_bytes(data)
        return folder

    def run(self, path: Path) -> None:
        _open_and_trace(path)


class IRTarget(Target):
    name = "ir"

    def prepare(self, work: Path) -> None:
        self.texts = seeds.ir_texts()
        self.lines = sorted({ln for t in self.texts for ln in t.splitlines()})

    def make(self, rng: random.Random, into: Path) -> Path:
        import re

        lines = rng.choice(self.texts).splitlines()
        for _ in range(rng.randint(1, 4)):
            op = rng.random()
            i = rng.randrange(len(lines))
            if op < 0.15:
                del lines[i]
            elif op < 0.3:
                lines.insert(i, rng.choice(self.lines))
            elif op < 0.55:  # a number (an id, a dim, a parameter) made extreme
                nums = list(re.finditer(r"-?\d+", lines[i]))
                if nums:
                    m = rng.choice(nums)
                    v = str(rng.choice(INTERESTING_INTS + [10**30, -(10**9)]))
                    lines[i] = lines[i][:m.start()] + v + lines[i][m.end():]
            elif op < 0.7:  # a word replaced by another word of the texts
                words = re.findall(r"[A-Za-z_]+", " ".join(self.lines))
                found = list(re.finditer(r"[A-Za-z_]+", lines[i]))
                if found:
                    m = rng.choice(found)
                    lines[i] = lines[i][:m.start()] + rng.choice(words) + lines[i][m.end():]
            elif op < 0.8:  # regions nested deep
                k = rng.choice([2, 40, 1000])
                lines[i:i] = ["region(", "%0: f32[4] = param", ") {",
                              "%1: f32[4] = Fused{eqns=1} %0"] * k
                lines[i + 4 * k:i + 4 * k] = ["} -> result %1"] * k
            elif op < 0.9:  # brackets, quotes, separators, deep literals
                junk = rng.choice(["(", ")", "{", "}", "[", "]", "'", '"', ",", ";", "=", "%",
                                   "(" * 500, "[" * 5000, "((1," * 300, ":f32", "\\"])
                j = rng.randrange(len(lines[i]) + 1)
                lines[i] = lines[i][:j] + junk + lines[i][j:]
            else:
                lines[i] = mutate_bytes(lines[i].encode(), rng).decode("utf-8", "replace")
        path = into / "g.txt"
        path.write_text("\n".join(lines))
        return path

    def run(self, path: Path) -> None:
        from poot.ir.parse import parse

        g = parse(path.read_text())
        parse(str(g))


TARGETS = {t.name: t for t in (GGUFTarget(), SafetensorsTarget(), HFTarget(), IRTarget())}


def _link_folder(src: Path, dst: Path, skip: set[str]) -> None:
    """A copy of a seed folder made of hard links, without the files in `skip`."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in skip:
            os.link(f, dst / f.name)


# -- the fork server -------------------------------------------------------------------------
def classify(exc: BaseException) -> str:
    from poot.errors import PootError

    if isinstance(exc, MemoryError):
        return "memory"
    return "typed" if isinstance(exc, PootError) else "untyped"


def _mapped_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


def _child(target: Target, path: Path, memory: int, report: Path) -> None:
    """Run one input; never returns (os._exit with the outcome's code)."""
    code = _EXIT["untyped"]
    try:
        limit = _mapped_bytes() + memory
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            target.run(path)
            code = _EXIT["ok"]
        except BaseException as exc:  # noqa: BLE001 - the point is to see every kind
            kind = classify(exc)
            code = _EXIT[kind]
            if kind != "typed":
                frames = traceback.extract_tb(exc.__traceback__)
                where = next((f"{Path(f.filename).name}:{f.lineno} {f.name}"
                              for f in reversed(frames) if "poot" in f.filename),
                             f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?")
                report.write_text(json.dumps({
                    "type": type(exc).__name__, "message": str(exc)[:300], "where": where}))
    finally:
        os._exit(code)


def fuzz(target: Target, inputs: int, seed: int, workers: int, timeout: float, memory: int,
         save: Path | None, start: int = 0) -> dict:
    scratch = Path(tempfile.mkdtemp(prefix=f"poot-fuzz-{target.name}-"))
    counts: Counter = Counter()
    problems: dict[tuple, dict] = {}
    running: dict[int, tuple[int, float, Path]] = {}  # pid -> (index, deadline, dir)
    free = [scratch / f"w{i}" for i in range(workers)]
    nxt, t0 = start, time.perf_counter()

    def finish(pid: int, status: int | None, timed_out: bool) -> None:
        index, _, wdir = running.pop(pid)
        report = wdir / "report.json"
        if timed_out:
            kind, detail = "timeout", {"type": "timeout", "message": f">{timeout} s", "where": ""}
        elif os.WIFSIGNALED(status):
            sig = signal.Signals(os.WTERMSIG(status)).name
            kind, detail = "untyped", {"type": sig, "message": "killed by a signal", "where": ""}
        else:
            code = os.WEXITSTATUS(status)
            kind = {v: k for k, v in _EXIT.items()}.get(code, "untyped")
            detail = json.loads(report.read_text()) if report.is_file() else \
                {"type": f"exit {code}", "message": "", "where": ""}
        counts[kind] += 1
        if kind not in ("ok", "typed"):
            key = (kind, detail["type"], detail["where"])
            entry = problems.setdefault(key, {**detail, "kind": kind, "count": 0,
                                              "first_input": index})
            entry["count"] += 1
            if save is not None and entry["count"] == 1:
                dest = save / target.name / f"{index}"
                shutil.copytree(wdir / "in", dest, dirs_exist_ok=True)
        shutil.rmtree(wdir, ignore_errors=True)
        free.append(wdir)

    while nxt < start + inputs or running:
        while free and nxt < start + inputs:
            wdir = free.pop()
            (wdir / "in").mkdir(parents=True)
            path = target.make(random.Random(f"{seed}:{target.name}:{nxt}"), wdir / "in")
            pid = os.fork()
            if pid == 0:
                _child(target, path, memory, wdir / "report.json")
            running[pid] = (nxt, time.monotonic() + timeout, wdir)
            nxt += 1
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid:
            finish(pid, status, False)
            continue
        now = time.monotonic()
        for p, (_, deadline, _) in list(running.items()):
            if now > deadline:
                os.kill(p, signal.SIGKILL)
                os.waitpid(p, 0)
                finish(p, None, True)
        time.sleep(0.0005)
    shutil.rmtree(scratch, ignore_errors=True)
    return {"target": target.name, "inputs": inputs, "seconds": round(time.perf_counter() - t0, 1),
            **{k: counts[k] for k in OUTCOMES},
            "problems": sorted(problems.values(), key=lambda e: -e["count"])}


def replay(target: Target, seed: int, index: int) -> None:
    """Make input `index` again and run it in this process, showing any traceback."""
    where = Path(tempfile.mkdtemp(prefix="poot-replay-"))
    path = target.make(random.Random(f"{seed}:{target.name}:{index}"), where)
    print(f"input {index} of {target.name}: {path}")
    try:
        target.run(path)
        print("ok")
    except BaseException as exc:  # noqa: BLE001
        print(classify(exc))
        traceback.print_exc()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default=",".join(TARGETS))
    ap.add_argument("--inputs", type=int, default=300, help="inputs per target")
    ap.add_argument("--start", type=int, default=0, help="index of the first input")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=10.0, help="seconds per input")
    ap.add_argument("--memory-mb", type=int, default=1024,
                    help="address space a child may map beyond the parent's")
    ap.add_argument("--save", type=Path, default=None, help="keep the first input of each "
                    "problem here")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--replay", type=int, default=None, help="run one input in-process")
    args = ap.parse_args(argv)
    names = [n for n in args.targets.split(",") if n]
    unknown = set(names) - set(TARGETS)
    if unknown:
        ap.error(f"unknown targets {sorted(unknown)}; known: {', '.join(TARGETS)}")
    work = Path(tempfile.mkdtemp(prefix="poot-fuzz-seeds-"))
    results = []
    try:
        for name in names:
            target = TARGETS[name]
            target.prepare(work)
            if args.replay is not None:
                replay(target, args.seed, args.replay)
                continue
            target.run(_seed_path(target, work))  # the seed itself must load; warms caches
            r = fuzz(target, args.inputs, args.seed, args.workers, args.timeout,
                     args.memory_mb << 20, args.save, args.start)
            results.append(r)
            print(f"{name:12s} {r['inputs']:6d} inputs in {r['seconds']:7.1f} s: " +
                  ", ".join(f"{k} {r[k]}" for k in OUTCOMES), flush=True)
            for p in r["problems"][:20]:
                print(f"    {p['count']:5d} x {p['kind']} {p['type']} at {p['where']}: "
                      f"{p['message'][:160]} (first: input {p['first_input']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    bad = sum(r[k] for r in results for k in ("untyped", "timeout", "memory"))
    return 1 if bad else 0


def _seed_path(target: Target, work: Path) -> Path:
    """The unmutated seed of a target, written out (so that run() warms every cache)."""
    if isinstance(target, GGUFTarget):
        return seeds.write_gguf(work / "seed.gguf", target.kvs, target.tensors)
    if isinstance(target, (SafetensorsTarget, HFTarget)):
        return target.folder
    path = work / "seed.txt"
    path.write_text(target.texts[-1])
    return path


if __name__ == "__main__":
    sys.exit(main())
