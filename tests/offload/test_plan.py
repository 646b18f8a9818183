"""The execution plan follows uses, learns loops and predicts the rest of the run."""

from offload import ExecutionPlan


def test_upcoming_is_the_rest_of_the_run():
    """After the text encoder, the rest of the plan follows in order."""
    plan = ExecutionPlan(["te", "unet", "vae"])
    plan.observe("te")
    assert plan.upcoming("unet") == ("vae",)
    assert plan.upcoming("te") == ("unet", "vae")


def test_a_backward_jump_is_learned_as_a_loop():
    """Using controlnet again after unet marks [controlnet, unet] as a loop body."""
    plan = ExecutionPlan(["te", "controlnet", "unet", "vae"])
    for model in ["te", "controlnet", "unet", "controlnet"]:
        plan.observe(model)
    assert plan.loops == {(1, 2)}
    assert plan.upcoming("unet") == ("controlnet", "unet", "vae")


def test_starting_over_is_not_a_loop():
    """Going back to the first model starts a new cycle; no loop is recorded."""
    plan = ExecutionPlan(["te", "unet", "vae"])
    for model in ["te", "unet", "vae", "te"]:
        plan.observe(model)
    assert plan.loops == set()
    assert plan.cursor == 0


def test_repeated_model_resolves_to_its_next_occurrence():
    """A model listed twice (VAE encode then decode) maps to the occurrence after the cursor."""
    plan = ExecutionPlan(["vae", "unet", "vae"])
    plan.observe("vae")
    plan.observe("unet")
    assert plan.locate("vae") == 2
    assert plan.upcoming("vae") == ()
