"""Batch job files: entries, seeds and names, and bad input refused in one line before any model loads."""

import json
import os

import pytest

from modular.batch import JobFileError, derive_seed, load_job, plan_batch, split_entries
from modular.cli.main import main


def _job(repo, **changes):
    job = {
        "output": "out",
        "seed": 3,
        "steps": 1,
        "sizes": ["32x32"],
        "prompts": ["a cat", "a dog", "a bird"],
        "images_per_prompt": 2,
        "workflows": [{"name": "sd", "repo": str(repo), "workflow": "text2image"}],
    }
    job.update(changes)
    return job


def _write(folder, job, name="job.json"):
    path = folder / name
    path.write_text(json.dumps(job))
    return path


def test_entries_go_prompt_by_prompt_with_seeds_from_the_job_seed_and_index(repo, tmp_path):
    """Entry i has seed derive_seed(job seed, i); entries go prompt, workflow, size, image; names are unique."""
    job = load_job(_job(repo), base=tmp_path)
    assert [(e.index, e.prompt.text, e.image) for e in job.entries] == [
        (0, "a cat", 0),
        (1, "a cat", 1),
        (2, "a dog", 0),
        (3, "a dog", 1),
        (4, "a bird", 0),
        (5, "a bird", 1),
    ]
    assert [e.seed for e in job.entries] == [derive_seed(3, i) for i in range(6)]
    assert job.entries[2].name == "sd-p00001-32x32-0"
    assert derive_seed(0, 0) == 6213027144842677344


def test_appending_prompts_keeps_every_earlier_entry(repo, tmp_path):
    """A prompt added at the end adds entries at the end: earlier indexes, seeds and names stay."""
    before = load_job(_job(repo), base=tmp_path).entries
    after = load_job(_job(repo, prompts=["a cat", "a dog", "a bird", "a fish"]), base=tmp_path).entries
    assert after[: len(before)] == before and len(after) == 8


def test_the_split_gives_every_entry_to_one_rank(repo, tmp_path):
    """A strided split over any number of ranks covers each entry once, and no seed depends on it."""
    entries = load_job(_job(repo), base=tmp_path).entries
    for world in (1, 2, 4, 7):
        shares = [split_entries(entries, rank, world) for rank in range(world)]
        assert sorted(e.index for share in shares for e in share) == list(range(6))


def test_explicit_seeds_and_jsonl_prompts(repo, tmp_path):
    """A workflow's 'seeds' list replaces the derived seeds; JSONL prompts carry names and negative prompts."""
    (tmp_path / "prompts.jsonl").write_text(
        '"a cat"\n\n{"prompt": "a dog", "name": "dog", "negative_prompt": "fog"}\n'
    )
    job = _job(repo, prompt_file="prompts.jsonl", images_per_prompt=1)
    del job["prompts"]
    job["workflows"][0]["seeds"] = [11, 12]
    entries = load_job(job, base=tmp_path).entries
    assert [(e.name, e.seed, e.negative_prompt) for e in entries] == [
        ("sd-p00000-32x32-0", 11, None),
        ("sd-p00000-32x32-1", 12, None),
        ("sd-dog-32x32-0", 11, "fog"),
        ("sd-dog-32x32-1", 12, "fog"),
    ]


def test_a_toml_job_file_gives_the_same_entries(repo, tmp_path):
    """The same job written as TOML (Python 3.11+) has the same entries as the JSON one."""
    pytest.importorskip("tomllib")
    (tmp_path / "job.toml").write_text(
        'output = "out"\nseed = 3\nsteps = 1\nsizes = ["32x32"]\nprompts = ["a cat", "a dog", "a bird"]\n'
        f'images_per_prompt = 2\n[[workflows]]\nname = "sd"\nrepo = "{repo}"\nworkflow = "text2image"\n'
    )
    from_toml = load_job(tmp_path / "job.toml")
    from_json = load_job(_write(tmp_path, _job(repo)))
    assert from_toml.entries == from_json.entries


def test_every_problem_of_a_job_file_is_named_at_once(repo, tmp_path):
    """Unknown keys and bad values are collected into one JobFileError, each with its key."""
    job = _job(repo, steps=0, promts=["x"])
    job["workflows"][0]["size"] = ["32x32"]
    with pytest.raises(JobFileError) as info:
        load_job(job, base=tmp_path)
    assert str(info.value) == (
        "job: 3 problems: 'steps' must be at least 1 (got 0); unknown key 'promts' (did you mean 'prompts'?); "
        "workflows[0]: unknown key 'size' (did you mean 'sizes'?)"
    )


def _refused(capsys, tmp_path, job, expected):
    """`modular batch` exits 2 with one line, ``expected``, on stderr, writes nothing and loads nothing."""
    path = job if isinstance(job, os.PathLike) else _write(tmp_path, job)
    assert main(["batch", str(path), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"modular: error: {expected}\n"
    assert captured.out == ""
    assert not (tmp_path / "out").exists()


def test_an_unknown_key_names_the_closest_valid_one(repo, tmp_path, capsys, no_model_loads):
    """A misspelt key is one line naming the closest valid key, exit status 2, before any model loads."""
    job = _job(repo)
    job["workflows"][0]["step"] = 2
    path = tmp_path / "job.json"
    _refused(
        capsys,
        tmp_path,
        job,
        f"JobFileError: {path}: workflows[0]: unknown key 'step' (did you mean 'steps'?)",
    )


def test_a_missing_prompt_file_is_refused(repo, tmp_path, capsys, no_model_loads):
    """A prompt_file that does not exist is one line naming it and where it was looked for."""
    job = _job(repo, prompt_file="prompts.txt")
    del job["prompts"]
    path = tmp_path / "job.json"
    _refused(
        capsys,
        tmp_path,
        job,
        f"FileNotFoundError: {path}: prompt_file 'prompts.txt' does not exist (looked for {tmp_path / 'prompts.txt'})",
    )


def test_a_workflow_the_family_lacks_is_refused(repo, tmp_path, capsys, no_model_loads):
    """A workflow the repo's family does not have is one line naming the family and its workflows."""
    job = _job(repo)
    job["workflows"][0]["workflow"] = "control"
    path = tmp_path / "job.json"
    _refused(
        capsys,
        tmp_path,
        job,
        f"JobFileError: {path}: workflow 'sd': '{repo}' is a stable-diffusion repo, whose blocks have no "
        "workflow 'control' (available: text2image, image2image, inpainting)",
    )


def test_two_entries_writing_one_file_are_refused(repo, tmp_path, capsys, no_model_loads):
    """Two entries whose output names are the same are one line naming both and the fix."""
    job = _job(repo, output_name="{workflow}-{prompt_index}")
    path = tmp_path / "job.json"
    _refused(
        capsys,
        tmp_path,
        job,
        f"JobFileError: {path}: entries 0 and 1 both write 'sd-0.png' (and 2 more); make 'output_name' "
        "('{workflow}-{prompt_index}') tell them apart, e.g. add {index}, or give the prompts distinct names",
    )


def test_an_output_folder_under_a_file_is_not_writable(repo, tmp_path, capsys, no_model_loads):
    """An output folder that cannot be made (a file stands in its path) is one line, before any model loads."""
    (tmp_path / "taken").write_text("a file")
    _refused(
        capsys,
        tmp_path,
        _job(repo, output="taken/out"),
        f"PermissionError: output folder '{tmp_path / 'taken' / 'out'}' is not writable ({tmp_path / 'taken'} "
        "is a file, not a folder); choose another 'output' or fix its permissions",
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_output_folder_is_not_writable(repo, tmp_path, capsys, no_model_loads):
    """An output folder without write permission is one line, before any model loads."""
    (tmp_path / "locked").mkdir(mode=0o555)
    try:
        assert main(["batch", str(_write(tmp_path, _job(repo, output="locked"))), "--quiet"]) == 2
    finally:
        (tmp_path / "locked").chmod(0o755)
    err = capsys.readouterr().err
    assert err.startswith(
        f"modular: error: PermissionError: output folder '{tmp_path / 'locked'}' is not writable"
    )


def test_dry_run_prints_each_ranks_entries_and_the_components_and_writes_nothing(
    repo, tmp_path, capsys, no_model_loads
):
    """--dry-run --ranks 2 lists each rank's entries and every component's load ID; no folder is made."""
    assert main(["batch", str(_write(tmp_path, _job(repo))), "--dry-run", "--ranks", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith(
        f"6 entries (0 done earlier, 6 to run), job seed 3, png files in {tmp_path / 'out'}"
    )
    assert f"  unet: UNet2DConditionModel  load_id={repo}|unet|null|null" in lines
    rank_1 = lines.index("rank 1 of 2: 3 entries")
    assert lines[rank_1 + 1] == f"  1  sd-p00000-32x32-1  seed {derive_seed(3, 1)}  'a cat'"
    assert lines[-1] == "dry run: no weights loaded, nothing written"
    assert not (tmp_path / "out").exists()


def test_the_plan_counts_finished_entries(repo, tmp_path):
    """plan_batch skips entries whose output and sidecar exist (none here) and splits the rest."""
    plan = plan_batch(load_job(_job(repo), base=tmp_path), world_size=4)
    assert [len(share) for share in plan.shares] == [2, 2, 1, 1]
    assert plan.finished == {} and len(plan.pending) == 6


def test_inputs_may_not_set_what_the_job_sets_itself(repo, tmp_path):
    """A workflow's 'inputs' that sets steps (or prompt, size, seed...) is refused, naming the job's own key."""
    job = _job(repo)
    job["workflows"][0]["inputs"] = {"num_inference_steps": 4}
    with pytest.raises(JobFileError) as info:
        load_job(job, base=tmp_path)
    assert str(info.value) == (
        "job: workflows[0]: 'inputs' sets 'num_inference_steps', which the job sets through its key 'steps'; "
        "use that key"
    )


@pytest.mark.parametrize("where", ["workflow", "top"])
def test_a_seed_outside_the_generators_range_is_refused_by_the_job_check(
    repo, tmp_path, capsys, no_model_loads, where
):
    """ "seeds": [1, 2**64] is one line naming the table, the key and the item, before any model loads."""
    job = _job(repo)
    del job["images_per_prompt"]
    (job["workflows"][0] if where == "workflow" else job)["seeds"] = [1, 2**64]
    prefix = "workflows[0]: " if where == "workflow" else ""
    _refused(
        capsys,
        tmp_path,
        job,
        f"JobFileError: {tmp_path / 'job.json'}: {prefix}'seeds' item 1 must be from 0 to 2**63-1 = "
        f"9223372036854775807 (got {2**64})",
    )


def test_an_output_name_too_long_for_the_file_system_is_refused_by_the_job_check(
    repo, tmp_path, capsys, no_model_loads
):
    """A prompt name that makes a file name (with its temporary suffix) past PC_NAME_MAX is one line naming the entry."""
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    # The image's own name fits ("<name>.png"), its sidecar's temporary name does not.
    name = "n" * (limit - len("sd--32x32-0.png") - 1)
    job = _job(repo, prompts=[{"prompt": "a cat", "name": name}], images_per_prompt=1)
    entry_name = f"sd-{name}-32x32-0"
    longest = len(f".{entry_name}.png.json..partial") + 16
    _refused(
        capsys,
        tmp_path,
        job,
        f"JobFileError: {tmp_path / 'job.json'}: entry 0 writes '{entry_name}.png', whose temporary sidecar file "
        f"'.{entry_name}.png.json.<rank>-<pid>.partial' may be {longest} characters long, more than the {limit} "
        f"the file system of {tmp_path / 'out'} takes; shorten 'output_name' or the prompt's 'name'",
    )
    with pytest.raises(JobFileError, match="entry 0 writes"):
        plan_batch(load_job(job, base=tmp_path))


def test_an_output_made_from_an_input_image_that_changed_is_made_again(repo, tmp_path):
    """The sidecar records the input images' sha256: an image file changed in place makes its entries run again."""
    import PIL.Image

    from modular.batch import OutputStore

    PIL.Image.new("RGB", (32, 32), "red").save(tmp_path / "cat.png")
    job_table = _job(repo, images_per_prompt=1, prompts=["a cat"])
    del job_table["sizes"]  # image-to-image takes its size from the image
    job_table["workflows"][0].update(workflow="image2image", images={"image": "cat.png"})
    job = load_job(job_table, base=tmp_path)
    store = OutputStore(job.output, "png")
    store.write(job.entries[0], b"an image", {})
    assert sorted(store.scan(job.entries)) == [0]
    PIL.Image.new("RGB", (32, 32), "blue").save(tmp_path / "cat.png")  # same path, other content
    changed = load_job(job_table, base=tmp_path)
    assert store.resume(changed.entries) == (
        {},
        {0: "its input image file(s) ['image'] changed since it was made"},
    )
    plan = plan_batch(changed)
    assert [entry.index for entry in plan.pending] == [0]
    assert plan.redo == {0: "its input image file(s) ['image'] changed since it was made"}
