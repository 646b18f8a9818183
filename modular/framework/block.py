"""The leaf block: the unit that declares components, configs, inputs and outputs, and runs."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from components import ComponentSpec, ConfigSpec
from modular.errors import MissingInputError, UnknownWorkflowError
from modular.framework.params import InputParam, OutputParam
from modular.framework.state import BlockState, PipelineState
from modular.framework.steps import Known, Step

if TYPE_CHECKING:
    import os

    from components import ComponentsManager
    from modular.pipeline.pipeline import ModularPipeline
    from modular.remote import BlockSource

__all__ = ["ModularPipelineBlocks"]


class _DeclaredList:
    """A list a block class declares as a class attribute (``inputs = [...]``).

    Each read returns a new list, as a property would: a caller that extends ``block.inputs`` changes
    neither the class nor any other instance. The items are frozen attrs classes, so sharing them is safe.
    """

    def __init__(self, items: list) -> None:
        self._items = tuple(items)

    def __get__(self, obj: object, owner: type | None = None) -> list:
        return list(self._items)


#: The declarations a class may give as plain lists; see :class:`_DeclaredList`.
_LIST_DECLARATIONS = ("expected_components", "expected_configs", "inputs", "intermediate_outputs")


class ModularPipelineBlocks:
    """Base of every block. A leaf block overrides the declarations and ``__call__``.

    Declarations are class attributes (``description = "..."``, ``inputs = [InputParam(...)]``), or
    properties where a block computes them (e.g. from its sub-blocks or its parent's declaration).
    ``__call__(components, state)`` reads its inputs with :meth:`get_block_state`, works with the
    models in ``components`` (the pipeline, or its per-call view: an object whose attributes are the
    components), writes its outputs with :meth:`set_block_state` and returns ``(components, state)``.
    """

    model_name: str | None = None
    #: Components this block runs without when the repo has none (its index lists them as ``[null, null]``,
    #: ``ModularPipeline.absent_component_names``): the plan leaves them out, and the block finds ``None``.
    #: A component that is only not loaded yet is still an error.
    optional_components: tuple[str, ...] = ()
    _workflow_map: dict[str, dict[str, Any]] | None = None
    #: Where a block loaded by :meth:`from_pretrained` came from (repo, revision, commit, content hash).
    source: BlockSource | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in _LIST_DECLARATIONS:
            declared = cls.__dict__.get(name)
            if isinstance(declared, list):
                setattr(cls, name, _DeclaredList(declared))

    # ----- declarations (leaf defaults) -----
    @property
    def description(self) -> str:
        return ""

    @property
    def expected_components(self) -> list[ComponentSpec]:
        return []

    @property
    def expected_configs(self) -> list[ConfigSpec]:
        return []

    @property
    def inputs(self) -> list[InputParam]:
        return []

    @property
    def intermediate_outputs(self) -> list[OutputParam]:
        return []

    @property
    def outputs(self) -> list[OutputParam]:
        return self.intermediate_outputs

    @property
    def sub_blocks(self) -> Mapping[str, ModularPipelineBlocks]:
        return {}

    # ----- derived names -----
    @property
    def required_inputs(self) -> list[str]:
        return [p.name for p in self.inputs if p.required and p.name]

    @property
    def input_names(self) -> list[str]:
        return [p.name for p in self.inputs if p.name]

    @property
    def intermediate_output_names(self) -> list[str]:
        return [p.name for p in self.intermediate_outputs if p.name]

    @property
    def output_names(self) -> list[str]:
        return [p.name for p in self.outputs if p.name]

    @property
    def component_names(self) -> list[str]:
        return [spec.name for spec in self.expected_components]

    # ----- selection -----
    def execution_steps(
        self, given: Known | Mapping[str, Any] | Iterable[str], path: tuple[str, ...] = ()
    ) -> list[Step]:
        """The steps that run, in order, for ``given`` input values (a mapping) or names (an iterable).

        Each block kind answers this one question; the call plan, :meth:`get_execution_blocks`, the docs
        and the run all use the answer. A leaf is one step. ``path`` names this block from the walked one;
        a walk passes its :class:`~modular.framework.steps.Known` down, to which each step adds what it produces.
        """
        known = Known.of(given)
        known.produced.update(self.intermediate_output_names)
        return [Step(self, path, uses=tuple(self.expected_components))]

    def get_execution_blocks(self, **inputs: Any) -> ModularPipelineBlocks | None:
        """The blocks that would run for these inputs (``None``: nothing runs); a leaf always runs."""
        return self

    @property
    def available_workflows(self) -> list[str]:
        if not self._workflow_map:
            msg = f"{type(self).__name__} defines no named workflows (its _workflow_map is empty)"
            raise NotImplementedError(msg)
        return list(self._workflow_map)

    def get_workflow(self, workflow_name: str) -> ModularPipelineBlocks | None:
        """The blocks of one named workflow, pruned to what runs for it (``None``: nothing runs)."""
        workflows = self.available_workflows
        if workflow_name not in workflows:
            close = difflib.get_close_matches(str(workflow_name), workflows, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            msg = f"{type(self).__name__} has no workflow {workflow_name!r}{hint}. Available workflows: {workflows}"
            raise UnknownWorkflowError(msg)
        assert self._workflow_map is not None  # available_workflows raised otherwise
        return self.get_execution_blocks(**self._workflow_map[workflow_name])

    # ----- state access -----
    def get_block_state(self, state: PipelineState) -> BlockState:
        """This block's inputs, read from ``state``; a missing or ``None`` value takes the input's default."""
        data: dict[str, Any] = {}
        for param in self.inputs:
            if param.name:
                value = state.values.get(param.name)
                if value is None:
                    value = param.default
                if value is None and param.required:
                    msg = f"{type(self).__name__} needs input {param.name!r}, which is missing; pass {param.name}=..."
                    raise MissingInputError(msg)
                if value is not None or param.name not in data:
                    data[param.name] = value
            elif param.kwargs_type:
                group = data.setdefault(param.kwargs_type, {})
                for key, value in state.get_by_kwargs(param.kwargs_type).items():
                    if value is not None:
                        data[key] = value
                        group[key] = value
        return BlockState(**data)

    def set_block_state(self, state: PipelineState, block_state: BlockState) -> None:
        """Write this block's outputs, and any inputs it replaced, back into ``state``."""
        values = block_state.__dict__
        for output in self.intermediate_outputs:
            if output.name not in values:
                msg = (
                    f"{type(self).__name__} declares output {output.name!r} but did not set it; "
                    f"set block_state.{output.name} before set_block_state"
                )
                raise ValueError(msg)
            state.set(output.name, values[output.name], output.kwargs_type)
        for param in self.inputs:
            if param.name:
                if param.name in values and state.values.get(param.name) is not values[param.name]:
                    state.set(param.name, values[param.name], param.kwargs_type)
            elif param.kwargs_type:
                for key, current in state.get_by_kwargs(param.kwargs_type).items():
                    if key in values and values[key] is not current:
                        state.set(key, values[key], param.kwargs_type)

    #: The block-state values a step callback may read and replace (``callback_on_step_end_tensor_inputs``);
    #: a denoising loop declares them (the names the family's classic pipeline offers), as the peer's blocks do.
    _callback_tensor_inputs: tuple[str, ...] = ()

    @property
    def callback_tensor_inputs(self) -> list[str]:
        """The names a step callback can ask for: this block's and its sub-blocks' (whichever loop runs)."""
        names = list(self._callback_tensor_inputs)
        for block in self.sub_blocks.values():
            names += [name for name in block.callback_tensor_inputs if name not in names]
        return names

    # ----- running -----
    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """Configure the progress bars of the loops in this block (a leaf has none)."""

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        msg = f"{type(self).__name__} must implement __call__(self, components, state)"
        raise NotImplementedError(msg)

    def init_pipeline(
        self,
        pretrained_model_name_or_path: str | None = None,
        components_manager: ComponentsManager | None = None,
        collection: str | None = None,
        **index_kwargs: Any,
    ) -> ModularPipeline:
        """Make a pipeline of these blocks; with a repo, its index file overrides the blocks' specs."""
        from modular.pipeline.pipeline import ModularPipeline

        return ModularPipeline(
            self,
            pretrained_model_name_or_path,
            components_manager=components_manager,
            collection=collection,
            **index_kwargs,
        )

    # ----- block repos (modular/remote/) -----
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        trust_remote_code: bool = False,
        revision: str | None = None,
        *,
        subfolder: str = "",
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        **block_kwargs: Any,
    ) -> ModularPipelineBlocks:
        """The block whose code a repo (local folder or hub id) holds, in the peer's layout.

        ``modular_config.json`` names ``"auto_map": {"ModularPipelineBlocks": "<module>.<Class>"}``; the code
        runs only with ``trust_remote_code=True``, from the files of ``revision`` as read once, with its
        ``diffusers.modular_pipelines`` imports giving this project's classes. ``block_kwargs`` go to the
        class. The result's ``source`` records the repo, revision, commit and content hash.

        Raises:
            BlockRepoError: no or a bad config, a missing file or class, a path outside the repo, untrusted
                code, unmet requirements, or a class that is not a block. Nothing of the repo ran or was
                registered, except in the last case, where nothing was registered.
            BlockCodeError: the code does not parse or fails to import (the original error is chained).
            RepoNotFoundError, RevisionNotFoundError: the repo or revision cannot be found.
        """
        from modular.remote import load_block

        return load_block(
            cls,
            pretrained_model_name_or_path,
            trust_remote_code=trust_remote_code,
            revision=revision,
            subfolder=subfolder,
            token=token,
            cache_dir=cache_dir,
            local_files_only=local_files_only,
            block_kwargs=block_kwargs,
        )

    def save_pretrained(self, save_directory: str | os.PathLike) -> None:
        """Write this block's class as a block repo: its module file (with the files it imports relatively)
        and a ``modular_config.json`` naming the class, so ``from_pretrained(save_directory)`` gives it back.

        Raises:
            BlockRepoError: the class has no module file to copy (``__main__``, interactive, exec'd), is not
                at the top level of its module, or imports relatively from above its module's folder.
        """
        from modular.remote import save_block

        save_block(self, save_directory)

    # ----- presentation -----
    @property
    def doc(self) -> str:
        from modular.framework.doc import make_doc

        return make_doc(self)

    def __repr__(self) -> str:
        from modular.framework.doc import make_tree

        return make_tree(self)
