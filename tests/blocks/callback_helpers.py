"""What the SD and SDXL callback tests share: callbacks that record or change tensors, the interrupt flag, and
diffusers' IPAdapterScaleCutoffCallback beside the classic pipeline."""

import threading

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import IPAdapterScaleCutoffCallback, PipelineCallback

from .helpers import ParityHarness, assert_identical, make_image, seeded

WEIGHTS = {"subfolder": "models", "weight_name": "ip-adapter.safetensors"}


class ShiftLatents(PipelineCallback):
    """A ready-made-style callback of our own: shifts the latents at one step."""

    tensor_inputs = ["latents"]

    def callback_fn(self, pipeline, step_index, timesteps, callback_kwargs):
        if step_index == self.config.cutoff_step_index:
            callback_kwargs["latents"] = callback_kwargs["latents"] - 0.2
        return callback_kwargs


def changed_latents(pipeline, step, timestep, callback_kwargs):
    """At step 1, the latents halved and shifted."""
    if step == 1:
        return {"latents": callback_kwargs["latents"] * 0.5 + 0.1}
    return {}


def changed_mask(pipeline, step, timestep, callback_kwargs):
    """At the first step, the mask shifted and the masked image's latents dimmed (both halves alike)."""
    if step == 0:
        mask, masked = callback_kwargs["mask"], callback_kwargs["masked_image_latents"]
        return {"mask": mask.roll(3, dims=-1), "masked_image_latents": masked * 0.8}
    return {}


def interrupt_with(attribute):
    """A callback that sets ``pipeline.<attribute> = True`` at step 1."""

    def stop(pipeline, step, timestep, callback_kwargs):
        if step == 1:
            setattr(pipeline, attribute, True)
        return {}

    return stop


def assert_both_see_the_same_tensors(run, names):
    """Runs ``run(callback)`` (ours and the classic pipeline with that callback) and checks that at every step
    both sides' callbacks got the same step, timestep and tensors (names, shapes, values). Returns our side's
    records, ``(step, timestep, tensors)`` per step."""
    seen: dict[str, list] = {"ours": [], "theirs": []}

    def record(pipeline, step, timestep, callback_kwargs):
        side = "theirs" if isinstance(pipeline, DiffusionPipeline) else "ours"
        tensors = {k: None if v is None else v.clone() for k, v in callback_kwargs.items()}
        seen[side].append((step, int(timestep), tensors))
        return {}

    run(record)
    assert len(seen["ours"]) == len(seen["theirs"]) >= 2
    for (step, t, ours), (their_step, their_t, theirs) in zip(seen["ours"], seen["theirs"], strict=True):
        assert (step, t) == (their_step, their_t)
        assert list(ours) == names
        for name in names:
            if theirs[name] is None:  # negative_prompt_embeds without guidance
                assert ours[name] is None
            else:
                assert_identical(ours[name], theirs[name])
    return seen["ours"]


def assert_interrupt_equals_the_classic(harness, pipe, classic_workflow, call, attribute, config=None):
    """Ours interrupted at step 1 through `attribute` equals the classic pipeline interrupted through
    ``_interrupt``; ``pipe.interrupt`` is then True, and the next call resets it."""
    classic = harness.classic_from(pipe, classic_workflow, **(config or {}))
    theirs = classic(generator=seeded(0), callback_on_step_end=interrupt_with("_interrupt"), **call).images
    ours = pipe(generator=seeded(0), output="images", callback_on_step_end=interrupt_with(attribute), **call)
    assert_identical(ours, theirs)
    assert pipe.interrupt is True
    assert_identical(*harness.run_both(pipe, classic_workflow, classic_config=config, **call))
    assert pipe.interrupt is False


def ip_scales(unet):
    """The scale of every IP-Adapter attention processor of `unet`, as it reads it now."""
    return {name: list(proc.scale) for name, proc in unet.attn_processors.items() if hasattr(proc, "to_k_ip")}


def assert_ip_adapter_cutoff_is_classic_for_its_call(
    harness: ParityHarness, repo, ip_repo, denoiser="unet", **inputs
):
    """IPAdapterScaleCutoffCallback gives the classic pipeline's output; the scale it sets holds for its call
    only (the classic pipeline keeps it), so the next call equals the classic one at the pipeline's scale."""
    ours = harness.load_pipeline(repo)
    ours.load_ip_adapter(ip_repo, **WEIGHTS)
    classic = harness.classic_from(harness.load_pipeline(repo), "text2image")
    if denoiser == "transformer":  # FluxPipeline's loader takes the image encoder from its own argument
        encoder = {
            "image_encoder_pretrained_model_name_or_path": f"{ip_repo}/models/image_encoder",
            "image_encoder_dtype": torch.float32,
        }
    else:
        encoder = {}
    classic.load_ip_adapter(str(ip_repo), **WEIGHTS, **encoder)
    for pipe in (ours, classic):
        pipe.set_ip_adapter_scale(0.7)
    call = {
        "prompt": "a cat",
        "ip_adapter_image": make_image(),
        "num_inference_steps": 3,
        "output_type": "latent",
    }
    call.update(inputs)

    def cutoff():
        return IPAdapterScaleCutoffCallback(cutoff_step_ratio=None, cutoff_step_index=1)

    before = ip_scales(getattr(ours, denoiser))
    theirs = classic(generator=seeded(0), callback_on_step_end=cutoff(), **call).images
    mine = ours(generator=seeded(0), output="images", callback_on_step_end=cutoff(), **call)
    assert_identical(mine, theirs)
    assert (
        ip_scales(getattr(ours, denoiser)) == before
    )  # the call's own: the shared UNet keeps the pipeline's scale
    assert set(map(tuple, ip_scales(getattr(classic, denoiser)).values())) == {
        (0.0,)
    }  # the classic pipeline keeps the cutoff's
    uncut = ours(generator=seeded(0), output="images", **call)
    assert not torch.equal(mine, uncut)
    classic.set_ip_adapter_scale(0.7)
    assert_identical(uncut, classic(generator=seeded(0), **call).images)


def assert_ip_adapter_cutoff_stays_in_its_thread(harness: ParityHarness, repo, ip_repo, **inputs):
    """While one call's callback has set its IP-Adapter scale to 0.0, a call of the same pipeline in another
    thread runs at the pipeline's scale (its output equals a call run alone)."""
    pipe = harness.load_pipeline(repo)
    pipe.load_ip_adapter(ip_repo, **WEIGHTS)
    pipe.set_ip_adapter_scale(0.7)
    call = {
        "prompt": "a cat",
        "ip_adapter_image": make_image(),
        "num_inference_steps": 2,
        "output_type": "latent",
    }
    call.update(inputs)
    alone = pipe(generator=seeded(0), output="images", **call)
    cut, other_done, results = threading.Event(), threading.Event(), {}

    def cut_and_wait(pipeline, step, timestep, callback_kwargs):
        if step == 0:
            pipeline.set_ip_adapter_scale(0.0)
            cut.set()
            assert other_done.wait(60)
        return {}

    def cutting():
        results["cut"] = pipe(generator=seeded(0), output="images", callback_on_step_end=cut_and_wait, **call)

    def other():
        assert cut.wait(60)
        try:
            results["other"] = pipe(generator=seeded(0), output="images", **call)
        finally:
            other_done.set()

    threads = [threading.Thread(target=cutting), threading.Thread(target=other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert_identical(results["other"], alone)
    assert not torch.equal(results["cut"], alone)
