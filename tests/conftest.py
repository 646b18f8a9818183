"""Test-wide settings: no network, gpu tests skipped without CUDA."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
# print(cm) and the CLI fit the terminal's width (shutil.get_terminal_size): every test sees one 80-column
# terminal, whatever the terminal it is run from.
os.environ["COLUMNS"] = "80"

import pytest  # noqa: E402
import torch  # noqa: E402

# The block-family tests' shared checks report failures as a test module's own asserts do.
pytest.register_assert_rewrite("tests.blocks.helpers", "tests.blocks.lora_helpers")

# Tiny models gain nothing from threads, and on shared 2-core machines OpenMP threads spinning
# against another process make each call orders of magnitude slower.
torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # Under `pytest -n N --dist loadgroup` (scripts/test.sh) a file's tests stay on one worker, so its
    # module fixtures are built once, and every test that starts a Ray cluster shares one worker, so two
    # clusters never start at once. First of the hooks: xdist's worker reads the groups in its own (it
    # registers after this file, so it would run first and find none; tests/test_test_groups.py).
    for item in items:
        ray = "ray" in item.keywords or item.path.parent.name == "ray_serve"
        item.add_marker(pytest.mark.xdist_group("ray" if ray else item.path.as_posix()))
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
