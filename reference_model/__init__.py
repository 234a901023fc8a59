"""Beam's pure-PyTorch reference: config, ops (the numerics contract), model, KV cache, weights."""

from reference_model.cache import KVCache, fill_synthetic_context
from reference_model.config import PRESETS, BeamConfig, get_config
from reference_model.model import Beam, parameter_counts
from reference_model.ops import REFERENCE_OPS, ModelOps
from reference_model.weights import init_weights, load_safetensors, random_model, save_safetensors

__all__ = [
    "PRESETS",
    "REFERENCE_OPS",
    "Beam",
    "BeamConfig",
    "KVCache",
    "ModelOps",
    "fill_synthetic_context",
    "get_config",
    "init_weights",
    "load_safetensors",
    "parameter_counts",
    "random_model",
    "save_safetensors",
]
