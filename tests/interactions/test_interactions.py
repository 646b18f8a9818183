"""Where capabilities meet: sequences of operations over three pipelines on one manager (LoRA, IP-Adapter,
quantized loads, offload on random budgets, streaming, host budget and spill folder, several devices, save
and reload, remove and add, update_components, dropped pipelines, jobs through a scheduler on the same
manager, one cancelled) keep every output equal to a shadow run without offload, and every read of the
weights real (tests/interactions/machine.py).

CI runs a bounded number of examples, derandomized so that a failure reproduces. By hand:
``INTERACTIONS_EXAMPLES=2000 INTERACTIONS_SEED=7 pytest tests/interactions -k stateful`` (a seed draws other
examples; Hypothesis prints the failing steps and the seed).
"""

import os

import pytest
import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.stateful import run_state_machine_as_test

from .machine import InteractionMachine

EXAMPLES = int(os.environ.get("INTERACTIONS_EXAMPLES", "10"))
STEPS = int(os.environ.get("INTERACTIONS_STEPS", "8"))
SEED = os.environ.get("INTERACTIONS_SEED")


def test_stateful_operations_keep_outputs_equal_to_a_shadow_without_offload(files):
    """Every drawn sequence of operations keeps outputs, weight reads and the manager's facts equal to the
    shadow's, and every saved folder loads back to the output it was saved from."""
    InteractionMachine.files = files
    machine = InteractionMachine if SEED is None else hypothesis_seed(int(SEED))(InteractionMachine)
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            derandomize=SEED is None,
            database=None,
            print_blob=True,
            phases=[Phase.generate, Phase.shrink] if SEED is None else list(Phase),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )


class _PerturbedMachine(InteractionMachine):
    """The machine, with one weight of the side under test changed as it starts (or of both sides)."""

    both_sides = False

    def __init__(self):
        super().__init__()
        for side in (self.main, self.shadow) if self.both_sides else (self.main,):
            with torch.no_grad():
                next(side.pipes["sd_a"].unet.parameters()).view(-1)[0].add_(1e-3)


class _PerturbedBothMachine(_PerturbedMachine):
    both_sides = True


def run_once(machine):
    """One short example of ``machine``, no shrinking."""
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=1, stateful_step_count=1, deadline=None, database=None, phases=[Phase.generate]
        ),
    )


def test_a_weight_changed_on_one_side_fails_the_shadow_comparison(files):
    """The check can fail: one weight of the side under test changed by 1e-3 makes its output differ from the
    shadow's, and the machine reports it."""
    InteractionMachine.files = files
    with pytest.raises(AssertionError, match="outputs differ from the shadow's"):
        run_once(_PerturbedMachine)


def test_a_weight_changed_on_both_sides_fails_the_claim_of_source_weights(files):
    """The check can fail: a weight changed on both sides keeps the outputs equal, but the UNet still claims
    its repo's weights, and the machine reports it."""
    InteractionMachine.files = files
    with pytest.raises(AssertionError, match="claims the weights of"):
        run_once(_PerturbedBothMachine)


def test_a_served_result_unlike_the_shadows_call_fails_the_serving_check(files):
    """The check can fail: the side under test's Flux transformer changed (under the scheduler's served
    pipeline, which shares it) makes a served job's PNG differ from the shadow's direct call."""
    InteractionMachine.files = files
    machine = InteractionMachine()
    try:
        transformer = machine.scheduler().served.pipeline("flux").transformer
        with torch.no_grad():
            next(transformer.parameters()).add_(0.5)
        with pytest.raises(AssertionError, match="flux's result differs from the shadow's call"):
            machine.serve_a_job("flux", 0)
    finally:
        machine.teardown()
