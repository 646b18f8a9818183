"""What a block repo load reads: consent first, then only the named module and its relative imports, safely."""

import os

import pytest

from modular import BlockRepoError, ModularPipelineBlocks
from modular.remote import code_files

from .block_repos import DESCRIPTION, load_within, write_repo

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs and symlinks (POSIX)")


def _with_stray(folder, kind):
    """Adds `notes.py` beside the block as a FIFO, a link to /dev/zero, a directory or a dangling link."""
    path = folder / "notes.py"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        path.symlink_to(folder / "gone.py")
    return folder


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "dangling-link"])
def test_a_stray_python_name_the_code_does_not_import_is_never_read(tmp_path, kind):
    """A FIFO, a /dev/zero link, a directory or a dangling link named notes.py beside the block is not touched."""
    folder = _with_stray(write_repo(tmp_path / "repo"), kind)
    block = load_within(30, folder, trust_remote_code=True)
    assert block.description == DESCRIPTION


def test_consent_is_checked_before_any_code_file_is_read(tmp_path):
    """Untrusted, a repo whose code file is a FIFO is refused at once with the consent message (no read, no hang)."""
    folder = write_repo(tmp_path / "repo")
    (folder / "block.py").unlink()
    os.mkfifo(folder / "block.py")
    with pytest.raises(BlockRepoError, match=r"holds custom code: loading it runs .*block.py"):
        load_within(30, folder)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("fifo", "is a FIFO (named pipe), not a regular file; nothing was read."),
        ("dev-zero", "is a character device, not a regular file; nothing was read."),
        ("directory", "is a directory, not a regular file; nothing was read."),
        ("dangling-link", "is a link to a file that does not exist."),
    ],
)
def test_an_imported_file_that_is_not_a_regular_file_is_a_clear_error(tmp_path, kind, message):
    """`from . import notes` with notes.py not a regular file names the file and what it is."""
    code = "from diffusers.modular_pipelines import ModularPipelineBlocks\nfrom . import notes\n\n\nclass Noted(ModularPipelineBlocks):\n    pass\n"
    folder = _with_stray(
        write_repo(tmp_path / "repo", code, {"auto_map": {"ModularPipelineBlocks": "block.Noted"}}), kind
    )
    with pytest.raises(BlockRepoError) as info:
        load_within(30, folder, trust_remote_code=True)
    assert str(info.value).startswith(f"Block folder '{folder}': {folder / 'notes.py'} {message}")


def test_a_named_module_linked_to_dev_zero_is_refused_without_reading(tmp_path):
    """block.py as a link to /dev/zero is refused as a character device, without reading it."""
    folder = write_repo(tmp_path / "repo")
    (folder / "block.py").unlink()
    (folder / "block.py").symlink_to("/dev/zero")
    with pytest.raises(BlockRepoError, match=r"block.py is a character device, not a regular file"):
        load_within(30, folder, trust_remote_code=True)


def test_a_code_file_over_the_size_limit_is_refused_naming_file_and_limit(tmp_path, monkeypatch):
    """A code file larger than the limit is a clear error that names the file and the limit; nothing runs."""
    monkeypatch.setattr(code_files, "MAX_FILE_BYTES", 1000)
    marker = tmp_path / "ran.txt"
    helper = f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n" + "#" * 2000 + "\n"
    code = "from diffusers.modular_pipelines import ModularPipelineBlocks\nfrom .big import *\n\n\nclass Big(ModularPipelineBlocks):\n    pass\n"
    folder = write_repo(
        tmp_path / "repo", code, {"auto_map": {"ModularPipelineBlocks": "block.Big"}}, {"big.py": helper}
    )
    with pytest.raises(BlockRepoError) as info:
        ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert str(info.value) == (
        f"Block folder '{folder}': {folder / 'big.py'} is larger than the limit of 1000 bytes for a block repo's "
        f"code or config file; nothing was run. Split the file, or keep data out of the block's code."
    )
    assert not marker.exists()


def test_only_the_named_module_and_its_relative_imports_are_read(tmp_path):
    """The content hash covers block.py and what it imports relatively; an unrelated file changing leaves it."""
    code = "from diffusers.modular_pipelines import ModularPipelineBlocks\nfrom .pkg.helpers import VALUE\n\n\nclass Valued(ModularPipelineBlocks):\n    value = VALUE\n"
    files = {"pkg/__init__.py": "", "pkg/helpers.py": "VALUE = 3\n", "unrelated.py": "X = 1\n"}
    folder = write_repo(
        tmp_path / "repo", code, {"auto_map": {"ModularPipelineBlocks": "block.Valued"}}, files
    )
    first = ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True)
    assert first.value == 3
    (folder / "unrelated.py").write_text("X = 2\n")
    assert ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True).source.content_hash == (
        first.source.content_hash
    )
    (folder / "pkg" / "helpers.py").write_text("VALUE = 4\n")
    assert ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True).value == 4
