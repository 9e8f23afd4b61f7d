"""The package as pip installs it: version, import without torch, the `rotary` command, py.typed.

`make test-python` installs rotary into a venv (`pip install .`) and runs pytest there with
ROTARY_EXPECT_INSTALLED=1: then the tests below also check that `import rotary` is that installed
copy, never the source tree, and what the wheel put beside it. Without the variable (a build tree on
PYTHONPATH) those checks skip.
"""
import importlib
import importlib.metadata
import inspect
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import rotary
import rotary._version

SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[2]
INSTALLED = os.environ.get("ROTARY_EXPECT_INSTALLED") == "1"
installed_only = pytest.mark.skipif(not INSTALLED, reason="checks `pip install .`: ROTARY_EXPECT_INSTALLED=1 "
                                                          "(set by make test-python)")


def cmake_version() -> str:
    text = (SOURCE_ROOT / "CMakeLists.txt").read_text()
    match = re.search(r"project\(\s*rotary\s+VERSION\s+([0-9]+\.[0-9]+\.[0-9]+)", text)
    assert match, "no project(rotary VERSION x.y.z) in CMakeLists.txt"
    return match.group(1)


def package_env() -> dict[str, str]:
    """The environment for a child Python that imports the same rotary as this process."""
    return dict(os.environ, PYTHONPATH=str(pathlib.Path(rotary.__file__).parents[1]))


def installed_files() -> list[str]:
    """The paths in the installed distribution's RECORD, with / separators."""
    files = importlib.metadata.files("rotary")
    assert files is not None, "the rotary distribution has no RECORD"
    return [f.as_posix() for f in files]


def test_version_is_the_cmake_project_version():
    assert rotary._version.__version__ == cmake_version()


def test_package_exports_version():
    if not hasattr(rotary, "__version__"):
        pytest.skip("rotary/__init__.py does not export __version__ yet")
    assert rotary.__version__ == cmake_version()


@installed_only
def test_distribution_version_is_the_cmake_project_version():
    assert importlib.metadata.version("rotary") == cmake_version()


@installed_only
def test_import_resolves_to_the_installed_package():
    site_packages = {pathlib.Path(sysconfig.get_path(key)).resolve() for key in ("platlib", "purelib")}
    package_dir = pathlib.Path(rotary.__file__).resolve().parent
    assert package_dir.parent in site_packages, f"rotary imported from {package_dir}, not from {site_packages}"
    assert pathlib.Path(rotary._rotary.__file__).resolve().parent == package_dir


@installed_only
def test_runtime_requirement_is_numpy_only():
    requirements = importlib.metadata.requires("rotary") or []
    unconditional = [r for r in requirements if "extra ==" not in r]
    assert [re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in unconditional] == ["numpy"]
    extras = importlib.metadata.metadata("rotary").get_all("Provides-Extra")
    assert {"torch", "transformers"} <= set(extras)


def test_import_and_numpy_api_without_torch():
    # `sys.modules["torch"] = None` makes `import torch` raise ImportError, as where torch is absent.
    code = """if True:
        import sys
        sys.modules["torch"] = None
        import numpy as np
        import rotary
        rope = rotary.Rope(8, base=10000.0)
        q = np.random.default_rng(0).standard_normal((1, 3, 2, 8)).astype(np.float32)
        positions = np.array([0, 7, 4095])
        out = rope.apply(q, positions=positions)
        angle = positions.astype(np.float64)[:, None] * rope.inv_freq[None, :]
        cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
        x1, x2 = q[..., :4], q[..., 4:]
        expected = np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
        assert out.dtype == np.float32 and np.abs(out - expected).max() < 1e-5, np.abs(out - expected).max()
        assert sys.modules["torch"] is None
        print("ok", rotary.__file__)
    """
    result = subprocess.run([sys.executable, "-c", code], env=package_env(), capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", rotary.__file__]


def test_py_typed_ships_beside_the_package():
    assert (pathlib.Path(rotary.__file__).parent / "py.typed").is_file()


@installed_only
def test_wheel_holds_py_typed_version_and_extension():
    files = installed_files()
    assert "rotary/py.typed" in files
    assert "rotary/_version.py" in files
    assert any(re.fullmatch(r"rotary/_rotary\..*\.so", f) for f in files), files
    assert not any(f.endswith(".in") for f in files), files


@installed_only
def test_rotary_command_is_installed_and_runs():
    command = pathlib.Path(sysconfig.get_path("scripts")) / "rotary"
    assert command.is_file() and os.access(command, os.X_OK), f"no executable {command}"
    assert any(f.endswith("bin/rotary") for f in installed_files()), "the wheel did not install bin/rotary"
    result = subprocess.run([str(command), "info", "--preset", "llama-3.1-8b"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("schedule llama3  pairing half  head_dim 128"), result.stdout[:200]


def test_an_extension_that_misreads_numpy_2_is_refused():
    # pybind11 < 2.12 reads numpy 2's arrays with numpy 1's structures: wrong values, no error.
    with pytest.raises(ImportError, match=r"pybind11 2\.10, which cannot read numpy 2\.4\.6"):
        rotary._check_extension("2.4.6", (2, 10))
    rotary._check_extension("1.24.2", (2, 10))
    rotary._check_extension("2.4.6", (3, 1))
    assert tuple(rotary._rotary.pybind11_version) >= (2, 12) or np.__version__.startswith("1.")


def _public_callables(module):
    names = getattr(module, "__all__", [n for n in dir(module) if not n.startswith("_")])
    for name in names:
        obj = getattr(module, name)
        if (inspect.isclass(obj) and not issubclass(obj, BaseException)) or inspect.isfunction(obj):
            if getattr(obj, "__module__", "").startswith("rotary"):
                yield f"{module.__name__}.{name}", obj
                if inspect.isclass(obj):
                    for attr, member in vars(obj).items():
                        if not attr.startswith("_") and isinstance(member, (classmethod, staticmethod)):
                            member = member.__func__
                        if not attr.startswith("_") and inspect.isfunction(member):
                            yield f"{module.__name__}.{name}.{attr}", member


@pytest.mark.parametrize("module_name", ["rotary", "rotary.mrope", "rotary.torch", "rotary.transformers",
                                         "rotary.torch.distributed"])
def test_public_docstrings_are_numpy_style(module_name):
    # Every public function and class documents itself in NumPy's sections: a "Parameters" section
    # when it takes arguments, no Google-style "Args:"/"Raises:" lines.
    pytest.importorskip("torch")
    module = importlib.import_module(module_name)
    missing = []
    for name, obj in _public_callables(module):
        doc = inspect.getdoc(obj) or ""
        target = obj.__init__ if inspect.isclass(obj) else obj
        takes = [p for p in inspect.signature(target).parameters if p not in ("self", "cls")]
        if not doc or re.search(r"^\s*(Args|Raises|Returns):\s*$", doc, re.M):
            missing.append(name)
        elif takes and "Parameters\n----------" not in doc:
            missing.append(name)
    assert not missing, f"not NumPy-style: {missing}"
