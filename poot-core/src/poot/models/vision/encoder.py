"""Tower and connector as one traced graph, compiled and planned once for a backend, run
once per image (per tile, where the image is tiled): pixels [C, H, W] in, the language
model's rows [mm_tokens, text_dim] out."""
from __future__ import annotations

import time

import numpy as np

from poot.errors import BindError
from poot.ir.graph import Graph
from poot.models.vision.connector import CONNECTORS
from poot.models.vision.siglip import PIXELS, declarer, pixels_slot, tower


def build_encoder(config, weights) -> Graph:
    """The traced graph of one image through the SigLIP tower and the config's connector;
    `weights` a WeightSource of the "vision."/"projector."/"connector." names (its `arrays`
    then holds every const the graph binds)."""
    from poot.tracer import trace

    def encode():
        declare = declarer(weights)
        connector = CONNECTORS[config.connector]
        return connector(config, declare, tower(config, declare, pixels_slot(config)))

    return trace(encode, name=f"siglip_{config.connector}_{config.image_size}px_"
                              f"{config.layers}l")


class VisionEncoder:
    """The encoder graph compiled for (backend, device); `encode(pixels)` runs one image."""

    def __init__(self, config, weights, backend, device):
        import poot
        from poot.plan import plan
        from poot.runtime.executor import Executor

        self.config = config
        t0 = time.perf_counter()
        graph = build_encoder(config, weights)
        target = (backend, device)
        self.executor = Executor(plan(poot.compile(graph, target), target), weights.arrays)
        #: seconds to trace, compile, plan and bind; and of the last image's run
        self.setup_seconds = time.perf_counter() - t0
        self.seconds = 0.0

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The rows of one image [C, H, W], or of tiles [T, C, H, W] one after another."""
        c = self.config
        want = (c.channels, c.image_size, c.image_size)
        pixels = np.ascontiguousarray(pixels, np.float32)
        tiles = pixels if pixels.ndim == 4 else pixels[None]
        if tiles.shape[1:] != want or not len(tiles):
            raise BindError(f"the vision tower takes pixels {list(want)} (or tiles of them), "
                            f"got {list(pixels.shape)}")
        t0 = time.perf_counter()
        rows = [np.asarray(self.executor.step({PIXELS: np.ascontiguousarray(x)}).result,
                           np.float32) for x in tiles]
        self.seconds = time.perf_counter() - t0
        return rows[0] if len(rows) == 1 else np.concatenate(rows)
