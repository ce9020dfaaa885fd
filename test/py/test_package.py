"""The package `hostir`: its version, its public API, and the three ways it is found.

`pip install -e .` (the README's), a non-editable `pip install --target DIR .`, and the
checkout's own scripts where hostir is not installed (`tools/checkout.py`) each make the
folders `hostir/`, `passes/`, `runtime/`, `frontend/` and `tools/` one package.
"""

from __future__ import annotations

import importlib.metadata
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest
import xdsl

import hostir

REPOSITORY = Path(__file__).resolve().parents[2]

WHAT_A_PROCESS_SEES = """
import sys
import hostir, hostir.config, hostir.passes, hostir.frontend.backend
from torch._dynamo.backends.registry import lookup_backend
print(hostir.__version__)
print(hostir.__file__)
print(hostir.passes.__file__)
print(hostir.Program.__module__, hostir.explain.__module__)
print(len(hostir.passes.HOSTIR_PASSES))
print(all(m.__file__.startswith(hostir.__file__.rpartition("hostir")[0]) for n, m in sys.modules.items() if n.startswith("hostir")))
print(lookup_backend("hostir") is hostir.frontend.backend.hostir)
"""
"""What a fresh process finds: which hostir, and torch.compile's backend "hostir" (the
`torch_dynamo_backends` entry point, as torch.compile looks it up) in that same copy."""


def test_the_version_is_the_distributions():
    assert hostir.__version__ == importlib.metadata.version("hostir")
    assert [int(part) for part in hostir.__version__.split(".")] >= [0, 1, 0]


def test_the_public_api_is_imported_when_first_used():
    """`import hostir` imports none of its modules but its version; each public name comes
    from its module."""
    fresh = subprocess.run(
        [sys.executable, "-c", "import sys, hostir; print(sorted(m for m in sys.modules if m.startswith('hostir')))"],
        capture_output=True,
        text=True,
        cwd=REPOSITORY / "test",
    )
    assert fresh.stdout.strip() == "['hostir', 'hostir.version']", fresh.stderr
    from hostir.runtime.launch import run_on_local_ranks
    from hostir.runtime.program import Program

    assert hostir.Program is Program and hostir.run_on_local_ranks is run_on_local_ranks
    assert set(hostir.__all__) <= set(dir(hostir))
    for name in hostir.__all__:
        assert getattr(hostir, name) is not None, name
    with pytest.raises(AttributeError, match="module 'hostir' has no attribute 'Programme'"):
        hostir.Programme  # noqa: B018


def test_the_code_says_it_is_typed():
    for package in ("hostir", "hostir_dialect"):
        assert (Path(importlib.util.find_spec(package).origin).parent / "py.typed").is_file(), package


def _run(python: list[str], cwd: Path, **environment: str) -> list[str]:
    result = subprocess.run([*python, "-c", WHAT_A_PROCESS_SEES], capture_output=True, text=True, cwd=cwd, env=environment or None)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_an_editable_install_is_the_checkout(tmp_path):
    version, init, passes, api, count, frontend, backend = _run([sys.executable], tmp_path)
    assert (version, init, passes) == (hostir.__version__, str(REPOSITORY / "hostir" / "__init__.py"), str(REPOSITORY / "passes" / "__init__.py"))
    assert api == "hostir.runtime.program hostir.frontend.explain" and int(count) > 5 and frontend == backend == "True"


def _copy_of_the_checkout(destination: Path) -> Path:
    """The files git tracks (and those of this change), without the virtual environment: pip
    builds in the source folder, which must not be the checkout."""
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], capture_output=True, text=True, cwd=REPOSITORY, check=True
    ).stdout.split()
    for name in files:
        source = REPOSITORY / name
        if source.is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def test_a_non_editable_install_is_one_package(tmp_path):
    source = _copy_of_the_checkout(tmp_path / "source")
    target = tmp_path / "target"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )
    assert {p.name for p in target.iterdir()} >= {"hostir", "hostir_dialect"}
    assert {p.name for p in (target / "hostir").iterdir()} >= {"__init__.py", "config.py", "py.typed", "passes", "runtime", "frontend", "tools"}
    assert (target / "hostir_dialect" / "py.typed").is_file()
    # -P: not this folder; PYTHONPATH first: the installed copy, not the editable one.
    environment = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    version, init, passes, api, count, frontend, backend = _run([sys.executable, "-P"], tmp_path, **environment)
    assert (version, init, passes) == (hostir.__version__, str(target / "hostir" / "__init__.py"), str(target / "hostir" / "passes" / "__init__.py"))
    assert api == "hostir.runtime.program hostir.frontend.explain" and frontend == backend == "True"
    printed = subprocess.run(
        [sys.executable, "-P", str(target / "bin" / "hir-opt"), "--version"], capture_output=True, text=True, env=environment
    )
    assert printed.stdout.startswith(f"hir-opt {hostir.__version__}"), printed.stderr
    # The checkout's scripts beside that install, run from the checkout's root (as on a
    # machine with hostir installed by `pip install --target`): the installed package, not
    # the checkout's hostir/ folder, which holds none of the rooms, in the scripts and in
    # the local ranks they start (hir-run's, from a forkserver started in the checkout's
    # root). -S: no editable install's finder.
    beside = {"PYTHONPATH": f"{target}:{site.getsitepackages()[0]}", "PATH": "/usr/bin:/bin"}
    for script, arguments, printed in (
        ("tools/hir-opt.py", ["--help"], "usage"),
        ("tools/hir-run.py", ["examples/ag_linear.mlir", "--check"], "ok"),
        ("benchmarks/tp_layer.py", ["--help"], "usage"),
    ):
        ran = subprocess.run(
            [sys.executable, "-S", str(source / script), *arguments], capture_output=True, text=True, cwd=source, env=beside
        )
        assert ran.returncode == 0 and printed in ran.stdout, (script, ran.stderr[-2000:])


def test_the_checkout_scripts_run_where_hostir_is_not_installed(tmp_path):
    """`python -S` with the site-packages on PYTHONPATH: xDSL and torch are found, and the
    editable install's finder (a .pth file, which only `site` reads) is not."""
    site_packages = site.getsitepackages()[0]
    environment = {"PYTHONPATH": site_packages, "PATH": "/usr/bin:/bin"}
    missing = subprocess.run([sys.executable, "-S", "-c", "import hostir"], capture_output=True, text=True, cwd=tmp_path, env=environment)
    assert "No module named 'hostir'" in missing.stderr
    fusion = tmp_path / "f.mlir"
    fusion.write_text(
        "func.func @f(%x: !fusion.tensor<[4], f32>) -> !fusion.tensor<[4], f32> {\n"
        "  %y = fusion.neg %x : !fusion.tensor<[4], f32> -> !fusion.tensor<[4], f32>\n"
        "  func.return %y : !fusion.tensor<[4], f32>\n}\n"
    )
    for script, arguments, printed in (
        ("hir-opt.py", [str(fusion), "-p", "hir-lowering"], "hir.launch_kernel"),
        ("hir-run.py", [str(fusion), "--check"], ": ok"),
    ):
        result = subprocess.run(
            [sys.executable, "-S", str(REPOSITORY / "tools" / script), *arguments], capture_output=True, text=True, cwd=tmp_path, env=environment
        )
        assert result.returncode == 0 and printed in result.stdout, f"{script}: {result.stderr}"
    version = subprocess.run(
        [sys.executable, "-S", str(REPOSITORY / "tools" / "hir-run.py"), "--version"], capture_output=True, text=True, env=environment
    )
    assert version.stdout.split()[:2] == ["hir-run", hostir.__version__]
    assert f"xDSL {xdsl.__version__}" in version.stdout
