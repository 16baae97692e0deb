"""Time per image of Gemma 3's vision encoder (SigLIP tower and projector) on a backend.

    python poot-core/benchmarks/vision_encoder.py [--backend cpu] [--layers 27]
        [--image-size 896] [--images 2]

Random f32 weights of Gemma 3's tower shape (SigLIP so400m: hidden 1152, 16 heads, MLP 4304,
patch 14; 256 rows per image, projected to 2560, Gemma 3 4B's width). Prints the setup (trace,
compile, plan, bind) and each image's run.
"""
from __future__ import annotations

import argparse
import time


def weights(c, seed: int = 0):
    import numpy as np

    from poot.models.llama import ArrayWeights

    rng = np.random.default_rng(seed)
    w = ArrayWeights(f"random-vision-{seed}")
    d, f, n = c.hidden, c.ffn, c.patches_per_side ** 2

    def mat(*shape):
        return rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[-1] ** -0.5)

    def vec(k, base=0.0):
        return base + np.float32(0.1) * rng.standard_normal(k, dtype=np.float32)

    w.add_dense("vision.embeddings.patch_embedding.weight", mat(d, c.channels, c.patch, c.patch))
    w.add_dense("vision.embeddings.patch_embedding.bias", vec(d))
    w.add_dense("vision.embeddings.position_embedding.weight", mat(n, d))
    for i in range(c.layers):
        p = f"vision.encoder.layers.{i}."
        for s in ("q", "k", "v", "out"):
            w.add_dense(f"{p}self_attn.{s}_proj.weight", mat(d, d))
            w.add_dense(f"{p}self_attn.{s}_proj.bias", vec(d))
        for name, rows, cols in (("fc1", f, d), ("fc2", d, f)):
            w.add_dense(f"{p}mlp.{name}.weight", mat(rows, cols))
            w.add_dense(f"{p}mlp.{name}.bias", vec(rows))
        for k in ("layer_norm1", "layer_norm2"):
            w.add_dense(f"{p}{k}.weight", vec(d, 1.0))
            w.add_dense(f"{p}{k}.bias", vec(d))
    w.add_dense("vision.post_layernorm.weight", vec(d, 1.0))
    w.add_dense("vision.post_layernorm.bias", vec(d))
    w.add_dense("projector.mm_soft_emb_norm.weight", vec(d, 1.0))
    w.add_dense("projector.mm_input_projection_weight", mat(d, c.text_dim))
    return w


def main(argv=None) -> None:
    import numpy as np

    from poot.models.vision.config import VisionConfig
    from poot.models.vision.encoder import VisionEncoder
    from poot.plugin import select_backend

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--layers", type=int, default=27)
    ap.add_argument("--image-size", type=int, default=896)
    ap.add_argument("--images", type=int, default=2)
    args = ap.parse_args(argv)
    c = VisionConfig(hidden=1152, layers=args.layers, heads=16, ffn=4304,
                     image_size=args.image_size, patch=14, text_dim=2560, mm_tokens=256)
    b, dev = select_backend(args.backend)
    t0 = time.perf_counter()
    w = weights(c)
    enc = VisionEncoder(c, w, b, dev)
    print(f"{b.name} on {dev}: {c.layers} layers, {c.image_size} px "
          f"({c.patches_per_side ** 2} patches); weights made in "
          f"{time.perf_counter() - t0 - enc.setup_seconds:.1f} s, setup (trace, compile, "
          f"plan, bind) {enc.setup_seconds:.1f} s", flush=True)
    x = np.random.default_rng(1).standard_normal((3, c.image_size, c.image_size),
                                                 dtype=np.float32)
    for k in range(args.images):
        rows = enc.encode(x)
        print(f"image {k + 1}: {enc.seconds:.2f} s -> rows {list(rows.shape)}", flush=True)


if __name__ == "__main__":
    main()
