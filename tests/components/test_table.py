"""The printed manager table."""

import torch
from diffusers import PNDMScheduler

from components import ComponentsManager, tag_load_id
from components.table import device_cell, manager_table
from components.table_layout import ModelRow, OtherRow, render_table
from components.weight_marks import mark_modified
from offload import Residency


def test_render_exact_layout():
    """Columns are as wide as their widest cell; extra collections go on their own lines; info follows; the
    Size column has one unit, chosen from its largest value."""
    models = [
        ModelRow(
            "unet_1",
            "UNet2DConditionModel",
            "cpu",
            "torch.float16",
            1.5 * 2**30,
            "org/sd|unet|fp16|v2",
            ("sd", "xl"),
        ),
        ModelRow("vae_22", "AutoencoderKL", "cuda:0", "torch.float32", 160 * 2**20, "org/sd|vae|null|null"),
    ]
    others = [OtherRow("scheduler_333", "PNDMScheduler", ("sd",))]
    extras = [
        ("unet_1", {"Adapters": ["style"], "IP-Adapter": None, "Quantization": None}),
        ("vae_22", {"Adapters": None}),
    ]
    expected = "\n".join(
        [
            "Components:",
            "=" * 119,
            "Models:",
            "-" * 119,
            "Name_ID       | Class                | Device: act(exec) | Dtype         | Size     | Load ID              | Collection",
            "-" * 119,
            "unet_1        | UNet2DConditionModel | cpu               | torch.float16 | 1.50 GiB | org/sd|unet|fp16|v2  | sd",
            "              |                      |                   |               |          |                      | xl",
            "vae_22        | AutoencoderKL        | cuda:0            | torch.float32 | 0.16 GiB | org/sd|vae|null|null | N/A",
            "-" * 119,
            "",
            "Other Components:",
            "-" * 119,
            "ID            | Class         | Collection",
            "-" * 119,
            "scheduler_333 | PNDMScheduler | sd",
            "-" * 119,
            "",
            "Additional Component Info:",
            "=" * 119,
            "unet_1:",
            "  Adapters: ['style']",
        ]
    )
    assert render_table(models, others, extras) == expected


def test_empty_manager_prints_one_line():
    """An empty manager prints a short line saying so."""
    assert str(ComponentsManager()) == "Components: none registered."


def test_only_other_components():
    """Without models the table has only the Other Components section and no info section."""
    cm = ComponentsManager()
    scheduler = PNDMScheduler()
    component_id = cm.add("scheduler", scheduler)
    width = len(component_id) + len(" | PNDMScheduler | Collection")
    assert str(cm).splitlines() == [
        "Components:",
        "=" * width,
        "Other Components:",
        "-" * width,
        f"{'ID':<{len(component_id)}} | Class         | Collection",
        "-" * width,
        f"{component_id} | PNDMScheduler | N/A",
        "-" * width,
    ]


def test_manager_rows_show_real_device_dtype_size_and_load_id():
    """A model row of the full table shows the module's class, device, dtype, size and load ID; repr equals str."""
    cm = ComponentsManager()
    model = torch.nn.Linear(1024, 256).to(torch.bfloat16)
    tag_load_id(model, "org/name|unet|fp16|abc123")
    component_id = cm.add("unet", model, collection="sd")
    row = next(line for line in cm.table().splitlines() if line.startswith(component_id))
    assert [cell.strip() for cell in row.split(" | ")] == [
        component_id,
        "Linear",
        "cpu",
        "torch.bfloat16",
        "512.50 KiB",  # 1024 x 256 bfloat16 weights and 256 biases: 524800 B, below 1 MiB, in KiB
        "org/name|unet|fp16|abc123",
        "sd",
    ]
    assert repr(cm) == str(cm)


def _facts(resident, device, execution_device="cpu"):
    return Residency(
        attached=True, resident=resident, device=device, execution_device=torch.device(execution_device)
    )


def test_device_cell_from_engine_facts():
    """The cell reads 'where now(where it runs)': the device when resident, the host copy ('cpu') otherwise."""
    assert device_cell(_facts(True, "sim")) == "sim(sim)"
    assert device_cell(_facts(False, "sim")) == "cpu(sim)"
    assert device_cell(_facts(True, "cuda:0", "cuda:0")) == "cuda:0(cuda:0)"
    assert device_cell(_facts(False, "cuda:0", "cuda:0")) == "cpu(cuda:0)"
    assert device_cell(_facts(True, "cpu")) == "cpu(cpu)"


def test_a_partly_resident_model_shows_its_share_and_a_tiny_prefix_is_not_zero():
    def partly(share):
        return Residency(
            attached=True,
            resident=True,
            device="sim",
            execution_device=torch.device("cpu"),
            resident_share=share,
        )

    assert device_cell(partly(0.62)) == "partial 62%(sim)"
    assert device_cell(partly(0.0004)) == "partial <1%(sim)"  # a victim shrunk to its base group
    assert device_cell(partly(0.006)) == "partial 1%(sim)"


def test_manager_table_formats_the_facts_it_is_given():
    """manager_table asks for each model's facts and formats them; without facts it shows the model's device."""
    cm = ComponentsManager()
    unet_id = cm.add("unet", torch.nn.Linear(2, 2))
    vae_id = cm.add("vae", torch.nn.Linear(2, 2))
    asked = []

    def residency(component_id):
        asked.append(component_id)
        return _facts(True, "gpu7") if component_id == unet_id else None

    rows = {
        line.split(" | ")[0].strip(): line.split(" | ")[2].strip()
        for line in manager_table(cm, residency).splitlines()
        if " | " in line
    }
    assert (rows[unet_id], rows[vae_id]) == ("gpu7(gpu7)", "cpu")
    assert asked == [unet_id, vae_id]


def test_a_modified_model_is_marked_after_its_load_id_and_says_how():
    """A model whose weights differ from its load ID's shows "(modified)" after the load ID and a "Modified"
    line with each reason; an unmarked model's row is as before."""
    cm = ComponentsManager()
    model, other = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    tag_load_id(model, "org/sd|unet|null|null")
    tag_load_id(other, "org/sd|vae|null|null")
    unet_id, vae_id = cm.add("unet", model), cm.add("vae", other)
    mark_modified(model, "fused_lora", "LoRA ['style'] fused (lora_scale 1.0) by P")
    mark_modified(model, "edited", "weights edited in place (refresh_host_copy)")
    lines = cm.table().splitlines()
    cells = {line.split(" | ")[0].strip(): line.split(" | ")[5].strip() for line in lines if " | " in line}
    assert cells[unet_id] == "org/sd|unet|null|null (modified)"
    assert cells[vae_id] == "org/sd|vae|null|null"
    assert lines[-2:] == [
        f"{unet_id}:",
        "  Modified: LoRA ['style'] fused (lora_scale 1.0) by P; weights edited in place (refresh_host_copy)",
    ]
