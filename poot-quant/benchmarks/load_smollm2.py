"""Load the SmolLM2 GGUF with poot_quant: load time and peak resident memory against the file
size, then the numpy reference decode of every weight, each against the `gguf` package doing
the same in this run.

    python poot-quant/benchmarks/load_smollm2.py [path/to/SmolLM2-135M-Instruct.Q4_1.gguf]

The path defaults to $POOT_SMOLLM2_GGUF, then ~/.cache/poot/models/. Each phase runs in a
fresh process, so every peak-memory figure is that phase's own.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# every phase imports poot_quant and gguf before its clock starts
PHASES = {
    "poot_quant open": "c = poot_quant.open_checkpoint(PATH)",
    "gguf.GGUFReader open": "r = gguf.GGUFReader(PATH); "
                            "md = {k: f.contents() for k, f in r.fields.items()}",
    "poot_quant open + decode all": "c = poot_quant.open_checkpoint(PATH)\n"
                                    "for t in c.tensors.values(): t.dequantize()",
    "gguf.GGUFReader + gguf.quants decode all":
        "r = gguf.GGUFReader(PATH)\n"
        "for t in r.tensors: gguf.quants.dequantize(t.data, t.tensor_type)",
}

CHILD = """
import json, sys, time
import gguf, gguf.quants, poot_quant
PATH = sys.argv[1]
t0 = time.perf_counter()
{body}
seconds = time.perf_counter() - t0
hwm = next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM'))
print(json.dumps({{"seconds": seconds, "peak_rss": hwm}}))
"""


def model_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    env = os.environ.get("POOT_SMOLLM2_GGUF")
    return Path(env) if env else Path.home() / ".cache/poot/models/SmolLM2-135M-Instruct.Q4_1.gguf"


def run_phase(body: str, path: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD.format(body=body), str(path)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline(path: Path) -> dict:
    """Interpreter + numpy + poot_quant imported, nothing opened: the floor of every phase."""
    return run_phase("pass", path)


def main() -> None:
    path = model_path()
    if not path.is_file():
        sys.exit(f"SmolLM2 GGUF not found at {path}")
    size = path.stat().st_size
    floor = baseline(path)
    print(f"file {path.name}: {size / 2**20:.1f} MiB")
    print(f"imports alone: peak RSS {floor['peak_rss'] / 2**20:.1f} MiB")
    t = time.perf_counter()
    results = {name: run_phase(body, path) for name, body in PHASES.items()}
    for name, r in results.items():
        extra = r["peak_rss"] - floor["peak_rss"]
        print(f"{name:44s} {r['seconds']:7.3f} s   peak RSS {r['peak_rss'] / 2**20:7.1f} MiB "
              f"({r['peak_rss'] / size:5.2f}x file; {extra / 2**20:+7.1f} MiB over imports)")
    a, b = results["poot_quant open"], results["gguf.GGUFReader open"]
    print(f"open: poot_quant is {b['seconds'] / a['seconds']:.1f}x faster than GGUFReader")
    a, b = results["poot_quant open + decode all"], \
        results["gguf.GGUFReader + gguf.quants decode all"]
    print(f"decode all: {b['seconds'] / a['seconds']:.2f}x the speed of gguf.quants "
          f"(total wall {time.perf_counter() - t:.1f} s)")


if __name__ == "__main__":
    main()
