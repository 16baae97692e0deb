"""Speculative decoding in `poot serve` (--speculate lookup, draft:MODEL and self:N, a
request's `speculate` and `prediction` fields), through the openai client, on the fuzzer's
tiny Llama (random weights, a byte vocabulary) on the reference backend: greedy text is the
same with and without speculation, a request's speculation does not change another's text,
a prediction of the answer is accepted and counted in usage, /stats and /metrics count the
steps, and bad values are refused. A draft model's case runs on a 4-layer target whose
last 3 layers add little to its first (`draft_pair`), drafted by that first layer (as a
file of its own, and as self:1): proposals are mostly accepted, not all. One server per
mode."""
from __future__ import annotations

import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import openai
import pytest
from serve_process import openai_client, serve, tiny_llama

sys.path.insert(0, str(Path(__file__).parent / "fuzz"))
import seeds  # noqa: E402

MODEL = "smollm2"
#: a prompt that repeats itself, so that prompt lookup has n-grams to propose from
PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_llama(tmp_path_factory.mktemp("tiny"), 256)


@pytest.fixture(scope="module")
def server(tiny):
    with serve(tiny, "--max-batch", "4", "--max-seq", "256", "--speculate", "lookup",
               "--draft-tokens", "4") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def complete(client, prompt=PROMPT, max_tokens=40, **extra):
    kw = {k: extra.pop(k) for k in ("temperature", "seed", "logprobs", "stop", "n")
          if k in extra}
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                     temperature=kw.pop("temperature", 0.0),
                                     extra_body={"ignore_eos": True, **extra}, **kw)


@pytest.mark.parametrize("prompt", ["hello world", "ba", PROMPT])
def test_greedy_text_is_the_same_with_and_without_speculation(client, server, prompt):
    s0 = server.stats()["speculation"]
    plain = complete(client, prompt, speculate=False).choices[0].text
    s1 = server.stats()["speculation"]
    assert s1 == s0                     # speculate: false proposes nothing
    fast = complete(client, prompt)
    assert fast.choices[0].text == plain
    assert fast.usage.completion_tokens == 40
    assert fast.usage.completion_tokens_details is None       # no prediction given
    s2 = server.stats()["speculation"]
    assert s2["accepted"] > s1["accepted"]
    if prompt == "hello world":         # some proposals fail there: rolled back
        assert s2["proposed"] - s1["proposed"] > s2["accepted"] - s1["accepted"]
    streamed = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40,
                                         temperature=0.0, stream=True,
                                         extra_body={"ignore_eos": True})
    assert "".join(c.choices[0].text for c in streamed) == plain


def test_greedy_verification_reads_back_argmax_ids_once_that_plan_is_made(client, server):
    """Once the extra plans are made, a greedy request's verification steps read back ids
    (argmax_verify_steps), and its text is still the plain one; a sampled one's do not."""
    import time

    deadline = time.monotonic() + 120
    while server.stats()["extra_plans_waiting"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.stats()["extra_plans_waiting"] == 0
    plain = complete(client, speculate=False).choices[0].text
    s0 = server.stats()["speculation"]
    assert complete(client).choices[0].text == plain
    s1 = server.stats()["speculation"]
    assert s1["argmax_verify_steps"] - s0["argmax_verify_steps"] == \
        s1["verify_steps"] - s0["verify_steps"] > 0
    complete(client, temperature=0.9, seed=4)
    s2 = server.stats()["speculation"]
    assert s2["argmax_verify_steps"] == s1["argmax_verify_steps"]
    assert s2["verify_steps"] > s1["verify_steps"]


def test_a_prediction_of_the_answer_is_accepted_and_counted(client, server):
    plain = complete(client, speculate=False).choices[0].text
    s0 = server.stats()["speculation"]
    got = complete(client, prediction={"type": "content", "content": plain})
    assert got.choices[0].text == plain
    details = got.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    s1 = server.stats()["speculation"]
    assert s1["accepted"] - s0["accepted"] == details.accepted_prediction_tokens
    assert s1["proposed"] - s0["proposed"] == \
        details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert s1["verify_steps"] > s0["verify_steps"]
    # a verification step yields several tokens: fewer steps than tokens
    assert s1["verify_steps"] - s0["verify_steps"] < 39
    assert 0 < s1["acceptance"] <= 1
    # a wrong prediction changes no greedy token, and its tokens count as rejected
    wrong = complete(client, prediction={"type": "content", "content": "zzzz qqqq " * 8})
    assert wrong.choices[0].text == plain
    assert wrong.usage.completion_tokens_details.accepted_prediction_tokens >= 0
    # chat takes it too
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        temperature=0.0, extra_body={"ignore_eos": True, "speculate": False})
    text = chat.choices[0].message.content
    again = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
        temperature=0.0, prediction={"type": "content", "content": text},
        extra_body={"ignore_eos": True})
    assert again.choices[0].message.content == text
    assert again.usage.completion_tokens_details.accepted_prediction_tokens > 0


def test_speculation_does_not_change_another_requests_text(client):
    alone = complete(client, "xyz", 30, speculate=False).choices[0].text
    sampled = complete(client, "xyz", 30, speculate=False, temperature=1.0,
                       seed=5).choices[0].text
    plain = complete(client, "hello world", speculate=False).choices[0].text
    with ThreadPoolExecutor(4) as pool:
        beside = [pool.submit(complete, client, "xyz", 30, speculate=False),
                  pool.submit(complete, client, "xyz", 30, speculate=False,
                              temperature=1.0, seed=5),
                  pool.submit(complete, client, "hello world"),
                  pool.submit(complete, client, "hello world",
                              prediction={"type": "content", "content": plain[:20]})]
        texts = [f.result().choices[0].text for f in beside]
    assert texts == [alone, sampled, plain, plain]


def test_a_stop_string_or_max_tokens_ends_a_speculated_answer_where_it_would(client):
    """Tokens a verification step accepted past the end are dropped."""
    plain = complete(client, "hello world", speculate=False).choices[0].text
    stop = plain[20:22]
    cut = complete(client, "hello world", speculate=False, stop=stop).choices[0]
    for kw in ({}, {"prediction": {"type": "content", "content": plain}}):
        got = complete(client, "hello world", stop=stop, **kw).choices[0]
        assert (got.text, got.finish_reason) == (cut.text, cut.finish_reason) == \
            (plain[:plain.index(stop)], "stop")
        short = complete(client, "hello world", 7, **kw)
        assert short.choices[0].text == complete(client, "hello world", 7,
                                                 speculate=False).choices[0].text
        assert (short.usage.completion_tokens, short.choices[0].finish_reason) == (7, "length")
    # n choices: each its own proposer; usage sums their proposals
    two = complete(client, "hello world", 20, n=2,
                   prediction={"type": "content", "content": plain})
    first = complete(client, "hello world", 20, speculate=False).choices[0].text
    assert [c.text for c in two.choices] == [first] * 2
    d = two.usage.completion_tokens_details
    assert d.accepted_prediction_tokens >= 2


def test_a_seeded_sample_repeats_under_speculation_beside_others(client):
    """Its proposal lengths, hence its draws, follow its own acceptance, not the step
    times or its neighbours."""
    a, b = (complete(client, "hello world", temperature=1.0, seed=3).choices[0].text
            for _ in range(2))
    assert a == b and len(a) > 0
    with ThreadPoolExecutor(3) as pool:
        beside = [pool.submit(complete, client, "hello world", temperature=1.0, seed=3),
                  pool.submit(complete, client, "xyz", 30, temperature=0.7, seed=9),
                  pool.submit(complete, client, PROMPT)]
        assert beside[0].result().choices[0].text == a


def test_metrics_count_speculation(client, server):
    complete(client, max_tokens=12)
    stats = server.stats()["speculation"]
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    for name, key in (("poot_speculative_proposed_tokens_total", "proposed"),
                      ("poot_speculative_accepted_tokens_total", "accepted"),
                      ("poot_speculative_verify_steps_total", "verify_steps")):
        line = next(ln for ln in text.splitlines() if ln.startswith(name + " "))
        assert float(line.split()[1]) >= stats[key] > 0
    assert stats["mode"] == "lookup" and stats["draft_tokens"] == 4


@pytest.mark.parametrize("extra, param", [
    ({"speculate": "yes"}, "speculate"),
    ({"prediction": {"type": "text", "content": "x"}}, "prediction"),
    ({"prediction": {"type": "content", "content": ""}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": 5}}, "prediction.content"),
    ({"prediction": {"type": "content", "content": "x"}, "speculate": False}, "prediction"),
    ({"prediction": {"type": "content", "content": "x"}, "logprobs": 1}, "prediction"),
    ({"speculate": True, "logit_bias": {"5": 1}}, "speculate"),
])
def test_bad_speculation_fields_are_refused(client, extra, param):
    with pytest.raises(openai.BadRequestError) as e:
        complete(client, max_tokens=4, **extra)
    assert e.value.body["param"] == param




def test_a_prediction_is_walked_in_order_and_lookup_takes_over():
    from poot.serve.speculation import Prediction

    p = Prediction([1, 2, 3, 9, 1, 2, 4, 5, 6])
    assert p.propose([7, 1, 2, 3], 3, None) == ([9, 1, 2], None)
    # "1 2" occurs twice: the match at or after the last one is taken
    assert p.propose([7, 1, 2, 3, 9, 1, 2], 2, None) == ([4, 5], None)
    # at the prediction's end nothing follows; prompt lookup over the text proposes
    assert p.propose([8, 6, 0, 6], 2, None) == ([0, 6], None)


def test_an_answer_to_the_end_of_the_context_speculates_inside_it(client):
    n = complete(client, PROMPT, 1).usage.prompt_tokens
    plain = complete(client, PROMPT, 256 - n, speculate=False)
    fast = complete(client, PROMPT, 256 - n)
    assert fast.choices[0].text == plain.choices[0].text
    assert fast.usage.completion_tokens == 256 - n


def test_a_server_without_speculate_takes_a_prediction_and_refuses_speculate_true(tiny):
    with serve(tiny, "--max-batch", "2", "--max-seq", "256") as plain_server:
        c = openai_client(plain_server)
        plain = complete(c, "hello world", speculate=False).choices[0].text
        assert complete(c, "hello world").choices[0].text == plain
        assert plain_server.stats()["speculation"]["verify_steps"] == 0
        got = complete(c, "hello world", prediction={"type": "content", "content": plain})
        assert got.choices[0].text == plain
        assert got.usage.completion_tokens_details.accepted_prediction_tokens > 0
        assert plain_server.stats()["speculation"]["mode"] is None
        with pytest.raises(openai.BadRequestError) as e:
            complete(c, "hello world", 4, speculate=True)
        assert e.value.body["param"] == "speculate"


# -- a draft model ------------------------------------------------------------------------
def draft_pair(folder: Path, layers: int = 4, damp: float = 0.2) -> tuple[Path, Path]:
    """A `layers`-layer tiny Llama whose layers after the first have their output
    projections scaled by `damp` (so its first layer and head nearly predict it), and that
    first layer and head as a model of its own: a target and its draft, one tokenizer."""
    vocab = len(seeds.byte_vocab()[0])
    first = seeds.llama_tensors(vocab)
    target = dict(first)
    for i in range(1, layers):
        src = seeds.llama_tensors(vocab, seed=i)
        for name, w in src.items():
            if name.startswith("blk.0."):
                scale = damp if name.endswith(("attn_output.weight", "ffn_down.weight")) else 1
                target[f"blk.{i}." + name[len("blk.0."):]] = w * np.float32(scale)
    kvs = seeds.set_kv(seeds.llama_kvs(), "llama.context_length", seeds.U32, 256)
    one = {k: v for k, v in first.items() if not k.startswith("blk.") or
           k.startswith("blk.0.")}
    return (seeds.tiny_llama_gguf(folder / "target.gguf",
                                  seeds.set_kv(kvs, "llama.block_count", seeds.U32, layers),
                                  target),
            seeds.tiny_llama_gguf(folder / "draft.gguf",
                                  seeds.set_kv(kvs, "llama.block_count", seeds.U32, 1), one))


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    return draft_pair(tmp_path_factory.mktemp("draft"))


@pytest.fixture(scope="module")
def draft_server(pair):
    target, draft = pair
    with serve(target, "--max-batch", "4", "--max-seq", "256", "--speculate",
               f"draft:{draft}", "--draft-tokens", "4") as s:
        yield s


PROMPTS = ["hello world", "the cat sat on the mat", "xyz", "ba"]


def concurrently(client, calls: list[tuple[tuple, dict]]) -> list[str]:
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(complete, client, *a, **kw) for a, kw in calls]
        return [f.result().choices[0].text for f in futures]


def draft_blocks_back(server) -> dict:
    """The draft's stats once idle; every draft block is back in its pool."""
    spec = server.wait_idle()["speculation"]
    assert spec["draft_sequences"] == 0
    assert spec["draft_free_blocks"] == spec["draft_pool_blocks"] > 0
    return spec


def test_a_draft_model_keeps_every_requests_greedy_text(draft_server):
    """Several requests at once, one with "speculate": false beside the drafted ones:
    each text is its plain greedy text; the draft's rows propose in shared steps."""
    c = openai_client(draft_server)
    plain = [complete(c, p, speculate=False).choices[0].text for p in PROMPTS]
    s0 = draft_server.stats()["speculation"]
    assert s0["verify_steps"] == 0 and s0["draft_steps"] == 0   # speculate: false
    # and a prediction's proposals verified in the same steps as the draft's
    texts = concurrently(c, [((p,), {"speculate": False} if i == 0 else {})
                             for i, p in enumerate(PROMPTS)]
                         + [((PROMPTS[2],), {"prediction": {"type": "content",
                                                            "content": plain[2]}})])
    assert texts == plain + [plain[2]]
    s1 = draft_blocks_back(draft_server)
    assert s1["mode"].startswith("draft:") and s1["mode"].endswith("draft.gguf")
    assert s1["draft_model"] == "draft.gguf" and s1["draft_layers"] == 1
    assert any("speculating with the draft draft.gguf (1 layer, up to 4 tokens a step)" in ln
               for ln in draft_server.log)
    assert 0 < s1["accepted"] <= s1["proposed"] and s1["verify_steps"] > 0
    assert s1["draft_steps"] >= s1["verify_steps"]
    # a stream, and an answer that ends mid-proposal at max_tokens, as plain
    streamed = c.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=40,
                                    temperature=0.0, stream=True,
                                    extra_body={"ignore_eos": True})
    assert "".join(x.choices[0].text for x in streamed) == plain[1]
    assert complete(c, PROMPTS[1], 7).choices[0].text == \
        complete(c, PROMPTS[1], 7, speculate=False).choices[0].text


def test_a_drafted_seeded_sample_repeats_beside_others(draft_server):
    """The rejection rule with the draft's distributions: a seed repeats its text, alone
    or beside other requests (its proposal lengths and draws are its own)."""
    c = openai_client(draft_server)
    alone = [complete(c, "hello world", temperature=1.0, seed=s).choices[0].text
             for s in (3, 4)]
    assert alone[0] != alone[1]
    quiet = complete(c, "xyz", 30, temperature=0.7, seed=9, speculate=False).choices[0].text
    before = draft_server.stats()["speculation"]["verify_steps"]
    beside = concurrently(c, [(("hello world",), {"temperature": 1.0, "seed": 3}),
                              (("xyz", 30), {"temperature": 0.7, "seed": 9,
                                             "speculate": False}),
                              (("hello world",), {"temperature": 1.0, "seed": 4}),
                              ((PROMPT,), {})])
    assert beside[0::2] == alone and beside[1] == quiet
    assert draft_server.stats()["speculation"]["verify_steps"] > before
    draft_blocks_back(draft_server)


def test_a_disconnected_drafted_stream_gives_its_draft_blocks_back(draft_server):
    c = openai_client(draft_server)
    stream = c.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200,
                                  temperature=0.0, stream=True,
                                  extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 8:
            break
    stream.close()
    spec = draft_blocks_back(draft_server)
    assert draft_server.stats()["cancelled"] >= 1 and spec["draft_steps"] > 0
    with urllib.request.urlopen(draft_server.url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    line = next(ln for ln in text.splitlines()
                if ln.startswith("poot_speculative_accepted_tokens_total "))
    assert float(line.split()[1]) >= spec["accepted"] > 0


def test_self_speculation_by_the_first_layer_keeps_greedy_text(pair):
    target, _ = pair
    with serve(target, "--max-batch", "2", "--max-seq", "256", "--speculate", "self:1",
               "--draft-tokens", "3") as s:
        c = openai_client(s)
        plain = [complete(c, p, 30, speculate=False).choices[0].text for p in PROMPTS[:2]]
        assert concurrently(c, [((p, 30), {}) for p in PROMPTS[:2]]) == plain
        spec = draft_blocks_back(s)
        assert spec["mode"] == spec["draft_model"] == "self:1" and spec["draft_layers"] == 1
        assert spec["accepted"] > 0 and spec["draft_tokens"] == 3


def test_a_draft_that_does_not_pay_gives_its_blocks_back_early(pair):
    """The target as its own draft reads every weight it reads: a sequence's AdaptiveK
    stops after its trial proposals (all accepted: the same model) and its draft
    sequence closes then, before the request ends; the text is the plain one."""
    target, _ = pair
    with serve(target, "--max-batch", "2", "--max-seq", "256", "--speculate",
               f"draft:{target}") as s:
        c = openai_client(s)
        plain = complete(c, "hello world", 60, speculate=False).choices[0].text
        assert complete(c, "hello world", 60).choices[0].text == plain
        spec = draft_blocks_back(s)
        assert spec["accepted"] == spec["proposed"] == 4 and spec["verify_steps"] == 2
        assert spec["draft_released"] == 1


def other_vocabulary(folder: Path) -> Path:
    """The tiny Llama with one more token: a vocabulary the target does not share."""
    tokens, types, _ = seeds.byte_vocab()
    kvs = seeds.set_kv(seeds.llama_kvs(), "tokenizer.ggml.tokens", seeds.ARRAY,
                       (seeds.STRING, [*tokens, "xyz"]))
    kvs = seeds.set_kv(kvs, "tokenizer.ggml.token_type", seeds.ARRAY,
                       (seeds.I32, [*types, 1]))
    return seeds.tiny_llama_gguf(folder / "other.gguf", kvs,
                                 seeds.llama_tensors(len(tokens) + 1))


def test_serve_refuses_a_draft_it_cannot_use_in_one_line(pair, tmp_path):
    """A draft with another vocabulary (naming both models), a self-draft of every layer."""
    target, _ = pair
    other = other_vocabulary(tmp_path)
    for mode, words in ((f"draft:{other}", ["other.gguf: 264 tokens", "target.gguf: 263",
                                            "does not share the target's tokenizer"]),
                        ("self:4", ["self:4", "1 to 3 of the model's 4 layers"])):
        run = subprocess.run([sys.executable, "-m", "poot", "serve", str(target), "--backend",
                              "reference", "--max-seq", "256", "--speculate", mode,
                              "--quiet"], capture_output=True, text=True, timeout=120)
        assert run.returncode == 2
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
        assert all(w in run.stderr for w in words), run.stderr


def test_a_draft_sequence_follows_its_text_through_rollbacks(pair):
    """DraftBatch alone: two rows drafted together, each turn accepting a random part of
    its proposal and adding tokens of its own (a verification's, a run of plain steps'),
    propose what a fresh draft sequence fed the whole text proposes: the rolled-back and
    caught-up KV is the text's. Closing every sequence gives every block back."""
    import poot
    from poot.models.sampling import Sampler
    from poot.models.speculate import Spec
    from poot.serve.speculation import DraftBatch

    target, draft = pair
    model = poot.load(str(target), "reference", kv="paged", max_seq=256)
    drafts = DraftBatch(model, Spec("draft", str(draft)), [1, 2])
    rng = np.random.default_rng(0)
    greedy = Sampler()
    texts = {"a": model.tokenizer.encode("hello world"), "b": [5, 6, 7]}
    for turn in range(12):
        ks = {seq: int(rng.integers(1, 5)) for seq in texts}
        before = drafts.counters["draft_steps"]
        fresh = drafts.propose_rows({("fresh", seq): (list(t), ks[seq], greedy)
                                     for seq, t in texts.items()})
        if turn == 0:   # batched: one prefill step feeds both prompts, a decode step a token
            assert drafts.counters["draft_steps"] - before == 1 + max(ks.values())
        for seq in texts:
            drafts.close(("fresh", seq))
        got = drafts.propose_rows({seq: (t, ks[seq], greedy) for seq, t in texts.items()})
        for seq, text in texts.items():
            assert got[seq] == fresh[("fresh", seq)] and len(got[seq][0]) == ks[seq]
            kept = int(rng.integers(0, ks[seq] + 1))
            text += got[seq][0][:kept] + [int(t) for t in rng.integers(3, 200,
                                                                        rng.integers(1, 4))]
    assert drafts.stats()["draft_sequences"] == 2
    for seq in texts:
        drafts.close(seq)
    stats = drafts.stats()
    assert stats["draft_free_blocks"] == stats["draft_pool_blocks"]


def test_a_self_draft_binds_the_served_models_weights_once(pair):
    """self:1 drafts with the served model's first layer and head: bound through the
    served session's weight cache, its plans (of the shapes the served session has made)
    upload nothing of their own."""
    import poot
    from poot.models.sampling import Sampler
    from poot.models.speculate import Spec
    from poot.serve.speculation import DraftBatch

    target, _ = pair
    model = poot.load(str(target), "reference", kv="paged", max_seq=256)
    served = model.session("paged", batch=2, decode_batches=[1, 2], prefill_batches=[1, 2])
    for shape in ((1, 1), (model.prefill_tokens, 1)):
        served.rehearse(*shape)
    uploads = served.weights.uploads
    drafts = DraftBatch(model, Spec("self", 1), [1, 2])
    drafts.share_weights(served)
    got = drafts.propose_rows({"a": (model.tokenizer.encode("hello world"), 3, Sampler())})
    assert len(got["a"][0]) == 3
    assert drafts.session.weights is served.weights and served.weights.uploads == uploads
    assert served.weights.hits > 0
