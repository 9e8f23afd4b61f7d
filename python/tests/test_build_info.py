"""rotary.build_info(): what this build of rotary is and what it runs on this machine, the same facts
as ``rotary info --build --json``."""
import json
import shutil
import subprocess

import rotary


def test_build_info_names_the_version_the_cpu_target_and_the_cuda_kernels():
    info = rotary.build_info()
    assert info["version"] == rotary.__version__
    assert info["cpu_target"] in info["cpu_targets"]
    cuda = info["cuda"]
    assert cuda["compiled"] is rotary._rotary.cuda
    if cuda["compiled"]:
        assert any(a.startswith("sm_") for a in cuda["architectures"])
        assert cuda["usable"] is (cuda["why_not"] is None)
        if cuda["usable"]:
            assert cuda["devices"] >= 1 and cuda["device"]
    else:
        assert not cuda.get("usable") and cuda["why_not"] == rotary._rotary.no_cuda_kernels


def test_the_command_line_says_the_same():
    command = shutil.which("rotary")
    if command is None:
        import pytest

        pytest.skip("no `rotary` command on PATH (the installed package has one)")
    out = subprocess.run([command, "info", "--build", "--json"], check=True, capture_output=True, text=True).stdout
    cli = json.loads(out)
    info = rotary.build_info()
    assert (cli["version"], cli["cpu_target"], cli["cpu_targets"]) == (
        info["version"], info["cpu_target"], info["cpu_targets"])
    assert cli["cuda"]["compiled"] == info["cuda"]["compiled"]
    if info["cuda"]["compiled"]:
        for key in ("architectures", "runtime", "driver", "devices", "device", "usable", "why_not"):
            assert cli["cuda"][key] == info["cuda"][key], key
