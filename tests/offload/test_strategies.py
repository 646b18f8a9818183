"""Strategies pick victims from the request alone: next use, the peer's smallest set, LRU."""

from types import SimpleNamespace
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from offload import LRUStrategy, NextUseStrategy, OffloadRequest, SmallestSufficientSet

GB = 10**9


def request(nbytes, free, residents, upcoming=(), recent_plans=(), last_used=None):
    return OffloadRequest(
        model_id="incoming",
        nbytes=nbytes,
        free=free,
        residents=residents,
        upcoming=tuple(upcoming),
        recent_plans=tuple(tuple(p) for p in recent_plans),
        last_used=last_used or {},
    )


def test_next_use_evicts_the_model_needed_furthest_ahead():
    """Of two equal models, the one the plan needs later goes."""
    req = request(
        4, 0, {"a": 4, "b": 4}, upcoming=["a", "x", "b"], recent_plans=[["incoming", "a", "x", "b"]]
    )
    assert NextUseStrategy().select_victims(req) == ["b"]


def test_next_use_keeps_the_denoiser_over_a_once_per_image_encoder():
    """Inside the loop, a model needed again this iteration outranks the text encoder used once per image."""
    plan = ["text_encoder", "controlnet", "unet", "vae"]
    req = request(
        3 * GB,
        0,
        {"text_encoder": 9 * GB, "unet": 22 * GB},
        upcoming=["unet", "controlnet", "unet", "vae"],
        recent_plans=[plan],
    )
    assert NextUseStrategy().select_victims(req) == ["text_encoder"]


def test_next_use_does_not_evict_a_small_model_alongside_a_sufficient_big_one():
    """A small model taken first is kept when the big one after it frees enough alone."""
    req = request(5, 0, {"small": 1, "big": 8, "soon": 9}, upcoming=["soon", "big"], recent_plans=[])
    assert NextUseStrategy().select_victims(req) == ["big"]


def test_next_use_evicts_models_outside_recent_plans_first():
    """A model no recent plan uses goes before one that the running pipeline uses again."""
    req = request(4, 0, {"other": 4, "mine": 4}, upcoming=[], recent_plans=[["mine", "incoming"]])
    assert NextUseStrategy().select_victims(req) == ["other"]


def test_next_use_without_plan_is_size_aware_recency():
    """Without a plan the least recently used goes, but not if a more recent one alone suffices after it."""
    residents = {"old": 2, "mid": 6, "new": 6}
    last_used = {"old": 1, "mid": 2, "new": 3}
    assert NextUseStrategy().select_victims(request(5, 0, residents, last_used=last_used)) == ["mid"]
    assert NextUseStrategy().select_victims(request(1, 0, residents, last_used=last_used)) == ["old"]


def test_lru_evicts_oldest_first_until_enough():
    """LRU takes the oldest residents in order until the shortfall is covered."""
    residents = {"old": 2, "mid": 6, "new": 6}
    last_used = {"old": 1, "mid": 2, "new": 3}
    assert LRUStrategy().select_victims(request(5, 0, residents, last_used=last_used)) == ["old", "mid"]


def test_smallest_sufficient_set_picks_smallest_total():
    """The subset with the smallest total that is still enough wins, even if it holds two models."""
    req = request(10, 3, {"a": 8, "b": 4, "c": 3, "d": 1})
    assert sorted(SmallestSufficientSet().select_victims(req)) == ["b", "c"]


def test_smallest_sufficient_set_evicts_everything_when_nothing_suffices():
    """If no subset frees enough, every resident is evicted (the peer's rule)."""
    req = request(100, 0, {"a": 8, "b": 4})
    assert sorted(SmallestSufficientSet().select_victims(req)) == ["a", "b"]


def _peer_victims(req):
    from diffusers.modular_pipelines import components_manager as peer

    def hook(model_id, size):
        model = SimpleNamespace(get_memory_footprint=lambda: size)
        return SimpleNamespace(model_id=model_id, model=model)

    backend = mock.Mock()
    backend.return_value.mem_get_info.return_value = (req.free, 10**12)
    strategy = peer.AutoOffloadStrategy(memory_reserve_margin=0)
    with mock.patch.object(peer, "TorchDeviceBackend", backend):
        chosen = strategy(
            hooks=[hook(m, s) for m, s in req.residents.items()],
            model_id=req.model_id,
            model=SimpleNamespace(get_memory_footprint=lambda: req.nbytes),
            execution_device="cuda",
        )
    return [h.model_id for h in chosen]


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 50), min_size=1, max_size=7),
    nbytes=st.integers(1, 200),
    free=st.integers(0, 40),
)
def test_smallest_sufficient_set_matches_diffusers_auto_offload_strategy(sizes, nbytes, free):
    """On any residents, SmallestSufficientSet evicts exactly what diffusers' AutoOffloadStrategy evicts."""
    if nbytes <= free:
        return  # the engine asks a strategy only when the model does not fit
    residents = {f"m{i}": s for i, s in enumerate(sizes)}
    req = request(nbytes, free, residents)
    assert sorted(SmallestSufficientSet().select_victims(req)) == sorted(_peer_victims(req))


@pytest.mark.parametrize("strategy", [NextUseStrategy(), LRUStrategy(), SmallestSufficientSet()])
@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=8), data=st.data())
def test_every_shipped_strategy_frees_enough_from_residents_only(strategy, sizes, data):
    """Victims are distinct residents and free at least the shortfall whenever that is possible."""
    residents = {f"m{i}": s for i, s in enumerate(sizes)}
    shortfall = data.draw(st.integers(1, sum(sizes)))
    order = data.draw(st.permutations(list(residents)))
    req = request(
        shortfall,
        0,
        residents,
        upcoming=order[:3],
        recent_plans=[order],
        last_used={m: i for i, m in enumerate(order)},
    )
    victims = strategy.select_victims(req)
    assert len(set(victims)) == len(victims)
    assert set(victims) <= set(residents)
    assert sum(residents[v] for v in victims) >= shortfall
