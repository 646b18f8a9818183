"""IP-Adapter steps the families share: the image prompt's inputs, its encoding, and what the denoiser passes on.

An IP-Adapter (loaded with ``pipe.load_ip_adapter``) adds image-prompt projections to the denoiser's
cross-attention. A family's ``ip_adapter`` stage runs only when a call gives an IP-Adapter input; it checks
that an adapter is loaded, encodes the image prompt (one entry per loaded adapter) and hands the denoiser
``ip_adapter_image_embeds`` and ``negative_ip_adapter_image_embeds``: per adapter, one ``[1, images, dim]``
(or ``[1, images, tokens, dim]``) tensor, which the denoiser repeats for every image of the batch, as the
classic pipelines' ``prepare_ip_adapter_image_embeds`` does. A call without these inputs plans and runs as
if the stage were not there.
"""

from __future__ import annotations

from typing import Any

import torch

# diffusers' projection classes (diffusers.models.embeddings) are imported by the functions that test for them,
# when an adapter is used: importing a family's blocks imports no diffusers model module.
from components.model_info import IP_ADAPTER_ENCODER, IP_ADAPTER_SOURCE
from modular import (
    BlockState,
    ConditionalPipelineBlocks,
    InputParam,
    ModularPipelineBlocks,
    OutputParam,
    PipelineState,
)
from modular.framework.params import INPUT_TEMPLATES

from .workflows import STAGES

__all__ = [
    "IP_ADAPTER_DENOISER_INPUTS",
    "IP_ADAPTER_STAGE",
    "IPAdapterEmbedsStep",
    "IPAdapterImageStep",
    "IPAdapterStep",
    "STAGES_WITH_IP_ADAPTER",
    "denoiser_ip_embeds",
    "loaded_projections",
]

IP_ADAPTER_STAGE = "ip_adapter"
# Right after the input checks: a call with IP-Adapter inputs and no adapter loaded is refused before any model runs.
STAGES_WITH_IP_ADAPTER = (STAGES[0], IP_ADAPTER_STAGE, *STAGES[1:])
"""The stages of a family that takes image prompts."""

_EMBEDS_HINT = list[torch.Tensor]
_IMAGE_HINT = INPUT_TEMPLATES["image"]["type_hint"] | list  # a list of images per adapter, too
_PER_ADAPTER = "one entry per loaded IP-Adapter (a single value stands for a list of one)"

IP_ADAPTER_IMAGE = InputParam(
    "ip_adapter_image", type_hint=_IMAGE_HINT, description=f"The image prompt: {_PER_ADAPTER}."
)
NEGATIVE_IP_ADAPTER_IMAGE = InputParam(
    "negative_ip_adapter_image",
    type_hint=_IMAGE_HINT,
    description=f"The image prompt of the unconditional prediction: {_PER_ADAPTER}.",
)
IP_ADAPTER_IMAGE_EMBEDS = InputParam(
    "ip_adapter_image_embeds",
    type_hint=_EMBEDS_HINT,
    description=(
        "Image-prompt embeddings instead of ip_adapter_image: one [1, images, dim] tensor (or [1, images, "
        "tokens, dim] for IP-Adapter Plus) per loaded IP-Adapter."
    ),
)
NEGATIVE_IP_ADAPTER_IMAGE_EMBEDS = InputParam(
    "negative_ip_adapter_image_embeds",
    type_hint=_EMBEDS_HINT,
    description="Image-prompt embeddings of the unconditional prediction, shaped as ip_adapter_image_embeds.",
)
IP_ADAPTER_DENOISER_INPUTS = (IP_ADAPTER_IMAGE_EMBEDS, NEGATIVE_IP_ADAPTER_IMAGE_EMBEDS)
"""What a denoiser reads of the image prompt (absent: the call has none)."""

_OUTPUTS = [
    OutputParam(
        "ip_adapter_image_embeds",
        type_hint=_EMBEDS_HINT,
        description="Image-prompt embeddings, one [1, images, ...] tensor per loaded IP-Adapter.",
    ),
    OutputParam(
        "negative_ip_adapter_image_embeds",
        type_hint=_EMBEDS_HINT,
        description="Image-prompt embeddings of the unconditional prediction, or None where none is needed.",
    ),
]


def loaded_projections(components: Any, denoiser_name: str, block_name: str) -> list[torch.nn.Module]:
    """The image projection of each IP-Adapter loaded into the denoiser.

    Raises:
        ValueError: no IP-Adapter is loaded (the message says how to load one).
    """
    projection = getattr(getattr(components, denoiser_name, None), "encoder_hid_proj", None)
    from diffusers.models.embeddings import MultiIPAdapterImageProjection

    if not isinstance(projection, MultiIPAdapterImageProjection):
        msg = (
            f"{block_name}: IP-Adapter inputs were given, but no IP-Adapter is loaded into {denoiser_name!r}; "
            "call pipe.load_ip_adapter(...) first, or leave out ip_adapter_image / ip_adapter_image_embeds"
        )
        raise ValueError(msg)
    return list(projection.image_projection_layers)


def _per_adapter(value: Any, count: int, name: str, block_name: str) -> list[Any]:
    values = value if isinstance(value, list) else [value]
    if len(values) != count:
        msg = (
            f"{block_name}: {name} needs one entry per loaded IP-Adapter: {count} loaded, {len(values)} given; "
            f"pass a list of {count}"
        )
        raise ValueError(msg)
    return values


class _IPAdapterStepBase(ModularPipelineBlocks):
    """What the image and the embeddings steps share: the denoiser they read the adapters of, and outputs."""

    #: The component the IP-Adapter is loaded into (``"unet"`` or ``"transformer"``).
    denoiser_name = "unet"

    intermediate_outputs = list(_OUTPUTS)

    def projections(self, components: Any) -> list[torch.nn.Module]:
        return loaded_projections(components, self.denoiser_name, type(self).__name__)

    def __call__(self, components: Any, state: PipelineState) -> tuple[Any, PipelineState]:
        block_state = self.get_block_state(state)
        self.prepare(components, block_state, self.projections(components))
        self.set_block_state(state, block_state)
        return components, state

    def prepare(self, components: Any, block_state: BlockState, projections: list[torch.nn.Module]) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement prepare()")


class IPAdapterImageStep(_IPAdapterStepBase):
    """Encode the image prompt with the image encoder, once per loaded IP-Adapter.

    The ``image_encoder`` (a ``CLIPVisionModelWithProjection``) and ``feature_extractor`` (a
    ``CLIPImageProcessor``) are the pipeline's once ``load_ip_adapter`` has loaded them; they are not declared
    as the block's components, so that a pipeline without an IP-Adapter has the components it had without
    this step.

    A plain IP-Adapter takes the encoder's ``image_embeds``; the others (Plus, Full Face) its penultimate
    hidden states. Without a negative image prompt, the unconditional embeddings are zeros (plain) or the
    encoding of a zero image (the others), as in the classic pipelines.
    """

    description = (
        "Encodes ip_adapter_image (and negative_ip_adapter_image) with the image encoder, one entry per "
        "loaded IP-Adapter, into ip_adapter_image_embeds and negative_ip_adapter_image_embeds."
    )

    inputs = [
        IP_ADAPTER_IMAGE,
        NEGATIVE_IP_ADAPTER_IMAGE,
        IP_ADAPTER_IMAGE_EMBEDS,
        NEGATIVE_IP_ADAPTER_IMAGE_EMBEDS,
    ]

    def pixels(self, components: Any, image: Any) -> torch.Tensor:
        """The image prompt as the image encoder's input [N, 3, size, size]."""
        encoder = components.image_encoder
        if not isinstance(image, torch.Tensor):
            image = components.feature_extractor(image, return_tensors="pt").pixel_values
        return image.to(device=components._execution_device, dtype=next(encoder.parameters()).dtype)

    @staticmethod
    def encode(components: Any, pixels: torch.Tensor, hidden_states: bool) -> torch.Tensor:
        """[1, N, dim] image embeddings, or [1, N, tokens, dim] penultimate hidden states."""
        if hidden_states:
            encoded = components.image_encoder(pixels, output_hidden_states=True).hidden_states[-2]
        else:
            encoded = components.image_encoder(pixels).image_embeds
        return encoded[None, :]

    def default_positive(self, components: Any, block_state: BlockState, count: int) -> list[Any]:
        """The image prompt when only a negative one is given: refused here; a family may supply one."""
        msg = f"{type(self).__name__}: negative_ip_adapter_image needs ip_adapter_image too; pass ip_adapter_image"
        raise ValueError(msg)

    def default_negative(
        self, components: Any, projection: torch.nn.Module, pixels: torch.Tensor, positive: torch.Tensor
    ) -> torch.Tensor:
        """The unconditional embeddings of one adapter when no negative image prompt is given."""
        from diffusers.models.embeddings import ImageProjection

        if isinstance(projection, ImageProjection):
            return torch.zeros_like(positive)
        return self.encode(components, torch.zeros_like(pixels), hidden_states=True)

    def no_image_encoder(self, components: Any) -> str:
        """Why this pipeline has no image encoder for the loaded IP-Adapter, and what to do.

        The adapter lives in the denoiser, which other pipelines may share: one loaded through another pipeline
        (with its image encoder, which that pipeline holds) is said so, naming that pipeline.
        """
        name = type(self).__name__
        denoiser = getattr(components, self.denoiser_name, None)
        loaded_by = getattr(denoiser, IP_ADAPTER_SOURCE, None)
        encoder = getattr(denoiser, IP_ADAPTER_ENCODER, None)
        if encoder is not None:
            return (
                f"{name}: an image prompt needs the image encoder, and this pipeline holds none: the IP-Adapter in "
                f"{self.denoiser_name!r} was loaded through another pipeline sharing the model ({loaded_by}), "
                f"with image encoder {encoder}. Call pipe.load_ip_adapter(...) on this pipeline too (the image "
                "encoder is reused through the manager), or pass ip_adapter_image_embeds"
            )
        by = f" (it was loaded by {loaded_by})" if loaded_by else ""
        return (
            f"{name}: an image prompt needs the image encoder, and the IP-Adapter was loaded without one; "
            f"pass ip_adapter_image_embeds, or load the adapter again with its image_encoder_folder{by}"
        )

    def prepare(self, components: Any, block_state: BlockState, projections: list[torch.nn.Module]) -> None:
        name = type(self).__name__
        if (
            getattr(components, "image_encoder", None) is None
            or getattr(components, "feature_extractor", None) is None
        ):
            raise ValueError(self.no_image_encoder(components))
        if (
            block_state.ip_adapter_image_embeds is not None
            or block_state.negative_ip_adapter_image_embeds is not None
        ):
            msg = (
                f"{name}: pass the image prompt either as images (ip_adapter_image) or as embeddings "
                "(ip_adapter_image_embeds), not both"
            )
            raise ValueError(msg)
        count = len(projections)
        images = (
            self.default_positive(components, block_state, count)
            if block_state.ip_adapter_image is None
            else _per_adapter(block_state.ip_adapter_image, count, "ip_adapter_image", name)
        )
        negatives = (
            None
            if block_state.negative_ip_adapter_image is None
            else _per_adapter(block_state.negative_ip_adapter_image, count, "negative_ip_adapter_image", name)
        )
        from diffusers.models.embeddings import ImageProjection

        positive_embeds, negative_embeds = [], []
        for index, (image, projection) in enumerate(zip(images, projections)):
            hidden_states = not isinstance(projection, ImageProjection)
            pixels = self.pixels(components, image)
            embeds = self.encode(components, pixels, hidden_states)
            positive_embeds.append(embeds)
            if negatives is None:
                negative_embeds.append(self.default_negative(components, projection, pixels, embeds))
            else:
                negative_pixels = self.pixels(components, negatives[index])
                negative_embeds.append(self.encode(components, negative_pixels, hidden_states))
        block_state.ip_adapter_image_embeds = positive_embeds
        block_state.negative_ip_adapter_image_embeds = negative_embeds


class IPAdapterEmbedsStep(_IPAdapterStepBase):
    """Check precomputed image-prompt embeddings against the loaded IP-Adapters and pass them on.

    Without negative embeddings, zeros stand in for them (what the image path uses for a plain IP-Adapter).
    """

    description = (
        "Checks ip_adapter_image_embeds (one [1, images, ...] tensor per loaded IP-Adapter) and "
        "negative_ip_adapter_image_embeds (zeros when not given) and passes them to the denoiser."
    )

    inputs = [IP_ADAPTER_IMAGE_EMBEDS, NEGATIVE_IP_ADAPTER_IMAGE_EMBEDS]

    def _checked(self, value: Any, count: int, name: str) -> list[torch.Tensor]:
        embeds = _per_adapter(value, count, name, type(self).__name__)
        for index, tensor in enumerate(embeds):
            if not isinstance(tensor, torch.Tensor) or tensor.ndim not in (3, 4) or tensor.shape[0] != 1:
                shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
                msg = (
                    f"{type(self).__name__}: {name}[{index}] must be a [1, images, dim] or [1, images, tokens, "
                    f"dim] tensor (got {shape}); pass the unconditional half as negative_ip_adapter_image_embeds"
                )
                raise ValueError(msg)
        return embeds

    def default_negative(
        self, block_state: BlockState, positive: list[torch.Tensor]
    ) -> list[torch.Tensor] | None:
        """The unconditional embeddings when none are given: zeros shaped as the positive ones."""
        return [torch.zeros_like(embeds) for embeds in positive]

    def prepare(self, components: Any, block_state: BlockState, projections: list[torch.nn.Module]) -> None:
        count = len(projections)
        if block_state.ip_adapter_image_embeds is None:
            msg = (
                f"{type(self).__name__}: negative_ip_adapter_image_embeds needs ip_adapter_image_embeds too; "
                "pass ip_adapter_image_embeds"
            )
            raise ValueError(msg)
        positive = self._checked(block_state.ip_adapter_image_embeds, count, "ip_adapter_image_embeds")
        if block_state.negative_ip_adapter_image_embeds is None:
            negative = self.default_negative(block_state, positive)
        else:
            name = "negative_ip_adapter_image_embeds"
            negative = self._checked(block_state.negative_ip_adapter_image_embeds, count, name)
            for index, (neg, pos) in enumerate(zip(negative, positive)):
                if neg.shape != pos.shape:
                    msg = (
                        f"{type(self).__name__}: {name}[{index}] has shape {list(neg.shape)}, "
                        f"ip_adapter_image_embeds[{index}] {list(pos.shape)}; pass tensors of one shape"
                    )
                    raise ValueError(msg)
        block_state.ip_adapter_image_embeds = positive
        block_state.negative_ip_adapter_image_embeds = negative


class IPAdapterStep(ConditionalPipelineBlocks):
    """The image prompt: encoded from images, or given as embeddings; nothing runs without either.

    SD and SDXL use it as it is; a family whose steps differ (Flux's true-CFG negatives) subclasses it with
    its own ``block_classes``.
    """

    block_classes = [IPAdapterImageStep, IPAdapterEmbedsStep]
    block_names = ["ip_adapter_image_encoder", "ip_adapter_embeds"]
    block_trigger_inputs = [
        "ip_adapter_image",
        "negative_ip_adapter_image",
        "ip_adapter_image_embeds",
        "negative_ip_adapter_image_embeds",
    ]

    description = (
        "The IP-Adapter image prompt: `ip_adapter_image_encoder` when ip_adapter_image or "
        "negative_ip_adapter_image is given, `ip_adapter_embeds` when only embeddings are, nothing otherwise."
    )

    def select_block(self, **trigger_values: Any) -> str | None:
        image, embeds = self.block_names
        if trigger_values.get("ip_adapter_image") is not None:
            return image
        if trigger_values.get("negative_ip_adapter_image") is not None:
            return image
        if any(trigger_values.get(name) is not None for name in self.trigger_inputs):
            return embeds
        return None

    def selects_on_presence(self) -> bool:
        return True

    def branch_conditions(self) -> dict[str, str]:
        image, embeds = self.block_names
        return {
            image: "when ip_adapter_image or negative_ip_adapter_image given",
            embeds: "when only ip_adapter_image_embeds or negative_ip_adapter_image_embeds given",
        }


def _repeated(embeds: list[torch.Tensor], batch: int, device: torch.device) -> list[torch.Tensor]:
    return [torch.cat([tensor] * batch, dim=0).to(device) for tensor in embeds]


def denoiser_ip_embeds(
    components: Any,
    block_state: BlockState,
    denoiser_name: str,
    block_name: str,
    *,
    negative: bool = False,
    guided: bool = False,
) -> list[torch.Tensor] | None:
    """The image-prompt embeddings the denoiser takes, one [batch, ...] tensor per adapter, or ``None``.

    ``negative`` gives the unconditional ones (Flux's true CFG); ``guided`` the unconditional and conditional
    ones stacked, negatives first (a UNet's classifier-free guidance batch). The batch is the latents'.

    Raises:
        ValueError: an IP-Adapter is loaded into the denoiser but the call gives no image prompt.
    """
    positive = block_state.ip_adapter_image_embeds
    if positive is None:
        projection = getattr(getattr(components, denoiser_name), "encoder_hid_proj", None)
        from diffusers.models.embeddings import MultiIPAdapterImageProjection

        if isinstance(projection, MultiIPAdapterImageProjection):
            msg = (
                f"{block_name}: an IP-Adapter is loaded into {denoiser_name!r}, so each call needs an image "
                "prompt; pass ip_adapter_image or ip_adapter_image_embeds, or call pipe.unload_ip_adapter()"
            )
            raise ValueError(msg)
        return None
    batch, device = block_state.latents.shape[0], components._execution_device
    if negative:
        negatives = block_state.negative_ip_adapter_image_embeds
        return None if negatives is None else _repeated(negatives, batch, device)
    positive = _repeated(positive, batch, device)
    if not guided:
        return positive
    negatives = _repeated(block_state.negative_ip_adapter_image_embeds, batch, device)
    return [torch.cat([neg, pos], dim=0) for neg, pos in zip(negatives, positive)]
