"""Sizes come from the real storage behind parameters and buffers."""

import torch

from offload import module_nbytes


def test_counts_parameters_and_buffers():
    """A Linear(4, 2) with bias and a 3-float buffer is (8 + 2 + 3) * 4 bytes."""
    module = torch.nn.Linear(4, 2)
    module.register_buffer("scale", torch.ones(3))
    assert module_nbytes(module) == 13 * 4


def test_tied_weights_count_once():
    """Two modules sharing one Parameter count its bytes once."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4, bias=False), torch.nn.Linear(4, 4, bias=False))
    model[1].weight = model[0].weight
    assert module_nbytes(model) == 16 * 4


def test_views_of_one_storage_count_the_whole_storage_once():
    """Parameters that are views of one storage count that storage once, whole."""
    base = torch.zeros(10)
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(base[:4])
    module.b = torch.nn.Parameter(base[4:6])
    assert module_nbytes(module) == 40


def test_meta_tensors_are_sized_without_allocation():
    """Meta parameters (data pointer 0) are each counted by their own storage."""
    module = torch.nn.Module()
    module.a = torch.nn.Parameter(torch.empty(10**9, dtype=torch.uint8, device="meta"), requires_grad=False)
    module.b = torch.nn.Parameter(torch.empty(5, dtype=torch.bfloat16, device="meta"), requires_grad=False)
    assert module_nbytes(module) == 10**9 + 10
