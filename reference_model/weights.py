"""Beam's weights: seeded random initialization on the target device, and safetensors save/load.

Initialization draws each parameter from its own generator, seeded from (seed, parameter name),
directly on the parameter's device and in its dtype: no host detour (beam-slice is 66 GB), and a
parameter's values do not depend on which others exist or in what order they are drawn. The same
seed gives the same weights on the same device type; CPU and CUDA generators differ.

Scales keep activations O(1): projections N(0, 1/fan_in), the embedding N(0, 1) (it is the
residual stream's first term). Norm weights are 1 + 0.1 N(0, 1) and biases small but nonzero,
so a kernel that ignores a norm weight or a bias fails parity instead of passing by luck.

Checkpoints always use the unpacked layout (wq, wk, wv, wg separate), whatever the model's
`pack_qkv_gate`, and record the config they were saved from.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from reference_model.config import BeamConfig, get_config
from reference_model.model import Beam
from reference_model.ops import REFERENCE_OPS, ModelOps

CONFIG_METADATA_KEY = "beam_config"


@dataclass(frozen=True)
class Init:
    """N(mean, std^2); std None means 1/sqrt(fan_in), fan_in the parameter's last dim."""

    mean: float
    std: float | None


FAN_IN = Init(0.0, None)
NORM_WEIGHT = Init(1.0, 0.1)
# Keyed by the parameter's attribute name in model.py: one rule per kind of weight.
INIT_RULES: dict[str, Init] = {
    "embedding": Init(0.0, 1.0),
    "lm_head": FAN_IN,
    "wq": FAN_IN,
    "wk": FAN_IN,
    "wv": FAN_IN,
    "wg": FAN_IN,
    "wo": FAN_IN,
    "w_gate": FAN_IN,
    "w_up": FAN_IN,
    "w_down": FAN_IN,
    "router": FAN_IN,  # FP32 logits of std ~1: sigmoid scores spread over (0, 1)
    "correction_bias": Init(0.0, 0.05),  # shifts some selections, as a trained load-balancing bias does
    "gate_bias": Init(0.0, 0.1),
    "pre_norm": NORM_WEIGHT,
    "post_norm": NORM_WEIGHT,
    "final_norm": NORM_WEIGHT,
    "q_norm": NORM_WEIGHT,
    "k_norm": NORM_WEIGHT,
}


def parameter_seed(seed: int, name: str) -> int:
    """A 63-bit seed for one parameter, stable across processes and Python versions."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


@torch.no_grad()
def init_weights(model: Beam, seed: int) -> None:
    """Fill every parameter in place from its own seeded generator (see the module docstring)."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int; got {seed!r}")
    for name, param in model.named_parameters():
        if param.device.type == "meta":
            raise ValueError("a model on the meta device has no storage to initialize (it is for counting only)")
        leaf = name.rsplit(".", 1)[-1]
        if leaf not in INIT_RULES:
            raise ValueError(f"parameter {name!r} has no init rule; known names: {sorted(INIT_RULES)}")
        rule = INIT_RULES[leaf]
        std = rule.std if rule.std is not None else param.shape[-1] ** -0.5
        gen = torch.Generator(device=param.device).manual_seed(parameter_seed(seed, name))
        param.normal_(rule.mean, std, generator=gen)


def random_model(
    preset: str | BeamConfig,
    seed: int = 0,
    device: torch.device | str = "cpu",
    ops: ModelOps = REFERENCE_OPS,
    pack_qkv_gate: bool = False,
) -> Beam:
    """A Beam of the given preset with seeded random weights, built directly on `device`."""
    cfg = get_config(preset) if isinstance(preset, str) else preset
    model = Beam(cfg, ops=ops, pack_qkv_gate=pack_qkv_gate, device=device)
    init_weights(model, seed)
    return model


# ---- safetensors -----------------------------------------------------------------------------
def _config_json(cfg: BeamConfig) -> str:
    return json.dumps(dataclasses.asdict(cfg), sort_keys=True)


def save_safetensors(model: Beam, path: str | Path) -> None:
    """Write the model's parameters (unpacked layout) and its config to `path`."""
    tensors = {}
    for name, tensor in model.state_dict().items():
        # safetensors refuses tensors that share storage; the packed model's wq..wg are views of
        # one buffer, so each gets its own copy (a checkpoint is unpacked by definition).
        owns_storage = tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        tensors[name] = tensor if owns_storage else tensor.clone()
    save_file(tensors, str(path), metadata={CONFIG_METADATA_KEY: _config_json(model.cfg)})


@torch.no_grad()
def load_safetensors(model: Beam, path: str | Path) -> None:
    """Copy a checkpoint into the model's parameters, one tensor at a time straight to their device.

    Raises ValueError when the checkpoint's config, names, shapes or dtypes differ from the model's.
    """
    params = dict(model.named_parameters())
    with safe_open(str(path), framework="pt", device=str(model.device)) as f:
        saved_config = (f.metadata() or {}).get(CONFIG_METADATA_KEY)
        if saved_config != _config_json(model.cfg):
            raise ValueError(
                f"checkpoint {str(path)!r} was saved from config {saved_config}; "
                f"the model's is {_config_json(model.cfg)}"
            )
        names = set(f.keys())
        missing, unexpected = sorted(params.keys() - names), sorted(names - params.keys())
        if missing or unexpected:
            raise ValueError(f"checkpoint {str(path)!r}: missing {missing[:5]}, unexpected {unexpected[:5]}")
        for name, param in params.items():
            tensor = f.get_tensor(name)
            if tensor.shape != param.shape or tensor.dtype != param.dtype:
                raise ValueError(
                    f"checkpoint {str(path)!r}: {name} is {tensor.dtype} {tuple(tensor.shape)}, "
                    f"the model expects {param.dtype} {tuple(param.shape)}"
                )
            param.copy_(tensor)
