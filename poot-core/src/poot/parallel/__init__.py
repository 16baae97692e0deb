"""Tensor parallelism: split a traced model over N ranks (one ordinary graph per rank).

`layout` decides which heads, FFN units and vocabulary rows each rank holds; `shard` is the
graph pass; `megatron` names the decoder's weight splits; poot.oracle.ranks evaluates the
rank graphs together (the oracle of a sharded model).
"""
from poot.parallel.layout import Layout, layout_of, plan_layout
from poot.parallel.megatron import shard_step, splits
from poot.parallel.shard import RankGraph, Split, shard

__all__ = ["Layout", "layout_of", "plan_layout", "shard", "shard_step", "splits", "RankGraph",
           "Split"]
