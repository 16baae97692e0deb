"""Top-1 agreement on the shipped text: llama.cpp (its q8 activations, f16 KV) and poot `fast`
against poot `exact` on the cpu backend, the same 512-token windows (second halves scored).
Usage: LLAMA_CPP_LIB_PATH=... python top1_llama.py TOKENS
(llama-cpp-python importable; see smollm2_cpu.py for building it)."""
import sys
from pathlib import Path

import numpy as np
from llama_cpp import Llama

import poot
from poot.models.hub import resolve_model
from poot.models.perplexity import WindowRunner, scored, windows

path = str(resolve_model("smollm2", pull_missing=True))
W, N = 512, int(sys.argv[1])
text = open(Path(__file__).parents[2] / "tests/texts/areopagitica.txt").read()
m = poot.load(path, "cpu", max_seq=W)
fast = poot.load(path, "cpu", max_seq=W, precision="fast")
tok = m.tokenizer
ids = tok.encode_text(text)[:N] if hasattr(tok, "encode_text") else tok.encode(text)[:N]
cut = windows(ids, W, tok.bos_id if tok.add_bos else None)
rows = scored(W)
llm = Llama(path, n_ctx=W, n_batch=W, n_threads=2, logits_all=True, verbose=False)
ex, fx = WindowRunner(m, W), WindowRunner(fast, W)
agree = {"llama": 0, "fast": 0, "llama_vs_fast": 0}; n = 0
for w in cut:
    a = np.concatenate([l for _, l in ex.chunks(w, rows)])
    f = np.concatenate([l for _, l in fx.chunks(w, rows)])
    llm.reset(); llm.eval([int(t) for t in w])
    L = np.array(llm.scores[:len(w)])[rows]
    ta, tf, tl = a.argmax(-1), f.argmax(-1), L.argmax(-1)
    agree["llama"] += (ta == tl).sum(); agree["fast"] += (ta == tf).sum()
    agree["llama_vs_fast"] += (tl == tf).sum(); n += len(ta)
print(n, {k: round(100 * v / n, 2) for k, v in agree.items()})
