"""Load IDs: format, decode, tag."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components import decode_load_id, format_load_id, get_load_id, tag_load_id

_part = st.text(min_size=1, max_size=20).filter(lambda s: "|" not in s and s != "null")


def test_format_writes_null_for_missing_parts():
    """A missing part is written 'null'."""
    assert format_load_id("org/name", "unet", None, None) == "org/name|unet|null|null"
    assert format_load_id("org/name", "", "fp16", "v2") == "org/name||fp16|v2"


def test_decode_null_load_id_gives_all_none():
    """The load ID 'null' decodes to four None fields."""
    assert decode_load_id("null") == {
        "pretrained_model_name_or_path": None,
        "subfolder": None,
        "variant": None,
        "revision": None,
    }


def test_decode_rejects_wrong_number_of_parts():
    """A load ID without four parts is a ValueError that shows it."""
    with pytest.raises(ValueError) as info:
        decode_load_id("org/name|unet")
    assert str(info.value) == (
        "load_id must have 4 parts '<repo>|<subfolder>|<variant>|<revision>' or be 'null' "
        "(got 'org/name|unet' with 2 part(s))."
    )


@given(_part, st.one_of(st.just(""), _part), st.one_of(st.none(), _part), st.one_of(st.none(), _part))
def test_decode_inverts_format(repo, subfolder, variant, revision):
    """decode_load_id(format_load_id(...)) gives back the parts."""
    decoded = decode_load_id(format_load_id(repo, subfolder, variant, revision))
    assert decoded == {
        "pretrained_model_name_or_path": repo,
        "subfolder": subfolder,
        "variant": variant,
        "revision": revision,
    }


def test_tag_sets_peer_attribute():
    """tag_load_id stores the ID as _diffusers_load_id, and get_load_id reads it back."""

    class Thing:
        pass

    thing = Thing()
    assert get_load_id(thing) is None
    tag_load_id(thing, "org/name|vae|null|null")
    assert thing._diffusers_load_id == "org/name|vae|null|null"
    assert get_load_id(thing) == "org/name|vae|null|null"


def test_tag_rejects_object_without_attributes():
    """An object that takes no attributes cannot be tagged: TypeError naming its type."""
    with pytest.raises(TypeError, match="Cannot tag a int"):
        tag_load_id(3, "a|b|null|null")


def test_tag_rejects_malformed_load_id():
    """Tagging validates the load ID first."""

    class Thing:
        pass

    with pytest.raises(ValueError, match="load_id must have 4 parts"):
        tag_load_id(Thing(), "nope")
