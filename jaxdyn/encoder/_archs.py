"""Paper B's two encoders, ModernBERT-base and DeiT-tiny, as random-weight architectures.

Paper B measured Gaussianity through pretrained ModernBERT and Tiny-DeiT. No package of the
registries this project uses ships either checkpoint for offline use (all-MiniLM-L6-v2 is
the one pretrained encoder jaxdyn loads, ``find_minilm``), so this module implements the
two architectures with their published sizes and their published random initialisation;
the Gaussianity experiment runs them as random-weight controls (``architecture:
modernbert`` / ``deit`` in a ``gaussianity`` config).

**ModernBERT** (Warner et al. 2024; ``ModernBertConfig`` defaults = ModernBERT-base: 22
layers, hidden 768, 12 heads, GeGLU width 1152). Pre-LN, no biases, LayerNorm without β;
layer l (x of shape (batch, seq, d), heads of size dh):

    u     = x                      if l = 0 (the embedding norm precedes layer 0)
          = LN_attn(x)             otherwise
    q, k, v = split(u W_qkv);  q, k ← RoPE(q), RoPE(k)   (θ = 160 000 global, 10 000 local)
    A     = softmax(q kᵀ / sqrt(dh) + window mask)       (local layers: |i − j| ≤ w/2, w = 128;
                                                          every third layer, l ≡ 0 mod 3, global)
    x     ← x + concat_h(A v) W_o
    g, a  = split(LN_mlp(x) W_i)                          (W_i: d → 2·1152)
    x     ← x + (GELU(g) ⊙ a) W_f

RoPE rotates the pairs (e_i, e_{i+dh/2}) of each head by the angle p·θ^{−2i/dh} at position
p (the "rotate half" convention). Initialisation (the reference ``_init_weights``): weights
~ N(0, σ²) truncated at ±2σ, σ = 0.02 for W_qkv and W_i and the embeddings, σ = 0.02 /
sqrt(2·n_layers) for the output projections W_o and W_f; LayerNorm γ = 1.

**DeiT-tiny** (Touvron et al. 2021, ``deit_tiny_patch16_224``; ``DeitConfig`` defaults: 12
layers, hidden 192, 3 heads, MLP 768, LayerNorm eps 1e-6). A ViT: ``embed_deit`` cuts a
224×224×3 image into 14×14 patches of 16×16, maps each by a linear patch embedding (the
16×16 stride-16 convolution), prepends a class token and adds position embeddings (197
tokens). Layer (pre-LN, with biases):

    x ← x + Attn(LN1(x)),   x ← x + W2 GELU(W1 LN2(x) + b1) + b2.

Initialisation (timm's ViT): linear weights ~ N(0, 0.02²) truncated at ±2 (absolute),
biases 0; position embedding ~ N(0, 0.02²) truncated; class token ~ N(0, 10⁻¹²); the patch
convolution keeps PyTorch's default U(±1/sqrt(fan_in)) for weight and bias, fan_in = 768.

``encode_modernbert`` / ``encode_deit`` feed token embeddings h0 straight into layer 0 and
return ``[h_0, …, h_L]`` (the residual stream after each layer, before any final norm), like
:func:`jaxdyn.encoder.encode` does for BERT.
"""

from __future__ import annotations

import dataclasses
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from ._bert import EncoderSizes, attend, layer_norm

_HIGHEST = jax.lax.Precision.HIGHEST


def _mm(x, w):
    """X W at the highest matmul precision."""
    return jnp.matmul(x, w, precision=_HIGHEST)


def _gelu(x):
    """GELU, erf form."""
    return jax.nn.gelu(x, approximate=False)


def _trunc(key, shape, std, cutoff, dtype):
    """N(0, std²) truncated to [−cutoff, cutoff] (cutoff absolute)."""
    return std * jax.random.truncated_normal(key, -cutoff / std, cutoff / std, shape, dtype)


# ---------------------------------------------------------------------------------------
# ModernBERT


# kept apart deliberately: the field lists of ModernBertConfig and DeitConfig (like those of
# BertConfig and control's ReachOptions) have one shape, an annotated default a line; each
# architecture's published sizes are its own defaults, and what the configs share is EncoderSizes.
@dataclasses.dataclass(frozen=True)
class ModernBertConfig(EncoderSizes):
    """ModernBERT's static architecture; the defaults are ModernBERT-base's published ones.

    Attributes:
      hidden_size: d.
      num_attention_heads: H (an even head size d/H: RoPE rotates pairs).
      intermediate_size: the GeGLU width f (W_i maps d → 2f).
      num_hidden_layers: L.
      local_attention: the window w of the local layers (|i − j| ≤ w/2).
      global_attn_every_n_layers: every n-th layer (l ≡ 0 mod n) attends globally.
      global_rope_theta: RoPE's θ in the global layers.
      local_rope_theta: RoPE's θ in the local layers.
      norm_eps: the LayerNorms' epsilon.
      initializer_range: σ of the initialisation.
      initializer_cutoff_factor: the truncation, in units of σ.
    """

    hidden_size: int = 768
    num_attention_heads: int = 12
    intermediate_size: int = 1152
    num_hidden_layers: int = 22
    local_attention: int = 128
    global_attn_every_n_layers: int = 3
    global_rope_theta: float = 160000.0
    local_rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    initializer_range: float = 0.02
    initializer_cutoff_factor: float = 2.0

    def __post_init__(self):
        """Refuse sizes that do not split into even heads, or a bad window (ValueError)."""
        self.check_sizes(even_heads=True)
        if self.local_attention < 2 or self.global_attn_every_n_layers < 1:
            raise ValueError(f"local_attention must be >= 2 and global_attn_every_n_layers >= 1, "
                             f"got {self.local_attention} and {self.global_attn_every_n_layers}")

    def is_global(self, layer: int) -> bool:
        """Whether layer ``layer`` attends globally (l ≡ 0 mod n)."""
        return layer % self.global_attn_every_n_layers == 0


class ModernBertParams(eqx.Module):
    """ModernBERT's stacked layer weights (leading axis: layer), stored (in, out).

    Attributes:
      wqkv: (L, d, 3d) the fused query/key/value projection.
      wo: (L, d, d) the attention output projection.
      wi: (L, d, 2f) the GeGLU input.
      wf: (L, f, d) the feed-forward output.
      attn_norm: (L, d) the attention LayerNorm γ (layer 0's unused).
      mlp_norm: (L, d) the feed-forward LayerNorm γ.
      final_norm: (d,) the final LayerNorm γ.
    """

    wqkv: Float[Array, "L d 3d"]
    wo: Float[Array, "L d d"]
    wi: Float[Array, "L d 2f"]
    wf: Float[Array, "L f d"]
    attn_norm: Float[Array, "L d"]   # layer 0's is unused (identity)
    mlp_norm: Float[Array, "L d"]
    final_norm: Float[Array, " d"]


def init_modernbert(cfg: ModernBertConfig, key, *, dtype=jnp.float32) -> ModernBertParams:
    """ModernBERT's published random initialisation (module docstring), drawn in one program.

    Args:
      cfg: the sizes, and σ and the cutoff of the truncated normals.
      key: a JAX PRNG key (traced keys are fine: the draw jits and vmaps over keys).
      dtype: the floating dtype of every weight.

    Returns:
      :class:`ModernBertParams`.
    """
    return _init(_modernbert_fields, cfg, key, np.dtype(dtype))


@eqx.filter_jit
def _init(fields, cfg, key, dtype):
    """The parameters ``fields(cfg, key, dtype)`` returns, drawn in one program."""
    return fields(cfg, key, dtype)


def _modernbert_fields(cfg: ModernBertConfig, key, dtype) -> ModernBertParams:
    """ModernBERT's weights: truncated normals, unit LayerNorm gains."""
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    std = cfg.initializer_range
    std_out = std / math.sqrt(2.0 * L)
    c = cfg.initializer_cutoff_factor
    k = jax.random.split(key, 4)
    return ModernBertParams(
        wqkv=_trunc(k[0], (L, d, 3 * d), std, c * std, dtype),
        wo=_trunc(k[1], (L, d, d), std_out, c * std_out, dtype),
        wi=_trunc(k[2], (L, d, 2 * f), std, c * std, dtype),
        wf=_trunc(k[3], (L, f, d), std_out, c * std_out, dtype),
        attn_norm=jnp.ones((L, d), dtype), mlp_norm=jnp.ones((L, d), dtype),
        final_norm=jnp.ones((d,), dtype))


def rope(x, theta: float):
    """Rotary position embedding along the sequence axis ("rotate half").

    Args:
      x: (b, s, H, dh) array.
      theta: RoPE's θ.

    Returns:
      The rotated array, the shape of x.
    """
    s, dh = x.shape[1], x.shape[-1]
    inv = 1.0 / (theta ** (np.arange(0, dh, 2, dtype=np.float64) / dh))
    ang = np.arange(s, dtype=np.float64)[:, None] * inv[None, :]          # (s, dh/2)
    cos = jnp.asarray(np.concatenate([np.cos(ang)] * 2, -1), x.dtype)[None, :, None, :]
    sin = jnp.asarray(np.concatenate([np.sin(ang)] * 2, -1), x.dtype)[None, :, None, :]
    x1, x2 = x[..., : dh // 2], x[..., dh // 2:]
    return x * cos + jnp.concatenate([-x2, x1], -1) * sin


def window_bias(s: int, window: int, dtype):
    """Additive mask of a local layer: 0 where |i − j| ≤ window/2, −inf-like elsewhere.

    Args:
      s: the sequence length.
      window: the window w.
      dtype: the floating dtype.

    Returns:
      (s, s) array.
    """
    i = np.arange(s)
    ok = np.abs(i[:, None] - i[None, :]) <= window // 2
    return jnp.where(jnp.asarray(ok), 0.0, jnp.finfo(dtype).min).astype(dtype)


def modernbert_layer(p, cfg: ModernBertConfig, layer: int, x):
    """Layer ``layer`` of ModernBERT (module docstring).

    Args:
      p: the layer's weights (a dict, without the layer axis).
      cfg: the architecture.
      layer: the layer index (global or local).
      x: (b, s, d) hidden states.

    Returns:
      (b, s, d) hidden states.
    """
    b, s, d = x.shape
    H, dh = cfg.num_attention_heads, cfg.head_size
    u = x if layer == 0 else layer_norm(x, p["attn_norm"], None, cfg.norm_eps)
    qkv = _mm(u, p["wqkv"]).reshape(b, s, 3, H, dh)
    glob = cfg.is_global(layer)
    theta = cfg.global_rope_theta if glob else cfg.local_rope_theta
    q, k = rope(qkv[:, :, 0], theta), rope(qkv[:, :, 1], theta)
    bias = None if glob else window_bias(s, cfg.local_attention, x.dtype)
    x = x + _mm(attend(q, k, qkv[:, :, 2], bias), p["wo"])
    g, a = jnp.split(_mm(layer_norm(x, p["mlp_norm"], None, cfg.norm_eps), p["wi"]), 2, axis=-1)
    return x + _mm(_gelu(g) * a, p["wf"])


@eqx.filter_jit
def _encode_modernbert(params, cfg, h0):
    """The stack, unrolled: (L + 1, b, s, d)."""
    hs, h = [h0], h0
    layers = {n: getattr(params, n) for n in ("wqkv", "wo", "wi", "wf", "attn_norm", "mlp_norm")}
    for l in range(cfg.num_hidden_layers):  # unrolled: global and local layers differ statically
        h = modernbert_layer({n: a[l] for n, a in layers.items()}, cfg, l, h)
        hs.append(h)
    return jnp.stack(hs)


def encode_modernbert(params: ModernBertParams, cfg: ModernBertConfig,
                      h0: Float[Array, "batch seq d"]) -> list:
    """``[h_0, …, h_L]``: h0 through every ModernBERT layer (residual stream, no final norm).

    The layers are unrolled (global and local layers differ statically). Jitted; jittable,
    vmappable and differentiable. A ValueError (from the config's check) for h0 of the wrong
    shape or weights of another depth.

    Args:
      params: ModernBERT's weights.
      cfg: its architecture.
      h0: (batch, seq, d) token embeddings.

    Returns:
      The list of L + 1 hidden states.
    """
    h0 = jnp.asarray(h0)
    cfg.check_h0(h0, params.wqkv.shape[0])
    return list(_encode_modernbert(params, cfg, h0.astype(params.wqkv.dtype)))


# ---------------------------------------------------------------------------------------
# DeiT


# kept apart deliberately: the same shape as ModernBertConfig's field list (see there).
@dataclasses.dataclass(frozen=True)
class DeitConfig(EncoderSizes):
    """DeiT's static architecture; the defaults are deit_tiny_patch16_224's.

    Attributes:
      hidden_size: d.
      num_attention_heads: H.
      intermediate_size: the MLP width.
      num_hidden_layers: L.
      image_size: the image side, pixels.
      patch_size: the patch side P (image_size a multiple of it).
      channels: C.
      norm_eps: the LayerNorms' epsilon.
    """

    hidden_size: int = 192
    num_attention_heads: int = 3
    intermediate_size: int = 768
    num_hidden_layers: int = 12
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    norm_eps: float = 1e-6

    def __post_init__(self):
        """Refuse sizes that do not split into heads or patches (ValueError)."""
        self.check_sizes()
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} must be a multiple of patch_size {self.patch_size}")

    @property
    def num_tokens(self) -> int:
        """The number of tokens: the patches and the class token."""
        return (self.image_size // self.patch_size) ** 2 + 1  # patches + the class token


class DeitParams(eqx.Module):
    """DeiT's stacked layer weights (leading axis: layer), stored (in, out), and its embedding.

    Attributes:
      wqkv: (L, d, 3d) the fused query/key/value projection; bqkv its bias.
      wo: (L, d, d) the attention output projection; bo its bias.
      w1: (L, d, f) the MLP input; b1 its bias.
      w2: (L, f, d) the MLP output; b2 its bias.
      ln1_g: (L, d) LayerNorm1 γ; ln1_b its β (ln2_g, ln2_b: LayerNorm2's).
      patch_w: (C·P·P, d) the patch embedding, rows in (channel, row, column) order; patch_b
        its bias.
      cls_token: (d,) the class token.
      pos_embed: (tokens, d) the position embeddings.
    """

    wqkv: Float[Array, "L d 3d"]
    bqkv: Float[Array, "L 3d"]
    wo: Float[Array, "L d d"]
    bo: Float[Array, "L d"]
    w1: Float[Array, "L d f"]
    b1: Float[Array, "L f"]
    w2: Float[Array, "L f d"]
    b2: Float[Array, "L d"]
    ln1_g: Float[Array, "L d"]
    ln1_b: Float[Array, "L d"]
    ln2_g: Float[Array, "L d"]
    ln2_b: Float[Array, "L d"]
    patch_w: Float[Array, "cpp d"]
    patch_b: Float[Array, " d"]
    cls_token: Float[Array, " d"]
    pos_embed: Float[Array, "t d"]


def init_deit(cfg: DeitConfig, key, *, dtype=jnp.float32) -> DeitParams:
    """The ViT initialisation of timm for DeiT (module docstring), in one jitted program.

    Args:
      cfg: DeiT's sizes (layers, width, patches).
      key: a JAX PRNG key.
      dtype: the floating dtype.

    Returns:
      :class:`DeitParams`.
    """
    return _init(_deit_fields, cfg, key, np.dtype(dtype))


def _deit_fields(cfg: DeitConfig, key, dtype) -> DeitParams:
    """DeiT's weights: truncated normals, zero biases, PyTorch's default patch convolution."""
    d, f, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    fan_in = cfg.channels * cfg.patch_size ** 2
    k = jax.random.split(key, 8)
    z = lambda *shape: jnp.zeros(shape, dtype)  # noqa: E731
    bound = 1.0 / math.sqrt(fan_in)
    return DeitParams(
        wqkv=_trunc(k[0], (L, d, 3 * d), 0.02, 2.0, dtype), bqkv=z(L, 3 * d),
        wo=_trunc(k[1], (L, d, d), 0.02, 2.0, dtype), bo=z(L, d),
        w1=_trunc(k[2], (L, d, f), 0.02, 2.0, dtype), b1=z(L, f),
        w2=_trunc(k[3], (L, f, d), 0.02, 2.0, dtype), b2=z(L, d),
        ln1_g=jnp.ones((L, d), dtype), ln1_b=z(L, d), ln2_g=jnp.ones((L, d), dtype), ln2_b=z(L, d),
        patch_w=jax.random.uniform(k[4], (fan_in, d), dtype, -bound, bound),
        patch_b=jax.random.uniform(k[5], (d,), dtype, -bound, bound),
        cls_token=1e-6 * jax.random.normal(k[6], (d,), dtype),
        pos_embed=_trunc(k[7], (cfg.num_tokens, d), 0.02, 2.0, dtype))


def patchify(images, patch: int):
    """Cut images into patches, each flattened in (channel, row, column) order.

    (A convolution weight's layout; the patches in row-major order.)

    Args:
      images: (b, H, W, C) images.
      patch: the patch side P.

    Returns:
      (b, H/P · W/P, C·P·P) patches.
    """
    b, Hh, Ww, C = images.shape
    x = images.reshape(b, Hh // patch, patch, Ww // patch, patch, C)
    return x.transpose(0, 1, 3, 5, 2, 4).reshape(b, (Hh // patch) * (Ww // patch), C * patch * patch)


def embed_deit(params: DeitParams, cfg: DeitConfig, images: Float[Array, "b H W C"]):
    """DeiT's input: the patch embedding, class token first, plus the position embeddings.

    Args:
      params: the weights.
      cfg: the architecture.
      images: (b, 224, 224, 3) images (cfg's sizes).

    Returns:
      (b, 197, d) tokens.

    Raises:
      ValueError: for images of another shape.
    """
    images = jnp.asarray(images)
    want = (cfg.image_size, cfg.image_size, cfg.channels)
    if images.ndim != 4 or tuple(images.shape[1:]) != want:
        raise ValueError(f"images must have shape (batch, {want[0]}, {want[1]}, {want[2]}), got {tuple(images.shape)}")
    return _embed_deit(params, cfg, images)


@eqx.filter_jit
def _embed_deit(params, cfg, images):
    """The embedding as one program."""
    tok = _mm(patchify(images, cfg.patch_size), params.patch_w) + params.patch_b
    cls = jnp.broadcast_to(params.cls_token, (images.shape[0], 1, cfg.hidden_size))
    return jnp.concatenate([cls, tok], axis=1) + params.pos_embed


def deit_layer(p, cfg: DeitConfig, x):
    """One pre-LN DeiT layer: x ← x + Attn(LN1(x)), x ← x + MLP(LN2(x)).

    Args:
      p: the layer's weights (a dict, without the layer axis).
      cfg: the architecture.
      x: (b, s, d) tokens.

    Returns:
      (b, s, d) tokens.
    """
    b, s, d = x.shape
    H, dh = cfg.num_attention_heads, cfg.head_size
    qkv = (_mm(layer_norm(x, p["ln1_g"], p["ln1_b"], cfg.norm_eps), p["wqkv"]) + p["bqkv"]).reshape(b, s, 3, H, dh)
    x = x + _mm(attend(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], None), p["wo"]) + p["bo"]
    y = _gelu(_mm(layer_norm(x, p["ln2_g"], p["ln2_b"], cfg.norm_eps), p["w1"]) + p["b1"])
    return x + _mm(y, p["w2"]) + p["b2"]


_DEIT_LAYER = ("wqkv", "bqkv", "wo", "bo", "w1", "b1", "w2", "b2", "ln1_g", "ln1_b", "ln2_g", "ln2_b")


@eqx.filter_jit
def _encode_deit(params, cfg, h0):
    """The stack as one scanned program: (L + 1, b, s, d)."""
    def step(h, p):
        h = deit_layer(p, cfg, h)
        return h, h

    _, hs = jax.lax.scan(step, h0, {n: getattr(params, n) for n in _DEIT_LAYER})
    return jnp.concatenate([h0[None], hs], axis=0)


def encode_deit(params: DeitParams, cfg: DeitConfig, h0: Float[Array, "batch seq d"]) -> list:
    """``[h_0, …, h_L]``: tokens h0 through every DeiT layer (residual stream, no final norm).

    One scanned program; jittable, vmappable and differentiable (ValueError from
    ``cfg.check_h0`` for tokens of the wrong shape or weights of another depth).

    Args:
      params: DeiT's weights.
      cfg: the sizes.
      h0: (batch, seq, d) tokens, e.g. from :func:`embed_deit`.

    Returns:
      The list of L + 1 hidden states.
    """
    h0 = jnp.asarray(h0)
    cfg.check_h0(h0, params.wqkv.shape[0])
    return list(_encode_deit(params, cfg, h0.astype(params.wqkv.dtype)))
