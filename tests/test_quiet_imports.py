"""Importing the packages prints nothing, torchao installed on a CPU-only torch included."""

import logging
import subprocess
import sys

import pytest

from components.quiet_imports import _DropMessages, install_filters


def test_importing_every_family_prints_nothing():
    code = (
        "import modular, blocks.stable_diffusion, blocks.stable_diffusion_xl, blocks.flux, blocks.z_image, "
        "blocks.flux2, blocks.sd3, blocks.qwenimage, blocks.wan"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout == ""
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("logger_name", "message"),
    [
        ("torchao", "Failed to load /x/torchao/_C_mxfp8.so: Could not load this library"),
        ("diffusers.quantizers.torchao.torchao_quantizer", "Unable to import `torchao` Tensor objects."),
        (
            "diffusers.guiders.guider_utils",
            "Guiders are currently an experimental feature under active development.",
        ),
        (
            "transformers.utils.import_utils",
            "`CLIPImageProcessor` requires torchvision (not installed); falling back to `CLIPImageProcessorPil`",
        ),
    ],
)
def test_only_the_known_lines_are_dropped(caplog, logger_name, message):
    install_filters()  # a second call adds no second filter
    logger = logging.getLogger(logger_name)
    assert sum(isinstance(f, _DropMessages) for f in logger.filters) == 1  # other libraries may add theirs
    with caplog.at_level(logging.WARNING, logger=logger_name):
        logger.warning(message)
        logger.warning("something else went wrong")
    assert [r.getMessage() for r in caplog.records] == ["something else went wrong"]
