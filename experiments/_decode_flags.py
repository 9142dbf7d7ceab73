"""The scripts' flags for :class:`bass_jax.DecodeConfig`'s fields, defined in one place and read back
into one ``DecodeConfig`` (:func:`define`, then :meth:`DecodeFlags.config`).

A script names the fields it exposes and, where its setting differs, their defaults::

    DECODE = _decode_flags.define("max_new_tokens", "temperature", batch_size=4)
    ...
    config = DECODE.config()   # a DecodeConfig of the flags' values, DecodeConfig's defaults elsewhere

The flags are defined before ``bass_jax`` (and JAX) is imported, so that a bad flag is refused in a
moment and a script can still set XLA's flags; the table below is therefore written out here, and
``tests/cli_flags`` checks it against ``DecodeConfig`` (every field but :data:`NOT_FLAGS` has exactly
one row, with ``DecodeConfig``'s default and the library's limits). A new decode setting is a field of
``DecodeConfig`` and a row here; every script that takes all of them (:data:`FIELDS`) gets its flag.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from typing import Any, Callable

from absl import flags

from experiments import _io

# bass_jax's limits, spelled out (checked by tests/cli_flags against bass_jax.sampling.config.MAX_SEED,
# draft_len.MAX_DRAFT_LEN and the profiles' names).
MAX_SEED = 2**63 - 1
MAX_VERIFY_CHUNK = 33  # the longest draft (32) and its bonus position
MAX_BATCH = 4096
PROFILES = ("cpu", "gpu")

# DecodeConfig's fields that no flag sets, and why.
NOT_FLAGS = {
    "eos_token_id": "the target's config (and generation_config.json) name its stop ids",
    "mesh": "--mesh sets the process's mesh (experiments._io), which a decode without one uses",
}


@dataclasses.dataclass(frozen=True)
class _Row:
  """One field's flag: absl's definer, its default (DecodeConfig's), help, definer keywords, and the
  conversion of the flag's value to the field's."""

  define: Callable[..., flags.FlagHolder]
  default: Any
  help: str
  keywords: dict[str, Any] = dataclasses.field(default_factory=dict)
  value: Callable[[Any], Any] = lambda v: v


ROWS: dict[str, _Row] = {
    # Sampling.
    "max_new_tokens": _Row(flags.DEFINE_integer, 128, "Tokens per sequence at most.",
                           {"lower_bound": 1}),
    "temperature": _Row(flags.DEFINE_float, 0.0, "Sampling temperature; 0 = greedy.",
                        {"lower_bound": 0.0}),
    "top_p": _Row(flags.DEFINE_float, 1.0, "Nucleus mass in (0, 1].", {"upper_bound": 1.0}),
    "seed": _Row(flags.DEFINE_integer, 0, "PRNG seed in [0, 2**63 - 1] (with static batches, batch i "
                 "uses seed + i).", {"lower_bound": 0, "upper_bound": MAX_SEED}),
    "acceptance": _Row(
        flags.DEFINE_string, "rejection", "How sampled drafts are accepted: 'rejection' (speculative "
        "rejection sampling, the paper's), 'gumbel' (Gumbel acceptance: each sequence's tokens depend "
        "only on the seed, its place in the run and the target, so a resumed continuous run repeats an "
        "uninterrupted one exactly; a model draft is accepted a little less often), another registered "
        "rule (bass_jax.acceptance_rules()), or py:<module>.<Class>, a bass_jax.AcceptanceRule of "
        "one's own (docs/extending.md)."),
    # Speculation.
    "method": _Row(flags.DEFINE_enum, "bass", "Decoding method.", {"enum_values": ["bass", "regular"]}),
    "draft_len": _Row(
        flags.DEFINE_string, "dynamic", "'dynamic' (BASS Algorithm 1), 'goodput' (per step the length, "
        "0 = plain decoding, that maximizes expected tokens per second from measured step costs) or an "
        "int >= 1.", value=_io.draft_len_value),
    "draft_tree": _Row(
        flags.DEFINE_multi_string, [], "Verify a token tree per row instead of a chain (EAGLE-2): "
        "'top_k=4,depth=5,nodes=16' (children per expanded node, levels, nodes verified per row, root "
        "included); absent: chains. With --draft_len at its default every step verifies the tree; with "
        "--draft_len=goodput each step chooses among plain steps, chains and the shapes given (repeat "
        "the flag for several).", value=lambda v: list(v) or None),
    "verify_chunk": _Row(
        flags.DEFINE_integer, None, "Positions one verification forward scores (compiled once; "
        "default: the backend profile's, 4 on a CPU, one pass of L + 1 on a GPU); a step scores its "
        "l_draft + 1 positions in passes. At most 33 (the longest draft, 32, and its bonus position).",
        {"lower_bound": 1, "upper_bound": MAX_VERIFY_CHUNK}),
    # Batching.
    "batch_size": _Row(flags.DEFINE_integer, None, "Rows that decode at once, at most 4096.",
                       {"lower_bound": 1, "upper_bound": MAX_BATCH}),
    "max_cache_len": _Row(flags.DEFINE_integer, None, "The most cache slots per row the decode may "
                          "allocate (default: what the prompts and --max_new_tokens need).",
                          {"lower_bound": 1}),
    "max_prompt_len": _Row(flags.DEFINE_integer, None, "The prompt capacity the programs are built "
                           "for (a power of two, at least 16; default: the run's longest prompt).",
                           {"lower_bound": 1}),
    # Backend.
    "attention_impl": _Row(flags.DEFINE_string, None, "Attention implementation "
                           "(bass_jax.attention_implementations()); default: the backend profile's (the "
                           "jnp reference on a CPU, pallas_split on a GPU)."),
    "profile": _Row(flags.DEFINE_enum, None, "Backend profile whose defaults fill --attention_impl and "
                    "--verify_chunk (bass_jax.profiles); default: the platform's.",
                    {"enum_values": list(PROFILES)}),
    "draft_sharding": _Row(flags.DEFINE_enum, "replicated", "How a draft model lies on --mesh: "
                           "replicated (whole on every device) or tensor_parallel (like the target).",
                           {"enum_values": ["replicated", "tensor_parallel"]}),
}

FIELDS = tuple(ROWS)  # every field a flag sets, in DecodeConfig's order

_VALIDATORS = {
    "temperature": lambda: flags.register_validator(
        "temperature", math.isfinite, message="--temperature must be a finite number >= 0 (0 = greedy)"),
    "top_p": lambda: flags.register_validator(
        "top_p", lambda v: math.isfinite(v) and v > 0, message="--top_p must be in (0, 1]"),
    "draft_len": _io.require_draft_len,
    "draft_tree": _io.require_tree_shapes,
}


@dataclasses.dataclass(frozen=True)
class DecodeFlags:
  """The decode flags a script defined (:func:`define`): field name -> absl ``FlagHolder``."""

  holders: dict[str, flags.FlagHolder]

  def __getitem__(self, name: str) -> flags.FlagHolder:
    return self.holders[name]

  def values(self) -> dict[str, Any]:
    """The flags' values as ``DecodeConfig`` takes them (``--draft_len=4`` the int 4, no
    ``--draft_tree`` None)."""
    return {name: ROWS[name].value(holder.value) for name, holder in self.holders.items()}

  def config(self, **overrides: Any):
    """A ``bass_jax.DecodeConfig`` of the flags' values with ``overrides`` (field name -> value) over
    them; the fields no flag set keep ``DecodeConfig``'s defaults. Imports ``bass_jax``.

    Raises:
      TypeError: an override that is not a ``DecodeConfig`` field.
    """
    from bass_jax.sampling import config as config_lib  # pylint: disable=g-import-not-at-top

    return config_lib.with_settings(None, {**self.values(), **overrides})


def define(*names: str, **defaults: Any) -> DecodeFlags:
  """Defines the flags of ``names`` and of ``defaults``' keys (``DecodeConfig`` field names; a default
  given here replaces ``DecodeConfig``'s for this script), with their validators, as flags of the
  calling module.

  Returns:
    :class:`DecodeFlags`.

  Raises:
    ValueError: a name that is not a flag-set field (:data:`FIELDS`; :data:`NOT_FLAGS` says why some
      fields have none).
  """
  module = sys._getframe(1).f_globals["__name__"]  # pylint: disable=protected-access
  if module == "__main__":  # absl files a script's own flags under its path (as get_flags_for_module
    module = sys.argv[0]    # looks "__main__" up)
  wanted = list(dict.fromkeys([*names, *defaults]))
  unknown = [n for n in wanted if n not in ROWS]
  if unknown:
    why = NOT_FLAGS.get(unknown[0], f"the fields with flags are {', '.join(FIELDS)}")
    raise ValueError(f"no decode flag for {unknown[0]!r}: {why}")
  holders = {}
  for name in sorted(wanted, key=FIELDS.index):
    row = ROWS[name]
    # Attributed to the calling script, as its own flags are (its --help, experiments._runs.settings).
    holders[name] = row.define(name, defaults.get(name, row.default), help=row.help,
                               module_name=module, **row.keywords)
    if name in _VALIDATORS:
      _VALIDATORS[name]()
  return DecodeFlags(holders)


def parse(name: str, *texts: str) -> Any:
  """``texts`` as the value of field ``name``, read as its flag reads them (``--<name>=<text>``,
  repeated for a multi-valued flag such as ``draft_tree``: the same parser, bounds and conversion),
  for settings written outside a flag of their own (a benchmark's variants and swept values).

  Raises:
    ValueError: a name without a flag row (:data:`FIELDS`), several texts for a single-valued
      setting, or text the flag refuses, naming the setting and the text.
  """
  if name not in ROWS:
    why = NOT_FLAGS.get(name, f"the settings are {', '.join(FIELDS)}")
    raise ValueError(f"no decode setting {name!r}: {why}")
  row = ROWS[name]
  values = flags.FlagValues()
  row.define(name, row.default, help=row.help, flag_values=values, **row.keywords)
  if len(texts) != 1 and not isinstance(values[name], flags.MultiFlag):
    raise ValueError(f"{name} takes one value, got {len(texts)}: {', '.join(texts)}")
  for text in texts:
    try:
      values[name].parse(text)
    except (flags.IllegalFlagValueError, ValueError) as e:
      raise ValueError(f"{name}={text}: {e}") from None
  return row.value(values[name].value)
