"""Two threads loading and running pipelines on one manager corrupt nothing."""

import threading

import torch

from blocks.stable_diffusion import make_tiny_repo
from modular import ComponentsManager, ModularPipeline


def test_two_threads_load_and_run_pipelines_on_one_manager(tmp_path):
    """Concurrent load + run on a shared manager: each model registered once, outputs as when run alone."""
    repo = make_tiny_repo(tmp_path / "tiny-sd")
    cm = ComponentsManager()
    results, errors = {}, []
    barrier = threading.Barrier(2)

    def work(key, workflow):
        try:
            barrier.wait()
            pipe = ModularPipeline.from_pretrained(repo, components_manager=cm, workflow=workflow)
            pipe.load_components(torch_dtype=torch.float32)
            pipe.set_progress_bar_config(disable=True)
            generator = torch.Generator().manual_seed(0)
            results[key] = (
                pipe,
                pipe(
                    prompt="a cat",
                    num_inference_steps=2,
                    generator=generator,
                    output_type="latent",
                    output="images",
                ),
            )
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k, "text2image")) for k in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    (pipe_a, out_a), (pipe_b, out_b) = results["a"], results["b"]
    assert pipe_a.unet is pipe_b.unet
    assert sum(cid.startswith("unet_") for cid in cm.components) == 1
    alone = ModularPipeline.from_pretrained(repo, components_manager=cm)
    alone.load_components(torch_dtype=torch.float32)
    alone.set_progress_bar_config(disable=True)
    expected = alone(
        prompt="a cat",
        num_inference_steps=2,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        output="images",
    )
    assert torch.equal(out_a, expected) and torch.equal(out_b, expected)


def test_one_object_under_two_names_is_registered_once(tmp_path):
    """update_components with an object the manager already holds does not register it again."""
    repo = make_tiny_repo(tmp_path / "tiny-sd")
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(repo, components_manager=cm)
    pipe.load_components(["unet"], torch_dtype=torch.float32)
    other = ModularPipeline.from_pretrained(repo, components_manager=cm)
    other.update_components(unet=pipe.unet)
    assert len([cid for cid in cm.components if cid.startswith("unet_")]) == 1
