"""Clients of trill serve (docs/service.md), with the class and method names of Tinker's SDK.

Every HTTP call is a fresh urllib request and no client holds mutable state outside a lock, so
one client may be shared by many threads. Each `_async` method runs its blocking call in a
thread (asyncio.to_thread) so an event loop can keep many calls in flight.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Any, Callable, Dict, List, Optional

from . import types

DEFAULT_BASE_URL = "http://127.0.0.1:8100"
MAX_POLL_WAIT_S = 30  # per long-poll; the server allows up to 60

_STATUS_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found", 413: "too_large",
                 429: "limit"}


class TrillError(Exception):
    """An error the server answered (code as in docs/service.md) or, with code "unreachable",
    a server that could not be reached. status is the HTTP status, None for a future's error."""

    def __init__(self, code: str, message: str, status: Optional[int] = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


def _async_variant(method: Callable[..., Any]) -> Callable[..., Any]:
    """`name_async` of a blocking method: the same call, run in a thread."""

    @functools.wraps(method)
    async def variant(self: Any, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(method, self, *args, **kwargs)

    variant.__name__ = method.__name__ + "_async"
    variant.__qualname__ = method.__qualname__ + "_async"
    variant.__doc__ = f"Async version of {method.__name__}."
    return variant


def _quote(segment: str) -> str:
    return urllib.parse.quote(segment, safe="")


class _Http:
    """JSON over HTTP to one server with one key. Immutable, hence thread-safe."""

    def __init__(self, base_url: str, api_key: Optional[str], timeout: float):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self._opener = urllib.request.build_opener()

    def call(self, method: str, path: str, body: Any = None, timeout: Optional[float] = None) -> Any:
        """The parsed JSON answer of `method /api/v1{path}`; a TrillError for any failure."""
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        request = urllib.request.Request(self.base_url + "/api/v1" + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with self._opener.open(request, timeout=timeout or self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as e:
            raise _http_error(e) from None
        except (urllib.error.URLError, OSError) as e:  # refused, reset, timed out
            reason = getattr(e, "reason", e)
            raise TrillError("unreachable", f"{method} {self.base_url}{path}: {reason}") from e
        return json.loads(raw) if raw else {}


def _http_error(e: urllib.error.HTTPError) -> TrillError:
    """The server's {"error": {code, message}}, or a code guessed from the status if absent."""
    try:
        error = json.loads(e.read())["error"]
        return TrillError(error["code"], error.get("message", ""), e.code)
    except (ValueError, KeyError, TypeError):
        return TrillError(_STATUS_CODES.get(e.code, "internal"), f"HTTP {e.code} {e.reason}", e.code)


class APIFuture:
    """The result of a call the server runs later, fetched by long-polling GET /futures/{id}.

    The outcome is kept once known, so result() may be called again and from many threads.
    """

    # Pauses between tries when the server cannot be reached (it may be restarting).
    RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0)

    def __init__(self, http: _Http, request_id: str, parse: Callable[[Dict[str, Any]], Any]):
        self.request_id = request_id
        self._http = http
        self._parse = parse
        self._lock = threading.Lock()
        self._outcome: Optional[tuple] = None  # (value, error) once done

    def result(self, timeout: Optional[float] = None) -> Any:
        """Blocks until the result is ready; TrillError if the call failed, TimeoutError if
        `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            outcome = self._outcome
        while outcome is None:
            remaining = MAX_POLL_WAIT_S if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"future {self.request_id} not done after {timeout} s")
            outcome = self._poll(min(MAX_POLL_WAIT_S, math.ceil(remaining)), deadline)
        value, error = outcome
        if error is not None:
            raise error
        return value

    async def result_async(self, timeout: Optional[float] = None) -> Any:
        return await asyncio.to_thread(self.result, timeout)

    def __await__(self):
        return self.result_async().__await__()

    def _poll(self, wait: int, deadline: Optional[float]) -> Optional[tuple]:
        """One long-poll, retried while the server is unreachable; the outcome, or None if pending."""
        path = f"/futures/{_quote(self.request_id)}?wait={wait}"
        for delay in self.RETRY_DELAYS_S + (None,):
            try:
                answer = self._http.call("GET", path, timeout=wait + self._http.timeout)
                break
            except TrillError as e:
                if e.code != "unreachable" or delay is None:
                    raise
                if deadline is not None and time.monotonic() + delay > deadline:
                    raise
                time.sleep(delay)
        status = answer.get("status")
        if status == "pending":
            return None
        if status == "done":
            outcome = (self._parse(answer.get("result") or {}), None)
        elif status == "error":
            error = answer.get("error") or {}
            outcome = (None, TrillError(error.get("code", "internal"), error.get("message", "")))
        else:
            raise TrillError("internal", f"future {self.request_id}: unexpected status {status!r}")
        with self._lock:
            self._outcome = outcome
        return outcome

    def __repr__(self) -> str:
        return f"APIFuture({self.request_id!r})"


class Tokenizer:
    """encode/decode through the server, for a model whose tokenizer lives there."""

    def __init__(self, http: _Http, model_name: str):
        self._http = http
        self.model_name = model_name
        self._lock = threading.Lock()
        self._eos: Optional[List[int]] = None

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        body = {"text": text, "add_special_tokens": add_special_tokens}
        return self._http.call("POST", f"/models/{_quote(self.model_name)}/tokenize", body)["tokens"]

    def decode(self, tokens: Any, skip_special_tokens: bool = False) -> str:
        if skip_special_tokens:
            raise NotImplementedError("trill's detokenize keeps special tokens")
        body = {"tokens": [int(t) for t in types._flatten(tokens, [])]}
        return self._http.call("POST", f"/models/{_quote(self.model_name)}/detokenize", body)["text"]

    def batch_decode(self, sequences: List[Any]) -> List[str]:
        """decode of many sequences in one request."""
        if not sequences:
            return []
        body = {"tokens": [[int(t) for t in types._flatten(seq, [])] for seq in sequences]}
        return self._http.call("POST", f"/models/{_quote(self.model_name)}/detokenize", body)["texts"]

    def apply_chat_template(self, conversation: List[Dict[str, Any]], tools: Optional[List[Dict[str, Any]]] = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            enable_thinking: Optional[bool] = None) -> Any:
        """The conversation as the model's chat template renders it (transformers'
        apply_chat_template): its token ids, or with tokenize=False its text. Rendered by the
        server (trill's built-in renderers of the known templates; another is refused, named)."""
        body: Dict[str, Any] = {"messages": conversation, "add_generation_prompt": add_generation_prompt}
        if tools is not None:
            body["tools"] = tools
        if enable_thinking is not None:
            body["enable_thinking"] = enable_thinking
        answer = self._http.call("POST", f"/models/{_quote(self.model_name)}/apply_chat_template", body)
        return answer["tokens"] if tokenize else answer["text"]

    @property
    def eos_token_ids(self) -> List[int]:
        """The model's end-of-sequence ids (config.json's eos_token_id)."""
        with self._lock:
            if self._eos is None:
                models = self._http.call("GET", "/models")["models"]
                self._eos = next(m.get("eos_token_ids", []) for m in models if m["name"] == self.model_name)
            return list(self._eos)

    @property
    def eos_token_id(self) -> Optional[int]:
        ids = self.eos_token_ids
        return ids[0] if ids else None


class SamplingClient:
    """Samples from a base model or from weights a trainer saved for sampling."""

    def __init__(self, http: _Http, sampler_id: str):
        self._http = http
        self.sampler_id = sampler_id

    def _submit(self, op: str, body: Dict[str, Any], parse: Callable[[Dict[str, Any]], Any]) -> APIFuture:
        answer = self._http.call("POST", f"/samplers/{_quote(self.sampler_id)}/{op}", body)
        return APIFuture(self._http, answer["request_id"], parse)

    def sample(self, prompt: types.ModelInput, num_samples: int = 1,
               sampling_params: Optional[types.SamplingParams] = None) -> APIFuture:
        """An APIFuture of a SampleResponse with num_samples sequences."""
        body = {"prompt": prompt.to_ints(), "num_samples": num_samples,
                "sampling_params": (sampling_params or types.SamplingParams()).to_wire()}
        return self._submit("sample", body, types.SampleResponse.from_wire)

    def compute_logprobs(self, prompt: types.ModelInput) -> APIFuture:
        """An APIFuture of each prompt token's log-probability (None for the first)."""
        return self._submit("compute_logprobs", {"prompt": prompt.to_ints()}, lambda r: r["logprobs"])

    def delete(self) -> None:
        """Frees the sampler on the server (trill's; its queued calls fail with "gone")."""
        self._http.call("DELETE", f"/samplers/{_quote(self.sampler_id)}")

    # As in Tinker, the async variants of a sampler return the result itself, not a future.
    async def sample_async(self, prompt: types.ModelInput, num_samples: int = 1,
                           sampling_params: Optional[types.SamplingParams] = None) -> types.SampleResponse:
        future = await asyncio.to_thread(self.sample, prompt, num_samples, sampling_params)
        return await future.result_async()

    async def compute_logprobs_async(self, prompt: types.ModelInput) -> List[Optional[float]]:
        future = await asyncio.to_thread(self.compute_logprobs, prompt)
        return await future.result_async()


def _create_sampling_client(http: _Http, model_path: Optional[str],
                            base_model: Optional[str]) -> SamplingClient:
    if (model_path is None) == (base_model is None):
        raise ValueError("give exactly one of model_path and base_model")
    body = {"model_path": model_path} if model_path is not None else {"base_model": base_model}
    return SamplingClient(http, http.call("POST", "/samplers", body)["sampler_id"])


def _save_body(name: Optional[str], kind: str, ttl_seconds: Optional[int]) -> Dict[str, Any]:
    body: Dict[str, Any] = {"name": name if name is not None else f"{kind}-{uuid.uuid4().hex[:16]}"}
    if ttl_seconds is not None:
        body["ttl_seconds"] = ttl_seconds
    return body


class TrainingClient:
    """One trainer: a LoRA adapter and its optimizer state on the server.

    Each work method returns an APIFuture at once; the server runs one trainer's calls in the
    order they were submitted, so forward_backward and optim_step may be queued back to back.
    """

    def __init__(self, http: _Http, trainer_id: str, base_model: Optional[str] = None):
        self._http = http
        self.trainer_id = trainer_id
        self._base_model = base_model

    def _submit(self, op: str, body: Dict[str, Any], parse: Callable[[Dict[str, Any]], Any]) -> APIFuture:
        answer = self._http.call("POST", f"/trainers/{_quote(self.trainer_id)}/{op}", body)
        return APIFuture(self._http, answer["request_id"], parse)

    def _loss_body(self, data: List[types.Datum], loss_fn: str,
                   loss_fn_config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        body: Dict[str, Any] = {"data": [datum.to_wire() for datum in data], "loss_fn": loss_fn}
        if loss_fn_config is not None:
            body["loss_fn_config"] = loss_fn_config
        return body

    def forward(self, data: List[types.Datum], loss_fn: str,
                loss_fn_config: Optional[Dict[str, Any]] = None) -> APIFuture:
        """The loss and per-token logprobs, without touching the gradient."""
        return self._submit("forward", self._loss_body(data, loss_fn, loss_fn_config),
                            types.ForwardBackwardOutput.from_wire)

    def forward_backward(self, data: List[types.Datum], loss_fn: str,
                         loss_fn_config: Optional[Dict[str, Any]] = None) -> APIFuture:
        """Like forward, and adds the loss's gradient to the trainer's."""
        return self._submit("forward_backward", self._loss_body(data, loss_fn, loss_fn_config),
                            types.ForwardBackwardOutput.from_wire)

    def optim_step(self, adam_params: types.AdamParams) -> APIFuture:
        return self._submit("optim_step", {"adam_params": adam_params.to_wire()},
                            types.OptimStepResponse.from_wire)

    def save_state(self, name: Optional[str] = None, ttl_seconds: Optional[int] = None) -> APIFuture:
        """Saves weights and optimizer state; the result's path resumes a trainer later. Without
        a name, one is made; with ttl_seconds the state is deleted that long after the save."""
        return self._submit("save_state", _save_body(name, "state", ttl_seconds), types.SaveWeightsResponse.from_wire)

    def load_state(self, path: str) -> APIFuture:
        return self._submit("load_state", {"path": path, "with_optimizer": False},
                            types.LoadWeightsResponse.from_wire)

    def load_state_with_optimizer(self, path: str) -> APIFuture:
        return self._submit("load_state", {"path": path, "with_optimizer": True},
                            types.LoadWeightsResponse.from_wire)

    def save_weights_for_sampler(self, name: Optional[str] = None, ttl_seconds: Optional[int] = None) -> APIFuture:
        """Saves the weights where a sampler can load them; the result's path names them
        (a name is made when none is given; ttl_seconds as for save_state)."""
        return self._submit("save_weights_for_sampler", _save_body(name, "sampler", ttl_seconds),
                            types.SaveWeightsForSamplerResponse.from_wire)

    def get_info(self) -> types.GetInfoResponse:
        return types.GetInfoResponse.from_wire(self._http.call("GET", f"/trainers/{_quote(self.trainer_id)}"))

    def get_tokenizer(self) -> Tokenizer:
        """The base model's tokenizer, run by the server (trill needs no local tokenizer files)."""
        return Tokenizer(self._http, self._base_model or self.get_info().base_model)

    def create_sampling_client(self, model_path: str) -> SamplingClient:
        return _create_sampling_client(self._http, model_path, None)

    def save_weights_and_get_sampling_client(self, name: Optional[str] = None, ttl_seconds: Optional[int] = None) -> SamplingClient:
        """Saves the weights for sampling and waits for them: the sampler sees this step."""
        return self.create_sampling_client(self.save_weights_for_sampler(name, ttl_seconds).result().path)

    def delete(self) -> None:
        """Frees the trainer on the server with its snapshots (trill's; its queued calls fail with
        "gone"; the states it saved stay usable by their paths)."""
        self._http.call("DELETE", f"/trainers/{_quote(self.trainer_id)}")

    forward_async = _async_variant(forward)
    forward_backward_async = _async_variant(forward_backward)
    optim_step_async = _async_variant(optim_step)
    save_state_async = _async_variant(save_state)
    load_state_async = _async_variant(load_state)
    load_state_with_optimizer_async = _async_variant(load_state_with_optimizer)
    save_weights_for_sampler_async = _async_variant(save_weights_for_sampler)
    get_info_async = _async_variant(get_info)
    create_sampling_client_async = _async_variant(create_sampling_client)
    save_weights_and_get_sampling_client_async = _async_variant(save_weights_and_get_sampling_client)

    def __repr__(self) -> str:
        return f"TrainingClient({self.trainer_id!r})"


class ServiceClient:
    """The entry point: lists models and makes training and sampling clients."""

    def __init__(self, base_url: Optional[str] = None, api_key: Optional[str] = None,
                 timeout: float = 60.0):
        base_url = base_url or os.environ.get("TRILL_BASE_URL") or os.environ.get("TINKER_BASE_URL") or DEFAULT_BASE_URL
        if api_key is None:
            api_key = os.environ.get("TRILL_API_KEY") or os.environ.get("TINKER_API_KEY")
        self._http = _Http(base_url, api_key, timeout)

    @property
    def base_url(self) -> str:
        return self._http.base_url

    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        return types.GetServerCapabilitiesResponse.from_wire(self._http.call("GET", "/models"))

    def _trainer(self, path: str, body: Dict[str, Any]) -> TrainingClient:
        answer = self._http.call("POST", path, body)
        return TrainingClient(self._http, answer["trainer_id"], answer.get("base_model"))

    def create_lora_training_client(self, base_model: str, rank: int = 32, seed: Optional[int] = None,
                                    train_mlp: bool = True, train_attn: bool = True,
                                    train_unembed: bool = True,
                                    user_metadata: Optional[Dict[str, Any]] = None) -> TrainingClient:
        """user_metadata is taken as Tinker's signature has it and not kept (trill's protocol has no
        field for it)."""
        body = {"base_model": base_model, "rank": rank, "seed": seed, "train_mlp": train_mlp,
                "train_attn": train_attn, "train_unembed": train_unembed}
        return self._trainer("/trainers", {k: v for k, v in body.items() if v is not None})

    def create_training_client_from_state(self, path: str) -> TrainingClient:
        """A new trainer with a saved state's weights; its optimizer starts fresh."""
        return self._trainer("/trainers/from_state", {"path": path, "with_optimizer": False})

    def create_training_client_from_state_with_optimizer(self, path: str) -> TrainingClient:
        """A new trainer resuming a saved state: weights, optimizer moments and step."""
        return self._trainer("/trainers/from_state", {"path": path, "with_optimizer": True})

    def create_sampling_client(self, model_path: Optional[str] = None,
                               base_model: Optional[str] = None) -> SamplingClient:
        return _create_sampling_client(self._http, model_path, base_model)

    def get_training_client(self, trainer_id: str) -> TrainingClient:
        """trill's: a client for a trainer made earlier (a loop that restarted picks its trainer
        up again by id; the server keeps it across its own restarts)."""
        info = types.GetInfoResponse.from_wire(self._http.call("GET", f"/trainers/{_quote(trainer_id)}"))
        return TrainingClient(self._http, trainer_id, info.base_model)

    get_server_capabilities_async = _async_variant(get_server_capabilities)
    create_lora_training_client_async = _async_variant(create_lora_training_client)
    create_training_client_from_state_async = _async_variant(create_training_client_from_state)
    create_training_client_from_state_with_optimizer_async = _async_variant(
        create_training_client_from_state_with_optimizer)
    create_sampling_client_async = _async_variant(create_sampling_client)
    get_training_client_async = _async_variant(get_training_client)
