"""Experiment kind ``gaussianity``: Paper B's measurement on a real pretrained encoder.

i.i.d. Gaussian token embeddings h0 = s·Z (batch × seq × hidden) go straight into layer 0 of a
BERT-family encoder (the pretrained all-MiniLM-L6-v2 by default), and after each layer the
pooled hidden-state cloud is compared with the Gaussian of the same mean and covariance:
sliced W2 (normalised by scale), skewness and excess kurtosis along random directions and
principal axes, a radial W2, the effective rank of the covariance, and the Bures distance
between consecutive layers — each beside its Monte-Carlo noise floor (the same statistic on
exact Gaussian samples of the same size and covariance). Controls: the same architecture with
random weights, and a deliberately non-Gaussian map (``model: nongaussian``).
"""

from ..kinds import kind_exports
from .schema import BATCH_AXES, KEY_METRICS, MODELS, SCHEMA, check, estimate_bytes, process_split, output_bytes

__getattr__, __all__ = kind_exports(__name__, ("MODELS", "KEY_METRICS"))
