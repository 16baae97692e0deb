"""gpt-oss with a q8_0 KV cache: every layer's sink attention reads the cache's codes and
scales in place on the cpu (Q8KVSinkAttention, no dequantized copy), and the cpu's logits
through a session (chunked prefill, then decode past the sliding window) are the
reference's, which runs the same graph as the oracle defines it."""
from __future__ import annotations

import numpy as np
import pytest
from test_families import IDS, rel_err
import test_gpt_oss
from test_gpt_oss import LAYERS, make_folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """test_gpt_oss's random folder with a head dim of 32, the q8_0 block (its own is 16)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_gpt_oss, "HEAD_DIM", 32)
        return make_folder(tmp_path_factory.mktemp("gpt-oss-q8"))[0]


def session_logits(model) -> np.ndarray:
    session = model.session()
    session.open("s")
    try:
        out = [session.prefill("s", IDS[:15])]
        out += [session.decode({"s": IDS[i]})["s"] for i in range(15, 20)]
    finally:
        session.close("s")
    return np.stack([np.asarray(x, np.float32).reshape(-1) for x in out])


def test_q8_0_cache_is_read_in_place_and_matches_the_reference(folder):
    import poot

    models = {b: poot.load(str(folder), backend=b, max_seq=32, prefill_tokens=6,
                           kv_dtype="q8_0") for b in ("reference", "cpu")}
    names = [e.op.name for e in models["cpu"].step_graph(1).eqns()]
    assert names.count("Q8KVSinkAttention") == LAYERS and "SinkAttention" not in names
    want = session_logits(models["reference"])
    got = session_logits(models["cpu"])
    plain = session_logits(poot.load(str(folder), backend="reference", max_seq=32,
                                     prefill_tokens=6, kv_dtype="f32"))
    # a key the cpu computed an ulp away from the reference's may round to the next code
    # when the cache quantizes it (a step of its block's scale), so the steps agree less
    # tightly than f32 steps do, yet far nearer than the unquantized cache's logits
    for i, (g, w, p) in enumerate(zip(got, want, plain, strict=True)):
        assert rel_err(g, w) < 1e-3 and rel_err(g, w) < rel_err(g, p) / 10, i
