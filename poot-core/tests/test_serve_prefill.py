"""Which prefill step a serving turn takes (poot.serve.engine.prefill_choice): the plan
that feeds the waiting prompts fastest by its measured step time."""
from __future__ import annotations

from poot.serve.engine import MIN_WIDTH, prefill_choice

BATCHES = [1, 2, 4, 8, 16, 32]
#: a 32-token chunk, each sequence given at least MIN_WIDTH tokens (Engine.prefill_widths)
WIDTHS = {b: max(32 // b, MIN_WIDTH) for b in BATCHES}
#: step seconds in the proportions measured on the H200 (SmolLM2, Q4_1)
COST = {1: 2.47e-3, 2: 2.5e-3, 4: 2.59e-3, 8: 6.0e-3, 16: 8.11e-3, 32: 8.66e-3}


def test_a_lone_prompt_takes_the_narrow_plan():
    assert prefill_choice(BATCHES, WIDTHS, COST, [10]) == (1, 32)
    assert prefill_choice(BATCHES, WIDTHS, COST, [500]) == (1, 32)


def test_a_burst_of_prompts_takes_the_wide_plan():
    assert prefill_choice(BATCHES, WIDTHS, COST, [12] * 32) == (32, 8)
    assert prefill_choice(BATCHES, WIDTHS, COST, [8] * 20) == (20, 8)


def test_a_few_long_prompts_keep_the_cheap_rows():
    # 5 x 20 tokens: 2 x 16 feeds 32 in 2.5 ms, 8 x 8 40 in 6 ms
    assert prefill_choice(BATCHES, WIDTHS, COST, [20] * 5) == (2, 16)
    # tails left after a wide step: cheap 32-row steps beat a wide one
    assert prefill_choice(BATCHES, WIDTHS, COST, [3] * 12) == (4, 8)


def test_untimed_plans_cost_their_rows():
    # nothing timed: every plan alike per row, the smallest that fills its rows on a tie
    assert prefill_choice(BATCHES, WIDTHS, {}, [12] * 32) == (4, 8)
    assert prefill_choice(BATCHES, WIDTHS, {}, [4] * 8) == (4, 8)      # 16 of 32 rows, a tie
    # only the 1 x 32 plan timed: the others cost their rows at its rate, so the wide one
    # is not taken before it is timed (Engine._plan_next times each plan it makes)
    assert prefill_choice(BATCHES, WIDTHS, {1: 2.5e-3}, [12] * 32) == (4, 8)


def test_a_plan_is_never_given_fewer_prompts_than_the_one_below_it_holds():
    # 3 prompts may take the 4-sequence plan, never the 8 or 32 one however cheap (they
    # would run as a 4-sequence step at another plan's width)
    cost = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1e-6, 16: 1e-6, 32: 1e-6}
    assert prefill_choice(BATCHES, WIDTHS, cost, [8] * 3) == (3, 8)
