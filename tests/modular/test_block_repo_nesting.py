"""Block repos whose code loads block repos: loads nest, threads load side by side, a cycle is an error."""

import threading

import pytest

from modular import ModularPipelineBlocks
from modular.remote.nesting import BlockRepoCycleError

from .block_repos import DESCRIPTION, load_within, write_repo

# Reached by the repos' code through sys.modules: both threads' repo code meet here while they run.
BARRIER = threading.Barrier(2, timeout=20)


def _config(class_name):
    return {"auto_map": {"ModularPipelineBlocks": f"block.{class_name}"}}


def _outer_code(inner_folder, where):
    """A block whose module (`where="module"`) or __init__ (`where="init"`) loads the repo at `inner_folder`."""
    load = f"ModularPipelineBlocks.from_pretrained({str(inner_folder)!r}, trust_remote_code=True)"
    if where == "module":
        return f"from modular import ModularPipelineBlocks\nINNER = {load}\n\n\nclass Outer(ModularPipelineBlocks):\n    inner = INNER\n"
    return (
        "from modular import ModularPipelineBlocks\n\n\nclass Outer(ModularPipelineBlocks):\n"
        f"    def __init__(self):\n        super().__init__()\n        self.inner = {load}\n"
    )


@pytest.mark.parametrize("where", ["module", "init"])
def test_a_block_repo_whose_code_loads_another_loads_both(tmp_path, where):
    """A repo loading another in its module or its block's __init__ returns both blocks instead of hanging."""
    inner = write_repo(tmp_path / "inner")
    outer = write_repo(tmp_path / "outer", _outer_code(inner, where), _config("Outer"))
    block = load_within(30, outer, trust_remote_code=True)
    assert type(block).__name__ == "Outer"
    assert block.inner.description == DESCRIPTION
    assert block.inner.source.repo == str(inner)


def test_a_block_repo_that_loads_itself_is_a_clear_error(tmp_path):
    """A repo whose code loads its own folder raises a BlockRepoCycleError naming the chain, not a hang."""
    folder = tmp_path / "selfish"
    write_repo(folder, _outer_code(folder, "module"), _config("Outer"))
    with pytest.raises(BlockRepoCycleError) as info:
        load_within(30, folder, trust_remote_code=True)
    where = f"Block folder '{folder}'"
    assert str(info.value) == (
        f"{where} is loaded again while its own code is loading it: {where} -> {where}. A block repo's code must "
        f"not load itself, directly or through the repos it loads; build the block in the code instead."
    )
    block = ModularPipelineBlocks.from_pretrained(write_repo(tmp_path / "plain"), trust_remote_code=True)
    assert block.description == DESCRIPTION  # nothing was left held


def test_two_repos_loading_each_other_is_a_clear_error(tmp_path):
    """A loads B whose code loads A: the error names A -> B -> A."""
    first, second = tmp_path / "a", tmp_path / "b"
    write_repo(first, _outer_code(second, "module"), _config("Outer"))
    write_repo(second, _outer_code(first, "init"), _config("Outer"))
    with pytest.raises(BlockRepoCycleError, match="while its own code is loading it") as info:
        load_within(30, first, trust_remote_code=True)
    a, b = f"Block folder '{first}'", f"Block folder '{second}'"
    assert f": {a} -> {b} -> {a}." in str(info.value)


def test_two_threads_load_different_repos_at_the_same_time(tmp_path):
    """Two repos' code runs in two threads at once (each waits at a barrier for the other): neither waits for a lock."""
    BARRIER.reset()
    code = "import sys\nfrom modular import ModularPipelineBlocks\n\nsys.modules[{test!r}].BARRIER.wait()\n\n\nclass Outer(ModularPipelineBlocks):\n    name = {name!r}\n"
    # Different names: different content, so each has its own turn (one code is run once, by one thread).
    folders = [
        write_repo(tmp_path / name, code.format(test=__name__, name=name), _config("Outer"))
        for name in ("one", "two")
    ]
    results = {}

    def load(folder):
        results[folder.name] = type(ModularPipelineBlocks.from_pretrained(folder, trust_remote_code=True))

    threads = [threading.Thread(target=load, args=(folder,), daemon=True) for folder in folders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(40)
    assert sorted(results) == ["one", "two"]
    assert results["one"] is not results["two"]
