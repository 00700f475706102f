"""Encoders and the Gaussianity measurements of Paper B's experiment.

A small JAX BERT-family encoder (loads local safetensors checkpoints such as the pretrained
all-MiniLM-L6-v2), Paper B's own architectures (ModernBERT-base, DeiT-tiny) with their published
random initialisation, and the layer-by-layer Gaussianity measurements. The forward passes jit,
vmap, differentiate and lower for accelerators; loading checkpoints and the profiles are host-side.
"""

from ._bert import (
    BertConfig as BertConfig,
    BertParams as BertParams,
    embed as embed,
    encode as encode,
    find_minilm as find_minilm,
    init_bert as init_bert,
    load_bert as load_bert,
    random_like as random_like,
    self_attention as self_attention,
)
from ._heads import attention_heads as attention_heads
from ._gaussianity import (
    GaussianityProfile as GaussianityProfile,
    gaussian_tokens as gaussian_tokens,
    gaussianity_profile as gaussianity_profile,
    measure_gaussianity as measure_gaussianity,
    nongaussian_stack as nongaussian_stack,
)
from ._archs import (
    DeitConfig as DeitConfig,
    DeitParams as DeitParams,
    ModernBertConfig as ModernBertConfig,
    ModernBertParams as ModernBertParams,
    embed_deit as embed_deit,
    encode_deit as encode_deit,
    encode_modernbert as encode_modernbert,
    init_deit as init_deit,
    init_modernbert as init_modernbert,
)

# every name imported above (the private modules start with an underscore)
__all__ = sorted(n for n in globals() if not n.startswith("_"))
