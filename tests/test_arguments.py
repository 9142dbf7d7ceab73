"""Strict arguments: every wrong type or value names its parameter; nothing is coerced into another value.

The cases are the ones a notebook user hits: strings from a config file (``"0.5"``, ``"70"``), ``None``,
floats where ints are meant, NumPy scalars and 2-D arrays, seeds past 32 bits, and a draft whose
tokenizer is not the target's.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bass_jax as bj
from conftest import tiny_model


@pytest.fixture(scope="module")
def target():
  return tiny_model(seed=0, scale=2.5)


@pytest.fixture(scope="module")
def prompts(target):
  rng = np.random.default_rng(0)
  return [rng.integers(0, target.config.vocab_size, n).tolist() for n in (3, 7)]


@pytest.mark.parametrize("override,match", [
    (dict(temperature="0.5"), r"temperature must be a number, got '0.5' \(str\)"),
    (dict(temperature=None), r"temperature must be a number, got None"),
    (dict(temperature=True), r"temperature must be a number"),
    (dict(top_p="0.9"), r"top_p must be a number"),
    (dict(top_p=0), r"top_p must be > 0.0"),
    (dict(seed=1.5), r"seed must be an int, got 1.5 \(float\)"),
    (dict(seed="3"), r"seed must be an int"),
    (dict(seed=-1), r"seed must be >= 0"),
    (dict(seed=2**63), r"seed must be <= 9223372036854775807"),
    (dict(eos_token_id="70"), r"eos_token_id must be an int or a sequence of ints, got the string '70'"),
    (dict(eos_token_id=[3, 2.0]), r"eos_token_id\[1\] must be an int"),
    (dict(eos_token_id=99), r"eos_token_id must be <= 60"),
    (dict(max_new_tokens=8.0), r"max_new_tokens must be an int, got 8.0"),
    (dict(max_new_tokens=True), r"max_new_tokens must be an int"),
    (dict(draft_len="4"), r"draft_len must be 'dynamic', 'goodput', an int >= 1"),
    (dict(draft_len=2.5), r"draft_len must be 'dynamic', 'goodput', an int >= 1"),
    (dict(verify_chunk="4"), r"verify_chunk must be an int"),
    (dict(verify_chunk=0), r"verify_chunk must be >= 1"),
    (dict(max_cache_len=np.float32(64)), r"max_cache_len must be an int"),
    (dict(method=None), r"method must be 'bass' or 'regular'"),
    (dict(attention_impl=3), r"attention_impl must be a name"),
])
def test_each_bad_argument_names_its_parameter(target, prompts, override, match):
  kwargs = dict(method="bass", max_new_tokens=8, draft_len=3)
  kwargs.update(override)
  with pytest.raises(ValueError, match=match):
    bj.generate(target, target, prompts, **kwargs)


def test_numpy_integers_are_accepted_wherever_ints_are(target, prompts):
  plain = bj.generate(target, target, prompts, max_new_tokens=8, draft_len=3, seed=5,
                      eos_token_id=[7], verify_chunk=3, temperature=0.5)
  numpy = bj.generate(target, target, [np.array(p, np.int64) for p in prompts],
                      max_new_tokens=np.int64(8), draft_len=np.int32(3), seed=np.uint64(5),
                      eos_token_id=np.array([7]), verify_chunk=np.int16(3),
                      temperature=np.float32(0.5))
  np.testing.assert_array_equal(plain.tokens, numpy.tokens)


def test_a_2d_array_is_a_batch_of_equal_length_prompts(target):
  rng = np.random.default_rng(1)
  batch = rng.integers(0, target.config.vocab_size, (3, 6))
  as_list = bj.generate(target, None, batch.tolist(), method="regular", max_new_tokens=5)
  for array in (batch, batch.astype(np.int32), jnp.asarray(batch, jnp.int32)):
    out = bj.generate(target, None, array, method="regular", max_new_tokens=5)
    np.testing.assert_array_equal(out.tokens, as_list.tokens)
  with pytest.raises(ValueError, match="2-D integer array"):
    bj.generate(target, None, batch.astype(np.float32), method="regular", max_new_tokens=5)
  with pytest.raises(ValueError, match="prompt 0 is a single int"):
    bj.generate(target, None, batch[0].tolist(), method="regular", max_new_tokens=5)
  # A boolean is no token id, in a list (numpy would make [True, 2] the ids [1, 2]) or an array.
  for bad in ([[True, 2, 3]], [[np.bool_(True), 2]], [np.array([True, False])]):
    with pytest.raises(ValueError, match="^prompt 0 (holds a boolean|must be a flat list of integer)"):
      bj.generate(target, None, bad, method="regular", max_new_tokens=5)


def test_all_64_bits_of_the_seed_count(target, prompts):
  kw = dict(method="regular", max_new_tokens=12, temperature=1.0)
  draw = lambda seed: bj.generate(target, None, prompts, seed=seed, **kw).tokens
  assert not np.array_equal(draw(2**32), draw(0))
  assert not np.array_equal(draw(2**32 + 1), draw(1))
  np.testing.assert_array_equal(draw(2**63 - 1), draw(2**63 - 1))
  # Below 2**32 the key is JAX's own key for the seed.
  assert np.array_equal(jax.random.key_data(bj.sampling.generate.prng_key(123)),
                        jax.random.key_data(jax.random.key(123)))


def _tokenizer(words: list[str], eos: str):
  """A word-level fast tokenizer over ``words`` (built offline, no files)."""
  import tokenizers
  import transformers

  vocab = {w: i for i, w in enumerate(words)}
  model = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token=words[0]))
  model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  return transformers.PreTrainedTokenizerFast(tokenizer_object=model, unk_token=words[0],
                                              eos_token=eos)


def test_a_draft_with_another_tokenizer_is_refused(target, prompts):
  vocab = target.config.vocab_size
  words = [f"w{i}" for i in range(vocab)]
  ours = _tokenizer(words, eos="w2")
  with_tok = lambda m, tok, **cfg: bj.Model(dataclasses.replace(m.config, **cfg), m.params, tok,
                                            m.name)
  tgt = with_tok(target, ours, eos_token_id=2, bos_token_id=1)
  bj.generate(tgt, with_tok(target, _tokenizer(words, eos="w2"), eos_token_id=2), prompts,
              max_new_tokens=4)  # same vocabulary, equal tokenizers: fine
  # The same ids with another EOS (a base model's draft for its instruct model), or EOS lists that
  # share an id (a GGUF header's one id against an HF config's several): the same tokenizer.
  bj.generate(tgt, with_tok(target, _tokenizer(words, eos="w3"), eos_token_id=[2, 3]), prompts,
              max_new_tokens=4)
  cases = [
      (with_tok(target, None, eos_token_id=50256), r"different eos_token_id \(50256 vs 2\)"),
      (with_tok(target, None, eos_token_id=(3, 4)), r"different eos_token_id \(\(3, 4\) vs 2\)"),
      (with_tok(target, None, eos_token_id=2, bos_token_id=0), r"different bos_token_id \(0 vs 1\)"),
      (with_tok(target, _tokenizer(words[:-1] + ["zz"], eos="w2"), eos_token_id=2),
       r"vocabularies differ .*'zz'"),
      (tiny_model(seed=4, vocab_size=vocab - 1), r"different vocabulary sizes \(60 vs 61\)"),
  ]
  for draft, match in cases:
    with pytest.raises(ValueError, match=match):
      bj.generate(tgt, draft, prompts, max_new_tokens=4)


def test_a_gpt2_draft_for_a_llama_target_is_refused(target, prompts):
  config = bj.GPT2Config(vocab_size=target.config.vocab_size, n_positions=64, n_embd=16, n_layer=1,
                         n_head=2, bos_token_id=60, eos_token_id=60)
  llama = bj.Model(dataclasses.replace(target.config, eos_token_id=2), target.params, name="llama")
  gpt2 = bj.Model(config, bj.init_params(config, jax.random.key(0)), name="gpt2")
  with pytest.raises(ValueError, match=r"draft 'gpt2' and target 'llama' have different eos_token_id"):
    bj.generate(llama, gpt2, prompts, max_new_tokens=4)


def test_load_model_checks_its_arguments(tmp_path):
  path = tmp_path / "m"
  bj.save_model(tiny_model(seed=0), path)
  for kwargs, match in ((dict(dtype="int8"), "dtype must be one of"), (dict(num_layers=1.0), "num_layers"),
                        (dict(num_layers=0), "num_layers must be >= 1"),
                        (dict(tokenizer="no"), "tokenizer must be True or False")):
    with pytest.raises(ValueError, match=match):
      bj.load_model(path, **kwargs)
  with pytest.raises(ValueError, match="spec must be"):
    bj.load_model(None)
  assert bj.load_model(path, dtype="bfloat16").dtype == jnp.bfloat16


def test_a_cache_too_short_is_refused_with_terms_that_add_up(target):
  """Issue 54, finding 5: the message's terms did not add up to its total (the kernels' alignment
  went unnamed). Each term, their sum and the rounding are checked against each other."""
  with pytest.raises(ValueError) as caught:
    bj.generate(target, None, [[1, 2, 3]], method="regular", max_new_tokens=40, max_cache_len=32)
  message = str(caught.value)
  match = re.search(r"needs (\d+) cache slots per row \(prompt padded to (\d+) \+ (\d+) output slots "
                    r"\(max_new_tokens=40 padded\) \+ (\d+) verification look-ahead = (\d+), rounded up "
                    r"to a multiple of (\d+) for the kernels' tiles\), more than max_cache_len=32; raise",
                    message)
  assert match, message
  total, prompt, output, ahead, needed, align = map(int, match.groups())
  assert prompt >= 3 and output >= 40 and prompt + output + ahead == needed, message
  assert total % align == 0 and needed <= total < needed + align, message
