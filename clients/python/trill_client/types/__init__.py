"""Data types of the trill serve protocol, named and shaped like Tinker's `tinker.types`.

Every type that is sent has `to_wire()` (the JSON value of docs/service.md); every result has
`from_wire()`. numpy and torch are never imported unless a method that returns them is called.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Union

__all__ = [
    "EncodedTextChunk", "ModelInput", "TensorData", "Datum", "SamplingParams", "AdamParams",
    "ForwardBackwardOutput", "OptimStepResponse", "SaveWeightsResponse",
    "SaveWeightsForSamplerResponse", "LoadWeightsResponse", "ModelData", "GetInfoResponse",
    "SupportedModel", "GetServerCapabilitiesResponse", "SampledSequence", "SampleResponse",
]


def _without_none(obj: Any) -> Dict[str, Any]:
    """A dataclass as a dict, fields left None dropped: the server applies its defaults."""
    return {k: v for k, v in dataclasses.asdict(obj).items() if v is not None}


def _flatten(value: Any, out: List[Any]) -> List[Any]:
    """Appends the numbers of a nested list/tuple/array/tensor, in row-major order, to out."""
    if isinstance(value, TensorData):
        out.extend(value.data)
        return out
    if hasattr(value, "tolist"):  # numpy array or scalar, torch tensor
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        for item in value:
            _flatten(item, out)
    else:
        out.append(value)
    return out


def _wire_dtype(dtype: Any) -> str:
    """Tinker's two dtypes: integers (and bools) travel as int64, everything else as float32."""
    name = str(dtype).replace("torch.", "")
    return "int64" if "int" in name or name == "bool" else "float32"


@dataclass
class EncodedTextChunk:
    """A run of token ids (Tinker's only chunk kind that trill serves)."""

    tokens: List[int]

    @property
    def length(self) -> int:
        return len(self.tokens)


@dataclass
class ModelInput:
    """A model's input sequence; sent as one flat list of token ids."""

    chunks: List[EncodedTextChunk] = field(default_factory=list)

    @classmethod
    def from_ints(cls, tokens: Any) -> "ModelInput":
        return cls([EncodedTextChunk([int(t) for t in _flatten(tokens, [])])])

    @classmethod
    def empty(cls) -> "ModelInput":
        return cls([])

    def to_ints(self) -> List[int]:
        return [t for chunk in self.chunks for t in chunk.tokens]

    @property
    def length(self) -> int:
        return sum(chunk.length for chunk in self.chunks)

    def append(self, chunk: EncodedTextChunk) -> "ModelInput":
        """A new ModelInput with chunk at the end (Tinker's inputs are immutable)."""
        return ModelInput(self.chunks + [chunk])

    def append_int(self, token: int) -> "ModelInput":
        return self.append(EncodedTextChunk([int(token)]))


@dataclass
class TensorData:
    """A tensor as flat data plus dtype and shape, the way Tinker carries loss inputs and outputs."""

    data: List[Union[int, float]]
    dtype: str
    shape: Optional[List[int]] = None

    @classmethod
    def from_numpy(cls, array: Any) -> "TensorData":
        return cls(array.reshape(-1).tolist(), _wire_dtype(array.dtype), list(array.shape))

    @classmethod
    def from_torch(cls, tensor: Any) -> "TensorData":
        return cls(tensor.detach().reshape(-1).tolist(), _wire_dtype(tensor.dtype), list(tensor.shape))

    @classmethod
    def from_any(cls, value: Any) -> "TensorData":
        """TensorData from a TensorData, numpy array, torch tensor, or (nested) list or tuple."""
        if isinstance(value, TensorData):
            return value
        if hasattr(value, "detach"):
            return cls.from_torch(value)
        if hasattr(value, "tolist") and hasattr(value, "shape") and hasattr(value, "dtype"):
            return cls.from_numpy(value)
        data = _flatten(value, [])
        shape: List[int] = []
        while isinstance(value, (list, tuple)):
            shape.append(len(value))
            value = value[0] if value else None
        size = 1
        for n in shape:
            size *= n
        dtype = "int64" if all(isinstance(x, int) for x in data) else "float32"
        return cls(data, dtype, shape if size == len(data) else None)

    def tolist(self) -> List[Any]:
        """The data nested by shape, as numpy's tolist() would give it."""
        def nest(flat: List[Any], shape: List[int]) -> List[Any]:
            if len(shape) <= 1:
                return list(flat)
            step = len(flat) // shape[0] if shape[0] else 0
            return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]
        return nest(self.data, self.shape or [])

    def to_numpy(self) -> Any:
        import numpy

        array = numpy.array(self.data, dtype=self.dtype)
        return array.reshape(self.shape) if self.shape is not None else array

    def to_torch(self) -> Any:
        import torch

        tensor = torch.tensor(self.data, dtype=getattr(torch, self.dtype))
        return tensor.reshape(self.shape) if self.shape is not None else tensor


@dataclass
class Datum:
    """One training sequence. loss_fn_inputs values become TensorData, as in Tinker."""

    model_input: ModelInput
    loss_fn_inputs: Dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.loss_fn_inputs = {k: TensorData.from_any(v) for k, v in self.loss_fn_inputs.items()}

    def to_wire(self) -> Dict[str, Any]:
        """Every input flat: the server knows the shapes (routed_experts is N x layers x k)."""
        return {"model_input": self.model_input.to_ints(),
                "loss_fn_inputs": {k: list(v.data) for k, v in self.loss_fn_inputs.items()}}


@dataclass
class SamplingParams:
    max_tokens: Optional[int] = None
    seed: Optional[int] = None
    stop: Union[str, List[str], List[int], None] = None
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0

    def to_wire(self) -> Dict[str, Any]:
        wire = _without_none(self)
        if isinstance(self.stop, str):  # Tinker takes one stop string as well as a list
            wire["stop"] = [self.stop]
        elif self.stop is not None:
            wire["stop"] = list(self.stop)
        return wire


@dataclass
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def to_wire(self) -> Dict[str, Any]:
        return _without_none(self)


@dataclass
class ForwardBackwardOutput:
    loss_fn_output_type: str
    loss_fn_outputs: List[Dict[str, TensorData]]
    metrics: Dict[str, float]

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "ForwardBackwardOutput":
        outputs = [{name: TensorData.from_any(values) for name, values in out.items()}
                   for out in d.get("loss_fn_outputs", [])]
        return cls(d.get("loss_fn_output_type", ""), outputs, d.get("metrics", {}))


@dataclass
class OptimStepResponse:
    metrics: Dict[str, float]

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "OptimStepResponse":
        return cls(d.get("metrics", {}))


@dataclass
class SaveWeightsResponse:
    path: str

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "SaveWeightsResponse":
        return cls(d["path"])


class SaveWeightsForSamplerResponse(SaveWeightsResponse):
    pass


@dataclass
class LoadWeightsResponse:
    """The protocol leaves load_state's result open: Tinker's path and trill's step, if given."""

    path: Optional[str] = None
    step: Optional[int] = None

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "LoadWeightsResponse":
        return cls(d.get("path"), d.get("step"))


@dataclass
class ModelData:
    model_name: Optional[str]


@dataclass
class GetInfoResponse:
    trainer_id: str
    base_model: Optional[str]
    lora_rank: Optional[int]
    step: Optional[int]
    lora_config: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "GetInfoResponse":
        return cls(d["trainer_id"], d.get("base_model"), d.get("rank"), d.get("step"),
                   d.get("lora_config") or {})

    # Tinker's names for the same facts.
    @property
    def model_id(self) -> str:
        return self.trainer_id

    @property
    def model_data(self) -> ModelData:
        return ModelData(self.base_model)


@dataclass
class SupportedModel:
    """A served base model. Fields the server adds beyond these become attributes too."""

    model_name: str
    architecture: Optional[str] = None
    vocab_size: Optional[int] = None
    n_moe_layers: Optional[int] = None
    experts_per_token: Optional[int] = None
    max_lora_rank: Optional[int] = None

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "SupportedModel":
        known = {f.name for f in dataclasses.fields(cls)}
        model = cls(d["name"], **{k: v for k, v in d.items() if k in known and k != "model_name"})
        for k, v in d.items():
            if k not in known and k != "name":
                setattr(model, k, v)
        return model


@dataclass
class GetServerCapabilitiesResponse:
    supported_models: List[SupportedModel]

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "GetServerCapabilitiesResponse":
        return cls([SupportedModel.from_wire(m) for m in d.get("models", [])])


@dataclass
class SampledSequence:
    tokens: List[int]
    logprobs: Optional[List[float]] = None
    stop_reason: Optional[str] = None
    routed_experts: Optional[List[int]] = None

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "SampledSequence":
        return cls(d["tokens"], d.get("logprobs"), d.get("stop_reason"), d.get("routed_experts"))


@dataclass
class SampleResponse:
    sequences: List[SampledSequence]

    @classmethod
    def from_wire(cls, d: Dict[str, Any]) -> "SampleResponse":
        return cls([SampledSequence.from_wire(s) for s in d.get("sequences", [])])
