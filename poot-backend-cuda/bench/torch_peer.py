"""A PyTorch peer for the SmolLM2 decode benchmark: the same forward written with PyTorch ops.

SmolLM2-135M's shape (30 layers, dim 576, 9 heads / 3 KV heads, head dim 64, FFN 1536,
vocab 49152, tied embeddings, RoPE base 100000, RMSNorm eps 1e-5; `--shape 8b` / `1b`: the
Llama-3 shapes of llama_gpu.py, the 8B's head untied), bf16 random weights, a
static KV cache (every step attends over the whole capacity under a causal mask, so shapes
never change), batch-1 greedy decode with the argmax on the device and the token read back
to the host every step (what a generation loop does). Timed: eager PyTorch, then
torch.compile(mode="reduce-overhead") (CUDA graphs), its compile time bounded and printed.
`--prefill T,...`: instead, eager prefill forwards of T tokens from position 0 (the
attention by F.scaled_dot_product_attention, causal: flash on a GPU; the K/V rows written
to the cache; the head on the last token), tok/s of the median of 5 timed forwards.

    python torch_peer.py                         # on a CUDA GPU, the SmolLM2 shape
    python torch_peer.py --tiny --device cpu     # anywhere: a small config, to check it runs
    python torch_peer.py --shape 8b --prefill 32,512   # eager prefill steps

Lines starting with "SUMMARY " are collected by h200_session.sh.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 49152
    dim: int = 576
    layers: int = 30
    heads: int = 9
    kv_heads: int = 3
    head_dim: int = 64
    ffn: int = 1536
    rope_base: float = 100000.0
    eps: float = 1e-5
    max_seq: int = 1024
    tied: bool = True


SMOLLM2 = Config()
TINY = Config(vocab=512, dim=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128,
              rope_base=10000.0, max_seq=64)
#: the real-size shapes of bench/llama_gpu.py (Llama-3-8B, untied; Llama-3.2-1B, tied)
SHAPES = {"smollm2": SMOLLM2, "tiny": TINY,
          "8b": Config(vocab=128256, dim=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
                       ffn=14336, rope_base=500000.0, tied=False),
          "1b": Config(vocab=128256, dim=2048, layers=16, heads=32, kv_heads=8, head_dim=64,
                       ffn=8192, rope_base=500000.0)}


def summary(key: str, value) -> None:
    print(f"SUMMARY {key} | {value}", flush=True)


class Peer(torch.nn.Module):
    """One decode step of a Llama-shaped model: (token [1], pos [1]) -> next token [1]."""

    def __init__(self, c: Config, device, dtype=torch.bfloat16, seed: int = 0):
        super().__init__()
        self.c = c
        # drawn where they live: an 8B model's 16 GB take minutes on a CPU, milliseconds here
        g = torch.Generator(device=device).manual_seed(seed)

        def w(*shape, std=0.02):
            return (torch.randn(*shape, generator=g, device=device) * std).to(dtype)

        hd, q, kv = c.head_dim, c.heads * c.head_dim, c.kv_heads * c.head_dim
        self.register_buffer("embed", w(c.vocab, c.dim))            # tied: also the output
        self.register_buffer("head", self.embed if c.tied else w(c.vocab, c.dim))
        self.register_buffer("norm", torch.ones(c.dim, device=device, dtype=dtype))
        names = ("attn_norm", "wq", "wk", "wv", "wo", "ffn_norm", "w_gate", "w_up", "w_down")
        for i in range(c.layers):
            shapes = ((c.dim,), (q, c.dim), (kv, c.dim), (kv, c.dim), (c.dim, q), (c.dim,),
                      (c.ffn, c.dim), (c.ffn, c.dim), (c.dim, c.ffn))
            for name, shape in zip(names, shapes, strict=True):
                t = torch.ones(shape, device=device, dtype=dtype) if len(shape) == 1 \
                    else w(*shape)
                self.register_buffer(f"{name}{i}", t)
            cache = (c.kv_heads, c.max_seq, hd)
            self.register_buffer(f"k{i}", torch.zeros(cache, device=device, dtype=dtype))
            self.register_buffer(f"v{i}", torch.zeros(cache, device=device, dtype=dtype))
        inv = 1.0 / (c.rope_base ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        ang = torch.arange(c.max_seq, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", ang.cos().to(device))             # [S, hd/2]
        self.register_buffer("sin", ang.sin().to(device))
        self.register_buffer("causal", torch.tril(torch.ones(c.max_seq, c.max_seq,
                                                             dtype=torch.bool)).to(device))

    def rms(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.c.eps)
        return xf.to(x.dtype) * weight

    def rope(self, x, cos, sin):
        """HF rotate-half RoPE on [..., hd] in f32."""
        half = x.shape[-1] // 2
        xf = x.float()
        a, b = xf[..., :half], xf[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1).to(x.dtype)

    def forward(self, tok, pos):
        c = self.c
        hd, group = c.head_dim, c.heads // c.kv_heads
        x = F.embedding(tok, self.embed)                                # [1, dim]
        cos, sin = self.cos[pos], self.sin[pos]                         # [1, hd/2]
        mask = self.causal[pos]                                         # [1, S]
        scale = 1.0 / math.sqrt(hd)
        for i in range(c.layers):
            h = self.rms(x, getattr(self, f"attn_norm{i}"))
            q = F.linear(h, getattr(self, f"wq{i}")).view(c.kv_heads, group, hd)
            k = F.linear(h, getattr(self, f"wk{i}")).view(c.kv_heads, 1, hd)
            v = F.linear(h, getattr(self, f"wv{i}")).view(c.kv_heads, 1, hd)
            q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
            kc, vc = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            kc.index_copy_(1, pos, k)                                   # static KV cache
            vc.index_copy_(1, pos, v)
            s = torch.matmul(q, kc.transpose(1, 2)).float() * scale     # [kv, group, S]
            s = s.masked_fill(~mask, float("-inf"))
            p = torch.softmax(s, -1).to(x.dtype)
            o = torch.matmul(p, vc).reshape(1, c.heads * hd)
            x = x + F.linear(o, getattr(self, f"wo{i}"))
            h = self.rms(x, getattr(self, f"ffn_norm{i}"))
            gate = F.silu(F.linear(h, getattr(self, f"w_gate{i}")))
            x = x + F.linear(gate * F.linear(h, getattr(self, f"w_up{i}")),
                             getattr(self, f"w_down{i}"))
        logits = F.linear(self.rms(x, self.norm), self.head)            # [1, vocab]
        return torch.argmax(logits, -1)                                 # [1]

    def prefill(self, toks):
        """A prefill forward of T tokens [T] from position 0: next token [1]."""
        c = self.c
        t, hd, group = toks.shape[0], c.head_dim, c.heads // c.kv_heads
        x = F.embedding(toks, self.embed)                               # [T, dim]
        cos, sin = self.cos[:t, None, :], self.sin[:t, None, :]         # [T, 1, hd/2]
        for i in range(c.layers):
            h = self.rms(x, getattr(self, f"attn_norm{i}"))
            q = self.rope(F.linear(h, getattr(self, f"wq{i}")).view(t, c.heads, hd), cos, sin)
            k = self.rope(F.linear(h, getattr(self, f"wk{i}")).view(t, c.kv_heads, hd),
                          cos, sin)
            v = F.linear(h, getattr(self, f"wv{i}")).view(t, c.kv_heads, hd)
            k, v = k.transpose(0, 1), v.transpose(0, 1)                 # [kv, T, hd]
            getattr(self, f"k{i}")[:, :t] = k
            getattr(self, f"v{i}")[:, :t] = v
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                is_causal=True)                                         # [heads, T, hd]
            x = x + F.linear(o.transpose(0, 1).reshape(t, c.heads * hd),
                             getattr(self, f"wo{i}"))
            h = self.rms(x, getattr(self, f"ffn_norm{i}"))
            gate = F.silu(F.linear(h, getattr(self, f"w_gate{i}")))
            x = x + F.linear(gate * F.linear(h, getattr(self, f"w_up{i}")),
                             getattr(self, f"w_down{i}"))
        logits = F.linear(self.rms(x[-1:], self.norm), self.head)      # [1, vocab]
        return torch.argmax(logits, -1)


def prefill(model, device, tokens: list[int], shape: str) -> None:
    """Eager prefill forwards of each of `tokens` tokens: tok/s of the median of 5."""
    for t in tokens:
        toks = (1234 + 7919 * torch.arange(t, device=device)) % model.c.vocab
        for _ in range(2):
            model.prefill(toks)                                         # warm-up
        times = []
        for _ in range(5):
            sync(device)
            t0 = time.perf_counter()
            model.prefill(toks)
            sync(device)
            times.append(time.perf_counter() - t0)
        secs = sorted(times)[2]
        print(f"eager prefill {t} tokens: {secs * 1e3:.2f} ms = {t / secs:.1f} tok/s",
              flush=True)
        summary(f"torch peer eager prefill {t} ({shape} shape)",
                f"{t / secs:.1f} tok/s ({secs * 1e3:.2f} ms a forward, SDPA)")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(step, device, steps: int, start: int = 0, mark=False) -> tuple[float, list[int]]:
    """Greedy decode `steps` tokens from token 1 at position `start`; each token read back
    to the host. Returns (seconds, tokens)."""
    tok = torch.tensor([1], device=device)
    pos = torch.tensor([start], device=device)
    out = []
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        if mark:
            torch.compiler.cudagraph_mark_step_begin()
        nxt = step(tok, pos)
        out.append(int(nxt[0]))                 # the host needs the token: a sync per step
        tok.copy_(nxt)
        pos.add_(1)
    sync(device)
    return time.perf_counter() - t0, out


class Graphed:
    """The eager step captured once in a CUDA graph (static token and position buffers)
    and replayed per call: launch overhead gone without torch.compile's minutes."""

    def __init__(self, model, device):
        self.tok = torch.ones(1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for _ in range(2):                  # warm-up off the capturing stream
                model(self.tok, self.pos)
        torch.cuda.current_stream(device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = model(self.tok, self.pos)

    def __call__(self, tok, pos):
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        self.graph.replay()
        return self.out


class _Timeout(Exception):
    pass


def timed_out(e: BaseException | None) -> bool:
    """Whether `e`, or an exception it was raised from, is the deadline's."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, _Timeout) or "_Timeout" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


@contextlib.contextmanager
def deadline(seconds: int):
    """Raise _Timeout in the main thread after `seconds`, and every 2 s after that until
    the block is left (0: no bound). The shell's `timeout` stays the hard bound."""
    if seconds <= 0 or not hasattr(signal, "SIGALRM"):
        yield
        return

    def fire(signum, frame):
        signal.alarm(2)   # again in 2 s if this one is swallowed by a broad `except` inside
        raise _Timeout(f"did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="a small config (checks on a CPU)")
    ap.add_argument("--shape", default="smollm2", choices=sorted(SHAPES),
                    help="the model shape (--tiny: 'tiny')")
    ap.add_argument("--steps", type=int, default=200, help="decode steps timed per mode")
    ap.add_argument("--compile-timeout", type=int, default=150,
                    help="seconds allowed for torch.compile's first calls (0: no bound)")
    ap.add_argument("--compile-mode", default="reduce-overhead")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--prefill", default="",
                    help="token counts of eager prefill forwards timed instead of decode")
    args = ap.parse_args()
    shape = "tiny" if args.tiny else args.shape
    c = SHAPES[shape]
    device = torch.device(args.device)
    steps = min(args.steps, c.max_seq - 8)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}; config {c}", flush=True)
    t0 = time.perf_counter()
    model = Peer(c, device)
    # weight bytes one step reads: all but the embedding table (one row), the tied head
    # reading it whole
    nbytes = sum(b.numel() * b.element_size() for n, b in model.named_buffers()
                 if not (n[0] in "kv" and n[1:].isdigit())
                 and n not in ("cos", "sin", "causal", "embed"))
    nbytes += model.embed.numel() * model.embed.element_size() if c.tied else 2 * c.dim
    print(f"weights {nbytes / 1e6:.1f} MB built in {time.perf_counter() - t0:.1f} s", flush=True)
    failed = False
    if args.prefill:
        with torch.no_grad():
            prefill(model, device, [int(t) for t in args.prefill.split(",")], shape)
        return 0
    with torch.no_grad():
        decode(model, device, 3)                                        # warm-up
        secs, eager_ids = decode(model, device, steps)
        eager = steps / secs
        print(f"eager: {steps} steps in {secs:.3f} s = {eager:.1f} tok/s "
              f"({nbytes / 1e9 * eager:.1f} GB/s of weights)", flush=True)
        summary(f"torch peer eager ({shape} shape)",
                f"{eager:.1f} tok/s")
        if device.type == "cuda":
            graphed = Graphed(model, device)
            decode(graphed, device, 3)
            secs, graph_ids = decode(graphed, device, steps)
            rate = steps / secs
            agree = sum(a == b for a, b in zip(eager_ids, graph_ids, strict=True))
            print(f"eager in a CUDA graph: {rate:.1f} tok/s ({nbytes / 1e9 * rate:.1f} GB/s "
                  f"of weights); greedy tokens equal to eager's: {agree}/{steps}", flush=True)
            summary(f"torch peer eager + CUDA graph ({shape} shape)",
                    f"{rate:.1f} tok/s ({nbytes / 1e9 * rate:.0f} GB/s)")
        if args.no_compile:
            return 0
        try:
            compiled = torch.compile(model, mode=args.compile_mode, fullgraph=True)
            mark = args.compile_mode == "reduce-overhead"
            t0 = time.perf_counter()
            with deadline(args.compile_timeout):
                decode(compiled, device, 3, mark=mark)  # compile, warm up, record graphs
            compile_s = time.perf_counter() - t0
            print(f"torch.compile(mode={args.compile_mode!r}): first 3 calls (compile + "
                  f"graph record) {compile_s:.1f} s", flush=True)
            secs, comp_ids = decode(compiled, device, steps, mark=mark)
            comp = steps / secs
            agree = sum(a == b for a, b in zip(eager_ids, comp_ids, strict=True))
            print(f"compiled: {steps} steps in {secs:.3f} s = {comp:.1f} tok/s "
                  f"({nbytes / 1e9 * comp:.1f} GB/s of weights); greedy tokens equal to "
                  f"eager's: {agree}/{steps}", flush=True)
            summary(f"torch peer compile {args.compile_mode} ({shape} shape)",
                    f"{comp:.1f} tok/s ({nbytes / 1e9 * comp:.0f} GB/s) "
                    f"(compile {compile_s:.0f} s)")
        except Exception as e:  # noqa: BLE001 - report, keep the eager number
            failed = True
            if timed_out(e):   # inductor may wrap the alarm's exception in its own
                print(f"torch.compile did not finish within {args.compile_timeout} s",
                      flush=True)
                summary(f"torch peer compile {args.compile_mode} ({shape} shape)",
                        f"TIMEOUT (> {args.compile_timeout} s compiling)")
            else:
                traceback.print_exc()
                summary(f"torch peer compile {args.compile_mode} ({shape} shape)",
                        f"FAILED {type(e).__name__}: {str(e)[:60]}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
