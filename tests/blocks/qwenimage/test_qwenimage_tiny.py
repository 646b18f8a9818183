"""The tiny Qwen-Image repo builders write repos diffusers itself loads and runs."""

import json

import torch
from diffusers import QwenImageEditPipeline, QwenImagePipeline

from blocks.qwenimage.encoders import EDIT_TEMPLATE, TEXT2IMAGE_DROP, TEXT2IMAGE_TEMPLATE
from blocks.qwenimage.tiny import load_tiny_processor, make_tiny_repo

from .. import helpers
from .conftest import make_image


def test_classic_pipeline_loads_and_runs(qwen_repo):
    """QwenImagePipeline.from_pretrained loads the tiny repo and makes a 32x32 image in 2 steps."""
    index = json.loads((qwen_repo / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImagePipeline"
    assert index["text_encoder"] == ["transformers", "Qwen2_5_VLForConditionalGeneration"]
    assert index["vae"] == ["diffusers", "AutoencoderKLQwenImage"]
    pipe = QwenImagePipeline.from_pretrained(qwen_repo)
    pipe.set_progress_bar_config(disable=True)
    images = pipe("a photo of a cat", height=32, width=32, num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 32, 32, 3)


def test_classic_edit_pipeline_loads_and_runs(qwen_edit_repo, small_edit_area):
    """QwenImageEditPipeline.from_pretrained loads the tiny edit repo (its processor read as load_tiny_processor
    reads it) and edits an image; the index names Qwen2VLProcessor, as real edit repos do."""
    index = json.loads((qwen_edit_repo / "model_index.json").read_text())
    assert (index["_class_name"], index["processor"]) == (
        "QwenImageEditPipeline",
        ["transformers", "Qwen2VLProcessor"],
    )
    processor = load_tiny_processor(qwen_edit_repo)
    pipe = QwenImageEditPipeline.from_pretrained(qwen_edit_repo, processor=processor)
    pipe.set_progress_bar_config(disable=True)
    images = pipe(make_image(), "make it red", num_inference_steps=2, output_type="np").images
    assert images.shape == (1, 64, 64, 3)


def test_the_text2image_template_prefix_is_the_34_tokens_the_pipeline_drops(qwen_repo):
    """With the tiny tokenizer, as with the real one, the system prompt before the user's text is 34 tokens."""
    tokenizer = QwenImagePipeline.from_pretrained(qwen_repo).tokenizer
    prefix = TEXT2IMAGE_TEMPLATE.split("{}")[0]
    assert len(tokenizer(prefix).input_ids) == TEXT2IMAGE_DROP
    ids = tokenizer(TEXT2IMAGE_TEMPLATE.format("a photo of a cat")).input_ids
    assert tokenizer.convert_ids_to_tokens(ids[TEXT2IMAGE_DROP : TEXT2IMAGE_DROP + 5]) == [
        "a",
        "Ġphoto",
        "Ġof",
        "Ġa",
        "Ġcat",
    ]


def test_the_processor_puts_the_images_vision_tokens_in_the_prompt(qwen_edit_repo):
    """The processor expands <|image_pad|> to the vision tower's merged patches (4 for a 56 x 56 image) and
    returns the pixels for the vision tower."""
    processor = load_tiny_processor(qwen_edit_repo)
    out = processor(text=[EDIT_TEMPLATE.format("a cat")], images=make_image(size=56), return_tensors="pt")
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert int((out["input_ids"] == pad).sum()) == 4
    assert out["image_grid_thw"].tolist() == [[1, 4, 4]]


def test_same_arguments_write_same_weights(tmp_path):
    """Two repos built with the same seed hold identical weights; another seed changes them."""
    helpers.assert_seed_decides_weights(
        make_tiny_repo, tmp_path, "transformer/diffusion_pytorch_model.safetensors"
    )


def test_variant_files_hold_variant_dtype(tmp_path):
    """With variant='bf16' each model folder also holds a bfloat16 `.bf16.safetensors` file."""
    repo = make_tiny_repo(tmp_path / "q", variant="bf16")
    folders = [(name, "diffusion_pytorch_model") for name in ("transformer", "vae")] + [
        ("text_encoder", "model")
    ]
    helpers.assert_variant_files(repo, "bf16", torch.bfloat16, folders)
