"""Property tests: composition checks and aggregated inputs on random block graphs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from modular import (
    BlockCompositionError,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    SequentialPipelineBlocks,
)

NAMES = ["a", "b", "c", "d", "e"]


def make_block(index, reads, writes):
    """A leaf that requires `reads` and writes each of `writes` as the sum of what it read plus one."""

    class Leaf(ModularPipelineBlocks):
        inputs = [InputParam(name, type_hint=int, required=True) for name in reads]

        intermediate_outputs = [OutputParam(name, type_hint=int) for name in writes]

        def __call__(self, components, state):
            block_state = self.get_block_state(state)
            total = sum(getattr(block_state, name) for name in reads) + 1
            for name in writes:
                setattr(block_state, name, total)
            self.set_block_state(state, block_state)
            return components, state

    Leaf.__name__ = f"Leaf{index}"
    return Leaf()


graphs = st.lists(
    st.tuples(
        st.sets(st.sampled_from(NAMES), max_size=2), st.sets(st.sampled_from(NAMES), min_size=1, max_size=2)
    ),
    min_size=1,
    max_size=5,
)


def expected_problem(graph):
    produced = set()
    for index, (reads, writes) in enumerate(graph):
        # A later block that requires the value too only changes it: the next stage, not a wrong order.
        for name in reads - produced:
            if any(name in w and name not in r for r, w in graph[index + 1 :]):
                return True
        produced |= writes
    return False


@settings(max_examples=150, deadline=None)
@given(graphs)
def test_composition_refuses_exactly_inputs_that_only_later_blocks_produce(graph):
    """Building a sequence fails iff some block needs a value that only a later block produces, one that makes
    it without requiring it."""
    blocks = {f"step{i}": make_block(i, reads, writes) for i, (reads, writes) in enumerate(graph)}
    try:
        composed = SequentialPipelineBlocks.from_blocks_dict(blocks)
    except BlockCompositionError:
        assert expected_problem(graph)
        return
    assert not expected_problem(graph)
    produced, needed = set(), []
    for reads, writes in graph:
        needed += [name for name in sorted(reads) if name not in produced and name not in needed]
        produced |= writes
    assert sorted(composed.required_inputs) == sorted(needed)
    pipe = composed.init_pipeline()
    state = pipe(**dict.fromkeys(needed, 1))
    assert produced <= set(state.values)
