"""ModularPipeline: blocks bound to components (through an optional shared manager), and the call."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import attrs
import torch

from components import ComponentsManager, ComponentSpec
from components.load_id import LOAD_ID_FIELDS
from components.remote_code import RemoteCodeConsent
from modular.adapters.ip_adapter import IPAdapterMethods
from modular.adapters.lora import LoraMixin
from modular.adapters.model_changes import running
from modular.framework.block import ModularPipelineBlocks
from modular.framework.composite import run_steps
from modular.framework.planning import CallPlan, PlanCache, check_inputs, check_output, tagged_inputs
from modular.framework.state import PipelineState
from modular.framework.steps import Step, StepKind
from modular.pipeline.call_components import CallComponents, fresh_state
from modular.pipeline.component_methods import LIVE_PIPELINES, ComponentMethods
from modular.pipeline.config_components import config_spec_from_index
from modular.pipeline.devices import DeviceMethods
from modular.pipeline.index import CLASSIC_INDEX, absent_components, read_index, specs_from_index
from modular.pipeline.outputs import call_result
from modular.pipeline.replacement import check_replacements
from modular.watch.events import Preview, ProgressEvent
from modular.watch.keywords import call_watch_of
from modular.watch.watch import loops_of

__all__ = ["ModularPipeline"]

logger = logging.getLogger(__name__)


class ModularPipeline(ComponentMethods, DeviceMethods, LoraMixin, IPAdapterMethods):
    """Blocks plus one spec and (once loaded) one object per component.

    Make one with ``blocks.init_pipeline(repo, components_manager=cm)`` or
    ``ModularPipeline.from_pretrained(repo, components_manager=cm)``; neither loads weights. Then
    ``load_components()`` loads (or, through the manager, reuses) them and ``pipe(**inputs)`` runs.
    Blocks see the pipeline as ``components``: ``components.unet``, ``components.<config name>``.
    """

    def __init__(
        self,
        blocks: ModularPipelineBlocks,
        pretrained_model_name_or_path: str | os.PathLike | None = None,
        components_manager: ComponentsManager | None = None,
        collection: str | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        trust_remote_code: RemoteCodeConsent = False,
        _index: tuple[str, dict[str, Any]] | None = None,
        **loading: Any,
    ) -> None:
        _refuse_loading_options(type(self).__name__, loading)
        if not isinstance(blocks, ModularPipelineBlocks):
            msg = f"ModularPipeline needs blocks (a ModularPipelineBlocks), got {type(blocks).__name__}"
            raise TypeError(msg)
        if components_manager is not None and not isinstance(components_manager, ComponentsManager):
            msg = f"components_manager must be a ComponentsManager (got {type(components_manager).__name__})"
            raise TypeError(msg)
        self._blocks = blocks
        self._plans = PlanCache()  # forgotten when components change (and when blocks are edited)
        self._components_manager = components_manager
        self._collection = collection
        self._specs: dict[str, ComponentSpec] = {spec.name: spec for spec in blocks.expected_components}
        self._config: dict[str, Any] = {spec.name: spec.default for spec in blocks.expected_configs}
        self._components: dict[str, Any] = dict.fromkeys(self._specs)
        self._absent: set[str] = set()  # components the repo's index says it has none of
        self._unlisted: set[str] = set()  # of those, the ones a classic index does not list at all
        LIVE_PIPELINES.add(self)
        self._blocks_class_name = type(blocks).__name__
        self._workflow: str | None = None
        self.pretrained_model_name_or_path = None
        if pretrained_model_name_or_path is not None:
            repo = str(pretrained_model_name_or_path)
            self.pretrained_model_name_or_path = repo
            kind, index = _index or read_index(repo, revision=revision, token=token)
            specs, config = specs_from_index(kind, index, repo, revision, trust_remote_code=trust_remote_code)
            for name, spec in specs.items():
                if name in self._specs:
                    self._specs[name] = _merge_spec(self._specs[name], spec, os.path.join(repo, kind))
            for name, value in config.items():
                if name in self._config:
                    self._config[name] = value
            self._absent = {name for name in absent_components(kind, index) if name in self._specs}
            if kind == CLASSIC_INDEX:
                # As diffusers' classic loading: a component the index does not list is None (older Wan 2.1
                # repos predate transformer_2; Wan 2.2 TI2V's has no image_encoder).
                self._unlisted = {
                    name
                    for name, spec in self._specs.items()
                    if name not in index
                    and spec.default_creation_method == "from_pretrained"
                    and not spec.pretrained_model_name_or_path
                }
                self._absent |= self._unlisted
        made = {n: s.create() for n, s in self._specs.items() if s.default_creation_method == "from_config"}
        check_replacements(blocks, self._specs, made)  # e.g. a saved guider the blocks cannot serve
        for name, obj in made.items():
            self._set_component(name, obj)

    # ----- construction from a repo -----
    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        components_manager: ComponentsManager | None = None,
        collection: str | None = None,
        workflow: str | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        trust_remote_code: RemoteCodeConsent = False,
        **loading: Any,
    ) -> ModularPipeline:
        """A pipeline for a repo's index (no weights loaded). The family comes from the index's class
        name through the ``modular.blocks`` entry points; ``workflow=`` prunes to one named workflow.

        Raises:
            TypeError: a loading option (``torch_dtype=``, ``variant=``, ...): it goes to ``load_components``.
        """
        from modular.families import family_for_index

        _refuse_loading_options(f"{cls.__name__}.from_pretrained", loading)

        repo = str(pretrained_model_name_or_path)
        kind, index = read_index(repo, revision=revision, token=token)
        family = family_for_index(index, repo)
        full_blocks = family.blocks_for(index)()
        workflow = workflow or index.get("_workflow")
        blocks = full_blocks.get_workflow(workflow) if workflow is not None else full_blocks
        pipe = cls(
            blocks,
            repo,
            components_manager=components_manager,
            collection=collection,
            revision=revision,
            token=token,
            trust_remote_code=trust_remote_code,
            _index=(kind, index),
        )
        # A pruned workflow is saved as the family's blocks plus the workflow's name, so it comes back pruned.
        pipe._blocks_class_name = type(full_blocks).__name__
        pipe._workflow = workflow
        return pipe

    def save_pretrained(
        self,
        save_directory: str | os.PathLike,
        safe_serialization: bool = True,
        variant: str | None = None,
        max_shard_size: int | str | None = None,
        push_to_hub: bool = False,
        **kwargs: Any,
    ) -> None:
        """Write every loaded component and a ``modular_model_index.json`` into ``save_directory``.

        Only the component folders it writes and the index are added or replaced; other files stay. A kill at
        any point leaves the old complete save or the new one (see ``modular/pipeline/saving.py``). The keywords are
        the peer's: ``overwrite_modular_index`` (``False``: an index that keeps its components' sources,
        without their weights) and, with ``push_to_hub=True``, ``repo_id``, ``commit_message``, ``private``,
        ``create_pr`` and ``token`` (``modular/pipeline/save_options.py``). Every keyword is checked before anything
        is written.

        Raises:
            ValueError: an empty path or a bad keyword value; TypeError: an unknown keyword.
            SaveTargetInUseError: the save would replace files a loaded component reads its weights from.

        The save reads the models as a call does: a change of them in another thread (a LoRA fused, an
        IP-Adapter loaded) waits for it to end, and it waits for a change in progress.
        """
        from modular.pipeline.save_options import save_pretrained

        with running(
            self
        ):  # reads the weights: a change of them (a fuse in another thread) waits, and it for one
            save_pretrained(
                self, save_directory, safe_serialization, variant, max_shard_size, push_to_hub, **kwargs
            )

    # ----- components -----
    def __getattr__(self, name: str) -> Any:
        state = self.__dict__
        if "_components" in state and name in state["_components"]:
            return state["_components"][name]
        if "_config" in state and name in state["_config"]:
            return state["_config"][name]
        msg = f"{type(self).__name__} has no attribute, component or config named {name!r}"
        raise AttributeError(msg)

    @property
    def blocks(self) -> ModularPipelineBlocks:
        return self._blocks

    @property
    def blocks_class_name(self) -> str:
        """The name of the blocks class this pipeline stands for, as a saved index names it.

        After ``from_pretrained(..., workflow=...)`` it is the family's full blocks, not the pruned ones.
        """
        return self._blocks_class_name

    @property
    def components_manager(self) -> ComponentsManager | None:
        return self._components_manager

    @property
    def doc(self) -> str:
        return self._blocks.doc

    @property
    def default_call_parameters(self) -> dict[str, Any]:
        """Each named input of the blocks with its default (``None`` for a required one or a default by
        branch), as the peer's property of this name."""
        return {param.name: param.default for param in self._blocks.inputs if param.name}

    def set_progress_bar_config(self, **kwargs: Any) -> None:
        """Configure the progress bars of every loop in the blocks (``disable=True`` hides them)."""
        if hasattr(self._blocks, "set_progress_bar_config"):
            self._blocks.set_progress_bar_config(**kwargs)

    # ----- running -----
    #: diffusers' name for the flag a step callback sets to stop the denoising loop. A call resets it when it
    #: starts and leaves it as its callbacks set it (each call has its own flag while it runs).
    _interrupt = False
    #: The peer keeps the call's callback here while it runs; ours lives in the call's watch, so this stays None.
    _callback_on_step_end = None

    @property
    def interrupt(self) -> bool:
        """Whether the last call that ended was interrupted by its step callback (``pipeline.interrupt = True``)."""
        return self._interrupt

    @interrupt.setter
    def interrupt(self, value: bool) -> None:
        self._interrupt = bool(value)

    @property
    def callback_tensor_inputs(self) -> list[str]:
        """The names ``callback_on_step_end_tensor_inputs`` may list: those the blocks' denoising loops offer
        (which of them a call has depends on its workflow)."""
        return self._blocks.callback_tensor_inputs

    def __call__(
        self,
        state: PipelineState | None = None,
        output: str | list[str] | None = None,
        *,
        callback_on_step_end: Callable[..., dict[str, Any]] | None = None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        cancel: Any = None,
        on_progress: Callable[[ProgressEvent], Any] | None = None,
        preview_every: int | None = None,
        on_preview: Callable[[Preview], Any] | None = None,
        preview_decoder: Any = None,
        **kwargs: Any,
    ):
        """Run the blocks on these inputs under ``torch.inference_mode()``.

        Returns the final PipelineState, one value (``output="images"``) or a dict (``output=[...]``); its
        tensors are ordinary ones (not inference tensors), which the caller may change in place.
        Everything is checked before anything runs: unknown inputs, wrong types, missing inputs,
        unloaded components and unknown outputs are errors that change nothing. A change of one of its models
        by another thread (a LoRA or IP-Adapter call, a removal, on a pipeline sharing the model) waits for
        the call to end, and the call waits for a change in progress (``modular/adapters/model_changes.py``).

        Watching and stopping the call (docs/callbacks.md):
            callback_on_step_end: ``callback(pipeline, step_index, timestep, callback_kwargs) -> dict`` after
                every denoising step, as in diffusers (``PipelineCallback`` objects too); ``step_index`` counts
                the steps of every loop of the call; the dict's tensors replace the loop's. ``pipeline`` is the
                call's view of this pipeline: ``pipeline.interrupt = True`` skips the remaining steps.
            callback_on_step_end_tensor_inputs: the names in ``callback_kwargs`` (default ``["latents"]``; see
                ``callback_tensor_inputs``).
            cancel: a ``threading.Event`` or ``modular.CancelToken``; once set, the call raises
                ``modular.CallCancelled`` before its next block or step.
            on_progress: called with a ``modular.ProgressEvent`` as each block starts and ends and after
                each denoising step.
            on_preview, preview_every, preview_decoder: every ``preview_every`` steps (default 1),
                ``on_preview`` gets a ``modular.Preview`` of the current latents: RGB PIL images made by the
                family's latent-to-RGB map (at latent size), or by ``preview_decoder`` (a small VAE such as
                diffusers' ``AutoencoderTiny``, registered with the manager and placed by offload as the call's
                other models). Previews never change the call's result.

        Raises:
            TypeError, ValueError: a watching keyword of the wrong kind, or tensors a loop does not offer
                (before anything runs); tensors a loop has no value for (when it starts); a callback's result
                that is not a dict of names the loop offers and has (at its step). A call that fails leaves
                ``interrupt`` False.
            CallCancelled: ``cancel`` was set.
        """
        # diffusers resets the flag when a call starts, also for a call that then fails its checks.
        self._interrupt = False
        watch = call_watch_of(
            callback_on_step_end,
            callback_on_step_end_tensor_inputs,
            cancel,
            on_progress,
            preview_every,
            on_preview,
            preview_decoder,
        )
        # Running on its models from the plan on: a change of them (a LoRA, an IP-Adapter, a removal) by a
        # pipeline sharing them waits for this call to end, and this call for a change in progress.
        with running(
            self, () if watch is None or watch.preview_decoder is None else (watch.preview_decoder,)
        ):
            plan, inputs = self._plan(kwargs, state)
            check_output(output, plan, inputs.keys() | (state.values.keys() if state is not None else set()))
            if watch is not None:
                watch.check_loops(loops_of(plan.steps))
                if watch.on_preview is not None:
                    self._prepare_previews(plan, watch.preview_decoder)
            state = fresh_state(state)
            # Only what was given goes into the state: each block applies its own default to a missing value.
            for name, (value, kwargs_type) in inputs.items():
                state.set(name, value, kwargs_type)
            cm = self._components_manager
            if cm is not None:
                cm.set_execution_plan(
                    self._models_in_order(plan, None if watch is None else watch.preview_decoder)
                )
            view = CallComponents(self, watch)
            try:
                with torch.inference_mode():
                    _, state = run_steps(plan.steps, view, state, watch)
            finally:
                view.call_ended()  # a scale a step callback set for this call (call_ip_adapter_scale.py) ends
            if watch is not None:  # a call that failed leaves the flag reset (the peer's contract)
                self._interrupt = watch.interrupted
            return call_result(
                state, output
            )  # tensors cloned out of inference mode (modular/pipeline/outputs.py)

    def _models_in_order(
        self, plan: CallPlan, preview_decoder: torch.nn.Module | None = None
    ) -> list[torch.nn.Module]:
        """The models this call uses, in order; a repeat in a row says nothing new and is dropped. A preview
        decoder runs in every loop after its models (each loop body is listed once, as the engine's plan wants)."""
        uses: list[Any]
        if preview_decoder is None:  # every call: the plan's cached order
            uses = [self._components[name] for name in plan.component_uses]
        else:
            uses = []

            def walk(steps: Iterable[Step]) -> None:  # plan.component_uses' order, with the decoder added
                for step in steps:
                    uses.extend(self._components[spec.name] for spec in step.uses)
                    walk(step.body)
                    if step.kind is StepKind.LOOP:
                        uses.append(preview_decoder)

            walk(plan.steps)
        models: list[torch.nn.Module] = []
        for obj in uses:
            if isinstance(obj, torch.nn.Module) and (not models or models[-1] is not obj):
                models.append(obj)
        return models

    def _prepare_previews(self, plan: CallPlan, decoder: torch.nn.Module | None) -> None:
        """Before the run: each loop can read this call's latents with its map or ``decoder``, and the decoder
        is in the manager (if not already, as the pipeline's own while it lives), so offload places it."""
        for loop in loops_of(plan.steps):
            loop.check_previews(self, decoder)
        cm = self._components_manager
        if decoder is not None and cm is not None and cm.get_id(decoder) is None:
            cm.add("preview_decoder", decoder, owner=self)

    def _plan(self, kwargs: dict[str, Any], state: PipelineState | None) -> tuple[CallPlan, dict]:
        """The checked plan for this call (made once per set of given input names) and its tagged inputs."""
        params = self._plans.params(self._blocks)
        check_inputs(type(self).__name__, params, kwargs, self._blocks)
        inputs = tagged_inputs(params, kwargs)  # a group given as one dict is spread into its members
        given = {**(state.values if state is not None else {}), **{k: v for k, (v, _) in inputs.items()}}
        absent, unlisted = frozenset(self._absent), frozenset(self._unlisted)
        return self._plans.plan(self._blocks, given, self._components, absent, unlisted), inputs

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}(blocks={type(self._blocks).__name__}"]
        for name, spec in self._specs.items():
            obj = self._components[name]
            state = "not loaded" if obj is None else type(obj).__name__
            lines.append(f"  {name}: {state}  [{spec.load_id}]")
        return "\n".join(lines) + "\n)"


def _merge_spec(declared: ComponentSpec, from_index: ComponentSpec, source: str) -> ComponentSpec:
    """The blocks' spec with the loading fields (and a more precise type) the index gives; a from-config
    component is made from the config the entry points at (``modular/pipeline/config_components.py``)."""
    if declared.default_creation_method == "from_config":
        return config_spec_from_index(declared, from_index, source)
    changes: dict[str, Any] = {key: getattr(from_index, key) for key in LOAD_ID_FIELDS}
    if from_index.type_hint is not None:
        changes["type_hint"] = from_index.type_hint
    return attrs.evolve(declared, **changes)


def _refuse_loading_options(where: str, given: dict[str, Any]) -> None:
    """A diffusers habit, ``from_pretrained(repo, torch_dtype=...)``: making a pipeline loads no weights, so the
    options of loading them go to ``load_components`` (the peer ignores them with a warning)."""
    if not given:
        return
    from components.load_kwargs import LOAD_OPTIONS

    loading = [name for name in given if name in (*LOAD_OPTIONS, *LOAD_ID_FIELDS)]
    if loading:
        shown = ", ".join(f"{name}=..." for name in loading)
        msg = (
            f"{where}() got {shown}: making a pipeline loads no weights; pass it to "
            f"pipe.load_components({shown}) (or per component, e.g. {loading[0]}={{'unet': ..., 'default': ...}})"
        )
    else:
        msg = f"{where}() got an unexpected keyword argument {next(iter(given))!r}"
    raise TypeError(msg)
