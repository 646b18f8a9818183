"""A file or another distribution's package that shadows one of ours fails the import, naming it and the fix."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_python(folder: Path, *args: str, path_first: Path | None = None) -> subprocess.CompletedProcess:
    """Python in ``folder`` (the working folder), ``path_first`` (default: ``folder``) ahead of this repo."""
    env = {**os.environ, "PYTHONPATH": f"{path_first or folder}:{ROOT}"}
    return subprocess.run(
        [sys.executable, *args], cwd=folder, env=env, capture_output=True, text=True, timeout=300
    )


def last_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    return result.stderr.strip().splitlines()[-1]


def rename_message(importer: str, name: str, shadow: Path, kind: str) -> str:
    return (
        f"ImportError: {importer} imports its sibling package {name!r} ({ROOT / name}), but the name {name!r} "
        f"finds {shadow} first: rename that {kind} (it shadows the package from the working folder or sys.path)"
    )


@pytest.mark.parametrize(
    ("code", "importer"),
    [("import components", "components"), ("import modular", "modular"), ("import blocks.flux", "blocks")],
)
def test_an_offload_py_in_the_working_folder_is_named_with_the_fix(tmp_path, code, importer):
    """A user's offload.py in the working folder: each package that imports offload names the file, says rename."""
    (tmp_path / "offload.py").write_text("import modular\n")
    result = run_python(tmp_path, "-c", code)
    assert last_line(result) == rename_message(importer, "offload", tmp_path / "offload.py", "file")
    assert "circular import" not in result.stderr


def test_a_script_named_offload_py_is_named_not_a_circular_import(tmp_path):
    """Running one's own script offload.py that imports modular says rename it, not 'partially initialized'."""
    (tmp_path / "offload.py").write_text("from modular import ModularPipeline\n")
    result = run_python(tmp_path, "offload.py")
    assert last_line(result) == rename_message("modular", "offload", tmp_path / "offload.py", "file")


def test_a_blocks_py_is_named_when_the_families_load(tmp_path):
    """A user's blocks.py: finding the families (entry points into blocks) names the file, not 'not a package'."""
    (tmp_path / "blocks.py").write_text("")
    result = run_python(tmp_path, "-c", "import modular; modular.available_families()")
    assert last_line(result) == rename_message("modular", "blocks", tmp_path / "blocks.py", "file")


def test_a_components_folder_ahead_on_sys_path_is_named(tmp_path):
    """A package folder of the same name earlier on sys.path: named as a folder to rename."""
    (tmp_path / "components").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("")
    result = run_python(tmp_path, "-c", "import modular")
    assert last_line(result) == rename_message("modular", "components", tmp_path / "components", "folder")


def test_an_installed_components_distribution_is_named_with_uninstall(tmp_path):
    """PyPI's components installed ahead of ours: the message names the distribution and says uninstall it."""
    site = tmp_path / "site-packages"
    (site / "components").mkdir(parents=True)
    (site / "components" / "__init__.py").write_text("")
    (site / "components-0.1.dist-info").mkdir()
    (site / "components-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: components\nVersion: 0.1\n"
    )
    (site / "components-0.1.dist-info" / "top_level.txt").write_text("components\n")
    result = run_python(tmp_path, "-c", "import modular", path_first=site)
    assert last_line(result) == (
        f"ImportError: modular imports its sibling package 'components' ({ROOT / 'components'}), but the name "
        f"'components' finds {site / 'components'} first, installed by the distribution 'components': uninstall "
        "the other 'components' package (pip uninstall components), or give this project a virtual environment "
        "of its own"
    )


def test_without_a_shadow_the_packages_import_and_the_check_imports_no_torch(tmp_path):
    """The normal case imports fine; the check itself (all `import blocks` runs) imports neither torch nor diffusers."""
    code = (
        "import sys; import blocks; heavy = sorted({'torch', 'diffusers'} & set(sys.modules)); "
        "import modular, components, offload; from modular import ModularPipeline; "
        "print(heavy, modular.__file__, components.__file__, offload.__file__)"
    )
    result = run_python(tmp_path, "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [
        "[]",
        str(ROOT / "modular" / "__init__.py"),
        str(ROOT / "components" / "__init__.py"),
        str(ROOT / "offload" / "__init__.py"),
    ]
