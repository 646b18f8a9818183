"""What ``Scheduler.submit`` accepts: the batch job check with its messages, the seeds of a request's images,
the server's limits; a refused request changes nothing."""

from __future__ import annotations

import threading

import PIL.Image
import pytest

from components import ComponentsManager
from modular.batch.entries import BatchJob
from modular.batch.jobfile import JobFileError, parse_job
from modular.errors import InputTypeError, MissingInputError, UnknownInputError
from modular.serving import Limits, QueueFullError, RequestError, Scheduler, ServedWorkflow, ServedWorkflows

from .conftest import SMALL


def _request(**fields):
    return {**SMALL, "workflow": "sd", "seed": 3, **fields}


def _batch_problems(repo, **keys) -> list[str]:
    """The problems ``modular batch`` finds in a one-prompt job file with ``keys`` at its top."""
    table = {"output": "out", "prompts": ["a red fox"], "workflows": [{"repo": str(repo)}], **keys}
    with pytest.raises(JobFileError) as refused:
        parse_job(table, "job.json", repo.parent)
    return refused.value.problems


def _refused(scheduler, request, error=RequestError):
    with pytest.raises(error) as refused:
        scheduler.submit(request)
    return refused.value


@pytest.fixture
def scheduler(make_scheduler):
    return make_scheduler("sd", "sd-i2i", "flux")


@pytest.mark.parametrize(
    "keys",
    [{"step": 2}, {"steps": 0}, {"steps": "2"}, {"images_per_prompt": 0}, {"guidance_scale": "x"}],
    ids=["unknown-key", "steps-zero", "steps-text", "no-images", "guidance-text"],
)
def test_a_bad_key_has_the_batch_message(scheduler, serving_repos, keys):
    error = _refused(scheduler, _request(**keys))
    assert error.problems == _batch_problems(serving_repos["sd"], **keys)
    assert str(error) == f"request: {error.problems[0]}"


def test_an_unknown_key_names_the_closest_one(scheduler):
    assert _refused(scheduler, _request(prompts="x")).problems == [
        "unknown key 'prompts' (did you mean 'prompt'?)"
    ]


def test_seeds_and_images_per_prompt_together_have_the_batch_message(scheduler, serving_repos):
    request = {**SMALL, "workflow": "sd", "seeds": [1, 2], "images_per_prompt": 2}
    error = _refused(scheduler, request)
    assert error.problems == _batch_problems(serving_repos["sd"], seeds=[1, 2], images_per_prompt=2)


def test_seed_and_seeds_together_are_refused(scheduler):
    error = _refused(scheduler, _request(seeds=[1, 2]))
    assert error.problems == [
        "give 'seed' (image i is made with seed + i) or 'seeds' (one per image), not both"
    ]


def test_a_bad_size_has_the_batch_rule_said_of_one_size(scheduler, serving_repos):
    (problem,) = _refused(scheduler, _request(size="32by32")).problems
    (batch,) = _batch_problems(serving_repos["sd"], sizes=["32by32"])
    assert batch.startswith("'sizes' must be a list of sizes ")
    assert problem == "'size' must be a size " + batch.removeprefix("'sizes' must be a list of sizes ")


@pytest.mark.parametrize(
    ("inputs", "problem"),
    [
        ({"width": 64}, "'inputs' sets 'width', which the job sets through its key 'size'; use that key"),
        (
            {"prompt": "b"},
            "'inputs' sets 'prompt', which the job sets through its key 'prompt'; use that key",
        ),
        (
            {"num_inference_steps": 10**6},
            "'inputs' sets 'num_inference_steps', which the job sets through its key 'steps'; use that key",
        ),
        (
            {"num_images_per_prompt": 99},
            "'inputs' sets 'num_images_per_prompt', which the job sets through its key 'images_per_prompt'; use that key",
        ),
        ({"output_type": "pil"}, "'inputs' sets 'output_type', which the server sets (results are PNG)"),
    ],
)
def test_inputs_cannot_set_what_a_request_key_sets_and_the_message_names_the_request_s_key(
    scheduler, inputs, problem
):
    """So no input passes around a limit (steps, size, images); the key named is one a request has."""
    assert _refused(scheduler, _request(inputs=inputs)).problems == [problem]


def test_a_workflow_not_served_is_refused_with_what_is(scheduler):
    (problem,) = _refused(scheduler, _request(workflow="tiny-sd")).problems
    assert problem == "'workflow' 'tiny-sd' is not served here; this server serves flux, sd, sd-i2i"


def test_a_missing_workflow_is_refused_when_several_are_served(scheduler):
    request = _request()
    del request["workflow"]
    (problem,) = _refused(scheduler, request).problems
    assert problem == "'workflow' is missing; this server serves flux, sd, sd-i2i"


def test_the_one_served_workflow_is_the_default(make_scheduler):
    scheduler = make_scheduler("flux")
    job = scheduler.submit({**SMALL, "seed": 1})
    assert job.workflow == "flux" and scheduler.describe(job.id)["request"]["workflow"] == "flux"


def test_an_input_the_pipeline_lacks_is_an_unknown_input(scheduler):
    error = _refused(scheduler, _request(inputs={"strenght": 0.5}), UnknownInputError)
    assert "'strenght'" in str(error) and "did you mean 'strength'" in str(error)


def test_a_missing_required_input_is_a_missing_input(scheduler):
    request = {"workflow": "sd-i2i", "prompt": "a fox", "steps": 2, "seed": 1}
    error = _refused(scheduler, request, MissingInputError)
    assert "(workflow 'image2image') needs image" in str(error)


def test_an_input_of_the_wrong_type_is_refused(scheduler):
    error = _refused(scheduler, _request(inputs={"strength": "strong"}), InputTypeError)
    assert "input 'strength' must be float" in str(error) and "'strong'" in str(error)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"prompt": 3}, "'prompt' must be a string (got 3 that is a int)"),
        ({"priority": 1.5}, "'priority' must be a whole number (got 1.5 that is a float)"),
        ({"priority": True}, "'priority' must be a whole number (got True that is a bool)"),
        (
            {"timeout": 0},
            f"'timeout' must be more than 0 and at most {threading.TIMEOUT_MAX:.0f} seconds (got 0)",
        ),
        ({"timeout": "1"}, "'timeout' must be a number (got '1' that is a str)"),
        ({"seed": -1}, "'seed' must be from 0 to 2**63-1 = 9223372036854775807 (got -1)"),
        (
            {"images": {"image": "/etc/passwd"}},
            "'images' come as uploads or base64 inputs, which the server stores itself",
        ),
    ],
)
def test_wrong_types_of_a_request_s_own_keys(scheduler, fields, problem):
    assert _refused(scheduler, _request(**fields)).problems == [problem]


def test_a_request_that_is_not_a_table_is_refused(scheduler):
    assert _refused(scheduler, ["a fox"]).problems == [
        "a request is one table of keys (got ['a fox'] that is a list)"
    ]


def test_every_problem_is_named_at_once(scheduler):
    error = _refused(scheduler, _request(step=2, priority="high", prompt=None))
    assert len(error.problems) == 3 and str(error).startswith("request: 3 problems: ")


# -- seeds ---------------------------------------------------------------------------------------------
def test_seed_s_gives_images_s_s_plus_1_and_so_on(scheduler):
    job = scheduler.submit(_request(seed=41, images_per_prompt=3))
    assert job.seeds == [41, 42, 43]
    assert [entry.seed for entry in job.request.entries] == [41, 42, 43]
    assert scheduler.describe(job.id)["seeds"] == [41, 42, 43]


def test_listed_seeds_are_the_images_seeds(scheduler):
    request = {**SMALL, "workflow": "sd", "seeds": [9, 4]}
    assert scheduler.submit(request).seeds == [9, 4]


def test_without_a_seed_one_is_chosen_and_recorded(scheduler):
    request = {**SMALL, "workflow": "sd", "images_per_prompt": 2}
    first, second = scheduler.submit(request), scheduler.submit(request)
    described = scheduler.describe(first.id)
    seed = described["request"]["seed"]
    assert isinstance(seed, int) and described["seeds"] == [seed, seed + 1]
    assert scheduler.store.get(first.id).request["request"]["seed"] == seed  # a restart makes the same images
    assert second.seeds != first.seeds


# -- limits --------------------------------------------------------------------------------------------
def test_limits_of_steps_images_and_pixels(make_scheduler):
    scheduler = make_scheduler("sd", limits=Limits(max_steps=4, max_images=2, max_pixels=32 * 32))
    assert _refused(scheduler, _request(steps=5)).problems == [
        "'steps' must be at most 4 on this server (got 5)"
    ]
    assert _refused(scheduler, _request(images_per_prompt=3)).problems == [
        "a request makes at most 2 images on this server (got 3)"
    ]
    assert _refused(scheduler, {**SMALL, "workflow": "sd", "seeds": [1, 2, 3]}).problems == [
        "a request makes at most 2 images on this server (got 3)"
    ]
    assert _refused(scheduler, _request(size="64x32")).problems == [
        "'size' 64x32 is 2048 pixels; this server makes at most 1024"
    ]
    assert scheduler.submit(_request(steps=4, images_per_prompt=2)).seeds == [3, 4]


@pytest.mark.parametrize(
    ("field", "value"), [("max_steps", 0), ("max_images", "8"), ("max_pixels", -1), ("max_images", 2.0)]
)
def test_limits_refuse_values_that_are_not_limits(field, value):
    with pytest.raises(ValueError) as refused:
        Limits(**{field: value})
    assert str(refused.value) == f"{field} must be a whole number of at least 1 (got {value!r})"


def test_a_huge_image_count_is_refused_before_any_entry_is_made(scheduler, monkeypatch):
    """Making 10**12 entries first would never end."""

    def refuse(spec):
        raise AssertionError("the batch job's entries were made")

    monkeypatch.setattr(BatchJob, "from_spec", staticmethod(refuse))
    for request in (
        _request(images_per_prompt=10**12),
        {**SMALL, "workflow": "sd", "images_per_prompt": 10**12},
    ):
        assert _refused(scheduler, request).problems == [
            "a request makes at most 8 images on this server (got 1000000000000)"
        ]


def test_an_uploaded_image_over_the_pixel_limit_is_refused(make_scheduler, tmp_path):
    scheduler = make_scheduler("sd-i2i", limits=Limits(max_pixels=32 * 32))
    big = tmp_path / "big.png"
    PIL.Image.new("RGB", (64, 32)).save(big)
    with pytest.raises(RequestError) as refused:
        scheduler.submit({"prompt": "a fox", "steps": 2, "seed": 1}, {"image": big})
    assert refused.value.problems == ["image 'image' is 64x32; this server takes at most 1024 pixels"]


def test_an_upload_that_is_not_an_image_is_refused(make_scheduler, tmp_path):
    scheduler = make_scheduler("sd-i2i")
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    with pytest.raises(RequestError, match=r"image 'image' is not an image this server can read"):
        scheduler.submit({"prompt": "a fox", "steps": 2, "seed": 1}, {"image": text})


def test_an_image2image_workflow_is_served_and_takes_its_image(make_scheduler, tmp_path):
    scheduler = make_scheduler("sd-i2i")
    image = tmp_path / "in.png"
    PIL.Image.new("RGB", (32, 32), (200, 30, 30)).save(image)
    job = scheduler.submit(
        {"prompt": "a fox", "steps": 2, "seed": 1, "inputs": {"strength": 0.5}}, {"image": image}
    )
    assert job.state == "queued" and scheduler.position(job.id) == 1


# -- a refusal changes nothing -------------------------------------------------------------------------
def _state(scheduler):
    return (
        [(record.id, record.state) for record in scheduler.store.all()],
        [job.id for job in scheduler.waiting()],
        scheduler.jobs(),
        scheduler.events.listener_count(),
    )


@pytest.mark.parametrize(
    ("request_", "error"),
    [
        (_request(step=2), RequestError),
        (_request(workflow="nope"), RequestError),
        (_request(inputs={"nope": 1}), UnknownInputError),
        ({"workflow": "sd-i2i", "prompt": "a", "seed": 1}, MissingInputError),
        (_request(images_per_prompt=99), RequestError),
    ],
    ids=["unknown-key", "not-served", "unknown-input", "missing-input", "limit"],
)
def test_a_refused_request_leaves_queue_and_store_as_they_were(scheduler, request_, error):
    scheduler.submit(_request(seed=1))
    with scheduler.events.subscribe() as listener:
        before = _state(scheduler)
        _refused(scheduler, request_, error)
        assert _state(scheduler) == before
        assert listener.get(timeout=0) is None  # nothing was published


def test_a_full_queue_refuses_with_a_retry_time_and_keeps_its_jobs(make_scheduler):
    scheduler = make_scheduler("sd", max_queue=2)
    accepted = [scheduler.submit(_request(seed=seed)).id for seed in (1, 2)]
    before = _state(scheduler)
    error = _refused(scheduler, _request(seed=3), QueueFullError)
    assert error.max_queue == 2 and error.retry_after >= 1
    assert str(error).startswith("the queue is full (2 jobs wait); try again in about ")
    assert _state(scheduler) == before
    assert [job.id for job in scheduler.waiting()] == accepted


def test_an_input_error_names_the_repo_as_served_not_the_server_s_folder(serving_repos):
    folder = serving_repos["sd"]
    served = ServedWorkflows([ServedWorkflow("sd", folder.name)], ComponentsManager(), base=folder.parent)
    scheduler = Scheduler(served)
    try:
        with pytest.raises(UnknownInputError) as caught:
            scheduler.submit({"prompt": "a fox", "inputs": {"strenght": 0.5}})
        message = str(caught.value)
        assert message.startswith(f"{folder.name}() got an unknown input 'strenght'")
        assert str(folder.parent) not in message
    finally:
        scheduler.close()
