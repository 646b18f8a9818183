"""save_pretrained's keywords, as the peer's: overwrite_modular_index, variant, max_shard_size,
safe_serialization, and push_to_hub through huggingface_hub (its calls faked: no network)."""

import huggingface_hub
import pytest
import torch
from diffusers import UNet2DConditionModel

from components import PickleWeightsError
from modular import ModularPipeline
from modular.pipeline.index import MODULAR_INDEX

from .saved import same_weights, saved_index

SAVED = ("scheduler", "text_encoder", "tokenizer", "unet", "vae")


def _loaded(repo, names=None):
    pipe = ModularPipeline.from_pretrained(repo)
    pipe.load_components(names, torch_dtype=torch.float32)
    return pipe


def test_an_index_that_keeps_its_sources_is_written_without_weights(repo, tmp_path):
    """overwrite_modular_index=False writes only the index, whose entries keep the repo they came from."""
    pipe = _loaded(repo)
    pipe.save_pretrained(tmp_path / "index-only", overwrite_modular_index=False)
    assert sorted(p.name for p in (tmp_path / "index-only").iterdir()) == [MODULAR_INDEX]
    index = saved_index(tmp_path / "index-only")
    assert {index[name][2]["pretrained_model_name_or_path"] for name in SAVED} == {str(repo)}
    again = _loaded(tmp_path / "index-only", ["unet"])
    assert again.get_component_spec("unet").load_id == f"{repo}|unet|null|null"
    assert same_weights(again.unet, pipe.unet)


def test_a_component_without_a_source_is_written_even_when_the_index_keeps_sources(repo, tmp_path):
    """A component made in memory (no load ID) has nothing to point at: it is saved and its entry names it."""
    pipe = _loaded(repo)
    fresh = UNet2DConditionModel.from_config(pipe.unet.config)
    pipe.update_components(unet=fresh)
    pipe.save_pretrained(tmp_path / "saved", overwrite_modular_index=False)
    assert sorted(p.name for p in (tmp_path / "saved").iterdir()) == [MODULAR_INDEX, "unet"]
    index = saved_index(tmp_path / "saved")
    assert index["unet"][2]["pretrained_model_name_or_path"] is None
    assert index["vae"][2]["pretrained_model_name_or_path"] == str(repo)
    assert same_weights(_loaded(tmp_path / "saved", ["unet"]).unet, fresh)


def test_variant_names_the_saved_weights_and_the_index_records_it(repo, tmp_path):
    """variant="fp16" writes the models' weights under that variant, records it, and the save loads back."""
    pipe = _loaded(repo)
    pipe.save_pretrained(tmp_path / "saved", variant="fp16")
    assert (tmp_path / "saved" / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    index = saved_index(tmp_path / "saved")
    variants = {name: index[name][2]["variant"] for name in SAVED}
    # Tokenizers and schedulers have no weights and their saves take no variant.
    assert variants == {
        "unet": "fp16",
        "vae": "fp16",
        "text_encoder": "fp16",
        "tokenizer": None,
        "scheduler": None,
    }
    again = _loaded(tmp_path / "saved")
    assert again.get_component_spec("unet").load_id.endswith("|unet|fp16|null")
    assert same_weights(again.unet, pipe.unet)


def test_max_shard_size_shards_the_weights(repo, tmp_path):
    """A small max_shard_size writes the UNet in shards with their index, and the shards load back."""
    pipe = _loaded(repo)
    pipe.save_pretrained(tmp_path / "saved", max_shard_size="100KB")
    files = sorted(p.name for p in (tmp_path / "saved" / "unet").iterdir())
    assert "diffusion_pytorch_model.safetensors.index.json" in files
    assert sum(name.endswith(".safetensors") for name in files) > 1
    assert same_weights(_loaded(tmp_path / "saved", ["unet"]).unet, pipe.unet)


def test_pickle_files_are_written_only_when_asked_and_read_only_with_consent(repo, tmp_path):
    """safe_serialization=False writes the UNet as a pickle file, which loads only with use_pickle=True."""
    pipe = _loaded(repo, ["unet"])
    pipe.save_pretrained(tmp_path / "saved", safe_serialization=False)
    assert [p.suffix for p in (tmp_path / "saved" / "unet").glob("diffusion_pytorch_model*")] == [".bin"]
    again = ModularPipeline.from_pretrained(tmp_path / "saved")
    with pytest.raises(PickleWeightsError):
        again.load_components(["unet"])
    again.load_components(["unet"], use_pickle=True)
    assert same_weights(again.unet, pipe.unet)


@pytest.mark.parametrize(
    ("keywords", "error", "message"),
    [
        ({"variant": ""}, ValueError, "variant must be a name like 'fp16', or None (got '')"),
        ({"variant": "../x"}, ValueError, "variant must be a name like 'fp16', or None (got '../x')"),
        (
            {"max_shard_size": 0},
            ValueError,
            "max_shard_size must be a byte count above 0 or a size like '5GB'",
        ),
        ({"max_shard_size": "big"}, ValueError, "(got 'big')"),
        ({"safe_serialization": "no"}, TypeError, "safe_serialization must be True or False (got 'no')"),
        ({"overwrite_modular_index": 1}, TypeError, "overwrite_modular_index must be True or False (got 1)"),
        ({"push_to_hub": "yes"}, TypeError, "push_to_hub must be True or False (got 'yes')"),
        ({"overwrite_index": False}, TypeError, "unknown keyword(s) ['overwrite_index']"),
        (
            {"commit_message": "hi"},
            TypeError,
            "['commit_message'] only apply to an upload; pass push_to_hub=True",
        ),
    ],
)
def test_bad_keywords_are_refused_before_anything_is_written(repo, tmp_path, keywords, error, message):
    """A bad keyword value, an unknown keyword or an upload keyword without an upload writes nothing."""
    pipe = _loaded(repo, ["unet"])
    with pytest.raises(error) as info:
        pipe.save_pretrained(tmp_path / "saved", **keywords)
    assert message in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_push_to_hub_offline_is_refused_before_anything_is_written(repo, tmp_path):
    """With the hub offline (the tests' HF_HUB_OFFLINE=1), push_to_hub=True says so and writes nothing."""
    pipe = _loaded(repo, ["unet"])
    with pytest.raises(ConnectionError, match=r"push_to_hub=True needs the hub, but it is offline"):
        pipe.save_pretrained(tmp_path / "saved", push_to_hub=True)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def fake_hub(monkeypatch):
    """huggingface_hub online, with create_repo and upload_folder recorded instead of sent."""
    calls = []

    def create_repo(self, repo_id, **kwargs):
        calls.append(("create_repo", repo_id, kwargs))
        full = repo_id if "/" in repo_id else f"me/{repo_id}"  # the hub puts a bare name in the user's space
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{full}")

    def upload_folder(self, **kwargs):
        calls.append(("upload_folder", kwargs["repo_id"], kwargs))

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    return calls


def test_push_to_hub_creates_the_repo_then_uploads_what_the_index_reads(repo, tmp_path, fake_hub):
    """push_to_hub creates the repo (named after the folder), saves, then uploads the index and the saved
    component folders only: a user's other files in the folder stay local."""
    folder = tmp_path / "my-pipe"
    folder.mkdir()
    (folder / "NOTES.md").write_text("mine")
    _loaded(repo, ["unet", "vae"]).save_pretrained(
        folder, push_to_hub=True, private=True, commit_message="v1"
    )
    [create, upload] = fake_hub
    assert create == ("create_repo", "my-pipe", {"private": True, "exist_ok": True})
    assert upload[1] == "me/my-pipe"
    assert upload[2]["folder_path"] == folder.resolve()
    assert sorted(upload[2]["allow_patterns"]) == [MODULAR_INDEX, "unet/**", "vae/**"]
    assert upload[2]["commit_message"] == "v1" and upload[2]["create_pr"] is False


def test_push_to_hub_uses_the_given_repo_id(repo, tmp_path, fake_hub):
    """repo_id names the hub repo whatever the folder is called; an index-only save uploads the index only."""
    _loaded(repo).save_pretrained(
        tmp_path / "local",
        push_to_hub=True,
        repo_id="team/pipe",
        overwrite_modular_index=False,
        create_pr=True,
    )
    [create, upload] = fake_hub
    assert create[1] == "team/pipe"
    assert upload[2]["allow_patterns"] == [MODULAR_INDEX] and upload[2]["create_pr"] is True


def test_a_refused_repo_leaves_nothing_written(repo, tmp_path, monkeypatch):
    """When the hub refuses to create the repo (no token, no access), the error is the hub's and no save is made."""

    def refuse(self, repo_id, **kwargs):
        raise PermissionError(f"no access to {repo_id}")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", refuse)
    with pytest.raises(PermissionError, match="no access to saved"):
        _loaded(repo, ["unet"]).save_pretrained(tmp_path / "saved", push_to_hub=True)
    assert list(tmp_path.iterdir()) == []
