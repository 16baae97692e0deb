"""poot_vulkan.rename on operation lists: an output whose place only costs a
write-after-read barrier moves to a shadow buffer with its readers, and nothing else
moves (pure, no device: buffers are stand-ins)."""
from poot_vulkan.rename import rename_war
from poot_vulkan.step import Binding, Copy, Dispatch, batches


class Buf:
    def __init__(self, label):
        self.label = label


def r(buf, at=0, n=256):
    return Binding(buf, at, n, False)


def w(buf, at=0, n=256):
    return Binding(buf, at, n, True)


def op(*bindings, out=None, sole=True):
    return Dispatch(None, bindings, (1, 1, 1), out, sole)


def shadows():
    made = []

    def alloc(n):
        made.append(Buf(f"shadow{len(made)}"))
        made[-1].size = n
        return made[-1]
    return made, alloc


def test_a_write_after_read_output_moves_with_its_readers():
    x, y, z = Buf("x"), Buf("y"), Buf("z")
    ops = [op(r(x), w(y), out=1),          # reads x
           op(r(z), w(x), out=1),          # writes x: only a WAR with the first
           op(r(x), w(z, 256), out=1),     # reads the moved value
           op(r(y), w(x), out=1),          # a new value on those bytes: moving ends
           op(r(x), w(y, 256), out=1)]
    made, alloc = shadows()
    got = rename_war(ops, alloc)
    (shadow,) = made
    assert shadow.size == 256
    assert got[1].bindings[1].buffer is shadow and got[2].bindings[0].buffer is shadow
    assert got[0] == ops[0] and got[3] == ops[3] and got[4] == ops[4]
    assert len(batches(got)) < len(batches(ops))


def test_nothing_moves_where_it_would_not_be_the_same():
    x, y, z = Buf("x"), Buf("y"), Buf("z")
    first, writer = op(r(x), w(y), out=1), op(r(z), w(x), out=1)
    cases = {
        "alive at the end": [first, writer, op(r(x), w(z), out=1)],
        "updated in place later": [first, writer, op(r(z), w(x, 0, 128)),
                                   op(r(y), w(x), out=1)],
        "read wider than the value": [first, writer, op(r(x, 0, 512), w(z), out=1),
                                      op(r(y), w(x), out=1)],
        "copied": [first, writer, Copy(x, 0, z, 0, 256), op(r(y), w(x), out=1)],
        "not its step's only dispatch": [first, op(r(z), w(x), out=1, sole=False),
                                         op(r(y), w(x), out=1)],
        "a true dependence": [op(r(z), w(y), out=1), op(r(y), w(z), out=1),
                              op(r(x), w(z), out=1)],
    }
    for name, ops in cases.items():
        made, alloc = shadows()
        assert rename_war(ops, alloc) == ops and not made, name
