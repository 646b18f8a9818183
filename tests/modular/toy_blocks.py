"""Small pure-Python blocks for framework tests (no models)."""

import torch

from modular import (
    AutoPipelineBlocks,
    InputParam,
    LoopSequentialPipelineBlocks,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)


class AddOne(ModularPipelineBlocks):
    """x -> y = x + 1"""

    inputs = [InputParam("x", type_hint=int, required=True, description="a number")]

    intermediate_outputs = [OutputParam("y", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.y = block_state.x + 1
        self.set_block_state(state, block_state)
        return components, state


class Double(ModularPipelineBlocks):
    """y -> z = 2 * y (scale optional)"""

    inputs = [InputParam("y", type_hint=int, required=True), InputParam("scale", type_hint=int, default=2)]

    intermediate_outputs = [OutputParam("z", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.z = block_state.y * block_state.scale
        self.set_block_state(state, block_state)
        return components, state


class Negate(ModularPipelineBlocks):
    """y -> z = -y"""

    inputs = [InputParam("y", type_hint=int, required=True), InputParam("flip", type_hint=bool)]

    intermediate_outputs = [OutputParam("z", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.z = -block_state.y
        self.set_block_state(state, block_state)
        return components, state


class AddOneThenDouble(SequentialPipelineBlocks):
    """x -> (x + 1) * scale"""

    block_classes = [AddOne, Double]
    block_names = ["add", "double"]


class DoubleOrNegate(AutoPipelineBlocks):
    """Negates when `flip` is given, else doubles."""

    block_classes = [Negate, Double]
    block_names = ["negate", "double"]
    block_trigger_inputs = ["flip", None]


class Accumulate(ModularPipelineBlocks):
    """total += i (one loop iteration)"""

    inputs = [InputParam("total", type_hint=int)]

    intermediate_outputs = [OutputParam("total", type_hint=int)]

    def __call__(self, components, block_state, i):
        block_state.total = (block_state.total or 0) + i
        return components, block_state


class SumLoop(LoopSequentialPipelineBlocks):
    """Sums 0..n-1 into total."""

    block_classes = [Accumulate]
    block_names = ["accumulate"]

    @property
    def loop_inputs(self):
        return [InputParam("n", type_hint=int, required=True)]

    @property
    def loop_intermediate_outputs(self):
        return [OutputParam("total", type_hint=int)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.total = 0
        with self.progress_bar(total=block_state.n) as bar:
            for i in range(block_state.n):
                components, block_state = self.loop_step(components, block_state, i=i)
                bar.update()
        self.set_block_state(state, block_state)
        return components, state


class MakeTensor(ModularPipelineBlocks):
    """z -> t (a tensor)"""

    inputs = [InputParam("z", type_hint=int, required=True)]

    intermediate_outputs = [OutputParam("t", type_hint=torch.Tensor)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.t = torch.full((2, 3), float(block_state.z))
        self.set_block_state(state, block_state)
        return components, state
