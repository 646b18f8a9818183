"""Index files are checked whole before anything in them is imported, loaded or registered."""

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
from huggingface_hub import constants
from hypothesis import given, settings
from hypothesis import strategies as st

import modular.pipeline.index
from blocks.stable_diffusion import make_tiny_repo
from components.errors import PipelineTypeError, SubfolderOutsideRepoError
from modular import ComponentsManager, ModularPipeline
from modular.errors import IndexFileError
from modular.pipeline.index import CLASSIC_INDEX, ENTRY_FIELDS, MODULAR_INDEX
from tests.components.hub_cache import add_to_hub_cache
from tests.components.test_load_safety import poisoned_pipeline_repo

MODULAR_HEAD = {"_blocks_class_name": "StableDiffusionAutoBlocks", "_class_name": "ModularPipeline"}
CLASSIC_HEAD = {"_class_name": "StableDiffusionPipeline", "_diffusers_version": "0.42.1"}
UNET = ["diffusers", "UNet2DConditionModel"]


@pytest.fixture(scope="module")
def tiny_repo(tmp_path_factory):
    return make_tiny_repo(tmp_path_factory.mktemp("tiny") / "repo")


@pytest.fixture
def imports(monkeypatch):
    """The (library, class) pairs that reading the index asked import_type for."""
    calls = []
    real = modular.pipeline.index.import_type

    def recording(library, class_name, trust_remote_code=False):
        calls.append((library, class_name))
        return real(library, class_name, trust_remote_code=trust_remote_code)

    monkeypatch.setattr(modular.pipeline.index, "import_type", recording)
    return calls


def write_index(folder, kind, data):
    """Writes ``data`` (JSON text as is, anything else as JSON) as the index file ``kind`` in ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / kind
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def refused(folder, path, imports, **kwargs):
    """from_pretrained on ``folder`` raises IndexFileError for ``path``; nothing is imported or registered."""
    cm = ComponentsManager()
    with pytest.raises(IndexFileError) as info:
        ModularPipeline.from_pretrained(folder, components_manager=cm, **kwargs)
    assert info.value.path == str(path)
    assert cm.components == {}
    assert imports == []
    return str(info.value)


@pytest.mark.parametrize(
    ("data", "shown"),
    [([1, 2], "array ([1, 2])"), ('"unet"', 'string ("unet")'), ("null", "null (null)"), ("3", "number (3)")],
)
def test_an_index_that_is_not_an_object_is_refused(tmp_path, imports, data, shown):
    """An index file holding a JSON array, string, null or number is an IndexFileError naming the file."""
    path = write_index(tmp_path, MODULAR_INDEX, data)
    assert refused(tmp_path, path, imports) == (
        f"{path}: the file holds a JSON {shown}; an index is a JSON object of component entries and config values"
    )


def test_a_two_item_entry_in_a_modular_index_is_refused(tmp_path, imports):
    """[null, null] in a modular index (whose entries have three items) is refused, not read as config."""
    path = write_index(tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, "unet": [*UNET, {}], "vae": [None, None]})
    assert refused(tmp_path, path, imports) == (
        f"{path}: entry 'vae' has 2 items ([null, null]); a component entry of modular_model_index.json is "
        f"[library, class, {{loading fields}}]"
    )


def test_a_three_item_entry_in_a_classic_index_is_refused(tmp_path, imports):
    """A modular-shaped entry in model_index.json is refused, not half read."""
    path = write_index(tmp_path, CLASSIC_INDEX, {**CLASSIC_HEAD, "unet": UNET, "vae": ["diffusers", "X", {}]})
    assert refused(tmp_path, path, imports) == (
        f'{path}: entry \'vae\' has 3 items (["diffusers", "X", {{}}]); a component entry of model_index.json is '
        f"[library, class] (or [null, null] for a component the repo does not have)"
    )


def test_an_entry_of_numbers_is_refused(tmp_path, imports):
    """[1, 2] where a component entry goes lists both wrong items, instead of becoming a config value."""
    path = write_index(tmp_path, CLASSIC_INDEX, {**CLASSIC_HEAD, "unet": UNET, "vae": [1, 2]})
    assert refused(tmp_path, path, imports) == (
        f"{path}: the index file has 2 problems:\n"
        f"  - entry 'vae': the library must be a string or null (got 1, a JSON number)\n"
        f"  - entry 'vae': the class must be a string or null (got 2, a JSON number)"
    )


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"a": 1},
            "entry 'vae' has unknown loading field(s) ['a']; known: ['pretrained_model_name_or_path', "
            "'subfolder', 'variant', 'revision', 'type_hint', 'repo']",
        ),
        (5, "entry 'vae': the third item must be an object of loading fields or null (got 5, a JSON number)"),
        ({"subfolder": 3}, "entry 'vae': subfolder must be a string or null (got 3, a JSON number)"),
        (
            {"variant": ["fp16"]},
            "entry 'vae': variant must be a string or null (got [\"fp16\"], a JSON array)",
        ),
        ({"revision": {}}, "entry 'vae': revision must be a string or null (got {}, a JSON object)"),
        (
            {"pretrained_model_name_or_path": True},
            "entry 'vae': pretrained_model_name_or_path must be a string or null (got true, a JSON boolean)",
        ),
        (
            {"subfolder": "a|b"},
            "entry 'vae': subfolder must not be 'null' or contain '|', which load IDs reserve (got 'a|b')",
        ),
        (
            {"type_hint": "diffusers"},
            "entry 'vae': type_hint must be [library, class] or null (got \"diffusers\", a JSON string)",
        ),
        (
            {"type_hint": ["diffusers"]},
            "entry 'vae': type_hint must be [library, class] or null (got [\"diffusers\"], a JSON array)",
        ),
        (
            {"type_hint": [1, "AutoencoderKL"]},
            "entry 'vae': the library of type_hint must be a string or null (got 1, a JSON number)",
        ),
        (
            {"type_hint": ["diffusers", None]},
            "entry 'vae': library of type_hint and class of type_hint must both be strings or both be null "
            '(got ["diffusers", null])',
        ),
        (
            {"type_hint": ["evil module", "X"]},
            "entry 'vae': the library of type_hint must be a module name such as 'diffusers' (got 'evil module')",
        ),
    ],
)
def test_loading_fields_of_the_wrong_type_are_refused(tmp_path, imports, fields, problem):
    """Loading fields that are not str-or-null, a type_hint that is not [library, class]: refused, named."""
    entry = ["diffusers", "AutoencoderKL", fields]
    path = write_index(tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, "unet": [*UNET, {}], "vae": entry})
    assert refused(tmp_path, path, imports) == f"{path}: {problem}"


def test_an_object_with_loading_fields_is_refused(tmp_path, imports):
    """A top-level object holding loading fields is a misplaced component entry, not a config value."""
    path = write_index(
        tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, "unet": [*UNET, {}], "vae": {"subfolder": "vae"}}
    )
    assert refused(tmp_path, path, imports) == (
        f"{path}: entry 'vae' is an object with loading fields ['subfolder']; a component entry is [library, "
        f"class, {{loading fields}}], and a config value holds no loading fields"
    )


def test_a_component_name_must_be_an_identifier(tmp_path, imports):
    """A component entry whose name is not an identifier is refused with the file's name."""
    path = write_index(tmp_path, CLASSIC_INDEX, {**CLASSIC_HEAD, "unet": UNET, "my-vae": UNET})
    assert refused(tmp_path, path, imports) == (
        f"{path}: entry 'my-vae': a component's name must be a Python identifier such as 'unet'"
    )


@pytest.mark.parametrize("key", ["_class_name", "_blocks_class_name", "_workflow"])
def test_metadata_must_be_strings(tmp_path, imports, key):
    """_class_name, _blocks_class_name and _workflow that are not strings are refused before the family lookup."""
    path = write_index(tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, key: ["x"]})
    assert (
        refused(tmp_path, path, imports)
        == f'{path}: entry {key!r} must be a string (got ["x"], a JSON array)'
    )


def test_deeply_nested_json_is_refused(tmp_path, imports):
    """JSON nested too deeply to parse is an IndexFileError, not a RecursionError."""
    path = write_index(tmp_path, MODULAR_INDEX, "[" * 100_000 + "]" * 100_000)
    assert refused(tmp_path, path, imports) == (
        f"{path}: its JSON is nested too deeply to read; an index file is a flat object of entries"
    )


def test_a_deeply_nested_entry_is_refused(tmp_path, imports):
    """An entry nested deeper than any index needs is refused by name."""
    deep = {"x": 1}
    for _ in range(40):
        deep = [deep]
    path = write_index(tmp_path, CLASSIC_INDEX, {**CLASSIC_HEAD, "unet": UNET, "extra": deep})
    assert refused(tmp_path, path, imports) == (
        f"{path}: entry 'extra' is nested more than 32 levels deep; index entries are a few levels at most"
    )


def test_an_index_that_is_not_utf8_is_refused(tmp_path, imports):
    """An index file that is not UTF-8 text is an IndexFileError naming it."""
    path = tmp_path / MODULAR_INDEX
    path.write_bytes(b'{"_class_name": "\xff"}')
    message = refused(tmp_path, path, imports)
    assert message.startswith(f"{path}: not UTF-8 text (")
    assert message.endswith("); the index file is damaged")


def test_a_malformed_index_on_the_hub_names_the_cached_file(tmp_path, monkeypatch, imports):
    """A hub repo's malformed index is refused, naming the file in the hub cache."""
    cache = tmp_path / "hub"
    write_index(tmp_path / "source", MODULAR_INDEX, {**MODULAR_HEAD, "unet": [1, None, None]})
    commit = add_to_hub_cache(cache, "org/bad", tmp_path / "source")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = cache / "models--org--bad" / "snapshots" / commit / MODULAR_INDEX
    assert refused("org/bad", path, imports) == (
        f"{path}: entry 'unet': the library must be a string or null (got 1, a JSON number)"
    )


@pytest.mark.parametrize(
    ("subfolder", "reason"),
    [
        ("../..", "it has a '..' part"),
        ("unet/../../other", "it has a '..' part"),
        ("/etc", "it is an absolute path"),
        ("C:\\models\\unet", "it names a drive ('C:')"),
    ],
)
def test_a_subfolder_leaving_the_index_folder_needs_an_explicit_repo(tmp_path, imports, subfolder, reason):
    """An entry without a repo whose subfolder leaves the index's folder is refused when the index is read."""
    entry = [*UNET, {"pretrained_model_name_or_path": None, "subfolder": subfolder}]
    path = write_index(tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, "unet": entry})
    assert refused(tmp_path, path, imports) == (
        f"{path}: entry 'unet': subfolder {subfolder!r} leaves the index's folder ({reason}); an entry without "
        f"pretrained_model_name_or_path loads from the index's own repo, so its subfolder must stay inside it. "
        f"Name the repo in pretrained_model_name_or_path, or fix the subfolder"
    )


def test_an_explicit_repo_with_a_climbing_subfolder_is_refused_at_load(tiny_repo, tmp_path):
    """With its repo named, the entry reads, but loading a subfolder outside that repo is refused."""
    repo = tiny_repo / "unet"
    entry = [*UNET, {"pretrained_model_name_or_path": str(repo), "subfolder": "../vae"}]
    write_index(tmp_path, MODULAR_INDEX, {**MODULAR_HEAD, "unet": entry})
    cm = ComponentsManager()
    pipe = ModularPipeline.from_pretrained(tmp_path, components_manager=cm)
    with pytest.raises(
        SubfolderOutsideRepoError, match=r"\(subfolder '../vae'\): the subfolder must be a folder"
    ):
        pipe.load_components(["unet"])
    assert "unet" in pipe.null_component_names
    assert not any(cid.startswith("unet_") for cid in cm.components)


def test_the_peers_deprecated_repo_field_names_the_repo(tiny_repo, tmp_path):
    """A modular entry's `repo` field (the peer's deprecated spelling) is read as its repo, not ignored."""
    entry = [*UNET, {"repo": str(tiny_repo), "subfolder": "unet"}]
    write_index(tmp_path / "saved", MODULAR_INDEX, {**MODULAR_HEAD, "unet": entry})
    pipe = ModularPipeline.from_pretrained(tmp_path / "saved")
    assert pipe.get_component_spec("unet").load_id == f"{tiny_repo}|unet|null|null"


@pytest.mark.parametrize("kind", [MODULAR_INDEX, CLASSIC_INDEX])
@pytest.mark.parametrize("pipeline_class", ["DiffusionPipeline", "StableDiffusionPipeline"])
def test_a_pipeline_class_as_a_component_is_refused_when_the_index_is_read(
    tiny_repo, tmp_path, kind, pipeline_class
):
    """An entry declaring a pipeline class is refused by from_pretrained: no nested .bin is read, nothing registers."""
    marker = tmp_path / "marker"
    folder = tmp_path / "pipe"
    if kind == MODULAR_INDEX:
        nested = poisoned_pipeline_repo(tiny_repo, tmp_path / "nested", marker)
        entry = [
            "diffusers",
            pipeline_class,
            {"pretrained_model_name_or_path": str(nested), "subfolder": None},
        ]
        path = write_index(folder, kind, {**MODULAR_HEAD, "unet": entry})
    else:
        # The classic entry's subfolder is its name: make that subfolder a whole (poisoned) pipeline repo.
        shutil.copytree(tiny_repo, folder)
        shutil.rmtree(folder / "unet")
        poisoned_pipeline_repo(tiny_repo, folder / "unet", marker)
        index = json.loads((folder / CLASSIC_INDEX).read_text())
        path = write_index(folder, kind, {**index, "unet": ["diffusers", pipeline_class]})
    cm = ComponentsManager()
    with pytest.raises(PipelineTypeError) as info:
        pipe = ModularPipeline.from_pretrained(folder, components_manager=cm)
        pipe.load_components(["unet"])
    module = (
        "pipeline_utils"
        if pipeline_class == "DiffusionPipeline"
        else "stable_diffusion.pipeline_stable_diffusion"
    )
    assert str(info.value) == (
        f"{path}: entry 'unet' declares diffusers.pipelines.{module}.{pipeline_class}, a whole pipeline, as a "
        f"component; loading it would load another repo's components (pickle files included) past the checks "
        f"made on one component folder. Declare the component's own class (a model, scheduler or tokenizer "
        f"class), or remove the entry."
    )
    assert cm.components == {}
    assert not marker.exists()


# ----- property: no malformed index gets past reading -----

EVIL = "evil_module_xyz"
COMPONENT_NAMES = ["vae", "text_encoder", "tokenizer", "scheduler", "extra"]
scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
non_strings = json_values.filter(lambda value: value is not None and not isinstance(value, str))
names = st.none() | st.sampled_from(["diffusers", EVIL, "UNet2DConditionModel", "Evil"])
field_keys = st.sampled_from(["pretrained_model_name_or_path", "subfolder", "variant", "revision", "repo"])
escaping = st.sampled_from(["..", "../..", "a/../../b", "/abs", "\\\\server\\share", "D:\\x", "..\\up"])


def _is_str(value):
    return isinstance(value, str)


def _deep(depth):
    value = []
    for _ in range(depth):
        value = [value]
    return value


def _not_a_pair(value):
    """Whether ``value`` is not a well-formed [library, class] pair (both strings, or both null)."""
    if not isinstance(value, list) or len(value) != 2:
        return True
    if not all(item is None or isinstance(item, str) for item in value):
        return True
    return (value[0] is None) != (value[1] is None)


def broken_entries(kind):
    """Values that are malformed wherever a non-metadata entry of an index of ``kind`` stands."""
    size = 3 if kind == MODULAR_INDEX else 2
    wrong_size = st.lists(names, min_size=5 - size, max_size=5 - size)  # 3 items in classic, 2 in modular
    wrong_items = st.tuples(non_strings, names).map(list) | st.tuples(names, non_strings).map(list)
    if size == 3:
        wrong_items = wrong_items.map(lambda pair: [*pair, None])
    common = [
        wrong_size,
        wrong_items,
        st.builds(
            lambda key, value: {key: value}, st.sampled_from(["subfolder", "type_hint", "repo"]), json_values
        ),
        st.integers(33, 60).map(_deep),
    ]
    if kind == CLASSIC_INDEX:
        return st.one_of(common)
    good = ["diffusers", "UNet2DConditionModel"]
    return st.one_of(
        *common,
        (non_strings | st.text(max_size=3))
        .filter(lambda v: not isinstance(v, dict))
        .map(lambda f: [*good, f]),
        st.dictionaries(st.text(min_size=1, max_size=6), json_values, min_size=1, max_size=2)
        .filter(lambda fields: not set(fields) <= set(ENTRY_FIELDS))
        .map(lambda f: [*good, f]),
        st.builds(lambda key, value: [*good, {key: value}], field_keys, non_strings),
        (non_strings | st.lists(names, max_size=4))
        .filter(_not_a_pair)
        .map(lambda hint: [*good, {"type_hint": hint}]),
        escaping.map(lambda sub: [*good, {"subfolder": sub}]),
    )


@st.composite
def malformed_indexes(draw):
    """(file name, JSON text): an index of either kind with at least one malformed part."""
    kind = draw(st.sampled_from([MODULAR_INDEX, CLASSIC_INDEX]))
    shape = draw(st.sampled_from(["not an object", "too deep to parse", "bad metadata", "bad entry"]))
    if shape == "not an object":
        return kind, json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict))))
    if shape == "too deep to parse":
        depth = draw(st.integers(50_000, 150_000))
        return kind, "[" * depth + "]" * depth
    head = dict(MODULAR_HEAD if kind == MODULAR_INDEX else CLASSIC_HEAD)
    # A well-formed entry naming a module that must never be imported (trust_remote_code=True is passed).
    head["unet"] = [EVIL, "Evil", {"subfolder": "unet"}] if kind == MODULAR_INDEX else [EVIL, "Evil"]
    if shape == "bad metadata":
        # (_class_name may be a custom pipeline's [module, class] pair of strings, which is well formed.)
        bad = non_strings.filter(lambda v: not (isinstance(v, list) and len(v) == 2 and all(map(_is_str, v))))
        head[draw(st.sampled_from(["_class_name", "_blocks_class_name", "_workflow"]))] = draw(bad)
    else:
        for name in draw(st.lists(st.sampled_from(COMPONENT_NAMES), min_size=1, max_size=3, unique=True)):
            head[name] = draw(broken_entries(kind))
    return kind, json.dumps(head)


@pytest.fixture(scope="module")
def evil_module(tmp_path_factory):
    """A module on sys.path that writes a marker when imported; yields the marker's path."""
    folder = tmp_path_factory.mktemp("evil")
    marker = folder / "imported"
    (folder / f"{EVIL}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass Evil: pass\n")
    sys.path.insert(0, str(folder))
    yield marker
    sys.path.remove(str(folder))
    sys.modules.pop(EVIL, None)


@settings(max_examples=80, deadline=None)
@given(malformed_indexes())
def test_a_malformed_index_is_refused_before_anything_is_imported_or_registered(evil_module, drawn):
    """Any malformed index: a ValueError naming the file; nothing registered; no module the index names imported."""
    kind, text = drawn
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, kind)
        Path(path).write_text(text)
        cm = ComponentsManager()
        with pytest.raises(ValueError) as info:
            ModularPipeline.from_pretrained(folder, components_manager=cm, trust_remote_code=True)
        assert isinstance(info.value, IndexFileError)
        assert str(info.value).startswith(f"{path}: ")
        assert cm.components == {}
    assert EVIL not in sys.modules and not evil_module.exists()
