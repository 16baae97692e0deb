"""`poot run MODEL`: with `--prompt` (or a prompt piped on stdin), stream one generation,
then tokens/s for prefill and decode; on a terminal without one, an interactive chat
(poot.cli.chat). Every flag is checked before the model loads."""
from __future__ import annotations

import sys

#: answer length of a prompt run that names no --max-tokens (a chat's answer runs to its
#: end-of-sequence token or the end of the context)
PROMPT_MAX_TOKENS = 64


def add_parser(sub):
    from poot.cli import MODEL_HELP

    p = sub.add_parser("run", help="generate text from a model, or chat with it (smollm2, a "
                       ".gguf, an HF folder)",
                       description="Generate from --prompt (or a prompt piped on stdin); "
                       "without one on a terminal, chat: type a message, /bye to leave.")
    p.add_argument("model", help=MODEL_HELP)
    p.add_argument("--prompt", default=None,
                   help="the prompt text (default: read stdin when it is not a terminal, "
                        "else chat interactively)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt in the model's chat template")
    p.add_argument("--system", default=None, metavar="TEXT",
                   help="a system prompt (a chat, or --prompt through the chat template)")
    p.add_argument("--image", action="append", default=[], metavar="PATH",
                   help="an image for a vision-language model, before the prompt's text "
                        "(repeatable; implies --chat)")
    p.add_argument("--mmproj", default=None, metavar="FILE",
                   help="the vision projector GGUF of a GGUF language model (llama.cpp's "
                        "mmproj: Gemma 3, Idefics3 / SmolVLM, Qwen2-VL or Qwen2.5-VL), for "
                        "--image")
    p.add_argument("--backend", default=None,
                   help="backend name (default: the best available; `poot backends` marks it)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help=f"the most tokens to generate (default: {PROMPT_MAX_TOKENS} for a "
                        f"prompt, the rest of the context for a chat answer)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k best (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="sample among the best holding this much probability (1 = off)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="1 = off")
    p.add_argument("--seed", type=int, default=None,
                   help="the sampler's seed (same seed and settings: same text on every "
                        "backend; default: a random one)")
    p.add_argument("--host-sampling", action="store_true",
                   help="read the logits back and sample on the host (default: decode steps "
                        "sample in the graph and read back only the token id)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--kv", choices=("dense", "paged"), default="dense",
                   help="the KV cache's form")
    p.add_argument("--max-seq", type=int, default=1024,
                   help="KV capacity in positions: prompt and answer together")
    p.add_argument("--lora", default=None, metavar="PATH",
                   help="generate through this PEFT LoRA adapter (a folder with "
                        "adapter_config.json and adapter_model.safetensors)")
    p.add_argument("--expert-pool", type=int, default=None, metavar="N",
                   help="keep N experts per MoE layer on the device, paging the rest in "
                        "as routing asks (default: every expert resident)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress lines on stderr (the closing tokens/s line and the notes "
                        "stay)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (one per GPU)")
    add_speculate_args(p)
    add_precision_args(p)


def add_speculate_args(p) -> None:
    """--speculate and --draft-tokens (poot.models.speculate)."""
    from poot.models.speculate import DRAFT_TOKENS

    p.add_argument("--speculate", default=None, metavar="lookup|draft:MODEL|self:N",
                   help="speculative decoding: propose tokens by prompt lookup (n-grams of "
                        "the prompt and answer), by a draft MODEL sharing the tokenizer, or "
                        "by the model's own first N layers, and verify them in one step "
                        "(greedy text is unchanged)")
    p.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                   help=f"the most tokens proposed per step (default {DRAFT_TOKENS}; each "
                        f"step picks fewer from the measured acceptance, none where "
                        f"proposals fail)")


def add_precision_args(p) -> None:
    """--precision and --kv-dtype (run and serve; docs/ir.md section 15). Their values are
    checked by poot.load, against the backend's table, in one line."""
    p.add_argument("--precision", default="exact", metavar="exact|fast",
                   help="exact: f32 activations into every contraction (default); fast: "
                        "16-bit weights read activations rounded to their dtype, integer-"
                        "coded packed weights read int8 rows (q8_0)")
    p.add_argument("--kv-dtype", default=None, metavar="f32|f16|q8_0",
                   help="how the KV cache holds keys and values (default: f32 for exact, "
                        "f16 for fast)")


def progress_lines(quiet: bool):
    """The progress callback of the model commands: one `[poot] ...` line on stderr."""
    def progress(msg: str) -> None:
        if not quiet:
            print(f"[poot] {msg}", file=sys.stderr, flush=True)
    return progress


def check(args) -> None:
    """Every flag of `poot run`, before anything loads; reads a piped prompt from stdin."""
    from pathlib import Path

    from poot.cli import checks
    from poot.errors import RequestError

    checks.count("--max-tokens", args.max_tokens)
    checks.count("--max-seq", args.max_seq)
    checks.count("--tp", args.tp)
    checks.count("--expert-pool", args.expert_pool)
    checks.sampling(args)
    checks.precision(args)
    checks.speculation(args)
    if args.lora is not None and not Path(args.lora).is_dir():
        raise RequestError(f"--lora {args.lora}: no such adapter folder")
    if args.prompt is None and not sys.stdin.isatty():
        args.prompt = sys.stdin.read().rstrip("\n")
        if not args.prompt:
            raise RequestError("the prompt read from stdin is empty (pass --prompt, or run "
                               "on a terminal to chat)")
    if args.prompt is not None and not args.prompt:
        raise RequestError("--prompt must not be empty")
    if args.prompt is None and args.tp > 1:
        raise RequestError("a chat runs on one rank; give --prompt with --tp")
    if args.system is not None and args.prompt is not None:
        args.chat = True
    from poot.cli import images

    images.check(args)


def run(args, rank: int = 0, group=None) -> int:
    """`rank` and `group`: this call is one rank of a `--tp` run (poot.parallel.launch)."""
    import time

    from poot.models.runner import load

    if group is None:
        check(args)
    if args.tp > 1 and group is None:
        from poot.parallel.launch import launch

        if args.temperature > 0 and args.seed is None:  # every rank samples the same token
            import random

            args.seed = random.randrange(1 << 31)
        return launch(args.tp, args.backend, run, args)
    progress = progress_lines(args.quiet or rank > 0)
    t0 = time.perf_counter()
    lora = [("lora", args.lora)] if args.lora else []
    model = load(args.model, args.backend, kv=args.kv, max_seq=args.max_seq,
                 progress=progress, lora=lora, expert_pool=args.expert_pool,
                 precision=args.precision, kv_dtype=args.kv_dtype)
    if group is not None:
        from poot.parallel.model import TensorParallel

        TensorParallel(model, group, rank)
    progress(f"loaded {model.checkpoint.path.name} ({model.config.arch}, "
             f"{model.config.layers} layers) for {model.backend.name} on {model.device} "
             f"in {time.perf_counter() - t0:.1f} s")
    from poot.cli.generating import check_chat_template, check_room
    from poot.models.sampling import Sampler

    check_chat_template(model, args)
    if args.prompt is not None and not args.image:
        check_room(model, len(model.prompt_ids(args.prompt, args.chat, args.system)))
    vision = None
    if args.image:      # before the first plan: the prefill plans take the image rows
        from poot.cli import images

        vision = images.attach(model, progress, args.mmproj)
    model.device_sampling = model.device_sampling and not args.host_sampling
    mode = model.sample_mode([Sampler(args.temperature, args.top_k, args.top_p,
                                      args.repetition_penalty, args.seed)])
    model.prepare(model.session(), prompt_tokens=2, sample=mode,  # plan before streaming
                  speculate=args.speculate, draft_tokens=args.draft_tokens)
    if args.prompt is None:
        from poot.cli.chat import chat

        return chat(model, args)
    from poot.cli.generating import context_note, empty_answer_note, sampling_kwargs

    if vision is not None:
        pieces = vision.generate(args.prompt, args.image, system=args.system, stream=True,
                                 max_tokens=args.max_tokens or PROMPT_MAX_TOKENS,
                                 **sampling_kwargs(args))
    else:
        pieces = model.generate(args.prompt, max_tokens=args.max_tokens or PROMPT_MAX_TOKENS,
                                chat=args.chat, system=args.system, stream=True,
                                **sampling_kwargs(args))
    if rank:  # the other ranks step in lockstep with rank 0 and print nothing
        for _ in pieces:
            pass
        return 0
    if not args.chat:
        sys.stdout.write(args.prompt)
    text = ""
    for piece in pieces:
        text += piece
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    sys.stdout.flush()  # the text ends before the stats line on a shared terminal
    s = model.stats
    print(f"[poot] prefill: {s.prompt_tokens} tokens, {s.prefill_tps:.1f} tok/s; "
          f"decode: {s.generated_tokens} tokens, {s.decode_tps:.1f} tok/s "
          f"({model.backend.name})" + (f"; {s.speculation}" if args.speculate else ""),
          file=sys.stderr)
    context_note(model)
    empty_answer_note(model, text, args.chat or vision is not None)
    pager = model.session().stepper
    if pager is not None:
        print(f"[poot] expert pool: {pager.counters}", file=sys.stderr)
    return 0
