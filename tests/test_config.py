"""The frozen config, its presets and the arithmetic derived from it (BEAM.md §1, §3, §7)."""

from __future__ import annotations

import dataclasses

import pytest

from reference_model.config import (
    FP8_BYTES,
    PRESETS,
    get_config,
    kv_bytes_per_token,
    sliding_kv_bytes_per_sequence,
)

BEAM = get_config("beam")


def test_beam_shape_follows_the_spec():
    assert (BEAM.n_layers, BEAM.hidden, BEAM.vocab_size) == (52, 5120, 131072)
    assert (BEAM.n_heads, BEAM.n_kv_heads, BEAM.head_dim, BEAM.q_per_kv) == (48, 8, 128, 6)
    assert BEAM.global_layers == (5, 11, 17, 23, 29, 35, 41, 47, 51)
    assert len(BEAM.sliding_layers) == 43 and BEAM.sliding_window == 512
    assert [layer for layer in range(52) if not BEAM.is_moe(layer)] == [0, 1, 2]
    assert (BEAM.n_experts, BEAM.n_groups, BEAM.experts_per_group, BEAM.topk_groups, BEAM.top_k) == (256, 8, 32, 4, 8)
    assert (BEAM.dense_ff, BEAM.expert_ff, BEAM.routed_scaling, BEAM.norm_eps) == (20480, 2560, 2.5, 1e-6)
    assert BEAM.qkv_gate_size == 6144 + 1024 + 1024 + 6144
    assert BEAM.n_sublayers == 104


def test_kv_cache_arithmetic():
    assert kv_bytes_per_token(BEAM) == 36 * 1024  # 9 layers x (k, v) x 8 heads x 128 x 2 bytes
    assert kv_bytes_per_token(BEAM, FP8_BYTES) == 18 * 1024
    assert kv_bytes_per_token(BEAM, FP8_BYTES) * 2**20 == 18 * 2**30  # "about 18 GiB of FP8 for 2^20 tokens"
    assert sliding_kv_bytes_per_sequence(BEAM) == 43 * 2 * 512 * 8 * 128 * 2


def test_slice_is_the_first_six_layers_at_full_width():
    cfg = get_config("beam-slice")
    assert cfg.n_layers == 6 and cfg.global_layers == (5,)
    assert [cfg.is_moe(layer) for layer in range(6)] == [False] * 3 + [True] * 3
    assert dataclasses.replace(cfg, name="beam", n_layers=52) == BEAM


def test_tiny_has_every_feature_of_beam():
    cfg = get_config("beam-tiny")
    kinds = {(cfg.is_moe(layer), cfg.is_global(layer)) for layer in range(cfg.n_layers)}
    assert kinds == {(False, False), (False, True), (True, False), (True, True)}, "dense/MoE x sliding/global"
    assert cfg.q_per_kv > 1 and cfg.topk_groups < cfg.n_groups and cfg.top_k > cfg.experts_per_group // 2
    assert cfg.global_layers[-1] == cfg.n_layers - 1
    assert cfg.sliding_window < 20, "tests cross the window with ~20-token sequences"


def test_presets_are_frozen_and_looked_up_by_exact_name():
    assert sorted(PRESETS) == ["beam", "beam-slice", "beam-tiny"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        BEAM.n_layers = 3
    with pytest.raises(ValueError, match=r"preset 'Beam' unknown; known: \['beam', 'beam-slice', 'beam-tiny'\]"):
        get_config("Beam")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"n_kv_heads": 7}, "n_heads=48 not a multiple of n_kv_heads=7"),
        ({"head_dim": 127}, "head_dim=127 must be even"),
        ({"n_groups": 5}, "n_experts=256 not a multiple of n_groups=5"),
        ({"topk_groups": 9}, "topk_groups=9 outside 1..n_groups=8"),
        ({"top_k": 129}, "top_k=129 outside 1..128"),
        ({"n_dense_layers": 53}, "n_dense_layers=53 outside 0..n_layers=52"),
        ({"sliding_window": 0}, "sliding_window=0"),
    ],
)
def test_invalid_configs_name_the_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        BEAM.replace(**changes)
