"""poot_wgpu.banks and the implicit barriers it saves, on operation lists (pure, no
device: buffers are stand-ins): an output that would make wgpu order two independent
dispatches moves to a bank with its readers, and nothing moves where that would not be
the same computation."""
from types import SimpleNamespace

from poot.runtime.renaming import Access
from poot_wgpu.banks import Pending, bank_outputs
from poot_wgpu.kernel import read_only
from poot_wgpu.step import implicit_barriers


class Buf:
    def __init__(self, label):
        self.label = label


def rng(buf, at=0, n=256):
    return {"buffer": buf, "offset": at, "size": n}


def op(*bindings, out=None, sole=True):
    """bindings: (range, writes) pairs."""
    return Pending(None, [dict(r) for r, _ in bindings], tuple(w for _, w in bindings), out,
                   sole)


def banks(ops, kept=None):
    made = []

    def alloc(n):
        made.append(SimpleNamespace(gpu=Buf(f"bank{len(made)}"), size=n))
        return made[-1]
    bank_outputs(ops, 256, alloc, kept if kept is not None else [])
    return made


def waits(ops):
    """implicit_barriers over the ops as bound (read-only where read_only allows)."""
    return implicit_barriers([SimpleNamespace(
        resources=o.resources, kernel=SimpleNamespace(readonly=read_only(o.resources, o.writes)))
        for o in ops])


def layer(arena, k_cache, v_cache):
    """SmolLM2's rotation batch: q|k|v in the arena, q rotated into the arena beside the
    rotated k and v rows written to their caches, then attention reading the rotated q,
    then a new value on the rotated q's bytes."""
    return [op((rng(arena, 0, 768), False), (rng(arena, 1024), True), out=1),      # rope q
            op((rng(arena, 256), False), (rng(k_cache), True), out=1),            # k row
            op((rng(arena, 512), False), (rng(v_cache), True), out=1),            # v row
            op((rng(arena, 1024), False), (rng(k_cache), False), (rng(v_cache), False),
               (rng(arena, 1280), True), out=3),                                  # attention
            op((rng(arena, 1280), False), (rng(arena, 1024), True), out=1)]       # reuse


def test_an_output_batch_mates_would_wait_on_moves_to_a_bank_with_its_readers():
    arena, k, v = Buf("arena"), Buf("k"), Buf("v")
    ops = layer(arena, k, v)
    assert waits(ops) == 3                     # the k row waits for the rotation
    (bank,) = banks(ops)
    assert bank.size == 256
    assert ops[0].resources[1]["buffer"] is bank.gpu and ops[0].resources[1]["offset"] == 0
    assert ops[3].resources[0]["buffer"] is bank.gpu          # its reader follows it
    assert ops[4].resources[1]["buffer"] is arena             # the new value stays put
    assert waits(ops) == 2                     # rotation | attention | reuse


def test_a_bank_reuses_the_bytes_of_a_value_with_no_reader_left():
    arena, k, v = Buf("arena"), Buf("k"), Buf("v")
    ops = layer(arena, k, v) + layer(arena, Buf("k1"), Buf("v1"))
    (bank,) = banks(ops)
    assert bank.size == 256                    # both layers' rotated q, one after the other
    assert ops[5].resources[1]["buffer"] is ops[8].resources[0]["buffer"] is bank.gpu
    assert waits(ops) == 2 * 2 + 1             # and the second layer waits as the first


def test_nothing_moves_where_it_would_not_be_the_same():
    arena, k, v = Buf("arena"), Buf("k"), Buf("v")
    cases = {
        "not its step's only dispatch": [op(*[(r, w) for r, w in zip(o.resources, o.writes)],
                                            out=o.out, sole=i != 0)
                                         for i, o in enumerate(layer(arena, k, v))],
        "updated in place later": layer(arena, k, v)[:4] + [
            op((rng(arena, 1024, 128), True)), op((rng(arena, 1280), False),
                                                  (rng(arena, 1024), True), out=1)],
        "read wider than the value": layer(arena, k, v)[:3] + [
            op((rng(arena, 1024, 512), False), (rng(arena, 2048), True), out=1),
            op((rng(arena, 2048), False), (rng(arena, 1024), True), out=1)],
    }
    cases["an output of the step"] = layer(arena, k, v)[:4]
    for name, ops in cases.items():
        before = [[dict(r) for r in o.resources] for o in ops]
        kept = [Access(arena, 1024, 1280, False)] if name == "an output of the step" else []
        assert not banks(ops, kept), name
        assert [o.resources for o in ops] == before, name
    ops = layer(arena, k, v)[:4]      # dead at the end where the plan does not read it out
    assert banks(ops) and ops[3].resources[0]["buffer"] is not arena
