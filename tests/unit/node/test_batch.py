"""A peer's behaviour hint is clamped once, to the one range the learner also uses."""

import math

import pytest

from node.learn import learner
from node.learn.batch import HINT_RANGE, clamp_hint
from node.seams import BEHAVIOUR_LOGPROB_FLOOR


@pytest.mark.parametrize(
    ("hint", "expected"),
    [(-25.0, BEHAVIOUR_LOGPROB_FLOOR), (-3.5, -3.5), (0.7, 0.0), (None, None), (math.nan, None), (math.inf, None)],
)
def test_clamp_hint(hint, expected):
    assert clamp_hint(hint) == expected


def test_batch_and_learner_share_one_range():
    assert HINT_RANGE == (BEHAVIOUR_LOGPROB_FLOOR, 0.0)
    assert learner.BEHAVIOUR_LOGPROB_FLOOR == BEHAVIOUR_LOGPROB_FLOOR
