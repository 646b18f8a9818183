"""IP-Adapters on SD, SDXL and Flux pipelines: bit-equal to the classic pipelines' load_ip_adapter, shared
through a manager, placed by auto offload, and refused clearly when misused."""

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import blocks.flux.tiny as flux_tiny
import blocks.stable_diffusion.tiny as sd_tiny
from blocks.flux import FAMILY as FLUX_FAMILY
from blocks.stable_diffusion_xl import FAMILY as SDXL_FAMILY
from components import ComponentsManager
from components.errors import MissingComponentFileError, PickleWeightsError
from modular import register_family
from modular.adapters.ip_adapter import IPAdapterError
from offload import SimulatedDevice

from .flux.conftest import FLUX
from .helpers import make_image, seeded
from .stable_diffusion.conftest import SD
from .stable_diffusion_xl.conftest import SDXL

register_family(SDXL_FAMILY)  # harmless once the entry points name them
register_family(FLUX_FAMILY)

HARNESSES = {"sd": SD, "sdxl": SDXL, "flux": FLUX}
MAKE_IP_ADAPTER = {
    "sd": sd_tiny.make_tiny_ip_adapter,
    "sdxl": sd_tiny.make_tiny_ip_adapter,
    "flux": flux_tiny.make_tiny_ip_adapter,
}
DENOISER = {"sd": "unet", "sdxl": "unet", "flux": "transformer"}
# Flux runs true CFG with a negative prompt, so that the negative image prompt is used too.
CALL = {
    "sd": {"prompt": "a cat"},
    "sdxl": {"prompt": "a cat"},
    "flux": {
        "prompt": "a cat",
        "negative_prompt": "blurry",
        "true_cfg_scale": 2.0,
        "height": 32,
        "width": 32,
    },
}
WEIGHTS = {"subfolder": "models", "weight_name": "ip-adapter.safetensors"}


@pytest.fixture(scope="session", params=list(HARNESSES))
def family(request):
    """Each family that takes IP-Adapters."""
    return request.param


@pytest.fixture(scope="session")
def repos(tmp_path_factory):
    """Per family: (tiny repo, tiny IP-Adapter repo for its denoiser)."""
    made = {}
    for name, harness in HARNESSES.items():
        root = tmp_path_factory.mktemp(f"ip-{name}")
        repo = harness.make_tiny_repo(root / "repo")
        made[name] = (repo, MAKE_IP_ADAPTER[name](root / "ip-adapter", repo))
    return made


def pipeline(family, repos, cm=None):
    repo = repos[family][0]
    pipe = HARNESSES[family].blocks_class().init_pipeline(repo, components_manager=cm)
    pipe.load_components(torch_dtype=torch.float32)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def classic_with_ip_adapter(family, repos):
    """The classic pipeline on its own objects, its IP-Adapter loaded by diffusers' load_ip_adapter."""
    classic = HARNESSES[family].classic_from(pipeline(family, repos), "text2image")
    ip_repo = str(repos[family][1])
    if family == "flux":
        encoder = f"{ip_repo}/models/image_encoder"
        classic.load_ip_adapter(
            ip_repo,
            **WEIGHTS,
            image_encoder_pretrained_model_name_or_path=encoder,
            image_encoder_dtype=torch.float32,
        )
    else:
        classic.load_ip_adapter(ip_repo, **WEIGHTS)
    return classic


def call(pipe, family, **inputs):
    kwargs = {**CALL[family], "num_inference_steps": 2, "output_type": "np", **inputs}
    if hasattr(pipe, "blocks"):
        return pipe(generator=seeded(0), output="images", **kwargs)
    return pipe(generator=seeded(0), **kwargs).images


def both(family, repos, scale=None, **inputs):
    ours = pipeline(family, repos)
    ours.load_ip_adapter(repos[family][1], **WEIGHTS)
    classic = classic_with_ip_adapter(family, repos)
    if scale is not None:
        ours.set_ip_adapter_scale(scale)
        classic.set_ip_adapter_scale(scale)
    return call(ours, family, **inputs), call(classic, family, **inputs)


def test_an_image_prompt_gives_the_classic_pipelines_output(family, repos):
    """With ip_adapter_image and set_ip_adapter_scale(0.5), the output equals the classic pipeline's bit for bit,
    and differs from the output without an IP-Adapter."""
    image = make_image(3, 40)
    ours, theirs = both(family, repos, scale=0.5, ip_adapter_image=image)
    assert torch.equal(torch.from_numpy(ours), torch.from_numpy(theirs))
    assert not np.array_equal(ours, call(pipeline(family, repos), family))


def test_precomputed_embeddings_give_the_classic_pipelines_output(family, repos):
    """ip_adapter_image_embeds (with negative ones) give the classic pipeline's output for the same embeddings."""
    positive, negative = torch.randn(2, 1, 1, 32, generator=seeded(7))
    ours = pipeline(family, repos)
    ours.load_ip_adapter(repos[family][1], **WEIGHTS)
    classic = classic_with_ip_adapter(family, repos)
    mine = call(ours, family, ip_adapter_image_embeds=[positive], negative_ip_adapter_image_embeds=[negative])
    if family == "flux":  # FluxPipeline takes the negative embeddings apart
        theirs = call(
            classic, family, ip_adapter_image_embeds=[positive], negative_ip_adapter_image_embeds=[negative]
        )
    else:  # the others take them stacked in front, for classifier-free guidance
        theirs = call(classic, family, ip_adapter_image_embeds=[torch.cat([negative, positive])])
    assert torch.equal(torch.from_numpy(mine), torch.from_numpy(theirs))


def test_unload_gives_the_output_of_a_pipeline_that_never_had_one(family, repos):
    """After load_ip_adapter then unload_ip_adapter, the output equals a fresh pipeline's; the image encoder is
    dropped from the pipeline and calls with an image prompt are refused."""
    pipe = pipeline(family, repos)
    pipe.load_ip_adapter(repos[family][1], **WEIGHTS)
    pipe.unload_ip_adapter()
    assert torch.equal(
        torch.from_numpy(call(pipe, family)), torch.from_numpy(call(pipeline(family, repos), family))
    )
    assert "image_encoder" not in pipe.components
    with pytest.raises(ValueError, match="no IP-Adapter is loaded"):
        call(pipe, family, ip_adapter_image_embeds=[torch.zeros(1, 1, 32)])


def test_the_image_encoder_is_shared_through_the_manager(repos):
    """Two pipelines loading the same IP-Adapter through one manager get the same image encoder object, registered
    once; the manager's model info shows the adapter on the UNet."""
    cm = ComponentsManager()
    first, second = pipeline("sd", repos, cm), pipeline("sd", repos, cm)
    first.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    second.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    assert first.image_encoder is second.image_encoder
    assert len(cm.get_ids("image_encoder")) == 1
    first.set_ip_adapter_scale(0.5)
    info = cm.get_model_info(cm.get_id(first.unet), "ip_adapter")["ip_adapter"]
    assert info["scales"] == [0.5] and info["processors"] > 0
    assert info["image_encoder"] == cm.get_id(first.image_encoder)
    assert set(info["scale_per_block"].values()) == {0.5}
    # Per block, as diffusers' per-block dicts set it; the table groups blocks by scale.
    first.set_ip_adapter_scale({"down": {"block_1": [1.0]}, "up": {"block_0": [0.0]}})
    info = cm.get_model_info(cm.get_id(first.unet), "ip_adapter")["ip_adapter"]
    assert info["scale_per_block"] == {"down_blocks.1": 1.0, "mid_block": 0.0, "up_blocks.0": 0.0}
    line = next(text for text in cm.table().splitlines() if "IP-Adapter" in text)
    assert f"image encoder {cm.get_id(first.image_encoder)}" in line
    assert "scale 1.0 (down_blocks.1), 0.0 (up_blocks.0, mid_block)" in line


def test_under_auto_offload_the_output_and_the_measured_size_follow_the_adapter(repos):
    """Under auto offload with a budget that forces evictions, an IP-Adapter loaded while offload is on gives the
    output of a pipeline without offload; the UNet's measured size grows with the adapter and shrinks back."""
    image = make_image(3, 40)
    plain = pipeline("sd", repos)
    plain.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    expected = call(plain, "sd", ip_adapter_image=image)
    cm = ComponentsManager()
    pipe = pipeline("sd", repos, cm)
    sizes = {
        name: sum(t.nbytes for t in obj.state_dict().values())
        for name, obj in pipe.components.items()
        if isinstance(obj, torch.nn.Module)
    }
    cm.enable_auto_cpu_offload(
        device=SimulatedDevice(sizes["unet"] + 4 * sizes["vae"]), memory_reserve_margin=0
    )
    unet_id = cm.get_id(pipe.unet)
    before = cm.offload_engine.nbytes(unet_id)
    call(pipe, "sd")  # the UNet resident when the adapter comes
    pipe.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    assert cm.offload_engine.nbytes(unet_id) > before
    assert cm.is_auto_offloaded(pipe.image_encoder)
    assert np.array_equal(call(pipe, "sd", ip_adapter_image=image), expected)
    assert any(decision.evicted for decision in cm.offload_log)
    pipe.unload_ip_adapter()
    assert cm.offload_engine.nbytes(unet_id) == before


# ----- refused, and nothing changed -----


def ip_processor_count(pipe):
    return sum(hasattr(proc, "to_k_ip") for proc in pipe.unet.attn_processors.values())


@pytest.mark.parametrize(
    "inputs", [{"ip_adapter_image": make_image()}, {"ip_adapter_image_embeds": [torch.zeros(1, 1, 32)]}]
)
def test_an_image_prompt_without_an_adapter_is_refused_before_any_model_runs(repos, inputs):
    """Without a loaded IP-Adapter, an image prompt raises a ValueError that says to load one; the pipeline works
    as before."""
    pipe = pipeline("sd", repos)
    before = call(pipe, "sd")
    with pytest.raises(ValueError, match=r"no IP-Adapter is loaded into 'unet'; call pipe.load_ip_adapter"):
        call(pipe, "sd", **inputs)
    assert np.array_equal(call(pipe, "sd"), before)


def test_an_adapter_without_image_encoder_takes_embeddings_only(repos):
    """Loaded with image_encoder_folder=None, the adapter takes ip_adapter_image_embeds; an image prompt is refused
    with a message that says what to pass."""
    pipe = pipeline("sd", repos)
    pipe.load_ip_adapter(repos["sd"][1], **WEIGHTS, image_encoder_folder=None)
    call(pipe, "sd", ip_adapter_image_embeds=[torch.zeros(1, 1, 32)])
    with pytest.raises(ValueError, match="loaded without one; pass ip_adapter_image_embeds"):
        call(pipe, "sd", ip_adapter_image=make_image())


def test_an_adapter_loaded_through_another_pipeline_is_said_so_naming_it(repos):
    """B loads an IP-Adapter into a UNet shared with A: an image prompt on A is refused saying the adapter came
    through another pipeline sharing the model, naming B and its image encoder (not "loaded without one"); the
    table says who loaded it; once A loads it too, A's call runs."""
    cm = ComponentsManager()
    first, second = pipeline("sd", repos, cm), pipeline("sd", repos, cm)
    second.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    label = f"StableDiffusionAutoBlocks@{id(second):#x}"
    encoder_id = cm.get_id(second.image_encoder)
    with pytest.raises(ValueError) as refused:
        call(first, "sd", ip_adapter_image=make_image())
    assert str(refused.value) == (
        "IPAdapterImageStep: an image prompt needs the image encoder, and this pipeline holds none: the "
        f"IP-Adapter in 'unet' was loaded through another pipeline sharing the model ({label}), with image "
        f"encoder {encoder_id}. Call pipe.load_ip_adapter(...) on this pipeline too (the image encoder is "
        "reused through the manager), or pass ip_adapter_image_embeds"
    )
    assert cm.get_model_info(cm.get_id(first.unet), "ip_adapter")["ip_adapter"]["loaded_by"] == label
    assert f"; loaded by {label}" in next(line for line in cm.table().splitlines() if "IP-Adapter:" in line)
    first.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    assert np.array_equal(
        call(first, "sd", ip_adapter_image=make_image()), call(second, "sd", ip_adapter_image=make_image())
    )


def test_a_loaded_adapter_without_an_image_prompt_is_refused(repos):
    """A call without image prompt while an IP-Adapter is loaded says to pass one or unload it."""
    pipe = pipeline("sd", repos)
    pipe.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    with pytest.raises(
        ValueError, match=r"pass ip_adapter_image or ip_adapter_image_embeds, or call pipe.unload_ip_adapter"
    ):
        call(pipe, "sd")


def test_a_wrong_weight_name_is_refused_naming_the_files(repos):
    """A weight_name the folder lacks raises MissingComponentFileError listing the files; nothing is loaded."""
    pipe = pipeline("sd", repos)
    with pytest.raises(
        MissingComponentFileError,
        match=r"no IP-Adapter file 'nope.safetensors' \(files present: \['ip-adapter.safetensors'\]\)",
    ):
        pipe.load_ip_adapter(repos["sd"][1], subfolder="models", weight_name="nope.safetensors")
    assert ip_processor_count(pipe) == 0 and "image_encoder" not in pipe.components


def test_a_pickle_file_needs_consent(repos, tmp_path):
    """A .bin IP-Adapter is refused without use_pickle=True (nothing loaded) and loads with it."""
    state = load_file(repos["sd"][1] / "models" / "ip-adapter.safetensors")
    nested = {"image_proj": {}, "ip_adapter": {}}
    for key, value in state.items():
        part, rest = key.split(".", 1)
        nested[part][rest] = value
    (tmp_path / "models").mkdir()
    torch.save(nested, tmp_path / "models" / "ip-adapter.bin")
    pipe = pipeline("sd", repos)
    with pytest.raises(PickleWeightsError, match="use_pickle=True"):
        pipe.load_ip_adapter(
            tmp_path, subfolder="models", weight_name="ip-adapter.bin", image_encoder_folder=None
        )
    assert ip_processor_count(pipe) == 0
    pipe.load_ip_adapter(
        tmp_path, subfolder="models", weight_name="ip-adapter.bin", image_encoder_folder=None, use_pickle=True
    )
    assert ip_processor_count(pipe) > 0


def test_a_file_without_image_projection_is_refused_and_changes_nothing(repos, tmp_path):
    """A file without image_proj keys raises IPAdapterError naming them; the UNet and the manager are unchanged."""
    state = load_file(repos["sd"][1] / "models" / "ip-adapter.safetensors")
    (tmp_path / "models").mkdir()
    save_file(
        {k: v for k, v in state.items() if not k.startswith("image_proj.")},
        str(tmp_path / "models" / "x.safetensors"),
    )
    cm = ComponentsManager()
    pipe = pipeline("sd", repos, cm)
    registered = set(cm.components)
    with pytest.raises(
        IPAdapterError, match=r"has no IP-Adapter image projection \(no 'image_proj\.\*' keys\)"
    ):
        pipe.load_ip_adapter(tmp_path, subfolder="models", weight_name="x.safetensors")
    assert ip_processor_count(pipe) == 0 and set(cm.components) == registered


def test_an_adapter_for_another_model_is_refused_and_changes_nothing(repos):
    """The SDXL IP-Adapter does not fit the SD UNet: IPAdapterError, and the UNet and the manager are as before."""
    cm = ComponentsManager()
    pipe = pipeline("sd", repos, cm)
    registered = set(cm.components)
    processors = dict(pipe.unet.attn_processors)
    with pytest.raises(IPAdapterError, match="does not fit 'unet'"):
        pipe.load_ip_adapter(repos["sdxl"][1], **WEIGHTS)
    assert pipe.unet.attn_processors == processors and pipe.unet.encoder_hid_proj is None
    assert set(cm.components) == registered and "image_encoder" not in pipe.components


def test_a_bad_scale_is_refused_and_keeps_the_scales(repos):
    """set_ip_adapter_scale without an adapter, or with a scale list of the wrong length, raises IPAdapterError;
    the scales stay as they were."""
    pipe = pipeline("sd", repos)
    with pytest.raises(IPAdapterError, match="no IP-Adapter is loaded into 'unet'"):
        pipe.set_ip_adapter_scale(0.5)
    pipe.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    pipe.set_ip_adapter_scale(0.3)
    with pytest.raises(IPAdapterError, match="does not fit the loaded IP-Adapter"):
        pipe.set_ip_adapter_scale([0.5, 0.7])
    assert {tuple(p.scale) for p in pipe.unet.attn_processors.values() if hasattr(p, "to_k_ip")} == {(0.3,)}


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"ip_adapter_image": [make_image(), make_image(1)]},
            "ip_adapter_image needs one entry per loaded IP-Adapter: 1 loaded, 2 given",
        ),
        (
            {"ip_adapter_image": make_image(), "ip_adapter_image_embeds": [torch.zeros(1, 1, 32)]},
            "either as images",
        ),
        (
            {"ip_adapter_image_embeds": [torch.zeros(2, 1, 32)]},
            r"ip_adapter_image_embeds\[0\] must be a \[1, images, dim\]",
        ),
        ({"negative_ip_adapter_image_embeds": [torch.zeros(1, 1, 32)]}, "needs ip_adapter_image_embeds too"),
    ],
)
def test_bad_image_prompts_are_refused(repos, inputs, message):
    """Image prompts that do not fit the loaded adapters raise a ValueError naming the input."""
    pipe = pipeline("sd", repos)
    pipe.load_ip_adapter(repos["sd"][1], **WEIGHTS)
    with pytest.raises(ValueError, match=message):
        call(pipe, "sd", **inputs)


def test_flux_embeddings_without_negatives_are_refused_under_true_cfg(repos):
    """Flux with true CFG and ip_adapter_image_embeds alone asks for negative_ip_adapter_image_embeds."""
    pipe = pipeline("flux", repos)
    pipe.load_ip_adapter(repos["flux"][1], **WEIGHTS)
    with pytest.raises(ValueError, match="needs negative_ip_adapter_image_embeds"):
        call(pipe, "flux", ip_adapter_image_embeds=[torch.zeros(1, 1, 32)])
