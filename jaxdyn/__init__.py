"""jaxdyn: mean-field dynamics of Transformers in JAX."""

__version__ = "0.1.0"
