"""A workflow that requires an input image is served: bound at start with no inputs, each request checked."""

from __future__ import annotations

import PIL.Image
import pytest

from blocks.stable_diffusion import make_tiny_repo
from components import ComponentsManager
from modular.errors import MissingInputError
from modular.serving import ServedWorkflow, ServedWorkflows
from modular.serving.requests import check_request


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    repo = make_tiny_repo(tmp_path_factory.mktemp("repos") / "tiny-sd")
    workflows = [
        ServedWorkflow("i2i", str(repo), "image2image"),
        ServedWorkflow("t2i", str(repo), "text2image"),
    ]
    return ServedWorkflows(workflows, ComponentsManager())


def test_an_image2image_workflow_binds_and_says_it_requires_an_image(served):
    """Binding checks no request's inputs (none is given yet); the workflow's description names the input."""
    inputs = {item["name"]: item for item in served.describe("i2i")["inputs"]}
    assert inputs["image"]["required"] is True
    assert not served.is_loaded("i2i")


def test_a_request_without_the_image_is_refused_and_one_with_it_accepted(served, tmp_path):
    """The image is checked per request, with the message of ``modular run``."""
    with pytest.raises(MissingInputError, match=r"workflow 'image2image'\) needs image: pass image"):
        check_request({"workflow": "i2i", "prompt": "a fox", "steps": 1}, served)
    image = tmp_path / "in.png"
    PIL.Image.new("RGB", (32, 32), (120, 60, 30)).save(image)
    checked = check_request({"workflow": "i2i", "prompt": "a fox", "steps": 1}, served, {"image": image})
    assert checked.workflow == "i2i"
