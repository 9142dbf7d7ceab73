"""Proposers by name: what the scripts' ``--draft`` specs can name (``bass_jax.load_draft_spec``).

A *proposer kind* is a name, a settings dataclass (whose fields the spec's ``key=value`` items set)
and a builder (settings and the target to what ``generate`` takes as its draft). The built-in
model-free proposers register themselves (``ngram``, ``siblings``); a user's proposer joins them with
:func:`register_proposer` (docs/extending.md), or is named by its import path in a spec without
registering (``py:my_pkg.my_module.MyProposer``). Draft *models* are not kinds: a spec that names no
kind is a model spec (``bass_jax.load_draft``).

The pattern is SGLang's ``@register_algorithm`` and vLLM's ``SpeculativeMethod`` names: one name
list, defined where the proposer is, which the scripts' grammar and help are generated from.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable

from bass_jax import _checks
from bass_jax.sampling.proposers.base import Proposer, not_model_free

# The settings a spec can write, by field type: what a value must look like, and its parse.
_BOOLS = {"true": True, "false": False, "1": True, "0": False}


def _parse_int(text: str) -> int:
  if not text.lstrip("-").isdigit():
    raise ValueError
  return int(text)


def _parse_float(text: str) -> float:
  value = float(text)
  if value != value:  # NaN  # pylint: disable=comparison-with-itself
    raise ValueError
  return value


def _parse_bool(text: str) -> bool:
  return _BOOLS[text.lower()]


_PARSERS: dict[Any, tuple[str, Callable[[str], Any]]] = {
    int: ("<int>", _parse_int), float: ("<float>", _parse_float), bool: ("true|false", _parse_bool),
    str: ("<text>", str)}


@dataclasses.dataclass(frozen=True)
class ProposerKind:
  """A proposer a draft spec can name.

  Attributes:
    name: the spec's name for it (``ngram``); letters, digits and ``_``.
    settings: a dataclass whose fields of type int, float, bool or str a spec sets as ``key=value``
      (for a model-free proposer, the proposer class itself); fields of other types keep their
      defaults.
    build: ``build(settings, target) -> draft``: anything ``generate`` takes as its draft (a
      ``Proposer``, or ``(proposer, params)`` for one with weights) from a settings instance and the
      target ``bass_jax.Model``.
    summary: one line for the scripts' help.
    model_free: True when ``build`` returns a proposer without weights or state, which a ``Hybrid``
      may use as a lookup (``hybrid+<name>:<model>``).
    settable: the settable fields, name -> (the value's form, its parse), read once from the
      settings' annotations (:func:`_make_kind`).
  """

  name: str
  settings: type
  build: Callable[[Any, Any], Any]
  summary: str
  model_free: bool
  settable: dict[str, tuple[str, Callable[[str], Any]]] = dataclasses.field(
      default_factory=dict, compare=False, hash=False)

  @property
  def required(self) -> tuple[str, ...]:
    """The settable fields without a default, which every spec of this kind sets."""
    return tuple(f.name for f in dataclasses.fields(self.settings)
                 if f.name in self.settable and f.default is dataclasses.MISSING
                 and f.default_factory is dataclasses.MISSING)

  def grammar(self) -> str:
    """``name[:key=<form>,...]``, as the help and errors write it; settings without a default
    outside the brackets (``name:key=<form>[,other=<form>]``)."""
    required = self.required
    need = ",".join(f"{key}={self.settable[key][0]}" for key in required)
    rest = ",".join(f"{key}={form}" for key, (form, _) in self.settable.items()
                    if key not in required)
    text = f"{self.name}:{need}" if need else self.name
    return f"{text}[{',' if need else ':'}{rest}]" if rest else text

  def parse(self, text: str, spec: str) -> Any:
    """A settings instance from ``key=value,...`` (empty: the defaults); ``spec``, the whole draft
    spec, is for the error messages only.

    Raises:
      ValueError: an unknown key, a value not of the field's type, a setting without a default
        left unset, or the settings' own refusal (their constructor's), each naming the spec and
        the accepted form.
    """
    fields = self.settable
    values = {}
    for item in filter(None, text.split(",")):
      key, _, value = item.partition("=")
      key, value = key.strip(), value.strip()
      if key not in fields:
        raise ValueError(f"draft spec {spec!r}: {self.name} takes no setting {key!r}; its form is "
                         f"{self.grammar()}")
      form, parse = fields[key]
      try:
        values[key] = parse(value)
      except (ValueError, KeyError):
        raise ValueError(f"draft spec {spec!r}: {self.name}'s {key} is {form}, got {value!r}"
                         ) from None
    missing = [key for key in self.required if key not in values]
    if missing:
      raise ValueError(f"draft spec {spec!r}: {self.name} needs {', '.join(missing)}; its form is "
                       f"{self.grammar()}")
    try:
      return self.settings(**values)
    except (TypeError, ValueError) as e:
      raise ValueError(f"draft spec {spec!r}: {e}") from e


def _identity(settings: Any, target: Any) -> Any:
  """The default builder: the settings instance is the proposer."""
  del target
  return settings


def _make_kind(name: str, settings: type, build: Callable[[Any, Any], Any] | None,
               summary: str | None, model_free: bool | None, where: str) -> ProposerKind:
  """A :class:`ProposerKind`, its settable fields read from the settings' annotations once.

  Raises:
    ValueError: annotations that do not resolve (``where`` says whose).
  """
  try:
    hints = typing.get_type_hints(settings)
  except Exception as e:  # pylint: disable=broad-except  # an annotation that does not resolve
    raise ValueError(f"{where}: the annotations of {settings.__name__} do not resolve "
                     f"({type(e).__name__}: {e}); import the types they name") from None
  settable = {f.name: _PARSERS[hints[f.name]] for f in dataclasses.fields(settings)
              if f.init and hints.get(f.name) in _PARSERS}
  if model_free is None:
    model_free = build is None and not_model_free(settings) is None
  doc = (summary or (settings.__doc__ or name).strip().splitlines()[0]).strip()
  return ProposerKind(name=name, settings=settings, build=build or _identity, summary=doc,
                      model_free=bool(model_free), settable=settable)


_KINDS: dict[str, ProposerKind] = {}
# Names a spec gives another meaning: ``hybrid`` (a model with lookups), ``py`` (an import path).
RESERVED = ("hybrid", "py")


def register_proposer(name: str, settings: type | None = None, *,
                      build: Callable[[Any, Any], Any] | None = None, summary: str | None = None,
                      model_free: bool | None = None):
  """Registers a proposer kind under ``name``, for the scripts' ``--draft`` specs.

  As a class decorator on a model-free proposer (a frozen dataclass, its fields the settings)::

    @bass_jax.register_proposer("repeat_last")
    @dataclasses.dataclass(frozen=True)
    class RepeatLast(bass_jax.Proposer): ...

  or as a call with a separate settings dataclass and a builder, e.g. for a proposer with weights:
  ``register_proposer("mine", MySettings, build=lambda s, target: (MyProposer(...), params))``.

  Args:
    name: the spec's name; letters, digits and ``_``, not a reserved word (``hybrid``, ``py``).
    settings: the settings dataclass; with no ``build``, a ``Proposer`` dataclass built as itself.
    build: ``build(settings, target) -> draft``; default: the settings instance is the proposer.
    summary: one line for the help; default: the first line of the class's docstring.
    model_free: whether a ``Hybrid`` may use it as a lookup; default: without ``build``, whether
      the class is model-free (``base.not_model_free``).

  Returns:
    ``settings`` (so that it decorates), or a decorator when ``settings`` is None.

  Raises:
    ValueError: a malformed or reserved name, a name registered to another class, settings that are
      not a dataclass or whose annotations do not resolve, or no ``build`` for settings that are not
      a ``Proposer``.
  """
  if settings is None:
    return lambda cls: register_proposer(name, cls, build=build, summary=summary,
                                         model_free=model_free)
  _checks.registry_name(name, "a proposer's name")
  if name in RESERVED:
    raise ValueError(f"{name!r} is reserved in draft specs ({', '.join(RESERVED)}); pick another name")
  if not (isinstance(settings, type) and dataclasses.is_dataclass(settings)):
    raise ValueError(f"register_proposer({name!r}): settings must be a dataclass, got {settings!r}")
  if build is None and not issubclass(settings, Proposer):
    raise ValueError(f"register_proposer({name!r}): {settings.__name__} is not a Proposer; give a "
                     "build(settings, target) that makes one")
  old = _KINDS.get(name)
  if old is not None and not _checks.same_definition(old.settings, settings):
    raise ValueError(f"proposer {name!r} is already registered to {old.settings.__qualname__}; "
                     "pick another name")
  _KINDS[name] = _make_kind(name, settings, build, summary, model_free,
                            where=f"register_proposer({name!r})")
  return settings


def proposer_kinds() -> tuple[ProposerKind, ...]:
  """Every registered kind, in order of registration."""
  return tuple(_KINDS.values())


def proposer_kind(name: str, spec: str) -> ProposerKind | None:
  """The kind a spec's first part names: a registered name, ``py:<module>.<Class>`` (imported), or
  None when it names no kind (then the spec is a model's).

  Args:
    name: the spec's first part (``ngram``, ``py:my_module.MyProposer``).
    spec: the whole spec, for the error messages only.

  Raises:
    ValueError: a ``py:`` path that does not import, names no ``Proposer`` dataclass, or names one
      whose annotations do not resolve.
  """
  if name in _KINDS:
    return _KINDS[name]
  if not name.startswith("py:"):
    return None
  path = name[3:]
  cls = _checks.import_object(path, f"draft spec {spec!r}")
  for kind in _KINDS.values():
    if kind.settings is cls:
      return kind
  if not (isinstance(cls, type) and issubclass(cls, Proposer) and dataclasses.is_dataclass(cls)):
    raise ValueError(f"draft spec {spec!r}: {path} is not a Proposer dataclass; register a builder "
                     "for it with bass_jax.register_proposer")
  return _make_kind(name, cls, None, (cls.__doc__ or path).strip().splitlines()[0], None,
                    where=f"draft spec {spec!r}")
