# SPDX-License-Identifier: Apache-2.0
"""torch.ops.kjit.*: the ops as torch custom ops, so that torch.compile traces a call as one
opaque node (with a fake implementation for shapes) instead of graph-breaking on it.

The custom-op dispatcher costs tens of microseconds per call; eager code should call the kjit
functions directly and keep these for compiled graphs.
"""

from typing import Optional

from . import _api

_registered = False


def register():
    global _registered
    import torch

    if _registered or not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
        return  # torch < 2.4 has no torch.library.custom_op: the plain functions still work
    _registered = True
    Tensor = torch.Tensor

    @torch.library.custom_op("kjit::merge_state", mutates_args=())
    def merge_state(v_a: Tensor, s_a: Tensor, v_b: Tensor, s_b: Tensor, lse_base: str,
                    lse_layout: str = "token_major",
                    pos_inf_as_empty: bool = True) -> tuple[Tensor, Tensor]:
        return _api.merge_state(v_a, s_a, v_b, s_b, lse_base=lse_base, lse_layout=lse_layout,
                                pos_inf_as_empty=pos_inf_as_empty)

    @merge_state.register_fake
    def _(v_a, s_a, v_b, s_b, lse_base, lse_layout="token_major", pos_inf_as_empty=True):
        return v_a.new_empty(v_a.shape), s_a.new_empty(s_a.shape)

    @torch.library.custom_op("kjit::merge_state_in_place", mutates_args=("v", "s"))
    def merge_state_in_place(v: Tensor, s: Tensor, v_other: Tensor, s_other: Tensor,
                             mask: Optional[Tensor], lse_base: str,
                             lse_layout: str = "token_major",
                             pos_inf_as_empty: bool = True) -> None:
        _api.merge_state_in_place(v, s, v_other, s_other, mask, lse_base=lse_base,
                                  lse_layout=lse_layout, pos_inf_as_empty=pos_inf_as_empty)

    @merge_state_in_place.register_fake
    def _(v, s, v_other, s_other, mask, lse_base, lse_layout="token_major",
          pos_inf_as_empty=True):
        return None

    @torch.library.custom_op("kjit::merge_states", mutates_args=())
    def merge_states(v: Tensor, s: Tensor, lse_base: str, lse_layout: str = "token_major",
                     pos_inf_as_empty: bool = True) -> tuple[Tensor, Tensor]:
        return _api.merge_states(v, s, lse_base=lse_base, lse_layout=lse_layout,
                                 pos_inf_as_empty=pos_inf_as_empty)

    @merge_states.register_fake
    def _(v, s, lse_base, lse_layout="token_major", pos_inf_as_empty=True):
        lse = (s.shape[0], s.shape[2]) if lse_layout == "token_major" else s.shape[:2]
        return v.new_empty((v.shape[0], v.shape[2], v.shape[3])), s.new_empty(lse)

    @torch.library.custom_op("kjit::gdn_decode", mutates_args=("state",))
    def gdn_decode(mixed_qkv: Tensor, a: Tensor, b: Tensor, a_log: Tensor, dt_bias: Tensor,
                   state: Tensor, state_indices: Tensor, scale: Optional[float] = None,
                   l2norm_qk: bool = True, softplus_threshold: float = 20.0,
                   invalid_index: str = "negative", row_order: str = "auto") -> Tensor:
        # invalid_index: see kjit.gdn_decode (vLLM's pools need "nonpositive").
        return _api.gdn_decode(mixed_qkv, a, b, a_log, dt_bias, state, state_indices,
                               scale=scale, l2norm_qk=l2norm_qk,
                               softplus_threshold=softplus_threshold,
                               invalid_index=invalid_index, row_order=row_order)

    @gdn_decode.register_fake
    def _(mixed_qkv, a, b, a_log, dt_bias, state, state_indices, scale=None, l2norm_qk=True,
          softplus_threshold=20.0, invalid_index="negative", row_order="auto"):
        return mixed_qkv.new_empty((mixed_qkv.shape[0], state.shape[1], state.shape[2]))

    @torch.library.custom_op("kjit::gdn_prefill", mutates_args=("state",))
    def gdn_prefill(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, state: Tensor,
                    state_indices: Tensor, a: Optional[Tensor] = None,
                    b: Optional[Tensor] = None, a_log: Optional[Tensor] = None,
                    dt_bias: Optional[Tensor] = None, g: Optional[Tensor] = None,
                    beta: Optional[Tensor] = None,
                    has_initial_state: Optional[Tensor] = None, scale: float = 0.0,
                    l2norm_qk: bool = True, softplus_threshold: float = 20.0) -> Tensor:
        return _api.gdn_prefill(q, k, v, cu_seqlens, state, state_indices, a=a, b=b,
                                a_log=a_log, dt_bias=dt_bias, g=g, beta=beta,
                                has_initial_state=has_initial_state, scale=scale,
                                l2norm_qk=l2norm_qk, softplus_threshold=softplus_threshold)

    @gdn_prefill.register_fake
    def _(q, k, v, cu_seqlens, state, state_indices, a=None, b=None, a_log=None, dt_bias=None,
          g=None, beta=None, has_initial_state=None, scale=0.0, l2norm_qk=True,
          softplus_threshold=20.0):
        return q.new_empty((q.shape[0], v.shape[1], v.shape[2]))

    # Checkpoints as an op of their own, with the buffers required: the plain function makes
    # them from a host copy of cu_seqlens, which a traced graph can neither take nor size an
    # output by, and torch 2.11 fails on an optional mutated argument left at its default
    # (IndexError in its ADInplaceOrView kernel; torch 2.15 does not). For the same reason
    # neither op takes a workspace: kjit allocates it stream-ordered, also under capture.
    @torch.library.custom_op("kjit::gdn_prefill_with_checkpoints",
                             mutates_args=("state", "state_checkpoints"))
    def gdn_prefill_with_checkpoints(
            q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, state: Tensor,
            state_indices: Tensor, state_checkpoints: Tensor, checkpoint_cu_starts: Tensor,
            checkpoint_every_n_tokens: int, a: Optional[Tensor] = None,
            b: Optional[Tensor] = None, a_log: Optional[Tensor] = None,
            dt_bias: Optional[Tensor] = None, g: Optional[Tensor] = None,
            beta: Optional[Tensor] = None, has_initial_state: Optional[Tensor] = None,
            scale: float = 0.0, l2norm_qk: bool = True,
            softplus_threshold: float = 20.0) -> Tensor:
        result = _api.gdn_prefill(q, k, v, cu_seqlens, state, state_indices, a=a, b=b,
                                  a_log=a_log, dt_bias=dt_bias, g=g, beta=beta,
                                  has_initial_state=has_initial_state, scale=scale,
                                  l2norm_qk=l2norm_qk, softplus_threshold=softplus_threshold,
                                  checkpoint_every_n_tokens=checkpoint_every_n_tokens,
                                  state_checkpoints=state_checkpoints,
                                  checkpoint_cu_starts=checkpoint_cu_starts)
        return result[0] if isinstance(result, tuple) else result  # (out, checkpoints) or out

    @gdn_prefill_with_checkpoints.register_fake
    def _(q, k, v, cu_seqlens, state, state_indices, state_checkpoints, checkpoint_cu_starts,
          checkpoint_every_n_tokens, a=None, b=None, a_log=None, dt_bias=None, g=None, beta=None,
          has_initial_state=None, scale=0.0, l2norm_qk=True, softplus_threshold=20.0):
        return q.new_empty((q.shape[0], v.shape[1], v.shape[2]))
