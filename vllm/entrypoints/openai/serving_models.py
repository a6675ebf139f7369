"""The served models: `/v1/models`, the model-name check and the LoRA
adapters (upstream: vllm/entrypoints/openai/models/serving.py).

One instance per engine. A server with a second (embedding) engine links the
two as peers: `/v1/models` lists every model of the server, and a request that
names a peer's model on this engine's routes gets `wrong_api_message` (a 400)
instead of "does not exist" (a 404).

LoRA adapters (`--lora-modules` at start-up, `/v1/load_lora_adapter` at run
time) are names a request's `model` may use besides the served ones. Loading
one asks the engine to load it now (`EngineClient.add_lora`), so a bad adapter
is refused here and never registered. Unloading only forgets the name: the
requests already running under it keep their LoRARequest and finish with it;
the engine's LRU cache drops the weights when the slot is needed (as upstream).
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING

from vllm.entrypoints.openai.protocol import (
    ErrorInfo,
    ErrorResponse,
    ModelCard,
    ModelList,
    ModelPermission,
)
from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest
from vllm.exceptions import LoRAAdapterNotFoundError, VLLMClientError
from vllm.logger import init_logger
from vllm.lora.request import LoRARequest
from vllm.v1.engine.exceptions import EngineDeadError

if TYPE_CHECKING:
    from vllm.engine.protocol import EngineClient

logger = init_logger(__name__)


@dataclass
class BaseModelPath:
    name: str
    model_path: str


@dataclass
class LoRAModulePath:
    """One `--lora-modules` entry: `name=path`, or JSON with these fields."""

    name: str
    path: str
    base_model_name: str | None = None
    is_3d_lora_weight: bool = False


def _error(message: str, err_type: str, status: HTTPStatus) -> ErrorResponse:
    return ErrorResponse(error=ErrorInfo(message=message, type=err_type, code=int(status)))


class OpenAIServingModels:
    """The names a request may use in its `model` field."""

    def __init__(
        self,
        engine_client: EngineClient,
        base_model_paths: list[BaseModelPath],
        supported_tasks: tuple[str, ...] | None = None,
        *,
        lora_modules: list[LoRAModulePath] | None = None,
    ) -> None:
        if not base_model_paths:
            raise ValueError("At least one served model name is needed.")
        self.engine_client = engine_client
        self.base_model_paths = base_model_paths
        self.max_model_len = engine_client.model_config.max_model_len
        # The engine's tasks (`EngineClient.get_supported_tasks`), shown on
        # the model cards; None: not reported.
        self.supported_tasks = supported_tasks
        # The other engines' models of the same server.
        self.peers: list[OpenAIServingModels] = []
        self.static_lora_modules = lora_modules
        # Adapter name -> the LoRARequest every request naming it runs with.
        self.lora_requests: dict[str, LoRARequest] = {}
        # lora_int_id: a new one per load, even a reload of a name (in place,
        # or after an unload): the engine caches weights by id, and requests
        # still running under the old load keep the old weights.
        self._lora_ids = itertools.count(1)
        # Loads and unloads run one at a time (they are rare; one lock, not
        # one per name, so that names a client invents cost no memory).
        self._lora_lock = asyncio.Lock()

    def link_peer(self, other: OpenAIServingModels) -> None:
        """Make `self` and `other` peers (both ways)."""
        self.peers.append(other)
        other.peers.append(self)

    def is_base_model(self, model_name: str) -> bool:
        return any(model.name == model_name for model in self.base_model_paths)

    def model_name(self, lora_request: LoRARequest | None = None) -> str:
        """The name responses report: the adapter's, else the first served name."""
        if lora_request is not None:
            return lora_request.lora_name
        return self.base_model_paths[0].name

    def wrong_api_message(self, model_name: str) -> str | None:
        """The error for a model that a peer engine serves (None: no peer
        serves it either, i.e. the model does not exist)."""
        for peer in self.peers:
            if peer.is_base_model(model_name) or model_name in peer.lora_requests:
                tasks = ", ".join(peer.supported_tasks or ()) or "unknown"
                here = ", ".join(f"`{base.name}`" for base in self.base_model_paths)
                return (
                    f"The model `{model_name}` does not support this API (its tasks: "
                    f"{tasks}); this API is served by {here}."
                )
        return None

    def model_cards(self) -> list[ModelCard]:
        """This engine's cards: one per served name, then one per adapter
        (`parent`: its base model's name, `root`: its path)."""
        tasks = list(self.supported_tasks) if self.supported_tasks is not None else None
        cards = [
            ModelCard(
                id=base.name,
                max_model_len=self.max_model_len,
                root=base.model_path,
                permission=[ModelPermission()],
                supported_tasks=tasks,
            )
            for base in self.base_model_paths
        ]
        cards += [
            ModelCard(
                id=lora.lora_name,
                root=lora.lora_path,
                parent=lora.base_model_name or self.base_model_paths[0].name,
                permission=[ModelPermission()],
                supported_tasks=tasks,
            )
            for lora in self.lora_requests.values()
        ]
        return cards

    async def show_available_models(self) -> ModelList:
        """The `/v1/models` listing: this engine's models, then its peers'."""
        cards = self.model_cards()
        for peer in self.peers:
            cards += peer.model_cards()
        return ModelList(data=cards)

    # ------------------------------------------------------------------
    # LoRA adapters
    # ------------------------------------------------------------------

    async def init_static_loras(self) -> None:
        """Load every `--lora-modules` adapter; the first that fails stops
        the start-up with its message (ValueError)."""
        for lora in self.static_lora_modules or ():
            if lora.base_model_name is not None and not self.is_base_model(lora.base_model_name):
                served = ", ".join(base.name for base in self.base_model_paths)
                raise ValueError(
                    f"--lora-modules: the base_model_name {lora.base_model_name!r} of adapter "
                    f"{lora.name!r} is not a served model name (served: {served})."
                )
            request = LoadLoRAAdapterRequest(
                lora_name=lora.name, lora_path=lora.path, is_3d_lora_weight=lora.is_3d_lora_weight
            )
            result = await self.load_lora_adapter(request, base_model_name=lora.base_model_name)
            if isinstance(result, ErrorResponse):
                raise ValueError(f"--lora-modules: {result.error.message}")

    async def load_lora_adapter(
        self, request: LoadLoRAAdapterRequest, base_model_name: str | None = None
    ) -> ErrorResponse | str:
        """Load an adapter into the engine and register its name; on any
        error nothing is registered. `load_inplace` replaces the adapter of a
        name already loaded (the requests that arrive later get the new one)."""
        name = request.lora_name
        async with self._lora_lock:
            error = self._check_load_lora_adapter_request(request)
            if error is not None:
                return error
            lora_request = LoRARequest(
                lora_name=name,
                lora_int_id=next(self._lora_ids),
                lora_path=request.lora_path,
                load_inplace=request.load_inplace,
            )
            if base_model_name is not None and self.is_base_model(base_model_name):
                lora_request.base_model_name = base_model_name
            try:
                await self.engine_client.add_lora(lora_request)
            except EngineDeadError:
                raise
            except Exception as e:
                return self._load_error(lora_request, e)
            self.lora_requests[name] = lora_request
        logger.info("Loaded new LoRA adapter: name '%s', path '%s'", name, request.lora_path)
        return f"Success: LoRA adapter '{name}' added successfully."

    async def unload_lora_adapter(self, request: UnloadLoRAAdapterRequest) -> ErrorResponse | str:
        """Forget an adapter's name: later requests naming it get a 404; the
        ones running under it finish with it."""
        name = request.lora_name
        async with self._lora_lock:
            error = self._check_unload_lora_adapter_request(request)
            if error is not None:
                return error
            del self.lora_requests[name]
        logger.info("Removed LoRA adapter: name '%s'", name)
        return f"Success: LoRA adapter '{name}' removed successfully."

    def _check_load_lora_adapter_request(
        self, request: LoadLoRAAdapterRequest
    ) -> ErrorResponse | None:
        """Upstream's checks (400 InvalidUserInput), then ours: LoRA enabled,
        no MoE (3D) weights, no clash with a served model name."""
        bad_input = HTTPStatus.BAD_REQUEST
        if not request.lora_name or not request.lora_path:
            return _error(
                "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput", bad_input
            )
        if not request.load_inplace and request.lora_name in self.lora_requests:
            return _error(
                f"The lora adapter '{request.lora_name}' has already been loaded. If you want "
                "to load the adapter in place, set 'load_inplace' to True.",
                "InvalidUserInput",
                bad_input,
            )
        if self.is_base_model(request.lora_name):
            return _error(
                f"The lora adapter name '{request.lora_name}' is a served model name; "
                "an adapter needs a name of its own.",
                "InvalidUserInput",
                bad_input,
            )
        if self.engine_client.vllm_config.lora_config is None:
            return _error(
                "LoRA is not enabled. Use --enable-lora to enable LoRA.",
                "BadRequestError",
                bad_input,
            )
        if request.is_3d_lora_weight:
            return _error(
                "'is_3d_lora_weight' (LoRA of fused MoE experts) is not supported.",
                "BadRequestError",
                bad_input,
            )
        return None

    def _check_unload_lora_adapter_request(
        self, request: UnloadLoRAAdapterRequest
    ) -> ErrorResponse | None:
        if not request.lora_name:
            return _error(
                "'lora_name' needs to be provided to unload a LoRA adapter.",
                "InvalidUserInput",
                HTTPStatus.BAD_REQUEST,
            )
        if request.lora_name not in self.lora_requests:
            return _error(
                f"The lora adapter '{request.lora_name}' cannot be found.",
                "NotFoundError",
                HTTPStatus.NOT_FOUND,
            )
        return None

    @staticmethod
    def _load_error(lora_request: LoRARequest, e: Exception) -> ErrorResponse:
        """The engine refused the adapter. A missing adapter (no directory, or
        no adapter_config.json in it) is upstream's 404. The loader's other
        refusals (ValueError: rank above --max-lora-rank, unsupported target
        modules, tensors that do not fit the base model, ...) are about the
        adapter the client named: a 400 (upstream answers 500 for these).
        Anything else failed in the server: a 500, as upstream."""
        not_found = LoRAAdapterNotFoundError(lora_request.lora_name, lora_request.lora_path)
        if isinstance(e, LoRAAdapterNotFoundError) or str(not_found) in str(e):
            return _error(str(not_found), "NotFoundError", HTTPStatus.NOT_FOUND)
        message = str(e) or type(e).__name__
        if isinstance(e, (ValueError, VLLMClientError)):
            logger.info("LoRA adapter '%s' refused: %s", lora_request.lora_name, message)
            return _error(message, "BadRequestError", HTTPStatus.BAD_REQUEST)
        logger.error("Loading LoRA adapter '%s' failed: %s", lora_request.lora_name, message)
        return _error(message, "InternalServerError", HTTPStatus.INTERNAL_SERVER_ERROR)
