"""gemv_mma's torch twin and the description of its rope epilogue's operands.

The twin takes gemv_mma's arguments and returns its results, rounding where the kernel and the separate
layer kernels round: x + residual and the normalised x to float16, gate and up to float16, the
projection to float16 before RoPE (as the unfused path stores qkv), RoPE in float32 (layer_ops.rope_and_cache).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from protospec.errors import KernelArgumentError
from protospec.kernels.launch.interop import check_tensor


@dataclass(frozen=True)
class RopeCache:
    """Where a qkv projection's epilogue rotates and stores: HF's rotate-half RoPE on q and k, k and v
    into the paged cache at slot_mapping (slot -1: not stored, a CUDA graph's padding row)."""
    positions: torch.Tensor     # [T] int64
    cos: torch.Tensor           # [P, d] float16 (both halves share frequencies)
    sin: torch.Tensor           # [P, d] float16
    kv_cache: torch.Tensor      # [2, blocks, block_size, kvh, d] float16
    slot_mapping: torch.Tensor  # [T] int64
    num_heads: int
    # positions and slot_mapping were written before the forward began (every layer but the first: the
    # first's come from the kernel just before it): the kernel loads them, and their cos / sin rows, before
    # it waits for that kernel, not in its epilogue. The same bits.
    inputs_before_wait: bool = False

    @property
    def head_dim(self) -> int:
        return self.kv_cache.shape[4]

    def check(self, weight_rows: int, tokens: int, glu: bool, out_dtype: torch.dtype) -> None:
        check_tensor("rope kv_cache", self.kv_cache, torch.float16, 5)
        for name, t in (("rope cos", self.cos), ("rope sin", self.sin)):
            check_tensor(name, t, torch.float16, 2)
        check_tensor("rope positions", self.positions, torch.int64, 1, rows=tokens)
        check_tensor("rope slot_mapping", self.slot_mapping, torch.int64, 1, rows=tokens)
        d, kv_heads = self.head_dim, self.kv_cache.shape[3]
        if glu or out_dtype != torch.float16:
            raise KernelArgumentError("gemv_mma: rope takes a plain float16 qkv projection (no glu, float16 out)")
        if d % 16 or self.cos.shape[1] != d or self.sin.shape[1] != d:
            raise KernelArgumentError(f"gemv_mma: rope needs a head size that is a multiple of 16 and cos/sin "
                                      f"tables of it, got {d}, {tuple(self.cos.shape)}")
        if weight_rows != (self.num_heads + 2 * kv_heads) * d or self.num_heads % kv_heads:
            raise KernelArgumentError(f"gemv_mma: rope: {weight_rows} weight rows are not {self.num_heads} q heads "
                                      f"and 2 x {kv_heads} kv heads of {d}")

    def apply(self, qkv: torch.Tensor) -> torch.Tensor:
        """The epilogue in torch: qkv [T, (h + 2 kvh) d] float16 -> q [T, h, d]; k and v stored."""
        d, kv_heads, half = self.head_dim, self.kv_cache.shape[3], self.head_dim // 2
        heads = qkv.float().view(qkv.shape[0], -1, d)
        c = self.cos[self.positions, :half].float()[:, None]   # [T, 1, d/2]
        s = self.sin[self.positions, :half].float()[:, None]
        rotated = heads[:, : self.num_heads + kv_heads]
        x1, x2 = rotated[..., :half], rotated[..., half:]
        rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).half()
        q, k = rotated[:, : self.num_heads], rotated[:, self.num_heads:]
        v = heads[:, self.num_heads + kv_heads:].half()
        flat = self.kv_cache.view(2, -1, kv_heads, d)          # [2, slots, kvh, d]
        keep = self.slot_mapping >= 0
        flat[0].index_copy_(0, self.slot_mapping[keep], k[keep])
        flat[1].index_copy_(0, self.slot_mapping[keep], v[keep])
        return q.contiguous()


def gemv_mma_reference(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None,
                       residual: torch.Tensor | None = None, eps: float = 1e-6, glu: bool = False,
                       x_rows: torch.Tensor | None = None, rope: RopeCache | None = None,
                       out_dtype: torch.dtype = torch.float16, dependent_launch: bool = False,
                       allow_early: bool = False, residual_squares: torch.Tensor | None = None,
                       row_squares: torch.Tensor | None = None):
    """gemv_mma in torch (same arguments, same results; dependent_launch and allow_early are launch
    details, unused; row_squares' values are unused: the scale is computed from x, as the sums it
    holds were)."""
    if x_rows is not None:
        x = x[x_rows]
        residual = None if residual is None else residual[x_rows]
    stream = x.float() if residual is None else (x.float() + residual.float()).half().float()
    h = x.float() if norm_weight is None else _rms_normed(stream, norm_weight, eps).float()
    out = h @ weight.float().T
    if row_squares is not None:  # the plain form's rows scaled by 1 / rms(x)
        out = out * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps)
    if glu:
        gate, up = out.chunk(2, dim=-1)
        gate, up = gate.half().float(), up.half().float()
        out = gate * torch.sigmoid(gate) * up
    out = out.half() if out_dtype != torch.float32 else out  # float32 logits: the accumulator's values
    out = rope.apply(out) if rope is not None else out.to(out_dtype)
    if residual_squares is not None:  # y + residual as the stream is stored; its 16-column tiles' sums of squares
        out = (out.float() + residual_squares.float()).half()
        return out, out.float().pow(2).view(out.shape[0], -1, 16).sum(-1)
    return (out, stream.half()) if norm_weight is not None else out


def _rms_normed(stream: torch.Tensor, norm_weight: torch.Tensor, eps: float) -> torch.Tensor:
    """norm_weight * rms_norm(stream) in float32, rounded to float16 as the B operand takes it."""
    return (norm_weight.float() * (stream * torch.rsqrt(stream.pow(2).mean(-1, keepdim=True) + eps))).half()
