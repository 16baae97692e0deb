"""`poot run --image PATH`: the checks of the flag and the model's vision tower attached."""
from __future__ import annotations


def check(args) -> None:
    """--image needs a prompt, one rank and a dense KV cache, and images Pillow decodes; it
    implies the chat template."""
    from poot.errors import RequestError

    if not args.image:
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


def attach(model, progress):
    """The model's ImageChat, its encoder planned; one progress line."""
    from poot.models.vision.chat import ImageChat

    chat = ImageChat(model, progress)
    c = chat.vision.config
    each = "tile" if c.connector == "idefics3" else "image"
    progress(f"vision tower: SigLIP {c.layers} layers at {c.image_size} px, "
             f"{c.mm_tokens} rows per {each}; planned in {chat.encoder.setup_seconds:.1f} s")
    return chat
