"""Blocks declare components, configs, inputs and outputs as class attributes or as properties."""

import torch

from components import ComponentSpec
from modular import InputParam, ModularPipelineBlocks, OutputParam, SequentialPipelineBlocks


class Declared(ModularPipelineBlocks):
    description = "Doubles x."
    expected_components = [ComponentSpec("scheduler", object)]
    inputs = [InputParam("x", type_hint=torch.Tensor, required=True)]
    intermediate_outputs = [OutputParam("y", type_hint=torch.Tensor)]

    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        block_state.y = block_state.x * 2
        self.set_block_state(state, block_state)
        return components, state


class Extended(Declared):
    # A subclass builds on its parent's declaration at class level, as a property would with super().
    inputs = [*Declared.inputs, InputParam("scale", default=1.0)]


class Computed(ModularPipelineBlocks):
    @property
    def inputs(self):
        return [InputParam("z")]


def test_a_class_declaration_reads_as_a_list_like_a_property():
    block = Declared()
    assert isinstance(block.inputs, list)
    assert [p.name for p in block.inputs] == ["x"]
    assert block.required_inputs == ["x"]
    assert block.intermediate_output_names == ["y"]
    assert [s.name for s in block.expected_components] == ["scheduler"]
    assert block.description == "Doubles x."


def test_extending_a_returned_list_changes_neither_the_class_nor_other_instances():
    first, second = Declared(), Declared()
    first.inputs.append(InputParam("intruder"))
    Declared.inputs.append(InputParam("intruder"))
    assert [p.name for p in second.inputs] == ["x"]
    assert [p.name for p in Declared().inputs] == ["x"]
    assert [p.name for p in first.inputs] == ["x"]


def test_a_subclass_extends_its_parents_declaration():
    assert [p.name for p in Extended().inputs] == ["x", "scale"]
    assert [p.name for p in Declared().inputs] == ["x"]


def test_declared_and_computed_blocks_compose():
    blocks = SequentialPipelineBlocks.from_blocks_dict({"double": Extended(), "other": Computed()})
    assert {p.name for p in blocks.inputs} == {"x", "scale", "z"}
    assert blocks.intermediate_output_names == ["y"]
