"""A small torch reproduction of PE-Core's official forward (facebookresearch/perception_models @
3e352cc, core/vision_encoder/pe.py and rope.py: `CLIP`, `VisionTransformer`, `TextTransformer`),
written independently with the official module names so that `state_dict()` is the official
file layout (`visual.conv1.weight`, `visual.transformer.resblocks.0.attn.in_proj_weight`,
`visual.attn_pool.probe`, `token_embedding.weight`, `logit_scale`, ...).

What it reproduces: conv stem without bias; optional class token; absolute posemb resized with
F.interpolate(bilinear, align_corners=False) on the patch part when the grid differs from the
trained one; ln_pre; blocks with 2-D RoPE (`Rope2D`: per-axis 'lang' frequencies of dim
head_dim/2, interleaved rotate-half, [x | y] layout, positions + 1 with a class token whose
angles are 0) in the vision tower, nn.MultiheadAttention with a causal mask in the text tower;
optional layer scale; ln_post on every token; attention pooling (nn.MultiheadAttention, probe,
x + MLP(LN(x))); proj; text: argmax (EOT) pooling after ln_final, text_projection; logit_scale.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn


class LayerScale(nn.Module):
  def __init__(self, dim, value):
    super().__init__()
    self.gamma = nn.Parameter(value * torch.ones(dim))

  def forward(self, x):
    return x * self.gamma


def _mlp(width, hidden):
  return nn.Sequential(OrderedDict([("c_fc", nn.Linear(width, hidden)), ("gelu", nn.GELU()),
                                    ("c_proj", nn.Linear(hidden, width))]))


def _rotate_half(x):
  x = x.unflatten(-1, (-1, 2))
  return torch.stack((-x[..., 1], x[..., 0]), dim=-1).flatten(-2)


def rope_freqs(grid_h, grid_w, head_dim, cls_token):
  """(S, head_dim) angles as Rope2D.update_grid builds them."""
  dim = head_dim // 2
  freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
  off = 1 if cls_token else 0
  fy = torch.repeat_interleave(torch.einsum("i,f->if", (torch.arange(grid_h) + off).float(), freqs), 2, -1)
  fx = torch.repeat_interleave(torch.einsum("i,f->if", (torch.arange(grid_w) + off).float(), freqs), 2, -1)
  freq = torch.cat([fx[None, :].expand(grid_h, grid_w, -1), fy[:, None].expand(grid_h, grid_w, -1)],
                   dim=-1).reshape(grid_h * grid_w, -1)
  if cls_token:
    freq = torch.cat([torch.zeros(1, freq.shape[-1]), freq], dim=0)
  return freq


class SelfAttention(nn.Module):
  def __init__(self, width, heads):
    super().__init__()
    self.heads = heads
    self.in_proj_weight = nn.Parameter(torch.randn(3 * width, width) / width ** 0.5)
    self.in_proj_bias = nn.Parameter(0.2 * torch.randn(3 * width))
    self.out_proj = nn.Linear(width, width)

  def forward(self, x, freq):
    b, s, d = x.shape
    q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).unflatten(-1, (3, d)).unbind(-2)
    q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in (q, k, v))
    f = freq[None, None]
    q = q * f.cos() + _rotate_half(q) * f.sin()
    k = k * f.cos() + _rotate_half(k) * f.sin()
    y = F.scaled_dot_product_attention(q, k, v)
    return self.out_proj(y.transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
  def __init__(self, width, heads, mlp_ratio, ls, rope):
    super().__init__()
    self.attn = SelfAttention(width, heads) if rope else nn.MultiheadAttention(width, heads, batch_first=True)
    self.ls_1 = LayerScale(width, ls) if ls is not None else nn.Identity()
    self.ls_2 = LayerScale(width, ls) if ls is not None else nn.Identity()
    self.ln_1, self.ln_2 = nn.LayerNorm(width, eps=1e-5), nn.LayerNorm(width, eps=1e-5)
    self.mlp = _mlp(width, int(width * mlp_ratio))

  def forward(self, x, freq=None, mask=None):
    y = self.ln_1(x)
    y = self.attn(y, freq) if freq is not None else self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
    x = x + self.ls_1(y)
    return x + self.ls_2(self.mlp(self.ln_2(x)))


class Transformer(nn.Module):
  def __init__(self, width, layers, heads, mlp_ratio, ls=None, rope=False):
    super().__init__()
    self.resblocks = nn.ModuleList([Block(width, heads, mlp_ratio, ls, rope) for _ in range(layers)])

  def forward(self, x, freq=None, mask=None):
    for blk in self.resblocks:
      x = blk(x, freq, mask)
    return x


class AttentionPooling(nn.Module):
  def __init__(self, width, heads):
    super().__init__()
    self.probe = nn.Parameter(torch.randn(1, 1, width))
    self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
    self.layernorm = nn.LayerNorm(width, eps=1e-5)
    self.mlp = _mlp(width, 4 * width)

  def forward(self, x):
    q = self.probe.repeat(x.shape[0], 1, 1)
    x = self.attn(q, x, x, need_weights=False)[0]
    return x + self.mlp(self.layernorm(x))


class VisionTransformer(nn.Module):
  def __init__(self, patch_size, width, layers, heads, mlp_ratio, output_dim, image_size,
               use_cls_token=True, attn_pooler_heads=8, ls_init_value=None):
    super().__init__()
    self.patch_size, self.width, self.heads, self.use_cls_token = patch_size, width, heads, use_cls_token
    self.grid = image_size // patch_size
    self.conv1 = nn.Conv2d(3, width, patch_size, patch_size, bias=False)
    self.ln_pre, self.ln_post = nn.LayerNorm(width, eps=1e-5), nn.LayerNorm(width, eps=1e-5)
    self.transformer = Transformer(width, layers, heads, mlp_ratio, ls_init_value, rope=True)
    self.attn_pool = AttentionPooling(width, attn_pooler_heads)
    scale = width ** -0.5
    if use_cls_token:
      self.class_embedding = nn.Parameter(scale * torch.randn(width))
    self.positional_embedding = nn.Parameter(scale * torch.randn(int(use_cls_token) + self.grid ** 2, width))
    self.proj = nn.Parameter(scale * torch.randn(width, output_dim))

  def _posemb(self, gh, gw):
    pos = self.positional_embedding
    if (gh, gw) == (self.grid, self.grid):
      return pos[None]
    cls, pos = (pos[:1], pos[1:]) if self.use_cls_token else (pos[:0], pos)
    pos = pos.reshape(1, self.grid, self.grid, -1).permute(0, 3, 1, 2)
    pos = F.interpolate(pos, size=(gh, gw), mode="bilinear", align_corners=False)
    return torch.cat([cls, pos.permute(0, 2, 3, 1).reshape(gh * gw, -1)])[None]

  def tokens(self, x):
    """The ln_post'ed tokens (`forward_features(norm=True)`)."""
    b, _, h, w = x.shape
    gh, gw = h // self.patch_size, w // self.patch_size
    x = self.conv1(x).permute(0, 2, 3, 1).reshape(b, -1, self.width)
    if self.use_cls_token:
      x = torch.cat([self.class_embedding.view(1, 1, -1).expand(b, -1, -1), x], dim=1)
    x = self.ln_pre(x + self._posemb(gh, gw))
    x = self.transformer(x, freq=rope_freqs(gh, gw, self.width // self.heads, self.use_cls_token))
    return self.ln_post(x)

  def forward(self, x):
    return self.attn_pool(self.tokens(x)).squeeze(1) @ self.proj


class CLIP(nn.Module):
  """Text tower at the top level (the official CLIP subclasses TextTransformer), `visual`."""

  def __init__(self, vision: dict, context_length, width, heads, layers, output_dim, vocab_size=49408):
    super().__init__()
    self.token_embedding = nn.Embedding(vocab_size, width)
    self.positional_embedding = nn.Parameter(0.01 * torch.randn(context_length, width))
    self.transformer = Transformer(width, layers, heads, 4.0)
    self.ln_final = nn.LayerNorm(width, eps=1e-5)
    self.text_projection = nn.Parameter(width ** -0.5 * torch.randn(width, output_dim))
    self.register_buffer("attn_mask", torch.full((context_length, context_length), float("-inf")).triu_(1),
                         persistent=False)
    self.visual = VisionTransformer(output_dim=output_dim, **vision)
    self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

  def encode_text(self, text):
    n = text.shape[1]
    x = self.token_embedding(text) + self.positional_embedding[:n]
    x = self.ln_final(self.transformer(x, mask=self.attn_mask[:n, :n]))
    return x[torch.arange(x.shape[0]), text.argmax(dim=-1)] @ self.text_projection

  def encode_image(self, image):
    return self.visual(image)

  def forward(self, image, text):
    zi = F.normalize(self.encode_image(image), dim=-1)
    zt = F.normalize(self.encode_text(text), dim=-1)
    return zi, zt, self.logit_scale.exp()
