"""Every schedule of the library's registry reaches Python: Rope(schedule=NAME) builds it, the Rope
docstring lists it, and an unknown name's error lists them all (tests/test_schedule_registry.cpp
checks the C++ API, the config reader, the CLI and the C ABI)."""
import numpy as np
import pytest

import rotary
from rotary import Rope, _rotary

HEAD_DIM = 64

# A valid value of each field a schedule may require (a new schedule's new field needs one here).
SAMPLES = {
    "factor": 4.0,
    "original_max_position": 4096,
    "max_position": 16384,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "short_factor": [1.5] * (HEAD_DIM // 2),
    "long_factor": [3.0] * (HEAD_DIM // 2),
    "max_length": 4096,
    "partial_rotary_factor": 0.5,
}

SCHEDULES = _rotary.schedules()


def _arguments(required, optional):
    """The first field of each required group, and longrope's factor lists (make_schedule needs them)."""
    names = [group[0] for group in required] + [n for n in optional if n in ("short_factor", "long_factor")]
    missing = [n for n in names if n not in SAMPLES]
    assert not missing, f"give {missing} a value in SAMPLES"
    return {n: SAMPLES[n] for n in names}


def test_the_registry_lists_every_schedule_once():
    names = [name for name, _, _, _ in SCHEDULES]
    assert len(names) == len(set(names))
    assert names[0] == "default"


@pytest.mark.parametrize("name, doc, required, optional", SCHEDULES, ids=[s[0] for s in SCHEDULES])
def test_every_schedule_reaches_rope(name, doc, required, optional):
    rope = Rope(HEAD_DIM, schedule=name, **_arguments(required, optional))
    assert rope.schedule == name
    assert rope.inv_freq.shape == (HEAD_DIM // 2,)
    assert np.all(np.isfinite(rope.inv_freq))
    assert doc
    assert f"``{name}``" in Rope.__doc__, f"Rope's docstring does not list schedule {name}"


def test_an_unknown_schedule_lists_them_all():
    with pytest.raises(ValueError) as raised:
        Rope(HEAD_DIM, schedule="nope")
    for name, _, _, _ in SCHEDULES:
        assert name in str(raised.value)
    assert isinstance(raised.value, rotary.RotaryError)
