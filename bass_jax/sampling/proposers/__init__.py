"""The draft side of BASS as proposers: a draft model, model-free n-gram lookup, and their hybrid.

The decode loop (``bass_jax.sampling.loop``) talks to the draft side only through this interface, the
one vLLM and SGLang give their speculators (docs/design.md, "Proposers"). A proposer is a static, hashable
description (part of the compiled program's key) whose weights, if any, travel as a separate pytree;
each step it

1. **proposes** up to ``l`` tokens per row (:class:`Proposal`: the drafts, how many of them are real
   for each row, and their per-position distributions ``q``, or None for a deterministic proposer,
   whose ``q`` is one-hot at its draft, which keeps rejection sampling exact: Leviathan et al. 2023,
   §3.5 holds for any ``q``), or, in a token-tree step, a tree of candidates per row
   (:meth:`Proposer.propose_tree`: deterministic nodes, one-hot ``q``);
2. **rolls back** after acceptance: its state is brought in line with the text each row now has.

For the cost-aware draft length it also times its forwards (:meth:`Proposer.forward_costs`,
:meth:`Proposer.tree_costs`).

With continuous batching the loop also restarts rows of the state on new prompts, several at once
(:meth:`Proposer.admit`; by default :meth:`Proposer.init_state` for those rows, written into them), so an
``init_state`` must take the ``prefill_chunk`` keyword (and may ignore it).

Its state (a ragged draft cache, or nothing) lives in ``DecodeState.proposer_state``. A proposer also
says whether it could propose anything at all this step (:meth:`Proposer.can_propose`): when no row
can, the loop runs a plain decoding step instead of a verification (``loop.decode``).

Implementations, one module each (and :class:`NoProposer`, in ``base``: regular decoding is the decode
whose proposer never proposes, so the loop compiles its plain step only):

* :class:`ModelProposer` (``draft_model``): an independent draft model, the paper's method, autoregressive over a ragged
  cache that it brings up to date (catch-up) before drafting.
* :class:`NGramProposer` (``ngram``): prompt lookup decoding (Saxena 2023; vLLM's ``ngram``
  speculator): match the row's last n tokens, longest n first, against its own prompt and output so
  far and propose what followed the most recent match (in a tree step, several matches as
  branches). No weights, no state, one-hot ``q``.
* :class:`EagleProposer` (``eagle_draft``): an EAGLE-style feature draft (``bass_jax.models.eagle``)
  that reads the target's own features, which the loop keeps for it (``needs_features``).
* :class:`SiblingProposer` (``siblings``): batch-shared suffix lookup (SuffixDecoding's idea, on
  device): match the row's last tokens against the text of the other samples of its prompt (rows of
  the batch, and a continuous batch's finished samples) and propose the continuation most of the
  matches agree on, as far as they agree. No weights, no state, one-hot ``q``.
* :class:`Hybrid` (``hybrid``): per row, the first of its model-free lookups that proposes (n-gram,
  sibling or a user's lookup), else a draft model (independent or EAGLE).
* :class:`Replay` (``replay``): a draft model whose forwards run every step but whose tokens are a
  recorded continuation, wrong at set per-position rates: a benchmark's realistic acceptance at any
  model shape (random weights included).

The interface, :class:`StepContext`, :class:`Proposal`, the drafting loop the model drafts share and
:class:`WrapsModel` (what a proposer built around a draft model, ``Hybrid`` or ``Replay``, hands to
its model) are in ``base``.

Axes: B batch, T token buffer (prompt bucket + output bucket), L max draft length, C verification
chunk, V vocabulary, E the target's feature size.
"""

from bass_jax.sampling.proposers.base import (DRAFT_SOURCES, FinishedSamples, NoProposer, Proposal,
                                              Proposer, StepContext, WrapsModel,
                                              draft_autoregressively)
from bass_jax.sampling.proposers.draft_model import DraftCacheState, ModelProposer
from bass_jax.sampling.proposers.eagle_draft import EagleProposer, EagleState
from bass_jax.sampling.proposers.hybrid import Hybrid
from bass_jax.sampling.proposers.medusa_heads import MedusaProposer
from bass_jax.sampling.proposers.ngram import NGramProposer
from bass_jax.sampling.proposers.replay import Replay, replay_text
from bass_jax.sampling.proposers.siblings import SiblingProposer

__all__ = ["DRAFT_SOURCES", "DraftCacheState", "EagleProposer", "EagleState", "FinishedSamples",
           "MedusaProposer",
           "Hybrid", "ModelProposer", "NGramProposer", "NoProposer", "Proposal", "Proposer",
           "Replay", "SiblingProposer", "StepContext", "WrapsModel", "draft_autoregressively",
           "replay_text"]
