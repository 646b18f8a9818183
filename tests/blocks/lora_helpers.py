"""What every family's LoRA tests share: random LoRA files made with peft and saved by the classic pipeline's
own `save_lora_weights`, a kohya-named copy, and our pipeline beside the classic one through a series of LoRA
calls, compared bit for bit after each.

Our pipeline and the classic one run on separate loads of the same tiny repo: a LoRA loaded into one must not
reach the other, so each side's loader does its own work.
"""

import copy
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, inject_adapter_in_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file

from modular import ModularPipeline

from .helpers import STEPS, ParityHarness, assert_identical, seeded

#: The attention projections the tests put LoRA layers on, per kind of model.
DENOISER_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
CLIP_TARGETS = ["q_proj", "k_proj", "v_proj", "out_proj"]


def make_lora(
    folder: Path,
    classic_class: type,
    models: Mapping[str, tuple[torch.nn.Module, list[str]]],
    seed: int = 0,
    rank: int = 4,
    alpha: float = 8.0,
    weight_name: str | None = None,
) -> Path:
    """Write a random LoRA for `models` ({component: (model, target modules)}) with `classic_class`'s
    `save_lora_weights` into `folder`; returns the folder.

    Each model is copied before peft injects the layers (`init_lora_weights=False`: A and B random, so the
    LoRA changes outputs), so the models given are left as they were.
    """
    layers, metadata = {}, {}
    for offset, (name, (model, targets)) in enumerate(models.items()):
        torch.manual_seed(seed * 100 + offset)
        config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
        with_lora = inject_adapter_in_model(config, copy.deepcopy(model), adapter_name="default")
        layers[f"{name}_lora_layers"] = get_peft_model_state_dict(with_lora, adapter_name="default")
        metadata[f"{name}_lora_adapter_metadata"] = config.to_dict()
    classic_class.save_lora_weights(folder, **layers, **metadata, weight_name=weight_name)
    return Path(folder)


def loras_fixture(
    harness: ParityHarness, repo_fixture: str, classic_class: type, targets: Mapping[str, list[str]]
):
    """A module-scoped fixture giving two random LoRAs (seeds 0 and 1) for our pipeline of the repo that
    `repo_fixture` names, each over the models in `targets` ({component: target modules}) in one file, written
    with `classic_class`'s `save_lora_weights` as a trainer would."""

    @pytest.fixture(scope="module")
    def loras(request, tmp_path_factory) -> list[Path]:
        pipe = harness.load_pipeline(request.getfixturevalue(repo_fixture))
        models = {name: (getattr(pipe, name), modules) for name, modules in targets.items()}
        folder = tmp_path_factory.mktemp(f"{repo_fixture}-loras")
        return [make_lora(folder / name, classic_class, models, seed=seed) for seed, name in enumerate("ab")]

    return loras


def kohya_copy(source: Path, target: Path, alpha: float, prefixes: Mapping[str, str]) -> Path:
    """Write `source`'s diffusers-format LoRA file again under kohya/A1111 names; returns the new file.

    Each key `<component>.<module path>.lora_A.weight` becomes `<kohya prefix>_<module path with '_' for '.'>
    .lora_down.weight` (`lora_B` -> `lora_up`), plus one `.alpha` per module: the naming kohya's trainer writes.
    diffusers' `lora_state_dict` turns it back; no table of module names is involved.
    """
    state_dict = load_file(source / "pytorch_lora_weights.safetensors")
    kohya: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        component, rest = key.split(".", 1)
        module, kind = rest.rsplit(".lora_", 1)
        name = f"{prefixes[component]}_{module.replace('.', '_')}"
        kohya[f"{name}.lora_{'down' if kind.startswith('A') else 'up'}.weight"] = tensor
        kohya[f"{name}.alpha"] = torch.tensor(alpha)
    target.mkdir(parents=True, exist_ok=True)
    save_file(kohya, target / "kohya_lora.safetensors")
    return target / "kohya_lora.safetensors"


def run(pipe, inputs: Mapping) -> torch.Tensor | object:
    """One seeded call of our pipeline or of a classic one, returning the images."""
    if isinstance(pipe, ModularPipeline):
        return pipe(generator=seeded(0), output="images", **copy.deepcopy(dict(inputs)))
    return pipe(generator=seeded(0), **copy.deepcopy(dict(inputs))).images


def assert_parity_through(ours: ModularPipeline, classic, steps: Iterable[Callable], inputs: Mapping) -> list:
    """Apply each step to our pipeline and to the classic one; after each, their images are identical.

    Returns our images after each step, so a test can also check that a step changed (or kept) them.
    """
    images = []
    for step in steps:
        step(ours)
        step(classic)
        mine = run(ours, inputs)
        assert_identical(mine, run(classic, inputs))
        images.append(mine)
    return images


def text2image_inputs(**extra) -> dict:
    """A small text-to-image call: two steps, a numpy image."""
    return {"prompt": "a photo of a cat", "num_inference_steps": STEPS, "output_type": "np", **extra}


def same(first, second) -> bool:
    """Whether two numpy images are identical."""
    return bool((first == second).all())


def lora_cases(
    first: Path, second: Path, weights: Mapping, components: list[str]
) -> dict[str, list[Callable]]:
    """The LoRA call sequences every family runs beside the classic pipeline, by name.

    `first` and `second` are LoRA folders; `weights` is the per-component weight dict given to the first adapter
    by `set_adapters`; `components` are the models `fuse_lora`/`unfuse_lora` name (the classic defaults differ
    between families).
    """

    def load(folder: Path, name: str) -> Callable:
        return lambda pipe: pipe.load_lora_weights(folder, adapter_name=name)

    return {
        "load_disable_enable_unload": [
            load(first, "a"),
            lambda pipe: pipe.disable_lora(),
            lambda pipe: pipe.enable_lora(),
            lambda pipe: pipe.unload_lora_weights(),
        ],
        "two_adapters_weighted_then_delete": [
            load(first, "a"),
            load(second, "b"),
            lambda pipe: pipe.set_adapters(["a", "b"], adapter_weights=[dict(weights), 0.3]),
            lambda pipe: pipe.delete_adapters("a"),
        ],
        "fuse_then_unfuse": [
            load(first, "a"),
            lambda pipe: pipe.fuse_lora(lora_scale=0.7, components=components),
            lambda pipe: pipe.unfuse_lora(components=components),
        ],
    }


def assert_case_effects(case: str, baseline, images: list) -> None:
    """What each case of `lora_cases` does to our images besides matching the classic pipeline's."""
    assert not same(images[0], baseline)  # the LoRA changes the image
    if case == "load_disable_enable_unload":
        assert same(images[1], baseline)
        assert same(images[2], images[0])
        assert same(images[3], baseline)
    elif case == "two_adapters_weighted_then_delete":
        assert not same(images[2], images[1])  # the weights change the image
        assert not same(images[3], images[2])
    elif case == "fuse_then_unfuse":
        assert not same(images[1], baseline)


#: The cases of `lora_cases`, for parametrizing.
CASES = ["load_disable_enable_unload", "two_adapters_weighted_then_delete", "fuse_then_unfuse"]


def ours_and_classic(harness, repo):
    """Our pipeline and the classic text-to-image one, each on its own load of `repo`."""
    return harness.load_pipeline(repo), harness.classic_from(harness.load_pipeline(repo), "text2image")


def assert_case_matches_classic(harness, repo, loras, case, weights, components, inputs) -> None:
    """Run `case` of `lora_cases` on our pipeline and on the classic one: identical images after each call,
    and each call has its effect (`assert_case_effects`)."""
    ours, classic = ours_and_classic(harness, repo)
    baseline = run(ours, inputs)
    steps = lora_cases(*loras, weights, components)[case]
    assert_case_effects(case, baseline, assert_parity_through(ours, classic, steps, inputs))


#: The LoRA scales a call gives (``cross_attention_kwargs={"scale": s}``): off, part, and past one.
SCALES = [0.0, 0.5, 1.3]


def lora_scalings(pipe) -> dict[str, list[dict]]:
    """Every LoRA layer's per-adapter scale, per model of `pipe` (ours or a classic one)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    models = {
        name: getattr(pipe, name, None) for name in ("unet", "transformer", "text_encoder", "text_encoder_2")
    }
    return {
        name: [dict(layer.scaling) for layer in model.modules() if isinstance(layer, BaseTunerLayer)]
        for name, model in models.items()
        if isinstance(model, torch.nn.Module)
    }


def assert_scale_matches_classic(harness, repo, lora: Path, kwargs_name: str, scale: float, inputs) -> None:
    """A call with ``{kwargs_name: {"scale": scale}}`` gives the classic pipeline's images (the LoRA scaled in the
    text encoders as in the denoiser), the scale changes them, and every LoRA layer's scale is as before after."""
    ours, classic = ours_and_classic(harness, repo)
    for pipe in (ours, classic):
        pipe.load_lora_weights(lora, adapter_name="a")
    before = lora_scalings(ours)
    scaled = {**inputs, kwargs_name: {"scale": scale}}
    mine = run(ours, scaled)
    assert_identical(mine, run(classic, scaled))
    assert not same(mine, run(ours, inputs))
    assert lora_scalings(ours) == before
