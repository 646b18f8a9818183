"""What the durability and serving-with tests share: tiny repos made once per session, a scheduler over a
manager, and the direct call a served job must equal (the same pipeline call, on a manager of its own).

Kept apart from tests/serving/conftest.py: these are plain functions, and the tests' fixtures call them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch

from components import ComponentsManager
from components.load_id import get_load_id
from modular.batch.jobs import call_job
from modular.batch.store import encode
from modular.serving import Scheduler, ServedWorkflow, ServedWorkflows, check_request
from modular.serving.requests import open_images

#: A request that runs in tens of milliseconds on the tiny repos (with a 32x32 size, or a 32x32 input image).
SMALL = {"prompt": "a red fox", "steps": 1}


def tiny_repo(root: Path, family: str = "sd", seed: int = 0) -> Path:
    """The tiny repo of ``family`` (``sd``, ``sdxl``, ``flux``) under ``root``, written once."""
    folder = root / f"{family}-{seed}"
    if (folder / "model_index.json").exists():
        return folder
    if family == "sd":
        from blocks.stable_diffusion import make_tiny_repo
    elif family == "sdxl":
        from blocks.stable_diffusion_xl import make_tiny_repo
    elif family == "flux":
        from blocks.flux import make_tiny_repo
    else:
        raise ValueError(f"no tiny repo for family {family!r}")
    return Path(make_tiny_repo(folder, seed=seed))


def served(manager: ComponentsManager, workflows: Mapping[str, tuple[Path, str | None]]) -> ServedWorkflows:
    """``ServedWorkflows`` of ``{name: (repo, workflow)}`` on ``manager``."""
    return ServedWorkflows(
        [ServedWorkflow(name, str(repo), workflow) for name, (repo, workflow) in workflows.items()], manager
    )


def request(workflow: str, seed: int, size: str | None = "32x32", **more: Any) -> dict[str, Any]:
    """A small request of ``workflow`` with ``seed`` (and no size for a workflow whose size is its image's)."""
    sized = {} if size is None else {"size": size}
    return {"workflow": workflow, **SMALL, **sized, "seed": seed, **more}


def input_image(path: Path, size: int = 32, shade: int = 90) -> Path:
    """A plain RGB PNG of ``size`` x ``size`` at ``path`` (an image-to-image input)."""
    PIL.Image.new("RGB", (size, size), (shade, 2 * shade % 256, 200)).save(path)
    return path


class DirectCalls:
    """The direct call of a served request: its workflows on a manager of their own (no offload, no
    scheduler) unless ``manager`` is given, each image ``call_job`` on its entry, encoded as the scheduler
    encodes results."""

    def __init__(
        self, workflows: Mapping[str, tuple[Path, str | None]], manager: ComponentsManager | None = None
    ) -> None:
        self.served = served(manager or ComponentsManager(), workflows)

    def arrays(self, data: Mapping[str, Any], uploads: Mapping[str, Path] | None = None) -> list[np.ndarray]:
        """Each image of request ``data`` (in normal form: its seed given), as the pipeline returns it."""
        assert "seed" in data or "seeds" in data, "a direct call needs the request's recorded seed"
        checked = check_request(dict(data), self.served, dict(uploads or {}))
        pipe = self.served.load(checked.workflow)
        images = open_images(dict(uploads or {}))
        return [call_job(pipe, entry.job(images, False)) for entry in checked.entries]

    def pngs(self, data: Mapping[str, Any], uploads: Mapping[str, Path] | None = None) -> list[bytes]:
        """The PNG bytes of each image of request ``data``, encoded as the scheduler encodes its results."""
        return [encode(array, "png") for array in self.arrays(data, uploads)]


def result_bytes(scheduler: Scheduler, job_id: str) -> list[bytes]:
    """The bytes of each result file of job ``job_id``, in entry order."""
    names = scheduler.describe(job_id)["results"]
    return [(scheduler.results / name).read_bytes() for name in names]


def run_all(scheduler: Scheduler, limit: int = 50) -> list[str]:
    """Run waiting jobs in this thread until none may start (at most ``limit``); their ids in run order."""
    ran = []
    for _ in range(limit):
        job = scheduler.run_next()
        if job is None:
            return ran
        ran.append(job.id)
    raise AssertionError(f"more than {limit} jobs ran; the queue does not drain")


def image_count(data: Mapping[str, Any]) -> int:
    """How many images request ``data`` makes."""
    return len(data["seeds"]) if "seeds" in data else int(data.get("images_per_prompt", 1))


def expected_names(jobs: Sequence[tuple[str, Mapping[str, Any]]]) -> list[str]:
    """The result file names of ``(job id, request)`` pairs once done: ``<id>-<index>.png`` each."""
    return sorted(f"{job_id}-{index}.png" for job_id, data in jobs for index in range(image_count(data)))


def models_by_load_id(manager: ComponentsManager) -> dict[str, torch.nn.Module]:
    """Every model the manager holds, by its load ID (``repo|subfolder|variant|revision``)."""
    found = {}
    for obj in manager.components.values():
        if isinstance(obj, torch.nn.Module):
            load_id = get_load_id(obj)
            assert load_id is not None, f"{type(obj).__name__} has no load ID"
            found[load_id] = obj
    return found


def assert_same_weights(manager: ComponentsManager, reference: ComponentsManager) -> None:
    """Every model of ``manager`` holds exactly the weights of the model with its load ID in ``reference`` (a
    manager that never offloaded): none lost to a placeholder, a dropped host copy or a missed read-back."""
    mine, theirs = models_by_load_id(manager), models_by_load_id(reference)
    assert set(mine) <= set(theirs), sorted(set(mine) - set(theirs))
    for load_id, model in mine.items():
        held, expected = model.state_dict(), theirs[load_id].state_dict()
        assert held.keys() == expected.keys(), load_id
        differ = [key for key in held if not torch.equal(held[key], expected[key])]
        assert not differ, f"{load_id}: {len(differ)} tensors differ, e.g. {differ[:3]}"
