"""`/v1/embeddings`: a text's vector from the served model itself.

The served checkpoints are decoder language models with no pooling configuration, so the
vector is what decoder embedding models (E5-Mistral, Qwen3-Embedding, SFR) define: the
final hidden state (after the output norm, before the head) at the text's last token,
which has attended to the whole text, scaled to unit length (L2). The model's step graph
gives it with build_decoder's logits="hidden"; the embedder reads it through a dense KV
session of its own (each text fed from position 0, in prefill chunks) that binds the served
session's uploaded weights, so the weights are on the device once. The engine's thread runs
it between decode steps (poot.serve.engine).
"""
from __future__ import annotations

import numpy as np

from poot.errors import RequestError


def refusal(model) -> RequestError | None:
    """Why this model's embeddings are not served (None: they are)."""
    if model.expert_pool is not None or model.tp is not None:
        return RequestError("embeddings are not served for a model run with an expert pool "
                            "or tensor parallelism", param="model")
    return None


class Embedder:
    def __init__(self, model, weights):
        """`weights`: the served session's WeightCache (its plans' uploaded weights)."""
        from poot.runtime.session import Session

        self.session = Session(
            lambda t, b: model.step_graph(t, b, kv="dense", logits="hidden"),
            model.bound_consts, kv="dense", capacity=model.config.max_seq, batch=1,
            prefill_tokens=model.prefill_tokens, target=(model.backend, model.device))
        self.session.weights = weights
        if model.adapters is not None:
            from poot.models.lora import SLOT

            self.session.row_slots[SLOT] = {}    # every text reads the base model (row 0)

    def embed(self, ids: list[int]) -> np.ndarray:
        """The unit vector [dim] of one text's token ids."""
        self.session.open("embedding")
        try:
            v = np.asarray(self.session.prefill("embedding", ids), np.float64).reshape(-1)
        finally:
            self.session.close("embedding")
        return (v / max(np.linalg.norm(v), 1e-12)).astype(np.float32)
