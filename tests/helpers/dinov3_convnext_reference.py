"""A torch reference of DINOv3's ConvNeXt backbone, written from facebookresearch/dinov3 at
6876159a11b4df116f30f667f8c9888617df0751, `dinov3/models/convnext.py` (`ConvNeXt`, `Block`,
`LayerNorm`), for the equality tests: the same module names (so `state_dict()` has the official
file's keys, `norms.3.*` included) and the same inference forward (`forward_features`:
`x_norm_clstoken` = norm(spatial mean of the last stage), `x_norm_patchtokens` = norm of every
position). Drop path and the training-only paths are left out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ChannelsFirstLayerNorm(nn.Module):
  """The official `LayerNorm(..., data_format="channels_first")`: normalises dim 1 of NCHW
  with the biased variance, eps added inside the square root."""

  def __init__(self, dim: int, eps: float = 1e-6):
    super().__init__()
    self.weight = nn.Parameter(torch.ones(dim))
    self.bias = nn.Parameter(torch.zeros(dim))
    self.eps = eps

  def forward(self, x):
    mean = x.mean(1, keepdim=True)
    var = (x - mean).pow(2).mean(1, keepdim=True)
    x = (x - mean) / torch.sqrt(var + self.eps)
    return self.weight[:, None, None] * x + self.bias[:, None, None]


class Block(nn.Module):
  """dwconv 7x7 -> (NHWC) LayerNorm -> pwconv1 -> GELU -> pwconv2 -> gamma, + input."""

  def __init__(self, dim: int):
    super().__init__()
    self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
    self.norm = nn.LayerNorm(dim, eps=1e-6)
    self.pwconv1 = nn.Linear(dim, 4 * dim)
    self.pwconv2 = nn.Linear(4 * dim, dim)
    self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

  def forward(self, x):
    y = self.dwconv(x).permute(0, 2, 3, 1)
    y = self.gamma * self.pwconv2(F.gelu(self.pwconv1(self.norm(y))))
    return x + y.permute(0, 3, 1, 2)


class DinoV3ConvNeXt(nn.Module):
  """`ConvNeXt(depths, dims)` of the official code, headless (`head` is an Identity)."""

  def __init__(self, depths, dims, in_chans: int = 3):
    super().__init__()
    self.downsample_layers = nn.ModuleList([nn.Sequential(
        nn.Conv2d(in_chans, dims[0], 4, stride=4), ChannelsFirstLayerNorm(dims[0]))])
    for i in range(3):
      self.downsample_layers.append(nn.Sequential(
          ChannelsFirstLayerNorm(dims[i]), nn.Conv2d(dims[i], dims[i + 1], 2, stride=2)))
    self.stages = nn.ModuleList(
        nn.Sequential(*[Block(dims[i]) for _ in range(depths[i])]) for i in range(4))
    self.norm = nn.LayerNorm(dims[-1], eps=1e-6)
    self.head = nn.Identity()
    # the official `norms`: three Identities and the final norm itself (saved twice)
    self.norms = nn.ModuleList([nn.Identity(), nn.Identity(), nn.Identity(), self.norm])

  def forward_features(self, x):
    for down, stage in zip(self.downsample_layers, self.stages):
      x = stage(down(x))
    pooled = x.mean([-2, -1])
    tokens = torch.cat([pooled[:, None], x.flatten(2).transpose(1, 2)], dim=1)
    normed = self.norm(tokens)
    return {"x_norm_clstoken": normed[:, 0], "x_norm_patchtokens": normed[:, 1:],
            "x_prenorm": x}

  def forward(self, x):
    return self.head(self.forward_features(x)["x_norm_clstoken"])
