"""`poot run --image PATH [--mmproj FILE]`: the checks of the flags and the model's vision
tower attached (a GGUF language model's from its vision projector GGUF)."""
from __future__ import annotations


def check(args) -> None:
    """--image needs a prompt, one rank and a dense KV cache, and images Pillow decodes; it
    implies the chat template."""
    from poot.errors import RequestError

    mmproj = getattr(args, "mmproj", None)
    check_mmproj(mmproj)
    if not args.image:
        if mmproj is not None:
            raise RequestError("--mmproj needs --image (a chat with images is not "
                               "interactive)")
        return
    if args.prompt is None:
        raise RequestError("--image needs --prompt (a chat with images is not interactive)")
    if args.tp > 1 or args.kv != "dense":
        raise RequestError("--image runs on one rank with a dense KV cache; drop --tp and "
                           "--kv paged")
    args.chat = True
    from poot.models.vision.preprocess import open_rgb

    for path in args.image:     # a bad image is refused before the model loads
        open_rgb(path)


def check_mmproj(path) -> None:
    """--mmproj names a file (what it holds is checked once the language model is in)."""
    from pathlib import Path

    from poot.errors import RequestError

    if path is not None and not Path(path).is_file():
        raise RequestError(f"--mmproj {path}: no such file")


def attach(model, progress, mmproj=None):
    """The model's ImageChat, its encoder planned (the tower `mmproj`'s, where given); one
    progress line."""
    from poot.models.vision.chat import ImageChat

    if mmproj is not None:
        from poot.models.vision.mmproj import attach as attach_mmproj

        attach_mmproj(model, mmproj)
    chat = ImageChat(model, progress)
    c = chat.vision.config
    if c.connector == "qwen25vl":     # planned per image grid, as each image comes
        progress(f"vision tower: Qwen2.5-VL {c.layers} layers, {c.patch} px patches, "
                 f"a row per {c.merge} x {c.merge} patches")
        return chat
    each = "tile" if c.connector == "idefics3" else "image"
    progress(f"vision tower: SigLIP {c.layers} layers at {c.image_size} px, "
             f"{c.mm_tokens} rows per {each}; planned in {chat.encoder.setup_seconds:.1f} s")
    return chat
