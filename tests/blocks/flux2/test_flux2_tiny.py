"""The tiny Flux.2 repo builder writes a repo diffusers itself loads and runs."""

import json

import torch
from diffusers import Flux2Pipeline
from safetensors.torch import load_file

from blocks.flux2.tiny import TEXT_LAYERS, make_tiny_repo

from .. import helpers


def test_classic_pipeline_loads_and_runs(flux2_repo):
    """Flux2Pipeline.from_pretrained loads the tiny repo and makes a 32x32 image in 2 steps with its defaults."""
    index = json.loads((flux2_repo / "model_index.json").read_text())
    assert index["_class_name"] == "Flux2Pipeline"
    assert index["text_encoder"] == ["transformers", "Mistral3ForConditionalGeneration"]
    assert index["vae"] == ["diffusers", "AutoencoderKLFlux2"]
    pipe = Flux2Pipeline.from_pretrained(flux2_repo)
    pipe.set_progress_bar_config(disable=True)
    assert (
        pipe.text_encoder.config.text_config.num_hidden_layers == TEXT_LAYERS == 30
    )  # layers 10, 20, 30 exist
    images = pipe(prompt="a cat", height=32, width=32, num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 32, 32, 3)


def test_tokenizer_chat_template_and_words(flux2_repo):
    """The tokenizer's chat template makes a Mistral-style system and user turn, and words are single tokens."""
    tokenizer = Flux2Pipeline.from_pretrained(flux2_repo).tokenizer
    messages = [
        {"role": "system", "content": [{"type": "text", "text": "you"}]},
        {"role": "user", "content": [{"type": "text", "text": "a cat"}]},
    ]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<s>[SYSTEM_PROMPT]you[/SYSTEM_PROMPT][INST]a cat[/INST]"
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "<s>", "[SYSTEM_PROMPT]", "you", "[/SYSTEM_PROMPT]", "[INST]", "a", "Ġcat", "[/INST]"
    ]  # fmt: skip
    padded = tokenizer.apply_chat_template(
        [messages], tokenize=True, return_dict=True, padding="max_length", max_length=12, truncation=True
    )
    assert padded["attention_mask"] == [[1] * 8 + [0] * 4]


def test_vae_batch_norm_statistics_are_set(flux2_repo):
    """The VAE's batch-norm statistics are not the identity, so the latent normalization shows in results."""
    vae = Flux2Pipeline.from_pretrained(flux2_repo).vae
    assert not torch.equal(vae.bn.running_mean, torch.zeros_like(vae.bn.running_mean))
    assert not torch.equal(vae.bn.running_var, torch.ones_like(vae.bn.running_var))


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(
        make_tiny_repo, tmp_path, "transformer/diffusion_pytorch_model.safetensors"
    )


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='bf16' each model folder also holds a bfloat16 `.bf16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "f", variant="bf16")
    folders = [("transformer", "diffusion_pytorch_model"), ("text_encoder", "model")]
    helpers.assert_variant_files(repo, "bf16", torch.bfloat16, folders)
    # The VAE's batch norm counts its batches in an integer, which stays one.
    vae = load_file(repo / "vae" / "diffusion_pytorch_model.bf16.safetensors")
    assert {t.dtype for t in vae.values()} == {torch.bfloat16, torch.int64}
