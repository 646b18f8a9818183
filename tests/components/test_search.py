"""Search patterns: a|b, leading !, x*, *x, *x*."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.search import compile_pattern

NAMES = ["unet", "vae", "text_encoder", "text_encoder_2", "tokenizer", "scheduler"]


def select(pattern):
    predicate = compile_pattern(pattern)
    return [name for name in NAMES if predicate(name)]


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        ("unet", ["unet"]),
        ("unet|vae", ["unet", "vae"]),
        ("!unet", ["vae", "text_encoder", "text_encoder_2", "tokenizer", "scheduler"]),
        ("text*", ["text_encoder", "text_encoder_2"]),
        ("*er", ["text_encoder", "tokenizer", "scheduler"]),
        ("*enc*", ["text_encoder", "text_encoder_2"]),
        ("!text*|vae", ["unet", "tokenizer", "scheduler"]),
        ("*", NAMES),
        ("text", []),
    ],
)
def test_pattern_selects(pattern, expected):
    """Each pattern form selects exactly the names it describes."""
    assert select(pattern) == expected


@pytest.mark.parametrize("pattern", ["", "!", "unet||vae", "u*n*et"])
def test_malformed_pattern_is_value_error(pattern):
    """Empty terms and inner '*' are rejected with a ValueError naming the pattern."""
    with pytest.raises(ValueError, match="Search pattern"):
        compile_pattern(pattern)


def test_non_string_pattern_is_type_error():
    """A pattern must be a str."""
    with pytest.raises(TypeError, match="Search pattern must be a str"):
        compile_pattern(["unet"])


_word = st.text(alphabet="abcdefgh_", min_size=1, max_size=6)


@given(st.lists(_word, min_size=1, max_size=4), _word)
def test_negation_is_complement(terms, name):
    """'!p' matches exactly the names 'p' does not."""
    pattern = "|".join(terms)
    assert compile_pattern("!" + pattern)(name) != compile_pattern(pattern)(name)


@given(_word, _word)
def test_wildcards_agree_with_str_methods(core, name):
    """x* is startswith, *x is endswith, *x* is containment, x is equality."""
    assert compile_pattern(core + "*")(name) == name.startswith(core)
    assert compile_pattern("*" + core)(name) == name.endswith(core)
    assert compile_pattern("*" + core + "*")(name) == (core in name)
    assert compile_pattern(core)(name) == (name == core)
