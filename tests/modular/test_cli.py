"""The command line: `modular run` (the main job) and `modular inspect`."""

import os
import subprocess
import sys

import PIL.Image
import pytest

from modular.cli.main import main


def test_run_saves_an_image_from_a_tiny_repo(tmp_path, capsys):
    """`modular run` builds the default tiny repo, generates, saves a PNG and prints the manager."""
    assert main(["run", "--out", str(tmp_path / "out"), "--quiet", "--steps", "1"]) == 0
    images = list((tmp_path / "out").glob("*.png"))
    assert len(images) == 1
    assert PIL.Image.open(images[0]).size == (64, 64)
    printed = capsys.readouterr().out
    assert "UNet2DConditionModel" in printed and f"saved {images[0]}" in printed


def test_inspect_shows_blocks_and_components_without_loading(capsys):
    """`modular inspect` prints the block tree, the doc and each component's load ID."""
    assert main(["inspect", "--workflow", "text2image"]) == 0
    printed = capsys.readouterr().out
    assert "Inputs:" in printed and "prompt" in printed
    assert "unet: UNet2DConditionModel  load_id=" in printed


def test_run_works_for_every_installed_family(tmp_path):
    """`modular run --family X` generates an image (a video for Wan) for each family registered by entry point."""
    from modular import available_families

    for name, family in available_families().items():
        if family.make_tiny_repo is None:
            continue
        out = tmp_path / name
        assert main(["run", "--family", name, "--out", str(out), "--quiet", "--steps", "1"]) == 0
        assert len([*out.glob("*.png"), *out.glob("*.mp4")]) == 1, name  # an image, or a video family's video


def test_missing_repo_is_one_line_on_stderr_and_status_2(tmp_path, capsys):
    """A repo folder that does not exist is one `modular: error:` line on stderr and exit status 2."""
    missing = tmp_path / "missing"
    assert main(["run", "--repo", str(missing), "--quiet"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"modular: error: FileNotFoundError: '{missing}' is not a folder on disk")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_missing_repo_from_the_shell_prints_no_traceback(tmp_path):
    """`python -m modular inspect --repo <missing>` exits 2 with one stderr line and no traceback."""
    missing = tmp_path / "missing"
    done = subprocess.run(
        [sys.executable, "-m", "modular", "inspect", "--repo", str(missing)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("modular: error: FileNotFoundError: ")
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_unknown_family_is_one_line(capsys):
    """An unknown --family is one error line naming the installed families, exit status 2."""
    assert main(["inspect", "--family", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modular: error: ValueError: unknown family 'nope'; installed families: [")
    assert err.count("\n") == 1


def test_error_line_keeps_the_first_line_of_the_message(monkeypatch, capsys):
    """Only a message's first line is printed, and a KeyError's message without the quotes str() adds."""
    import modular.cli.main as cli

    def fail(args):
        raise KeyError("no component named 'unte'\nsecond line")

    monkeypatch.setattr(cli, "inspect", fail)
    assert main(["inspect"]) == 2
    assert capsys.readouterr().err == "modular: error: KeyError: no component named 'unte'\n"


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    """With --debug, or MODULAR_DEBUG=1, the error propagates (so Python prints the traceback)."""
    missing = str(tmp_path / "missing")
    with pytest.raises(FileNotFoundError):
        main(["inspect", "--repo", missing, "--debug"])
    monkeypatch.setenv("MODULAR_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["inspect", "--repo", missing])


def test_interrupt_exits_130(monkeypatch, capsys):
    """Ctrl-C during a command is exit status 130 and one line, no traceback."""
    import modular.cli.main as cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "inspect", interrupted)
    assert main(["inspect"]) == 130
    assert capsys.readouterr().err == "modular: interrupted\n"


@pytest.mark.parametrize(
    ("steps", "reason"),
    [
        ("-1", "must be at least 1 (got -1)"),
        ("0", "must be at least 1 (got 0)"),
        ("two", "must be a positive whole number (got 'two')"),
    ],
)
def test_steps_must_be_a_positive_whole_number(steps, reason, tmp_path, capsys):
    """--steps below 1 is refused when the arguments are parsed: exit status 2, nothing generated."""
    with pytest.raises(SystemExit) as info:
        main(["run", "--steps", steps, "--out", str(tmp_path / "out"), "--quiet"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modular run: error: argument --steps: {reason}"
    assert not (tmp_path / "out").exists()


def test_output_is_named_after_the_family_that_ran(tmp_path, capsys):
    """A Flux repo given with --repo (and the default --family) saves <repo folder>-seed0-0.png."""
    from blocks.flux import make_tiny_repo

    repo = make_tiny_repo(tmp_path / "tiny-flux")
    out = tmp_path / "out"
    assert main(["run", "--repo", str(repo), "--out", str(out), "--quiet", "--steps", "1"]) == 0
    assert sorted(path.name for path in out.glob("*.png")) == ["tiny-flux-seed0-0.png"]


# ---- the built-in scenario, any repo, --then, families (issue 10) -----------------------------------------


@pytest.fixture(scope="module")
def seed_repos(tmp_path_factory):
    """A seed-scale Flux base repo and a canny-style control repo that takes the rest from it."""
    from blocks.flux import make_seed_scale_repo

    folder = tmp_path_factory.mktemp("seed-repos")
    base = make_seed_scale_repo(folder / "tiny-flux-dev")
    canny = make_seed_scale_repo(folder / "tiny-flux-canny-dev", control=True, seed=1, shared_from=base)
    return base, canny


@pytest.fixture(scope="module")
def picture(tmp_path_factory):
    """A small PNG to pass as an image."""
    path = tmp_path_factory.mktemp("images") / "picture.png"
    PIL.Image.new("RGB", (64, 64), (120, 30, 200)).save(path)
    return path


def _one_error_line(capsys, text):
    """stderr is exactly ``text`` on one line, stdout empty."""
    captured = capsys.readouterr()
    assert captured.err == text + "\n", captured.err
    assert captured.out == ""


def test_run_without_a_repo_runs_the_seed_scenario(tmp_path, capsys):
    """`modular run` runs the three Flux workflows, printing a table after each and the offload summary,
    and saves the images, the control images and the memory plot; nothing reaches stderr."""
    from modular.cli.memory_plot import FIGURE_PIXELS, matplotlib_available

    out = tmp_path / "out"
    assert main(["run", "--output", str(out), "--quiet", "--steps", "1"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    printed = captured.out
    assert printed.startswith("FLUX.1 text-to-image, then Canny and Depth control, on one ComponentsManager")
    assert (
        "Auto offload on a simulated device, budget 32.00 MiB, margin 3.00 MiB;\nstrategy NextUseStrategy."
        in printed
    )
    # One table (or, at the tests' 80 columns, its summary) after each workflow.
    assert sum(line.startswith("Components:") for line in printed.splitlines()) == 3
    for header in ("[1/3] text2image: tiny-flux-dev, 1 step,", "[2/3] canny: tiny-flux-canny-dev, 1 step,"):
        assert header in printed
    assert (
        "      loaded: transformer; reused: text_encoder, tokenizer, text_encoder_2,\n"
        "          tokenizer_2, vae, scheduler" in printed
    )
    summary = printed[printed.index("Offload over the run") :].splitlines()
    # Victims keep a resident prefix by default (offload.partial.shrink): T5's prefix stays while each transformer
    # runs, so ours moves less than whole models (the peer's 92.93 MiB); models left the device 8 times, 2
    # whole and 6 down to a prefix (each counted, not only the whole ones); and it peaks higher, within the
    # 29 MiB the margin leaves.
    assert summary[1].split() == ["to", "device", "copied", "back", "left", "the", "device", "peak"]
    assert summary[2].split() == [
        "ours",
        "80.73",
        "MiB",
        "0.00",
        "MiB",
        *"8 (2 whole, 6 shrunk)".split(),
        "28.99",
        "MiB",
    ]
    assert summary[3].split()[:4] == ["the", "peer's", "rule", "92.93"]
    assert summary[3].split()[5:7] == ["70.53", "MiB"]
    assert summary[3].split()[7:12] == "5 (5 whole, 0 shrunk)".split()
    prose = " ".join(line.strip() for line in summary[4:] if line.startswith("  "))
    assert prose.startswith("Ours is NextUseStrategy; the peer's rule is SmallestSufficientSet, replayed")
    assert (
        "Left the device: victims evicted whole, or shrunk to a resident prefix (only their tail left)."
        in prose
    )
    # Prose and headers fit the tests' 80 columns; only paths (load IDs, saved files) may run longer.
    assert all(len(line) <= 80 for line in printed.splitlines() if "/" not in line)
    names = ["text2image-seed42-0.png", "canny-seed42-0.png", "canny-control.png"]
    names += ["depth-seed42-0.png", "depth-control.png"]
    if matplotlib_available():
        names.append("memory.png")
        assert PIL.Image.open(out / "memory.png").size == FIGURE_PIXELS
    assert sorted(path.name for path in out.iterdir()) == sorted(names)
    assert [line for line in printed.splitlines() if line.startswith("saved ")] == [
        f"saved {out / name}" for name in names
    ]
    assert PIL.Image.open(out / "canny-seed42-0.png").size == (64, 64)


def test_without_matplotlib_the_plot_is_one_line_note(tmp_path, capsys, monkeypatch):
    """Without matplotlib a run under offload says so in one line and saves no plot."""
    import modular.cli.report as cli_report
    from blocks.stable_diffusion import make_tiny_repo

    monkeypatch.setattr(cli_report, "matplotlib_available", lambda: False)
    repo = make_tiny_repo(tmp_path / "tiny-sd")
    out = tmp_path / "out"
    argv = [
        "run",
        str(repo),
        "--offload",
        "sim",
        "--budget",
        "1GB",
        "--steps",
        "1",
        "-o",
        str(out),
        "--quiet",
    ]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "no memory plot: matplotlib is not installed (pip install 'modular-pipelines[plot]')\n" in printed
    assert sorted(path.name for path in out.iterdir()) == ["tiny-sd-seed0-0.png"]


def test_then_runs_several_repos_on_one_manager(seed_repos, picture, tmp_path, capsys):
    """`run A --then B ...` runs both on one manager: B reuses A's shared components and keeps its options."""
    base, canny = seed_repos
    out = tmp_path / "out"
    argv = [
        "run",
        str(base),
        "--steps",
        "1",
        "--height",
        "64",
        "--width",
        "64",
        "--seed",
        "3",
        "-o",
        str(out),
    ]
    argv += ["--quiet", "--then", str(canny), "--control-image", str(picture)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "[2/2] tiny-flux-canny-dev: tiny-flux-canny-dev, 1 step," in printed
    # The header's component list wraps to the terminal's width (80 columns in tests): compare the words.
    assert (
        "loaded: transformer; reused: text_encoder, tokenizer, text_encoder_2, tokenizer_2, vae, scheduler"
        in " ".join(printed.split())
    )
    assert sorted(path.name for path in out.iterdir()) == [
        "tiny-flux-canny-dev-seed3-0.png",
        "tiny-flux-dev-seed3-0.png",
    ]
    assert PIL.Image.open(out / "tiny-flux-canny-dev-seed3-0.png").size == (64, 64)


def test_families_lists_the_installed_families_and_workflows(capsys):
    """`modular families` prints each family with its workflows and the classic pipelines it serves."""
    assert main(["families"]) == 0
    printed = capsys.readouterr().out
    assert (
        "flux: FluxAutoBlocks (ships a tiny repo and a scenario)\n  workflows: text2image, image2image, control\n"
        in printed
    )
    assert (
        "  serves: StableDiffusionPipeline, StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline\n"
        in printed
    )


def test_inspect_takes_the_repo_as_an_argument(seed_repos, capsys, monkeypatch):
    """`modular inspect REPO` shows the repo's pipeline; a control repo's index names its workflow."""
    monkeypatch.setenv("COLUMNS", "400")  # wide enough for the temp path whole
    assert main(["inspect", str(seed_repos[1])]) == 0
    printed = capsys.readouterr().out
    assert f"transformer: FluxTransformer2DModel  load_id={seed_repos[1]}|transformer|null|null" in printed
    assert f"vae: AutoencoderKL  load_id={seed_repos[0]}|vae|null|null" in printed


def test_unknown_repo_is_one_line(tmp_path, capsys):
    """A REPO that is neither a folder nor a hub id is one error line, exit status 2."""
    missing = tmp_path / "missing"
    assert main(["run", str(missing)]) == 2
    _one_error_line(
        capsys,
        f"modular: error: FileNotFoundError: '{missing}' is not a folder on disk, nor a hub repo id like 'org/name'; check the path",
    )


def test_a_class_no_family_serves_is_one_line_listing_the_families(tmp_path, capsys):
    """A repo whose `_class_name` no family serves is one line that lists the installed families."""
    repo = tmp_path / "video"
    repo.mkdir()
    (repo / "model_index.json").write_text('{"_class_name": "StableVideoDiffusionPipeline"}')
    assert main(["run", str(repo), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"modular: error: ValueError: {repo}: no installed family serves 'StableVideoDiffusionPipeline'; "
        "installed families: flux (FluxPipeline, FluxImg2ImgPipeline, FluxControlPipeline, FluxAutoBlocks); "
    )
    assert "stable-diffusion (StableDiffusionPipeline," in err and err.count("\n") == 1


def test_bad_budget_is_one_line(capsys):
    """A --budget that is not a size is refused when parsing: one line, exit status 2."""
    with pytest.raises(SystemExit) as info:
        main(["run", "--budget", "lots"])
    assert info.value.code == 2
    _one_error_line(
        capsys,
        "modular run: error: argument --budget: a size must be a number followed by a unit, one of B, KB, MB, "
        "GB, TB, KiB, MiB, GiB, TiB (got 'lots'). Example: '8GB'.",
    )


def test_unknown_workflow_is_one_line_listing_the_workflows(seed_repos, capsys):
    """An unknown --workflow is one line naming the family's workflows."""
    assert main(["run", str(seed_repos[0]), "--workflow", "nope", "--quiet"]) == 2
    _one_error_line(
        capsys,
        "modular: error: UnknownWorkflowError: FluxAutoBlocks has no workflow 'nope'. Available workflows: "
        "['text2image', 'image2image', 'control']",
    )


def test_control_workflow_without_a_control_image_is_one_line(seed_repos, tmp_path, capsys):
    """A control workflow, asked for or named by the repo, without --control-image is refused before loading."""
    base, canny = seed_repos
    assert main(["run", str(base), "--workflow", "control", "-o", str(tmp_path / "out")]) == 2
    _one_error_line(
        capsys,
        f"modular: error: MissingInputError: {base} (workflow 'control') needs control_image: pass --control-image PATH",
    )
    assert main(["run", str(canny), "-o", str(tmp_path / "out")]) == 2
    _one_error_line(
        capsys, f"modular: error: MissingInputError: {canny} needs control_image: pass --control-image PATH"
    )
    assert not (tmp_path / "out").exists()


def test_image_that_is_missing_or_not_an_image_is_one_line(seed_repos, tmp_path, capsys):
    """An --image or --control-image path that does not exist, or is no image, is one line."""
    missing = tmp_path / "missing.png"
    assert main(["run", str(seed_repos[0]), "--image", str(missing)]) == 2
    _one_error_line(capsys, f"modular: error: FileNotFoundError: --image: '{missing}' does not exist")
    text = tmp_path / "notes.png"
    text.write_text("not an image")
    assert main(["run", str(seed_repos[1]), "--control-image", str(text)]) == 2
    _one_error_line(
        capsys,
        f"modular: error: ValueError: --control-image: '{text}' is not an image PIL can read (UnidentifiedImageError)",
    )


def test_steps_zero_is_one_line(capsys):
    """--steps 0 is exactly one error line and exit status 2."""
    with pytest.raises(SystemExit) as info:
        main(["run", "--steps", "0"])
    assert info.value.code == 2
    _one_error_line(capsys, "modular run: error: argument --steps: must be at least 1 (got 0)")


def test_then_needs_a_repo_and_takes_only_job_options(seed_repos, capsys):
    """--then without a first REPO, or a run option after --then, is one line."""
    assert main(["run", "--then", str(seed_repos[0])]) == 2
    _one_error_line(
        capsys,
        "modular: error: ValueError: --then starts the next job: give a REPO before it "
        "(modular run REPO ... --then REPO_B ...)",
    )
    with pytest.raises(SystemExit):
        main(["run", str(seed_repos[0]), "--then", str(seed_repos[0]), "--budget", "8GB"])
    _one_error_line(
        capsys,
        "modular run --then: error: unrecognized arguments: --budget 8GB (options of the whole run, such as "
        "--budget or --output, go before the first --then)",
    )


def test_the_scenario_refuses_inputs_it_makes_itself(capsys):
    """The built-in scenario with --control-image is one line saying to give a REPO."""
    assert main(["run", "--control-image", "edges.png"]) == 2
    _one_error_line(
        capsys,
        "modular: error: ValueError: the built-in scenario takes no --control-image (it makes its own inputs); "
        "give a REPO to use them",
    )


def test_reuse_takes_components_from_the_previous_job(tmp_path, picture, capsys):
    """`--then REPO --reuse a,b` takes those components from the previous job instead of loading the repo's copies."""
    from blocks.flux import make_tiny_repo

    base = make_tiny_repo(tmp_path / "base")
    control = make_tiny_repo(
        tmp_path / "control", control=True
    )  # ships its own encoders and VAE, like the hub's
    shared = "text_encoder,text_encoder_2,tokenizer,tokenizer_2,vae,scheduler"
    argv = ["run", str(base), "--steps", "1", "--height", "32", "--width", "32", "-o", str(tmp_path / "out")]
    argv += ["--quiet", "--then", str(control), "--control-image", str(picture), "--reuse", shared]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "      loaded: transformer; reused: text_encoder, text_encoder_2, tokenizer,\n"
        "          tokenizer_2, vae, scheduler\n" in printed
    )
    assert main(["run", str(base), "--reuse", "vae", "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"modular: error: ValueError: job {base.name!r} reuses ['vae'], but it is the first job: nothing ran "
        "before it\n"
    )


@pytest.mark.parametrize("where", ["file", "under-a-file"])
def test_an_output_that_cannot_hold_images_is_refused_before_anything_loads(
    where, tmp_path, capsys, no_model_loads
):
    """--output naming a file, or a folder under a file, is one line and exit status 2; nothing runs."""
    (tmp_path / "taken").write_text("a file")
    output = tmp_path / "taken" if where == "file" else tmp_path / "taken" / "images"
    argv = ["run", "--family", "stable-diffusion", "--output", str(output), "--quiet", "--steps", "1"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"modular: error: NotADirectoryError: --output: cannot write the images into {str(output)!r} "
        f"({tmp_path / 'taken'} is a file, not a folder); give --output a folder you can write\n"
    )
    assert (tmp_path / "taken").read_text() == "a file"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_output_folder_without_permission_is_refused_before_anything_loads(
    tmp_path, capsys, no_model_loads
):
    """--output in a read-only folder is one PermissionError line; nothing runs."""
    (tmp_path / "locked").mkdir(mode=0o555)
    try:
        argv = [
            "run",
            "--family",
            "stable-diffusion",
            "--output",
            str(tmp_path / "locked" / "out"),
            "--quiet",
        ]
        assert main(argv) == 2
    finally:
        (tmp_path / "locked").chmod(0o755)
    assert capsys.readouterr().err.startswith(
        f"modular: error: PermissionError: --output: cannot write the images into '{tmp_path / 'locked' / 'out'}'"
    )


@pytest.mark.parametrize(
    ("seed", "reason"),
    [
        (
            "99999999999999999999999",
            "must be from 0 to 2**63-1 = 9223372036854775807 (got 99999999999999999999999)",
        ),
        ("-1", "must be from 0 to 2**63-1 = 9223372036854775807 (got -1)"),
        ("1.5", "must be a whole number (got '1.5')"),
    ],
)
def test_a_seed_outside_the_generators_range_is_refused_when_parsed(seed, reason, tmp_path, capsys):
    """--seed past 2**63-1 (or negative) is refused by argument parsing: exit status 2, nothing generated."""
    with pytest.raises(SystemExit) as info:
        main(["run", "--seed", seed, "--out", str(tmp_path / "out"), "--quiet"])
    assert info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"modular run: error: argument --seed: {reason}"
    assert not (tmp_path / "out").exists()


# ---- the first hour (issue 22): what a newcomer types ----------------------------------------------------


def test_bare_modular_prints_the_usage_and_version_prints_the_version(capsys):
    """`modular` alone prints what it can do (status 0), not a one-line error; `--version` the version."""
    import modular

    assert main([]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("usage: modular") and "modular run REPO" in printed
    with pytest.raises(SystemExit) as caught:
        main(["--version"])
    assert caught.value.code == 0 and capsys.readouterr().out == f"modular {modular.__version__}\n"
    assert modular.__version__ != "0+unknown"  # the installed distribution's version


def test_a_misspelt_family_or_workflow_gets_did_you_mean(seed_repos, capsys):
    """`--family fluxx` and `--workflow text2imag` name the close installed name."""
    assert main(["inspect", "--family", "fluxx"]) == 2
    assert "unknown family 'fluxx' (did you mean 'flux'?); installed families: [" in capsys.readouterr().err
    assert main(["run", str(seed_repos[0]), "--workflow", "text2imag", "--quiet"]) == 2
    assert "no workflow 'text2imag' (did you mean 'text2image'?)" in capsys.readouterr().err


def test_a_device_the_machine_lacks_suggests_the_command_lines_simulated_device(capsys):
    """`--offload cuda:7` (no such device here) names the flags that simulate one, not the Python API."""
    assert main(["run", "--offload", "cuda:7", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("modular: error: ValueError: --offload cuda:7: ") and err.count("\n") == 1
    assert "On the command line: --offload sim --budget 8GB simulates a device" in err


def test_a_run_with_the_default_steps_prints_their_number(tmp_path, capsys):
    """A job without --steps says how many steps it ran (the blocks' default), not "default steps"."""
    from blocks.stable_diffusion import make_tiny_repo
    from modular import available_families

    repo = make_tiny_repo(tmp_path / "tiny-sd")
    default = next(
        p.default
        for p in available_families()["stable-diffusion"].blocks_class().inputs
        if p.name == "num_inference_steps"
    )
    assert main(["run", str(repo), "--output", str(tmp_path / "out"), "--quiet"]) == 0
    assert f"{default} steps (the default)" in capsys.readouterr().out


def test_no_table_leaves_the_managers_table_out(tmp_path, capsys):
    """`--no-table` prints each job's header but not the manager's table (printed by default)."""
    out = str(tmp_path / "out")
    assert main(["run", "--out", out, "--quiet", "--steps", "1", "--no-table"]) == 0
    printed = capsys.readouterr().out
    assert "[1/1]" in printed and "UNet2DConditionModel" not in printed
    assert main(["run", "--out", out, "--quiet", "--steps", "1"]) == 0
    assert "UNet2DConditionModel" in capsys.readouterr().out


def test_outputs_are_named_by_repo_and_workflow_and_a_rerun_keeps_the_first(tmp_path, capsys):
    """`run REPO --workflow W` names its images `<repo>-<W>-seed<s>-<n>.png`; running again with another prompt
    keeps the first file and numbers the new one (and says so); `--overwrite` replaces it."""
    from blocks.stable_diffusion import make_tiny_repo

    repo = make_tiny_repo(tmp_path / "tiny-sd")
    out = tmp_path / "out"
    argv = [
        "run",
        str(repo),
        "--workflow",
        "text2image",
        "--steps",
        "1",
        "-o",
        str(out),
        "--quiet",
        "--no-table",
    ]
    assert main(argv) == 0
    first = (out / "tiny-sd-text2image-seed0-0.png").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--prompt", "a red dog"]) == 0
    assert (
        f"saved {out / 'tiny-sd-text2image-seed0-0-run2.png'} (a file of that name was there and stays"
        in (capsys.readouterr().out)
    )
    assert (out / "tiny-sd-text2image-seed0-0.png").read_bytes() == first
    assert main([*argv, "--prompt", "a red dog", "--overwrite"]) == 0
    assert (out / "tiny-sd-text2image-seed0-0.png").read_bytes() != first
    assert not (out / "tiny-sd-text2image-seed0-0-run3.png").exists()
