"""A torch reference of DINOv3's ViT (`DinoVisionTransformer`) and its ImageNet-1k linear
classifier (`dinov3_vit7b16_lc`), written from facebookresearch/dinov3 at
6876159a11b4df116f30f667f8c9888617df0751 (`dinov3/models/vision_transformer.py`,
`dinov3/layers/{attention,block,ffn_layers,layer_scale,rope_position_encoding}.py`,
`dinov3/hub/{backbones,classifiers}.py`), for the equality tests.

Same module names as the official code, so `state_dict()` has the released files' keys:
`cls_token`, `storage_tokens`, `mask_token`, `rope_embed.periods`, `patch_embed.proj`,
`blocks.<i>.{norm1, attn.qkv (LinearKMaskedBias: `bias` + `bias_mask` only with qkv_bias),
attn.proj, ls1.gamma, norm2, mlp.w1 / w2 / w3 (SwiGLU, hidden int(d * ffn_ratio * 2 / 3)
rounded up to `align_to`), ls2.gamma}`, `norm`, and `local_cls_norm` when the global and local
class-token norms are untied (the 7B: training-only, never used at inference). Inference only
(no drop path, no RoPE shift / jitter / rescale augmentation, no masks).
`LinearClassifier` is `_LinearClassifierWrapper`: Linear(2 D, 1000) on
concat(x_norm_clstoken, mean of x_norm_patchtokens); its `linear_head.state_dict()` is the
head file's layout (`weight`, `bias`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class LinearKMaskedBias(nn.Linear):
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    if self.bias is not None:
      self.register_buffer("bias_mask", torch.ones_like(self.bias))

  def forward(self, x):
    bias = self.bias * self.bias_mask if self.bias is not None else None
    return F.linear(x, self.weight, bias)


def _rotate_half(x):
  a, b = x.chunk(2, dim=-1)
  return torch.cat([-b, a], dim=-1)


class SelfAttention(nn.Module):
  def __init__(self, dim, num_heads, qkv_bias, mask_k_bias):
    super().__init__()
    self.num_heads = num_heads
    self.qkv = (LinearKMaskedBias if mask_k_bias else nn.Linear)(dim, 3 * dim, bias=qkv_bias)
    self.proj = nn.Linear(dim, dim)

  def forward(self, x, rope):
    b, n, c = x.shape
    q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, c // self.num_heads).unbind(2)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    sin, cos = rope
    prefix = n - sin.shape[-2]
    q = torch.cat([q[:, :, :prefix], q[:, :, prefix:] * cos + _rotate_half(q[:, :, prefix:]) * sin], 2)
    k = torch.cat([k[:, :, :prefix], k[:, :, prefix:] * cos + _rotate_half(k[:, :, prefix:]) * sin], 2)
    y = F.scaled_dot_product_attention(q, k, v)
    return self.proj(y.transpose(1, 2).reshape(b, n, c))


class SwiGLUFFN(nn.Module):
  def __init__(self, dim, hidden, align_to):
    super().__init__()
    d = int(hidden * 2 / 3)
    d = d + (-d % align_to)
    self.w1, self.w2, self.w3 = nn.Linear(dim, d), nn.Linear(dim, d), nn.Linear(d, dim)

  def forward(self, x):
    return self.w3(F.silu(self.w1(x)) * self.w2(x))


class LayerScale(nn.Module):
  def __init__(self, dim):
    super().__init__()
    self.gamma = nn.Parameter(torch.full((dim,), 1e-5))

  def forward(self, x):
    return x * self.gamma


class Block(nn.Module):
  def __init__(self, dim, num_heads, ffn_ratio, qkv_bias, mask_k_bias, align_to, eps):
    super().__init__()
    self.norm1 = nn.LayerNorm(dim, eps=eps)
    self.attn = SelfAttention(dim, num_heads, qkv_bias, mask_k_bias)
    self.ls1 = LayerScale(dim)
    self.norm2 = nn.LayerNorm(dim, eps=eps)
    self.mlp = SwiGLUFFN(dim, int(dim * ffn_ratio), align_to)
    self.ls2 = LayerScale(dim)

  def forward(self, x, rope):
    x = x + self.ls1(self.attn(self.norm1(x), rope))
    return x + self.ls2(self.mlp(self.norm2(x)))


class PatchEmbed(nn.Module):
  def __init__(self, dim, patch_size):
    super().__init__()
    self.proj = nn.Conv2d(3, dim, patch_size, stride=patch_size)


class RopePositionEmbedding(nn.Module):
  """base-parametrised periods (persistent buffer), 'separate' coordinate normalisation."""

  def __init__(self, dim, num_heads, base=100.0):
    super().__init__()
    d_head = dim // num_heads
    self.register_buffer("periods", base ** (2 * torch.arange(d_head // 4, dtype=torch.float32)
                                             / (d_head // 2)), persistent=True)

  def forward(self, h, w):
    ch = torch.arange(0.5, h, dtype=torch.float32) / h
    cw = torch.arange(0.5, w, dtype=torch.float32) / w
    coords = torch.stack(torch.meshgrid(ch, cw, indexing="ij"), -1).flatten(0, 1) * 2.0 - 1.0
    angles = (2 * math.pi * coords[:, :, None] / self.periods[None, None, :]).flatten(1, 2)
    angles = angles.tile(2)
    return torch.sin(angles), torch.cos(angles)


class DinoVisionTransformer(nn.Module):
  """SwiGLU blocks (the 7B's `swiglu64` with align_to=64), LayerNorm eps 1e-5
  (`layernormbf16`), layer scale, `n_storage_tokens` storage tokens."""

  def __init__(self, *, embed_dim, depth, num_heads, ffn_ratio=3.0, patch_size=16,
               qkv_bias=False, mask_k_bias=True, align_to=64, n_storage_tokens=4,
               untie_global_and_local_cls_norm=True):
    super().__init__()
    self.embed_dim, self.n_storage_tokens = embed_dim, n_storage_tokens
    self.patch_embed = PatchEmbed(embed_dim, patch_size)
    self.cls_token = nn.Parameter(torch.randn(1, 1, embed_dim) * 0.02)
    self.storage_tokens = nn.Parameter(torch.randn(1, n_storage_tokens, embed_dim) * 0.02)
    self.rope_embed = RopePositionEmbedding(embed_dim, num_heads)
    self.blocks = nn.ModuleList(
        Block(embed_dim, num_heads, ffn_ratio, qkv_bias, mask_k_bias, align_to, 1e-5)
        for _ in range(depth))
    self.norm = nn.LayerNorm(embed_dim, eps=1e-5)
    if untie_global_and_local_cls_norm:
      self.local_cls_norm = nn.LayerNorm(embed_dim, eps=1e-5)
    self.head = nn.Identity()
    self.mask_token = nn.Parameter(torch.zeros(1, embed_dim))

  def forward_features(self, x):
    x = self.patch_embed.proj(x)
    b, _, h, w = x.shape
    x = x.flatten(2).transpose(1, 2)
    x = torch.cat([(self.cls_token + 0 * self.mask_token).expand(b, -1, -1),
                   self.storage_tokens.expand(b, -1, -1), x], 1)
    rope = self.rope_embed(h, w)
    for blk in self.blocks:
      x = blk(x, rope)
    # untie_global_and_local_cls_norm: eval uses `norm` for every token (local_cls_norm: training)
    x_norm = self.norm(x)
    k = self.n_storage_tokens + 1
    return {"x_norm_clstoken": x_norm[:, 0], "x_storage_tokens": x_norm[:, 1:k],
            "x_norm_patchtokens": x_norm[:, k:], "x_prenorm": x}


class LinearClassifier(nn.Module):
  def __init__(self, backbone: DinoVisionTransformer, num_classes: int = 1000):
    super().__init__()
    self.backbone = backbone
    self.linear_head = nn.Linear(2 * backbone.embed_dim, num_classes)

  def linear_input(self, x):
    f = self.backbone.forward_features(x)
    return torch.cat([f["x_norm_clstoken"], f["x_norm_patchtokens"].mean(dim=1)], dim=1)

  def forward(self, x):
    return self.linear_head(self.linear_input(x))
