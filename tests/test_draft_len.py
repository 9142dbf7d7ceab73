"""Algorithm 1 of the BASS paper (§3.2) against the traces worked out in docs/bass.md ("Choosing the
draft length")."""

import numpy as np
import pytest

from bass_jax.sampling.draft_len import DynamicDraftLen, FixedDraftLen, as_policy


def _trace(policy, accepted_per_step, start=None):
  length, s = policy.initial()
  if start is not None:
    length = start
  lengths = [int(length)]
  for accepted in accepted_per_step:
    length, s = policy.update(length, s, max(accepted(length)))
    lengths.append(int(length))
  return lengths


def test_all_accepted_grows_to_the_limit():
  got = _trace(DynamicDraftLen(), [lambda l: (l,)] * 14)
  assert got == [7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31, 32, 32]


def test_nothing_accepted_shrinks_to_one():
  got = _trace(DynamicDraftLen(), [lambda l: (0,)] * 12, start=32)
  assert got == [32, 28, 24, 20, 17, 14, 11, 8, 6, 4, 2, 1, 1]


def test_batch_of_two_trace():
  xs = [(7, 3), (9, 2), (11, 11), (13, 0), (12, 1), (10, 0), (8, 0), (6, 6)]
  got = _trace(DynamicDraftLen(), [lambda l, x=x: x for x in xs])
  assert got == [7, 9, 11, 13, 15, 13, 10, 8, 6]


def test_policies_parse_and_validate():
  assert as_policy("dynamic") == DynamicDraftLen()
  assert as_policy(4) == FixedDraftLen(4) and as_policy(np.int64(5)) == FixedDraftLen(5)
  assert _trace(FixedDraftLen(3), [lambda l: (0,)] * 3) == [3, 3, 3, 3]
  for bad in (0, -2, "often", "5", 2.5, True, None):
    with pytest.raises(ValueError):
      as_policy(bad)
  with pytest.raises(ValueError, match="l0"):
    DynamicDraftLen(l0=40)
