"""``lower``: the programs a decode would run, exported for a platform without running them
(``jax.export`` of the prefill and the decode, Pallas kernels included), on any machine."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from bass_jax.loading import Model
from bass_jax import platforms
from bass_jax.sampling import costs as costs_lib
from bass_jax.sampling import loop
from bass_jax import profiles
from bass_jax.sampling import state as state_lib
from bass_jax.sampling.config import DecodeConfig, with_settings
from bass_jax.sampling.draft_len import GoodputDraftLen, as_policy
from bass_jax.sampling.plan import prepare
from bass_jax.sampling.programs import compiled
from bass_jax.sampling.tree import tree_shapes
from pallas_kernels.ragged_attention import TRITON_CUSTOM_CALL


@dataclasses.dataclass(frozen=True)
class LoweredDecode:
  """What :func:`lower` returns.

  Attributes:
    prefill, decode: ``jax.export.Exported`` programs (``.mlir_module()`` is their StableHLO).
    spec: the decode's :class:`state.DecodeSpec`.
    cache_arrays: the shapes of every KV cache array of the decode state (target and draft) and of
      the EAGLE feature buffer, as ``"f32[B,K,S,H]"`` (``"f32[L,B,K,S,H]"`` for a model with scanned
      layers; ``hlo_census`` spells shapes so).
    host_decode_hlo: with ``compile_on_host``, the decode compiled for this machine from the same
      settings and profile, the jnp reference attention standing in for a kernel (XLA's optimized
      HLO text, where copy insertion has run); else None.
  """

  prefill: Any
  decode: Any
  spec: state_lib.DecodeSpec
  cache_arrays: tuple[str, ...]
  host_decode_hlo: str | None = None


def lower(target: Model, draft: Any, prompts: Any, config: DecodeConfig | None = None, *,
          platform: str, sm_count: int = platforms.H100_SM_COUNT,
          compile_on_host: bool = False, **settings: Any) -> LoweredDecode:
  """Lowers the programs ``run(prepare(target, draft, prompts, config))`` would run, for
  ``platform``, without running them.

  Args:
    target, draft, prompts, config: as for ``prepare``. A cost-aware draft length without costs gets
      placeholders: the step costs are a traced input (``StepCosts.as_array``), so any values lower
      the same program, and measuring them would run programs.
    platform: ``"cuda"``, ``"rocm"`` or ``"cpu"``: the programs are traced as for it
      (``platforms.compiling_for``), and the default profile is its.
    sm_count: the SMs the Pallas kernels' cache splits assume on a GPU platform.
    compile_on_host: also compile the decode of the same settings (the same profile) for this
      machine, for what only a compiler shows (copies of the caches). The jnp reference attention
      stands in for a Pallas kernel there: the kernel is a custom call that reads the cache as the
      reference's ops do, while the Pallas interpreter would copy its operands into state.
    **settings: :class:`DecodeConfig` fields (``generate``'s keywords), over ``config``'s.

  Returns:
    A :class:`LoweredDecode`.

  Raises:
    ValueError: as ``prepare``.
  """
  from jax import export  # pylint: disable=g-import-not-at-top

  config = with_settings(config, settings)
  policy = config.draft_len
  if (isinstance(policy, str) and policy == "goodput") or (isinstance(policy, GoodputDraftLen)
                                                           and policy.costs is None):
    trees = tree_shapes(config.draft_tree)
    config = dataclasses.replace(config, draft_len=dataclasses.replace(
        as_policy(policy), costs=costs_lib.StepCosts(1.0, 1.0, 0.0, 0.0, 1, (1.0,) * len(trees))))
  # A Pallas Triton kernel lowers to a custom call that export does not vouch for by default.
  checks = [export.DisabledSafetyCheck.custom_call(TRITON_CUSTOM_CALL)]
  with platforms.compiling_for(platform, sm_count=sm_count):
    plan = prepare(target, draft, prompts, config)
    spec = plan.spec
    observe = plan.place(True)
    state = jax.eval_shape(lambda *a: loop.prefill(spec, *a), *plan.args_prefill)
    prefill = export.export(jax.jit(lambda *a: loop.prefill(spec, *a)), platforms=[platform],
                            disabled_checks=checks)(*plan.args_prefill)
    decode = export.export(jax.jit(lambda *a: loop.decode(spec, *a), donate_argnums=0),
                           platforms=[platform], disabled_checks=checks)(state, *plan.args_tail,
                                                                         observe)
  caches = [leaf for cache in (state.target_cache, state.proposer_state)  # [B, K, S, H] per layer,
            for leaf in jax.tree_util.tree_leaves(cache) if leaf.ndim in (4, 5)]  # or [L, ...] scanned
  caches += [] if state.features is None else [state.features]
  cache_arrays = tuple(sorted({f"{jnp.dtype(x.dtype).name.replace('float', 'f')}"
                               f"[{','.join(map(str, x.shape))}]" for x in caches}))
  host_hlo = None
  if compile_on_host:
    with platforms.compiling_for(jax.default_backend()):
      # The jnp reference stands in for a Pallas kernel: XLA sees a kernel (a custom call) read the
      # cache as it sees the reference's ops read it, where the Pallas interpreter would copy its
      # operands into state, copies no GPU program makes.
      profile = profiles.backend_profile(config.profile or profiles.platform_profile(platform))
      host = prepare(target, draft, prompts, dataclasses.replace(
          config, profile=profile, attention_impl="reference"))
      (_, host_decode), _, _ = compiled(host.spec, host.args_prefill,
                                     (*host.args_tail, host.place(True)))
    host_hlo = host_decode.as_text()
  return LoweredDecode(prefill=prefill, decode=decode, spec=spec, cache_arrays=cache_arrays,
                       host_decode_hlo=host_hlo)
