"""How a decoder's dimensions split over N tensor-parallel ranks (Megatron's layout).

Every range is contiguous, in rank order:
- KV heads: with at least N of them, each rank holds whole GQA groups (a KV head and its
  query heads), as evenly as they go (3 KV heads over 2 ranks: 2 and 1). With fewer than N,
  each KV head is replicated on the ranks that share its group, and the group's query heads
  are split among them (3 KV heads of 3 query heads over 4 ranks: query heads 2+1, 3, 3).
  A rank never holds query heads of two groups it does not hold whole, so every rank's
  attention is an ordinary GQA attention of its own head counts. A group with fewer query
  heads than the ranks sharing it is refused (dim "heads").
- FFN hidden units: split as evenly as they go (uneven splits are legal: the rows of the
  down projection's partial sums are all `dim` wide).
- vocabulary: equal shards, since the logits are gathered by concatenation of equal shards;
  a vocabulary N does not divide is refused (dim "vocab").
Uneven splits trade balance for reach: the slowest rank sets the step's time.
"""
from __future__ import annotations

from dataclasses import dataclass

from poot.errors import ShardError


def even(total: int, parts: int) -> tuple[range, ...]:
    """`total` split into `parts` contiguous ranges, sizes differing by at most one."""
    return tuple(range(total * i // parts, total * (i + 1) // parts) for i in range(parts))


@dataclass(frozen=True)
class Layout:
    """Per rank: its query heads, KV heads, FFN units and vocabulary rows."""

    ranks: int
    head_dim: int
    q: tuple[range, ...]
    kv: tuple[range, ...]
    ffn: tuple[range, ...]
    vocab: tuple[range, ...]

    def describe(self) -> str:
        def r(x):
            return f"{x.start}:{x.stop}"
        return "; ".join(f"rank {i}: q {r(self.q[i])} kv {r(self.kv[i])} ffn {r(self.ffn[i])} "
                         f"vocab {r(self.vocab[i])}" for i in range(self.ranks))


def plan_layout(*, heads: int, kv_heads: int, head_dim: int, ffn: int, vocab: int,
                ranks: int) -> Layout:
    """The layout of a decoder of these sizes over `ranks` ranks, or a ShardError naming the
    dimension that does not split."""
    if ranks < 1:
        raise ShardError(f"a tensor-parallel degree must be at least 1, not {ranks}",
                         dim="ranks", ranks=ranks)
    if heads % kv_heads:
        raise ShardError(f"{heads} query heads do not form groups of {kv_heads} KV heads",
                         dim="heads", ranks=ranks)
    group = heads // kv_heads
    if kv_heads >= ranks:
        kv = even(kv_heads, ranks)
        q = tuple(range(k.start * group, k.stop * group) for k in kv)
    else:
        owners = even(ranks, kv_heads)          # the ranks that share each KV head
        kv, q = [], []
        for head, share in enumerate(owners):
            if len(share) > group:
                raise ShardError(f"KV head {head} is shared by {len(share)} ranks but has "
                                 f"only {group} query heads; {heads} query heads cannot "
                                 f"cover {ranks} ranks", dim="heads", ranks=ranks)
            for part in even(group, len(share)):
                kv.append(range(head, head + 1))
                q.append(range(head * group + part.start, head * group + part.stop))
        kv, q = tuple(kv), tuple(q)
    if ffn < ranks:
        raise ShardError(f"FFN of {ffn} units cannot cover {ranks} ranks", dim="ffn",
                         ranks=ranks)
    if vocab % ranks:
        raise ShardError(f"vocabulary of {vocab} does not split into {ranks} equal shards "
                         f"(the logits are gathered by concatenation)", dim="vocab",
                         ranks=ranks)
    return Layout(ranks, head_dim, q, kv, even(ffn, ranks), even(vocab, ranks))


def layout_of(config, ranks: int) -> Layout:
    """The layout of a poot.models.llama.LlamaConfig; mixtures of experts are refused."""
    if config.experts:
        raise ShardError(f"{config.arch}: mixture-of-experts layers are not sharded (expert "
                         f"parallelism is not implemented)", dim="experts", ranks=ranks)
    return plan_layout(heads=config.heads, kv_heads=config.kv_heads, head_dim=config.head_dim,
                       ffn=config.ffn, vocab=config.vocab, ranks=ranks)
