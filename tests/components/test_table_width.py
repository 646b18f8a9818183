"""The manager's table at a width: exact text at 120 and 80 columns, load IDs shortened in the middle, one
size unit per column, the one-line-per-component summary, and print(cm) following the terminal's width."""

import pytest
import torch
from diffusers import PNDMScheduler

from components import ComponentsManager, tag_load_id
from components.table_layout import ModelRow, fit_table, render_summary, shorten_load_id

REPO = "/tmp/pytest-of-someone/pytest-12/test_the_table0/tiny-sd"


@pytest.fixture
def manager():
    """A UNet (4 MiB, in two collections), a float16 VAE (8.25 KiB) and a scheduler, loaded from a temp path."""
    cm = ComponentsManager()
    unet = torch.nn.Linear(1024, 1024)
    tag_load_id(unet, f"{REPO}|unet|null|null")
    vae = torch.nn.Linear(64, 64).to(torch.float16)
    tag_load_id(vae, f"{REPO}|vae|fp16|main")
    ids = {"unet": cm.add("unet", unet, collection="sd")}
    cm.add("unet", unet, collection="sd-inpainting")
    ids["vae"] = cm.add("vae", vae, collection="sd")
    ids["scheduler"] = cm.add("scheduler", PNDMScheduler(), collection="sd")
    return cm, ids


def _cells(ids, *rows):
    """Table lines from ``(key, cells...)``: the key's id padded to the id column's width (ids are
    ``name_<id(obj)>``, so their length varies from run to run)."""
    width = max(len(ids[key]) for key in ids) if ids else 0
    return [f"{ids.get(key, key):<{width}} | {rest}".rstrip() for key, rest in rows]


def test_the_table_at_120_columns_exact(manager):
    """At 120 columns the table keeps its columns and headers; dtypes lose "torch.", load IDs keep the repo's
    last folder and |subfolder|variant|revision, and the Size column is all MiB."""
    cm, ids = manager
    pad = " " * max(len(i) for i in ids.values())
    span = len(pad) + 95
    assert span <= 120
    dash = "-" * span
    blank = f"{pad} |        |                   |         |          |                            | "
    expected = [
        "Components:",
        "=" * span,
        "Models:",
        dash,
        *_cells(
            {**ids, "Name_ID": "Name_ID"},
            (
                "Name_ID",
                "Class  | Device: act(exec) | Dtype   | Size     | Load ID                    | Collection",
            ),
        )[:1],
        dash,
        *_cells(
            ids, ("unet", "Linear | cpu               | float32 | 4.00 MiB | .../tiny-sd|unet|null|null | sd")
        ),
        blank + "sd-inpainting",
        *_cells(
            ids, ("vae", "Linear | cpu               | float16 | 0.01 MiB | .../tiny-sd|vae|fp16|main  | sd")
        ),
        dash,
        "",
        "Other Components:",
        dash,
        *_cells({**ids, "ID": "ID"}, ("ID", "Class         | Collection")),
        dash,
        *_cells(ids, ("scheduler", "PNDMScheduler | sd")),
        dash,
    ]
    assert cm.table(width=120).splitlines() == expected


def test_the_table_at_80_columns_exact(manager, monkeypatch):
    """Where no form of the table fits (80 columns), print(cm) shows the summary: one line per component, its
    load ID on a second line when the first is full; cm.table(width=80) is the narrowest table."""
    cm, ids = manager
    monkeypatch.setenv("COLUMNS", "80")
    assert str(cm).splitlines() == [
        "Components: 2 models, 1 other component",
        "Models:",
        f"{ids['unet']}  Linear  cpu  float32  4.00 MiB  (sd, sd-inpainting)",
        f"    {REPO}|unet|null|null",
        f"{ids['vae']}  Linear  cpu  float16  0.01 MiB  (sd)",
        f"    {REPO}|vae|fp16|main",
        "Other Components:",
        f"{ids['scheduler']}  PNDMScheduler  (sd)",
    ]
    assert all(len(line) <= 80 for line in str(cm).splitlines())
    narrowest = cm.table(width=80).splitlines()
    assert narrowest[4].split(" | ")[5].strip() == "Load ID"
    assert [line.split(" | ")[-1] for line in narrowest if line.count(" | ") == 6][1:4] == [
        "sd",
        "sd-",
        "inpainting",
    ]
    assert cm.table(width=80) == cm.table(width=40)  # as narrow as it gets


def test_print_follows_the_terminal_width_and_the_full_table_stays_available(manager, monkeypatch):
    """print(cm) fits $COLUMNS (the table at 120, the summary at 80); cm.table() is the full, unshortened
    table whatever the terminal."""
    cm, _ = manager
    monkeypatch.setenv("COLUMNS", "120")
    assert str(cm) == cm.table(width=120) and str(cm).startswith("Components:\n=")
    monkeypatch.setenv("COLUMNS", "200")
    assert f"{REPO}|unet|null|null" in str(cm)
    monkeypatch.setenv("COLUMNS", "80")
    assert str(cm) == cm.summary(width=80)
    full = cm.table()
    assert f"| {REPO}|unet|null|null | sd" in full and "torch.float16" in full
    assert max(len(line) for line in full.splitlines()) > 120


@pytest.mark.parametrize(
    ("width", "expected"),
    [
        (200, f"{REPO}|unet|null|null"),
        (50, "/tmp/pytest-of-someone/p.../tiny-sd|unet|null|null"),
        (30, "/tmp.../tiny-sd|unet|null|null"),
        (29, ".../tiny-sd|unet|null|null"),  # a head of fewer than 4 characters is left out
        (10, ".../tiny-sd|unet|null|null"),  # never shorter than the last folder and the parts after it
    ],
)
def test_load_ids_are_shortened_in_the_middle(width, expected):
    """The start of the repo, "...", then its last folder and |subfolder|variant|revision, never cut."""
    assert shorten_load_id(f"{REPO}|unet|null|null", width) == expected


def test_a_load_id_without_a_folder_to_leave_out_is_kept_whole():
    """A bare repo name (or a hub id's name alone) has nothing in the middle to drop; a Windows path shortens."""
    assert shorten_load_id("tiny-sd|unet|null|null", 5) == "tiny-sd|unet|null|null"
    assert shorten_load_id("org/tiny-sd|unet|fp16|main", 5) == ".../tiny-sd|unet|fp16|main"
    assert (
        shorten_load_id(r"C:\Users\me\AppData\Temp\tiny-sd|vae|null|null", 38)
        == r"C:\Users\me\A...\tiny-sd|vae|null|null"
    )


def test_one_unit_per_size_column_from_its_largest_value():
    """A 2 GiB model puts the whole column in GiB (a small model reads "<0.01 GiB", not "247352 B"); without it
    the column is in MiB, or KiB for models all under 1 MiB."""

    def sizes(*values):
        rows = [ModelRow(f"m{i}", "Linear", "cpu", "torch.float32", v, "null") for i, v in enumerate(values)]
        lines = fit_table(rows, [], [], 200)[0].splitlines()
        return [line.split(" | ")[4].strip() for line in lines if line.startswith("m")]

    assert sizes(2 * 2**30, 22 * 2**20, 247352) == ["2.00 GiB", "0.02 GiB", "<0.01 GiB"]
    assert sizes(22 * 2**20, 247352) == ["22.00 MiB", "0.24 MiB"]
    assert sizes(247352, 3000) == ["241.55 KiB", "2.93 KiB"]


def test_the_summary_in_full_and_with_info():
    """Without a width each component is one line; the info section follows and wraps at a width."""
    rows = [
        ModelRow(
            "unet_1",
            "Linear",
            "sim(sim)",
            "torch.bfloat16",
            3 * 2**20,
            f"{REPO}|unet|null|null",
            ("sd",),
            True,
        )
    ]
    info = [("unet_1", {"Modified": "LoRA ['style'] fused (lora_scale 1.0) by StableDiffusionAutoBlocks"})]
    line = f"unet_1  Linear  sim(sim)  bfloat16  3.00 MiB  (sd)  {REPO}|unet|null|null (modified)"
    assert render_summary(rows, [], info).splitlines() == [
        "Components: 1 model, 0 other components",
        "Models:",
        line,
        "",
        "Additional Component Info:",
        "=" * len(line),  # as wide as the widest line
        "unet_1:",
        "  Modified: LoRA ['style'] fused (lora_scale 1.0) by StableDiffusionAutoBlocks",
    ]
    assert render_summary(rows, [], info, width=48).splitlines() == [
        "Components: 1 model, 0 other components",
        "Models:",
        "unet_1  Linear  sim(sim)  bfloat16  3.00 MiB",
        "    (sd)  .../tiny-sd|unet|null|null (modified)",
        "",
        "Additional Component Info:",
        "=" * 47,  # the widest line
        "unet_1:",
        "  Modified: LoRA ['style'] fused (lora_scale",
        "    1.0) by StableDiffusionAutoBlocks",
    ]


def test_a_width_that_is_no_number_of_columns_is_refused(manager):
    """table() and summary() name the method and the width they were given."""
    cm, _ = manager
    with pytest.raises(
        TypeError, match=r"table\(width=\.\.\.\) must be a number of columns or None \(got '80'"
    ):
        cm.table(width="80")
    with pytest.raises(
        ValueError, match=r"summary\(width=\.\.\.\) must be at least 1 column, or None .*\(got 0\)"
    ):
        cm.summary(width=0)
