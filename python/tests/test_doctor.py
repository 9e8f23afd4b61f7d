"""rotary.doctor: the library's precision report for a config, as a dict shaped like ``rotary doctor
--json``; its arguments checked with errors naming them. The figures themselves are checked against an
independent emulation in tests/test_doctor.cpp."""
import json
import math
import pathlib

import numpy as np
import pytest

import rotary
from rotary import Rope, _rotary

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "tests" / "conformance" / "configs"


def config(name):
    return str(CONFIGS / f"{name}.json")


KEYS = ["context", "context_source", "positions", "schedule", "float32_drift", "bf16_resolution", "wrap_distance",
        "wrapping_pairs", "hazards"]
DRIFT_KEYS = ["threshold_rad", "first_position", "first_pair", "first_position_per_pair", "last_position",
              "max_rad_at_context", "worst_pair_at_context", "max_ulps_at_context", "rad_at_context_per_pair"]


def test_the_report_is_a_dict_shaped_like_the_json():
    report = rotary.doctor(config("meta-llama--Llama-3.1-8B"))
    assert list(report) == KEYS and list(report["float32_drift"]) == DRIFT_KEYS
    assert (report["context"], report["context_source"], report["schedule"]) == (131072, "max_position_embeddings",
                                                                                  "llama3")
    drift = report["float32_drift"]
    assert drift["threshold_rad"] == 1e-3 and drift["last_position"] == 131071
    assert isinstance(drift["first_position"], int) and drift["first_position"] < 131072
    assert drift["first_position"] == min(p for p in drift["first_position_per_pair"] if p is not None)
    assert drift["first_position_per_pair"][0] is None  # pair 0 turns by exactly 1 rad: exact below 2^24
    # The drift at the last position is `rotary info`'s, from the same schedule.
    rope = Rope.from_hf_config(config("meta-llama--Llama-3.1-8B"), seq_len=131072)
    angle, pair, ulps = _rotary.float32_drift(rope._impl, 131071)
    assert (drift["max_rad_at_context"], drift["worst_pair_at_context"], drift["max_ulps_at_context"]) == \
        (angle, pair, ulps)
    assert max(drift["rad_at_context_per_pair"]) == angle
    # Wrap distances: ceil(2π/θ_i) per pair, those <= 131071 wrap inside the context.
    wrap = report["wrap_distance"]
    assert wrap == [math.ceil(2 * math.pi / t) for t in rope.inv_freq]
    assert report["wrapping_pairs"] == [j for j, w in enumerate(wrap) if w <= 131071]
    kinds = [h["kind"] for h in report["hazards"]]
    assert kinds == ["float32_drift", "bf16_resolution", "wrap", "llama3_bands"]
    for h in report["hazards"]:
        assert list(h) == ["kind", "position", "detail"] and isinstance(h["position"], int) and h["detail"]
    assert report["hazards"][0]["position"] == drift["first_position"]
    assert "angles='exact'" in report["hazards"][0]["detail"]
    assert report["hazards"][1]["position"] == report["bf16_resolution"]["first_position"]


def test_a_dict_a_path_and_the_context():
    path = config("Qwen--Qwen2.5-7B-Instruct")
    with open(path, encoding="utf-8") as f:
        settings = json.load(f)
    report = rotary.doctor(path)
    assert rotary.doctor(settings) == report
    assert (report["context"], report["context_source"]) == (131072, "factor 4 x original length 32768")
    yarn = [h for h in report["hazards"] if h["kind"] == "yarn_ramp"]
    assert len(yarn) == 1 and yarn[0]["position"] == 32768
    assert "pairs 0-23 keep their frequencies, pairs 24-39 blend, pairs 40-63 are divided by factor 4" in yarn[0]["detail"]
    short = rotary.doctor(path, context=np.int64(5000))
    assert (short["context"], short["context_source"], short["positions"]) == (5000, "given", 5000)
    assert short["float32_drift"]["last_position"] == 4999
    assert short["float32_drift"]["first_position"] is None  # Qwen2.5's angles first stray past 15000


def test_longrope_switch_and_layer_types():
    phi = rotary.doctor(config("microsoft--Phi-3.5-mini-instruct"))
    switch = [h for h in phi["hazards"] if h["kind"] == "longrope_switch"]
    assert switch and switch[0]["position"] == 4096 and "seq_len=131072" in switch[0]["detail"]
    gemma = config("google--gemma-3-4b-it")
    assert rotary.doctor(gemma, context=5000)["schedule"] == "linear"
    assert rotary.doctor(gemma, context=5000, layer_type="sliding_attention")["schedule"] == "default"


@pytest.mark.parametrize("kwargs, error, match", [
    ({"context": 0}, ValueError, r"context=0 must be in \[1, 2\^31\]"),
    ({"context": 2 ** 31 + 1}, ValueError, r"context=2147483649 must be in \[1, 2\^31\]"),
    ({"context": 2 ** 70}, ValueError, "context="),
    ({"context": "70000"}, TypeError, "context must be an int, got str"),
    ({"context": True}, TypeError, "context must be an int, got bool"),
    ({"context": 1.5}, TypeError, "context must be an int, got float"),
    ({"layer_type": 3}, TypeError, "layer_type must be a str, got int"),
    ({"layer_type": "nope"}, ValueError, "layer_type 'nope' is not a RoPE layer type"),
])
def test_bad_arguments_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        rotary.doctor(config("meta-llama--Llama-3.1-8B"), **kwargs)


def test_bad_configs_are_refused(tmp_path):
    with pytest.raises(TypeError, match="path_or_dict must be a path or a dict, got int"):
        rotary.doctor(3)
    with pytest.raises(ValueError, match="cannot be read"):
        rotary.doctor(str(tmp_path / "none.json"))
    with pytest.raises(ValueError, match="context is needed: the settings state no length"):
        rotary.doctor({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8})
    assert rotary.doctor({"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8}, context=10)["context"] \
        == 10


def test_doctor_is_public_and_documented():
    assert "doctor" in rotary.__all__
    doc = rotary.doctor.__doc__
    for section in ("Parameters\n    ----------", "Returns\n    -------", "Raises\n    ------"):
        assert section in doc
