"""``pyminfer serve``: an OpenAI-compatible HTTP server (FastAPI + uvicorn).

Endpoints: POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /v1/models/{id}
(also without the /v1 prefix); GET or HEAD /health (503 while the model loads); in llama.cpp
server shapes POST /completion, GET /props, POST /tokenize, POST /detokenize; GET /metrics
(Prometheus text format). CORS: any origin may call (preflights answered), as llama.cpp's server.

Requests are served one at a time by a single worker thread. A request reuses the KV cache of the
longest prefix its prompt shares with the previous request's prompt and output (llama.cpp's
``cache_prompt``, default true; ``false`` prefills the whole prompt), so at temperature 0 a response
equals the same request served alone, up to the GPU prefill's tolerance on a near-tie. A client
that disconnects mid-generation stops it at the next token. Errors come back as OpenAI-style JSON
``{"error": {"message", "type", "param", "code"}}`` with a 4xx/5xx status.

Needs the ``server`` extra: ``pip install 'pyminfer[server]'``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import re
import threading
import time
import uuid
from contextlib import asynccontextmanager
from typing import Annotated, Any, AsyncIterator, Callable, List, Optional, Sequence, TypeVar, Union

try:
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.middleware.cors import CORSMiddleware
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ModuleNotFoundError as e:  # tests: test_missing_server_extra_and_native_core_are_one_line_errors
    from .cli import server_extra_missing

    raise server_extra_missing(e)  # noqa: B904  (the cause is set: the original error, or e itself)

from .api import LLM, ChatTemplateError
from .cli import package_version
from .generate import Chunk, GenerationResult, ScoringCancelled
from .infill import InfillChunk, InfillUnsupportedError, infill_ids
from .sampling import MAX_LOGPROBS, SamplingParams, TokenLogprob
from .spec import MAX_DEPTH
from .tokenizer import lone_surrogate

_T = TypeVar("_T")

MAX_POSITIONS = MAX_DEPTH  # speculative draft positions reported in /metrics: every depth a round can take


_VERSION = package_version()


# ---------------------------------------------------------------------------------------------- errors
class APIError(Exception):
    """An error with an HTTP status and an OpenAI-style body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def _loading_error() -> APIError:
    return APIError(503, "the model is loading; retry shortly", type="unavailable_error", code="model_loading")


# ---------------------------------------------------------------------------------------------- requests
# JSON types as the OpenAI API states them, without pydantic's lax coercions: those read "yes" and 1
# as true, true as 1, 2.0 as 2 and "0.5" as 0.5, so a mistyped field became a different request.
# Floats also refuse NaN and Infinity, which Python's json module reads although JSON has neither.
Int = Annotated[int, Field(strict=True)]
Bool = Annotated[bool, Field(strict=True)]
Float = Annotated[float, Field(strict=True, allow_inf_nan=False)]


class _Request(BaseModel):
    """A request body: OpenAI's API takes null for every optional field (some clients send explicit
    nulls), so a declared field given as null gets its default, as if it were absent."""

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if not (v is None and k in cls.model_fields)}
        return data


class StreamOptions(_Request):
    model_config = ConfigDict(extra="allow")

    include_usage: Bool = False


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _other_than(neutral: float) -> Callable[[Any], bool]:
    """"Asks for something" unless null or the number ``neutral``."""
    return lambda v: v is not None and not (_is_number(v) and v == neutral)


def _positive(v: Any) -> bool:
    """"Asks for something" unless null or a number <= 0 (llama.cpp's "off" for these)."""
    return v is not None and not (_is_number(v) and v <= 0)


def _nonempty(v: Any) -> bool:
    """"Asks for something" unless null or an empty string, list or object."""
    return v is not None and not (isinstance(v, (str, list, dict)) and not v)


def _biased(v: Any) -> bool:
    """logit_bias "asks for something" unless null or every bias is the number 0: an object
    {token: bias} (OpenAI) or a list of [token, bias] pairs (llama.cpp, where false bans the
    token); anything else counts as asking (and is refused with the field named)."""
    def zero(b: Any) -> bool:
        return isinstance(b, (int, float)) and not isinstance(b, bool) and b == 0

    if v is None:
        return False
    if isinstance(v, dict):
        return not all(zero(b) for b in v.values())
    if isinstance(v, list):
        return not all(isinstance(p, list) and len(p) == 2 and zero(p[1]) for p in v)
    return True


def _logit_bias_ids(v: Any) -> list[int]:
    """The token ids of a logit_bias value: an object {"id": bias} (OpenAI) or a list of [id, bias]
    pairs (llama.cpp), where llama.cpp also takes a token's text for its id and false for a bias
    (ban). APIError 400 for any other shape, an id that is not an integer >= 0, or a bias that is
    not a number in -100..100 (OpenAI's range) or false. Text keys are not ids (not returned)."""
    def bias_ok(b: Any) -> bool:
        return b is False or (isinstance(b, (int, float)) and not isinstance(b, bool) and -100 <= b <= 100)

    def bad(why: str) -> APIError:
        return APIError(400, f"logit_bias: {why}", param="logit_bias", code="invalid_value")

    j = json.dumps
    ids: list[int] = []
    pairs = list(v.items()) if isinstance(v, dict) else v if isinstance(v, list) else []
    for p in pairs:
        if not isinstance(v, dict) and not (isinstance(p, list) and len(p) == 2):
            raise bad(f"{j(p)} is not a [token, bias] pair")
        t, b = p
        if isinstance(v, dict) and re.fullmatch(r"-?[0-9]+", t):
            t = int(t)  # OpenAI's keys are ids written as strings ("--5" is text, not int("--5"))
        if isinstance(t, bool) or not isinstance(t, (int, str)) or (isinstance(t, int) and t < 0):
            raise bad(f"{j(t)} is not a token id (an integer >= 0) or a token's text")
        if not bias_ok(b):
            raise bad(f"the bias of token {j(t)} must be a number in -100..100 or false, got {j(b)}")
        if isinstance(t, int):
            ids.append(t)
    return ids


def _true(v: Any) -> bool:
    return v is not None and v is not False and v != 0


def _set(v: Any) -> bool:
    """"Asks for something" unless null or false: 0 counts (OpenAI's legacy completions return the
    sampled token's log-probability for logprobs = 0)."""
    return v is not None and v is not False


def _not_none_or_auto(v: Any) -> bool:
    # "none" and "auto" without tools (tools themselves are refused) both mean: answer in text
    return v not in (None, "none", "auto")


# Request fields of OpenAI's API or llama.cpp's server that this server does not implement: each with
# the test "does this value ask for something?" and why it is refused. A request that sets one to
# anything but its neutral value (the default, which is what this server does anyway) is a 400 naming
# it: ignoring it would answer a different request than the one sent. Fields that do not change the
# output (OpenAI's user, metadata, store, service_tier, parallel_tool_calls; llama.cpp's
# id_slot, n_keep, and the tuning knobs of the samplers refused here, such as mirostat_tau) are
# accepted and ignored; other unknown fields are ignored with a warning in the server log.
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    # OpenAI
    "n": (_other_than(1), "one choice is generated per request"),
    "best_of": (_other_than(1), "one candidate is generated per request"),
    "frequency_penalty": (_other_than(0), "for penalties use repeat_penalty"),
    "presence_penalty": (_other_than(0), "for penalties use repeat_penalty"),
    "logit_bias": (_biased, "logit biases are not applied"),
    "tools": (_nonempty, "no tool calling"),
    "tool_choice": (_not_none_or_auto, "no tool calling"),
    "functions": (_nonempty, "no function calling"),
    "function_call": (_not_none_or_auto, "no function calling"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type", "text") != "text",
                        "no constrained (JSON) output"),
    # llama.cpp's server (its defaults are the neutral values)
    "mirostat": (_other_than(0), "Mirostat sampling is not implemented"),
    "typical_p": (_other_than(1), "locally typical sampling is not implemented"),
    "tfs_z": (_other_than(1), "tail-free sampling is not implemented"),
    "dynatemp_range": (_positive, "dynamic temperature is not implemented"),
    "top_n_sigma": (_positive, "top-n-sigma sampling is not implemented"),
    "xtc_probability": (_positive, "XTC sampling is not implemented"),
    "dry_multiplier": (_positive, "the DRY repetition penalty is not implemented"),
    "grammar": (_nonempty, "no grammar-constrained output"),
    "json_schema": (_nonempty, "no schema-constrained output"),
    "ignore_eos": (_true, "generation always stops at an end-of-generation token"),
    "chat_template_kwargs": (_nonempty, "no extra variables are passed to the chat template"),
    "return_tokens": (_true, "the generated token ids are not returned"),
    "post_sampling_probs": (_true, "token probabilities are not computed"),
}
# Fields known not to change the output: accepted, ignored, and not warned about.
_IGNORED = frozenset({
    "user", "metadata", "store", "service_tier", "parallel_tool_calls", "prediction",
    "id_slot", "n_keep", "mirostat_tau", "mirostat_eta",
    "dynatemp_exponent", "xtc_threshold", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
    "dry_sequence_breakers", "timings_per_token", "return_progress",
    # llama.cpp reads it and does nothing with it ("TODO: implement"); llama.vim sends it
    "t_max_prompt_ms",
})


class _GenRequest(_Request):
    model_config = ConfigDict(extra="allow")

    model: Optional[str] = None
    max_tokens: Optional[Int] = Field(default=None, ge=0)
    max_completion_tokens: Optional[Int] = Field(default=None, ge=0)
    # llama.cpp's name for max_tokens (it reads either); -1: no limit (until end of generation or
    # a full context), as there
    n_predict: Optional[Int] = Field(default=None, ge=-1)
    temperature: Float = Field(default=0.8, ge=0.0)
    top_p: Float = Field(default=0.95, ge=0.0, le=1.0)
    top_k: Int = 40
    min_p: Float = Field(default=0.05, ge=0.0, le=1.0)
    # any positive value, as llama.cpp's server (which does not range-check it at all)
    repeat_penalty: Float = Field(default=1.0, gt=0.0)
    repeat_last_n: Int = Field(default=64, ge=-1)  # -1: the whole context (llama.cpp)
    stop: Optional[Union[str, List[str]]] = None
    seed: Optional[Int] = None
    stream: Bool = False
    stream_options: Optional[StreamOptions] = None
    # llama.cpp's: reuse the K/V of the longest prefix this prompt shares with the last request's
    # prompt + output (LLM.generate's cache_prompt); false: prefill it all
    cache_prompt: Bool = True
    n: Int = Field(default=1, ge=1)  # > 1: refused as unsupported (_UNSUPPORTED)
    # llama.cpp's sampler chain (pyminfer.sampling): a list of names or a string of one-letter
    # codes; [] is the empty chain (a draw from the whole distribution), as there; {} (an empty
    # Lua table as some editor plugins encode it) is the default chain, as there
    samplers: Optional[Union[List[str], str, dict]] = None
    # llama.cpp's generation limits for code completion (pyminfer.generate): the least indentation
    # of lines after the first, and a time limit (ms after the first token, <= 0 none) that ends
    # the text at the next newline
    n_indent: Int = Field(default=0, ge=0)
    t_max_predict_ms: Float = -1.0
    # llama.cpp's: the non-streamed /completion and /infill answer holds only these fields, a
    # path such as "timings/prompt_n" naming a nested one (a flat key in the answer)
    response_fields: Optional[List[str]] = None
    # Unimplemented fields declared for their types (a mistyped value is a 400 that says what the
    # type is); whether a value asks for something is _UNSUPPORTED's business.
    # token log-probabilities (pyminfer.sampling.TokenLogprob): OpenAI's chat takes logprobs true
    # and top_logprobs (0..20), its completions logprobs (0..20 alternatives), llama.cpp's
    # /completion n_probs (> 0)
    logprobs: Optional[Union[Bool, Int]] = None
    top_logprobs: Optional[Int] = None
    n_probs: Int = Field(default=0, ge=0)
    # llama.cpp's: the fewest candidates top_p and min_p keep (0: no floor)
    min_keep: Int = Field(default=0, ge=0)
    echo: Bool = False
    best_of: Optional[Int] = None
    frequency_penalty: Float = 0.0
    presence_penalty: Float = 0.0
    logit_bias: Optional[Union[dict, list]] = None  # llama.cpp also takes [[token, bias], ...]
    tools: Optional[list] = None
    response_format: Optional[dict] = None

    def check(self) -> None:
        """The checks pydantic's field types cannot express; APIError 400."""
        fields = type(self).model_fields
        extra = self.model_extra or {}
        if self.stream_options is not None and not self.stream:  # OpenAI's and vLLM's 400, not ignored
            raise APIError(400, "stream_options is only allowed when stream is true", param="stream_options",
                           code="invalid_value")
        if "logit_bias" in fields:  # a malformed map is a 400 of its own, not "not supported"
            _logit_bias_ids(self.logit_bias)
        asked = [(name, why) for name, (asks, why) in _UNSUPPORTED.items()
                 if asks(getattr(self, name) if name in fields else extra.get(name))]
        if asked:
            raise APIError(400, "not supported by this server: " + "; ".join(f"{n} ({why})" for n, why in asked),
                           param=asked[0][0], code="unsupported_parameter")
        unknown = sorted(k for k in extra if k not in _UNSUPPORTED and k not in _IGNORED)
        if unknown:  # most likely a misspelt field: say so where the operator looks
            logging.getLogger("uvicorn.error").warning("pyminfer: ignoring unknown request fields: %s",
                                                       ", ".join(unknown))
        given = {k: getattr(self, k) for k in ("max_tokens", "max_completion_tokens", "n_predict")
                 if getattr(self, k) is not None}
        if len({_no_limit_as_none(v) for v in given.values()}) > 1:
            said = ", ".join(f"{k}={v}" for k, v in given.items())
            raise APIError(400, f"{said} disagree: give one (n_predict is llama.cpp's name for max_tokens; "
                           "-1 means no limit)", param="n_predict" if "n_predict" in given else "max_tokens",
                           code="invalid_value")

    def token_limit(self) -> tuple[bool, int | None]:
        """(given?, the most tokens to generate, None for no limit) from max_tokens,
        max_completion_tokens or n_predict (check() has made sure they agree)."""
        for k in ("max_tokens", "max_completion_tokens", "n_predict"):
            v = getattr(self, k)
            if v is not None:
                return True, _no_limit_as_none(v)
        return False, None


def _prompt_kind(p: Any) -> str | None:
    """What one completion prompt is, by llama.cpp's rule (its tokenize_input_prompts): "text" (a
    string), "ids" (a list of token ids, empty included), "mixed" (a list of text pieces and ids, at
    least one of each); None for anything else (a batch: a list of strings, or of lists)."""
    if isinstance(p, str):
        return "text"
    if isinstance(p, list) and all(isinstance(x, (int, str)) for x in p):
        has_text, has_ids = any(isinstance(x, str) for x in p), any(isinstance(x, int) for x in p)
        if not has_text:
            return "ids"
        if has_ids:
            return "mixed"
    return None


def _no_limit_as_none(n: int) -> int | None:
    return None if n < 0 else n


class CompletionRequest(_GenRequest):
    # OpenAI: a string, token ids, or a batch of either (completion_prompts: one choice per prompt);
    # llama.cpp's: also a mixed list of text pieces and ids, and batches mixing all three kinds
    prompt: Union[str, List[Int], List[str], List[List[Int]], List[Union[Int, str]],
                  List[Union[str, List[Union[Int, str]]]]]
    # OpenAI's fill-in-the-middle: the text after the insertion point (a text prompt is the text
    # before it); non-empty: the FIM prompt of pyminfer.infill, for models with FIM tokens
    suffix: Optional[str] = None


class InfillExtra(_Request):
    """One chunk of /infill's input_extra (llama.cpp's {"filename": string, "text": string}; other
    keys, such as llama.vim's "time", are ignored as there; null filename: the default)."""

    text: str
    filename: str = "tmp"


class InfillRequest(_GenRequest):
    """llama.cpp's /infill: the text before and after the gap, other files' text, and text that
    ends the prefix (``prompt``: pyminfer.infill); every /completion option."""

    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: List[InfillExtra] = []
    prompt: str = ""

    def check(self) -> None:
        if _nonempty((self.model_extra or {}).get("suffix")):  # OpenAI's name for input_suffix: not ignored
            raise APIError(400, "suffix is /v1/completions' field: /infill takes the text after the gap as "
                           "input_suffix", param="suffix", code="invalid_value")
        super().check()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: str
    content: Optional[Union[str, List[dict]]] = None


class ChatRequest(_GenRequest):
    messages: List[ChatMessage] = Field(min_length=1)
    # vLLM's: true, the last (assistant) message is continued; false, answered with a new turn;
    # absent: the server's default (llama.cpp's assistant prefill, unless --no-prefill-assistant)
    continue_final_message: Optional[Bool] = None
    # vLLM's and llama.cpp's: false renders the messages without the assistant's opening; absent:
    # true (or, with a continued final message, moot); true together with continue_final_message
    # true is a 400, as in vLLM
    add_generation_prompt: Optional[Bool] = None

    def check(self) -> None:
        if _nonempty((self.model_extra or {}).get("suffix")):  # refused before FIM existed: still not ignored
            raise APIError(400, "not supported by this server: suffix (a chat has no fill-in-the-middle; use "
                           "/v1/completions' suffix or /infill)", param="suffix", code="unsupported_parameter")
        if self.echo:
            raise APIError(400, "not supported by this server: echo (a chat does not echo its messages; "
                           "/v1/completions echoes its prompt)", param="echo", code="unsupported_parameter")
        super().check()
        for i, m in enumerate(self.messages):
            # OpenAI: content is required, except in an assistant turn that carries tool calls;
            # a null user turn was rendered as an empty one, answering a question nobody asked
            calls = (m.model_extra or {}).get("tool_calls")
            if m.content is None and not (m.role == "assistant" and calls not in (None, [])):
                raise APIError(400, f"messages[{i}].content must be a string or a list of content parts (null only "
                               "in an assistant message with tool_calls)", param=f"messages.{i}.content",
                               code="invalid_value")


class TokenizeRequest(_Request):
    content: str
    add_special: Bool = False
    parse_special: Bool = True
    with_pieces: Bool = False


class DetokenizeRequest(_Request):
    tokens: List[Int]


_REQUESTS = (CompletionRequest, ChatRequest, ChatMessage, StreamOptions, TokenizeRequest, DetokenizeRequest,
             InfillRequest, InfillExtra)
# Field names of the request models: what in a pydantic error location is a field (the rest are the
# names of union members such as 'list[int]', which mean nothing to a client).
_FIELDS = frozenset(name for m in _REQUESTS for name in m.model_fields)
# What a union-typed field accepts, said plainly (pydantic reports one error per union member).
_UNION_KINDS = {
    "prompt": "a string, a list of token ids, a list of strings and token ids, or a list of such prompts",
    "stop": "a string or a list of strings",
    "content": "a string or a list of content parts",
    "logprobs": "a boolean or an integer",
    "logit_bias": "an object or a list of [token, bias] pairs",
}
# pydantic error type -> what the value must be
_TYPE_KINDS = {
    "int_type": "an integer", "int_parsing": "an integer", "int_from_float": "an integer",
    "bool_type": "true or false", "bool_parsing": "true or false",
    "float_type": "a number", "float_parsing": "a number", "finite_number": "a finite number",
    "string_type": "a string", "list_type": "a list", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object",
}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("<=", "le"),
           "less_than": ("<", "lt")}


def _where(path: Sequence[str | int]) -> str:
    """A request field's path as error messages write it, list indices in brackets
    (``messages[0].content``), as the Python API's messages do; the error's ``param`` keeps OpenAI's
    dotted form (``messages.0.content``)."""
    return "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in path).removeprefix(".")


def _validation_api_error(errs: Any) -> APIError:
    """The first pydantic error as a 400 whose message names the field plainly
    (``max_tokens: must be an integer, got true``)."""
    e = errs[0] if errs else {}
    path: list[str | int] = []
    in_union = False
    for x in e.get("loc", ()):
        if isinstance(x, int) or x in _FIELDS:
            path.append(x)
        elif x != "body":  # a union member's name: what follows it belongs to that member only
            in_union = True
            break
    param = ".".join(map(str, path)) or None
    where = _where(path)
    field = str(path[-1]) if path else ""
    typ = e.get("type", "")
    if typ == "missing":
        return APIError(400, f"missing required field '{where}'", param=param, code="missing_field")
    if in_union and field in _UNION_KINDS:
        msg = f"must be {_UNION_KINDS[field]}"
    elif typ in _TYPE_KINDS:
        msg = f"must be {_TYPE_KINDS[typ]}"
        got = e.get("input")
        if isinstance(got, (bool, int, float)) or (isinstance(got, str) and len(got) <= 40):
            msg += f", got {json.dumps(got)}"
    elif typ in _BOUNDS:
        op, key = _BOUNDS[typ]
        msg = f"must be {op} {(e.get('ctx') or {}).get(key)}"
    elif typ == "too_short":
        n = (e.get("ctx") or {}).get("min_length", 1)
        msg = "must not be empty" if n == 1 else f"must have at least {n} items"
    else:
        msg = str(e.get("msg", "invalid request")).removeprefix("Value error, ")
    return APIError(400, f"{where}: {msg}" if param else msg, param=param, code="invalid_value")


def _check_unicode(obj: Any) -> None:
    """APIError 400 naming the first string (or key) in the parsed body that holds a lone UTF-16
    surrogate: Python's json accepts ``"\\ud800"``, but such a string is not text; the tokenizer
    raises on it and even an error message quoting it cannot be encoded."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(obj, ())]
    while stack:  # iterative: the body may nest as deep as json.loads allows
        x, path = stack.pop()
        param = ".".join(map(str, path)) or None
        if isinstance(x, str):
            i = lone_surrogate(x)
            if i is not None:
                raise APIError(400, f"{_where(path) or 'body'}: invalid Unicode (lone surrogate U+{ord(x[i]):04X} at "
                               f"index {i}); send valid UTF-8 text", param=param, code="invalid_unicode")
        elif isinstance(x, dict):
            for k, v in reversed(list(x.items())):
                if lone_surrogate(k) is not None:
                    raise APIError(400, f"{_where(path) or 'body'}: a key holds invalid Unicode (a lone surrogate)",
                                   param=param, code="invalid_unicode")
                stack.append((v, (*path, k)))
        elif isinstance(x, list):
            stack.extend((v, (*path, j)) for j, v in reversed(list(enumerate(x))))


async def _parse(request: Request, model: type[BaseModel]) -> Any:
    """The JSON body as ``model`` (whatever the Content-Type); APIError 400 when it is not.
    Decoding and validation run in a worker thread (_off_loop)."""
    body = await request.body()
    return await _off_loop(_parse_body, body, model)


async def _off_loop(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` in a worker thread (Starlette's pool), its result or exception as its own.
    For request work that grows with the request (JSON, chat template, tokenization): on the
    event loop a 60 MB prompt held every other request, /health included, for a minute before
    it was refused as longer than n_ctx."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args)


def _parse_body(body: bytes, model: type[BaseModel]) -> Any:
    """_parse's work on the bytes of the body."""
    try:
        text = body.decode("utf-8-sig") if body else ""  # (a leading BOM tolerated, as json.loads(bytes) did)
    except UnicodeDecodeError as e:  # JSON text is UTF-8 (RFC 8259): name the byte, not "not JSON"
        raise APIError(400, f"the request body is not valid UTF-8 (byte 0x{body[e.start]:02x} at offset {e.start}); "
                       "JSON text must be UTF-8", code="invalid_json") from None
    try:
        obj = json.loads(text) if text else None
    except ValueError:
        raise APIError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, "the request body nests too deeply", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, "the request body must be a JSON object", code="invalid_json")
    _check_unicode(obj)
    try:
        req = model.model_validate(obj)
    except ValidationError as e:
        raise _validation_api_error(e.errors()) from None
    if isinstance(req, _GenRequest):
        req.check()
    return req


# ---------------------------------------------------------------------------------------------- metrics
class Metrics:
    """Counters since the server started, rendered in Prometheus text format."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.errors = 0
        self.cancelled = 0
        self.prompt_tokens = 0
        self.generated_tokens = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.last_decode_tok_s = 0.0
        self.spec_rounds = 0
        self.spec_drafted = 0
        self.spec_accepted = 0
        self.drafted_at = [0] * MAX_POSITIONS
        self.accepted_at = [0] * MAX_POSITIONS
        self.processing = 0

    def count_request(self, endpoint: str) -> None:
        with self.lock:
            self.requests[endpoint] = self.requests.get(endpoint, 0) + 1

    def add(self, n_prompt: int, n_gen: int, res: GenerationResult | None, cancelled: bool) -> None:
        with self.lock:
            self.prompt_tokens += n_prompt
            self.generated_tokens += n_gen
            self.cancelled += int(cancelled)
            if res is None:
                return
            t = res.timings
            self.prefill_s += t.get("prefill_s", 0.0)
            self.decode_s += t.get("decode_s", 0.0)
            self.last_decode_tok_s = t.get("decode_tok_s", 0.0)
            s = res.spec
            if s:
                self.spec_rounds += int(s.get("rounds", 0))
                self.spec_drafted += int(s.get("drafted", 0))
                self.spec_accepted += int(s.get("accepted", 0))
                for i, v in enumerate(s.get("drafted_per_position", [])[:MAX_POSITIONS]):
                    self.drafted_at[i] += int(v)
                for i, v in enumerate(s.get("accepted_per_position", [])[:MAX_POSITIONS]):
                    self.accepted_at[i] += int(v)

    def render(self, loaded: bool) -> str:
        with self.lock:
            lines: list[str] = []

            def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
                lines.append(f"# HELP pyminfer_{name} {help_}")
                lines.append(f"# TYPE pyminfer_{name} {kind}")
                for labels, v in samples:
                    lines.append(f"pyminfer_{name}{labels} {v:g}" if isinstance(v, float) else
                                 f"pyminfer_{name}{labels} {v}")

            metric("model_loaded", "gauge", "1 when the model is loaded.", [("", int(loaded))])
            metric("requests_total", "counter", "Generation requests received, by endpoint.",
                   [(f'{{endpoint="{k}"}}', v) for k, v in sorted(self.requests.items())] or [("", 0)])
            metric("request_errors_total", "counter", "Requests answered with an error.", [("", self.errors)])
            metric("requests_cancelled_total", "counter", "Generations stopped by a client disconnect.",
                   [("", self.cancelled)])
            metric("requests_processing", "gauge", "Generation requests running or queued.", [("", self.processing)])
            metric("prompt_tokens_total", "counter", "Prompt tokens processed.", [("", self.prompt_tokens)])
            metric("tokens_predicted_total", "counter", "Tokens generated.", [("", self.generated_tokens)])
            metric("prompt_seconds_total", "counter", "Prefill time.", [("", float(self.prefill_s))])
            metric("tokens_predicted_seconds_total", "counter", "Decode time.", [("", float(self.decode_s))])
            metric("prompt_tokens_per_second", "gauge", "Average prefill throughput.",
                   [("", float(self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0))])
            metric("predicted_tokens_per_second", "gauge", "Average decode throughput.",
                   [("", float(self.generated_tokens / self.decode_s if self.decode_s else 0.0))])
            metric("last_predicted_tokens_per_second", "gauge", "Decode throughput of the last request.",
                   [("", float(self.last_decode_tok_s))])
            metric("spec_rounds_total", "counter", "Speculative rounds (drafts verified).", [("", self.spec_rounds)])
            metric("spec_draft_tokens_total", "counter", "Draft tokens proposed.", [("", self.spec_drafted)])
            metric("spec_accepted_tokens_total", "counter", "Draft tokens accepted.", [("", self.spec_accepted)])
            metric("spec_acceptance_rate", "gauge", "Accepted / proposed draft tokens.",
                   [("", float(self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0))])
            metric("spec_draft_tokens_at_position_total", "counter", "Draft tokens proposed at each draft position.",
                   [(f'{{position="{i + 1}"}}', v) for i, v in enumerate(self.drafted_at)])
            metric("spec_accepted_tokens_at_position_total", "counter", "Draft tokens accepted at each draft position.",
                   [(f'{{position="{i + 1}"}}', v) for i, v in enumerate(self.accepted_at)])
            return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- state
class ServerState:
    """The model (None while loading), the single worker thread and the metrics."""

    def __init__(self, loader: Callable[[], LLM], aliases: list[str] | None = None, *,
                 prefill_assistant: bool = True, defaults: SamplingParams | None = None):
        self.loader = loader
        # sampling settings for requests that leave them out (`pyminfer serve --temp ...`, as
        # llama-server's flags); None: the request fields' own defaults (llama.cpp's)
        self.defaults = defaults
        # a chat whose last message is the assistant's continues that message (llama.cpp's server
        # default; `pyminfer serve --no-prefill-assistant` turns it off) unless the request says
        self.prefill_assistant = prefill_assistant
        self.aliases = [a for a in (aliases or []) if a]
        self.llm: LLM | None = None
        self.load_error: str | None = None
        self.worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pyminfer-gen")
        self.metrics = Metrics()
        self.on_load_error: Callable[[BaseException], None] | None = None
        self.created = int(time.time())
        # shutdown (Ctrl-C): every generation's cancel event is set, so streams end with an error
        # event and [DONE] inside uvicorn's graceful period instead of being killed mid-stream
        self.closing = threading.Event()
        self._cancels: set[threading.Event] = set()
        self._cancels_lock = threading.Lock()
        # the generation running now, as /slots shows it: (task id, its params in the slot's shape);
        # task ids count the generations started (under metrics.lock)
        self.task: tuple[int, dict[str, Any]] | None = None
        self.n_tasks = 0

    def track(self, cancel: threading.Event) -> None:
        """Register a generation's cancel event (set at once when the server is shutting down)."""
        with self._cancels_lock:
            self._cancels.add(cancel)
            if self.closing.is_set():
                cancel.set()

    def untrack(self, cancel: threading.Event) -> None:
        """Forget a finished generation's cancel event (track's counterpart)."""
        with self._cancels_lock:
            self._cancels.discard(cancel)

    def begin_shutdown(self) -> None:
        """Stop every generation at its next token (the server is exiting). Called on the event
        loop (uvicorn's shutdown), never from a signal handler: track / untrack hold the lock."""
        with self._cancels_lock:
            self.closing.set()
            for c in self._cancels:
                c.set()

    def load(self) -> None:
        try:
            llm = self.loader()
        except BaseException as e:  # noqa: BLE001 - reported through /health and the log
            self.load_error = f"{type(e).__name__}: {e}"
            from .engine import log

            log(f"pyminfer: error: loading the model failed: {self.load_error}")
            if self.on_load_error:
                self.on_load_error(e)
            return
        if llm.tokenizer.chat_template:
            # a template that does not compile fails every chat request (500): say so at startup, but
            # keep serving, since /v1/completions and the token endpoints still work
            try:
                llm.tokenizer.check_chat_template()
            except ChatTemplateError as e:
                from .engine import log

                log(f"pyminfer: warning: {e}")
        self.llm = llm

    @property
    def model_id(self) -> str:
        if self.aliases:
            return self.aliases[0]
        return self.llm.name if self.llm else "pyminfer"

    def names(self) -> set[str]:
        out = set(self.aliases)
        if self.llm is not None:
            p = self.llm.model_path
            out |= {p.name, p.stem, str(p)}
            from .models import MODELS

            out |= {k for k, v in MODELS.items() if v.filename == p.name}
        return out

    def require(self) -> LLM:
        if self.llm is None:
            if self.load_error:
                raise APIError(503, f"the model failed to load: {self.load_error}", type="server_error",
                               code="model_load_failed")
            raise _loading_error()
        return self.llm


def _logprobs_asked(req: _GenRequest) -> int | None:
    """How many alternatives a token the request asks log-probabilities with, or None: a chat's
    logprobs (bool) + top_logprobs (0..20, OpenAI's limit), a completion's logprobs (an int,
    0..20), llama.cpp's n_probs (> 0, no limit but the vocabulary; in a chat too, as llama.cpp
    passes it through). 400 for a value of the other API's type, one out of range, or
    top_logprobs > 0 without logprobs true (0 asks for nothing, so it is accepted, as vLLM does:
    some clients send it by default)."""
    def ranged(name: str, v: int) -> int:
        if not 0 <= v <= MAX_LOGPROBS:
            raise APIError(400, f"{name} must be in 0..{MAX_LOGPROBS}, got {v}", param=name, code="invalid_value")
        return v

    lp = req.logprobs
    if isinstance(req, ChatRequest):
        if lp is not None and not isinstance(lp, bool):
            raise APIError(400, "logprobs in a chat request is true or false (top_logprobs says how many "
                           "alternatives)", param="logprobs", code="invalid_value")
        if req.top_logprobs is not None and not lp:
            if ranged("top_logprobs", req.top_logprobs):
                raise APIError(400, "top_logprobs needs logprobs true", param="top_logprobs", code="invalid_value")
        if lp:
            return ranged("top_logprobs", req.top_logprobs or 0)
    else:
        if isinstance(lp, bool):
            raise APIError(400, "logprobs in a completion request is the number of alternatives a token "
                           f"(0..{MAX_LOGPROBS}), not true or false", param="logprobs", code="invalid_value")
        if req.top_logprobs is not None:
            raise APIError(400, "top_logprobs is a chat request's field; a completion takes logprobs "
                           f"(0..{MAX_LOGPROBS})", param="top_logprobs", code="invalid_value")
        if lp is not None:
            return ranged("logprobs", lp)
    return req.n_probs if req.n_probs > 0 else None


# The request fields a server default (ServerState.defaults) stands in for when a request leaves
# them out (SamplingParams has the same names).
_DEFAULTED = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n", "seed", "samplers")


def _params(req: _GenRequest, defaults: SamplingParams | None = None) -> SamplingParams:
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if defaults is not None:
        given = req.model_fields_set
        req = req.model_copy(update={k: getattr(defaults, k) for k in _DEFAULTED if k not in given})
    samplers = req.samplers
    if isinstance(samplers, dict):
        if samplers:
            raise APIError(400, "samplers must be a list of sampler names or a string of their letters "
                           "(an empty object stands for the default chain)", param="samplers", code="invalid_value")
        samplers = None
    p = SamplingParams(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                       repeat_penalty=req.repeat_penalty, repeat_last_n=req.repeat_last_n, seed=req.seed, stop=stop,
                       samplers=samplers, n_indent=req.n_indent, t_max_predict_ms=req.t_max_predict_ms,
                       logprobs=_logprobs_asked(req), min_keep=req.min_keep)
    try:
        p.validate()
    except ValueError as e:
        msg = str(e)
        param = next((f for f in ("samplers", "min_keep") if f in msg), "samplers" if "sampler" in msg else None)
        raise APIError(400, msg, param=param, code="invalid_value") from None
    return p


def _lp_piece(llm: LLM, token: int) -> tuple[str, list[int]]:
    """A token's text for a logprobs entry (invalid UTF-8, part of a character, as U+FFFD, as
    vLLM shows it) and its exact bytes."""
    b = llm.tokenizer.token_to_piece(token)
    return b.decode("utf-8", errors="replace"), list(b)


def _lp_entries(llm: LLM, lps: list[TokenLogprob], with_id: bool) -> list[dict[str, Any]]:
    """[{id (with_id: llama.cpp's), token, bytes, logprob, top_logprobs: [the same without
    top_logprobs]}]: OpenAI's chat logprobs content, llama.cpp's completion_probabilities."""
    def entry(i: int, lp: float) -> dict[str, Any]:
        text, b = _lp_piece(llm, i)
        return {**({"id": i} if with_id else {}), "token": text, "bytes": b, "logprob": lp}

    return [{**entry(e.id, e.logprob), "top_logprobs": [entry(i, lp) for i, lp in e.top]} for e in lps]


def _completion_logprobs(llm: LLM, lps: list[TokenLogprob], shift: int = 0,
                         echo: tuple[list[int], list[TokenLogprob | None]] | None = None) -> dict[str, Any]:
    """OpenAI's (legacy) completion choice logprobs: tokens, token_logprobs, top_logprobs (a map
    token text -> logprob a token) and text_offset (where each token's text starts in the
    choice's text, characters; ``shift`` added). ``echo``: the prompt's ids and their
    LLM.prompt_logprobs first (the first token's logprob and top_logprobs null, as OpenAI's)."""
    out: dict[str, Any] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for i, e in zip(*echo) if echo else ():
        out["tokens"].append(_lp_piece(llm, i)[0])
        out["token_logprobs"].append(None if e is None else e.logprob)
        out["top_logprobs"].append(None if e is None else {**{_lp_piece(llm, j)[0]: lp for j, lp in e.top},
                                                           out["tokens"][-1]: e.logprob})
        out["text_offset"].append(0 if e is None else e.offset)
    for e in lps:
        out["tokens"].append(_lp_piece(llm, e.id)[0])
        out["token_logprobs"].append(e.logprob)
        # OpenAI: "the API will always return the logprob of the sampled token", up to n + 1 entries
        top = {_lp_piece(llm, i)[0]: lp for i, lp in e.top}
        top.setdefault(out["tokens"][-1], e.logprob)
        out["top_logprobs"].append(top)
        out["text_offset"].append(e.offset + shift)
    return out


def _pick_fields(paths: list[str], out: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's response_fields (json_get_nested_values): for each path ("a" or "a/b") found
    in ``out``, the value under the path as a key; paths not found are left out."""
    picked: dict[str, Any] = {}
    for path in paths:
        cur: Any = out
        for key in path.split("/"):
            if not isinstance(cur, dict) or key not in cur:
                break
            cur = cur[key]
        else:
            picked[path] = cur
    return picked


def _usage(n_prompt: int, res: GenerationResult) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: the prompt's leading tokens
    whose K/V were reused from the last request (cache_prompt)."""
    n_gen = len(res.generated_ids)
    return {"prompt_tokens": n_prompt, "completion_tokens": n_gen, "total_tokens": n_prompt + n_gen,
            "prompt_tokens_details": {"cached_tokens": int(res.timings.get("cached_tokens", 0))}}


def _timings(res: GenerationResult) -> dict[str, Any]:
    t = res.timings
    prompt_n, prompt_ms = int(t.get("prefill_tokens", 0)), 1000 * t.get("prefill_s", 0.0)
    predicted_n, predicted_ms = len(res.generated_ids), 1000 * t.get("decode_s", 0.0)
    out = {"cache_n": int(t.get("cached_tokens", 0)), "prompt_n": prompt_n, "prompt_ms": prompt_ms,
           "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
           "prompt_per_second": t.get("prefill_tok_s", 0.0), "predicted_n": predicted_n,
           "predicted_ms": predicted_ms, "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
           # as llama.cpp's server: both rates from the same n (their product is 1000)
           "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms > 0 else 0.0}
    if res.spec:
        out["draft_n"] = res.spec.get("drafted", 0)
        out["draft_n_accepted"] = res.spec.get("accepted", 0)
    return out


# ---------------------------------------------------------------------------------------------- app
def create_app(state: ServerState, *, load_on_startup: bool = True) -> FastAPI:
    """The FastAPI app over ``state``; with ``load_on_startup`` the model loads in a background
    thread once the server is up (/health says 503 until then)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if load_on_startup and state.llm is None:
            threading.Thread(target=state.load, name="pyminfer-load", daemon=True).start()
        yield
        state.worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="pyminfer", lifespan=lifespan)
    app.state.pyminfer = state
    app.add_middleware(_CatchAll, state=state)
    # Any origin may call, as llama.cpp's server allows: browser front ends served from elsewhere
    # need the preflight answered. Added last, so outermost: error responses carry the headers too.
    app.add_middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"], allow_headers=["*"])

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        if exc.status != 499:  # a client that went away is counted as cancelled (_job), not as an error
            with state.metrics.lock:
                state.metrics.errors += 1
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        with state.metrics.lock:
            state.metrics.errors += 1
        return _validation_api_error(exc.errors()).response()

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        typ = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return APIError(exc.status_code, str(exc.detail), type=typ).response()

    # Unhandled exceptions: _CatchAll (500 JSON, the connection kept), not an Exception handler.

    # ------------------------------------------------------------------ info
    @app.api_route("/health", methods=["GET", "HEAD"])  # HEAD: load balancers' and uptime probes' check
    @app.api_route("/v1/health", methods=["GET", "HEAD"])  # llama.cpp's server answers both
    async def health() -> JSONResponse:
        if state.llm is None:
            if state.load_error:
                return JSONResponse({"status": "error", "error": state.load_error}, status_code=503)
            return JSONResponse({"status": "loading model"}, status_code=503)
        return JSONResponse({"status": "ok"})

    def model_card(llm: LLM, model_id: str) -> dict[str, Any]:
        return {"id": model_id, "object": "model", "created": state.created, "owned_by": "pyminfer",
                "meta": {"file": llm.name, "n_ctx": llm.n_ctx, "n_vocab": llm.tokenizer.n_vocab, "device": llm.device,
                         "draft": llm.draft.gguf.path.name if llm.draft is not None else None}}

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card(state.require(), state.model_id)]})

    @app.get("/v1/models/{model_id:path}")  # :path: the model's file path is one of its names
    @app.get("/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        """OpenAI's "retrieve model": any name this server answers to (aliases, file name, path)."""
        llm = state.require()
        if model_id not in state.names():
            raise APIError(404, f"The model '{model_id}' does not exist (this server serves '{state.model_id}')",
                           param="model", code="model_not_found")
        return JSONResponse(model_card(llm, model_id))

    @app.get("/props")
    async def props() -> JSONResponse:
        """llama.cpp's server properties, the fields its clients read."""
        llm = state.require()
        return JSONResponse({
            "default_generation_settings": _slot(state, running=False),
            "total_slots": 1,
            "model_path": str(llm.model_path),
            "chat_template": llm.tokenizer.chat_template or "",
            "modalities": {"vision": False, "audio": False},
            "build_info": f"pyminfer {_VERSION}",
        })

    @app.get("/slots")
    async def slots(fail_on_no_slot: str = "") -> JSONResponse:
        """llama.cpp's slot monitoring: a list of the slots (one here: requests run one at a time).
        ``?fail_on_no_slot=1``: a 503 while it is busy, as llama-server answers when no slot is idle."""
        s = _slot(state)
        if fail_on_no_slot not in ("", "0", "false") and s["is_processing"]:
            raise APIError(503, "no slot available", type="unavailable_error", code="no_slot_available")
        return JSONResponse([s])

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(state.metrics.render(state.llm is not None),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    @app.post("/embedding")
    async def embeddings() -> JSONResponse:
        # as llama.cpp's server without --embeddings: 501 with a reason, not a bare 404
        raise APIError(501, "this server does not compute embeddings (a generation-only engine)",
                       type="not_supported_error")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        req = await _parse(request, TokenizeRequest)
        llm = state.require()
        # add_special as llama.cpp's: BOS / EOS where the model adds them (add_bos_token /
        # add_eos_token in the GGUF), never one the model does not use
        model_default = None if req.add_special else False
        try:
            ids = await _off_loop(lambda: llm.tokenizer.encode(req.content, parse_special=req.parse_special,
                                                               add_bos=model_default, add_eos=model_default))
        except ValueError as e:
            raise APIError(400, str(e), param="content") from None
        if req.with_pieces:
            pieces = await _off_loop(lambda: [{"id": i, "piece": _piece(llm.tokenizer.token_to_piece(i))} for i in ids])
            return JSONResponse({"tokens": pieces})
        return JSONResponse({"tokens": ids})

    @app.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        req = await _parse(request, DetokenizeRequest)
        llm = state.require()
        try:
            return JSONResponse({"content": await _off_loop(llm.detokenize, req.tokens)})
        except ValueError as e:
            raise APIError(400, str(e), param="tokens") from None

    # ------------------------------------------------------------------ generation
    def check_model(req: _GenRequest) -> LLM:
        llm = state.require()
        if req.model and req.model not in state.names():
            raise APIError(404, f"The model '{req.model}' does not exist (this server serves '{state.model_id}')",
                           param="model", code="model_not_found")
        n_vocab = llm.tokenizer.n_vocab
        out = [i for i in _logit_bias_ids(getattr(req, "logit_bias", None)) if i >= n_vocab]
        if out:
            raise APIError(400, f"logit_bias: token id {out[0]} is outside the vocabulary (0..{n_vocab - 1})",
                           param="logit_bias", code="invalid_value")
        return llm

    def check_prompt(llm: LLM, ids: list[int], param: str = "prompt") -> None:
        """400 for an empty prompt or one that leaves no position free; ``param``: the request
        field the prompt came from ("messages" for a chat)."""
        if not ids:
            raise APIError(400, "the prompt is empty", param=param)
        if len(ids) >= llm.n_ctx:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this model's context holds {llm.n_ctx} "
                           "(at least one position must stay free)", param=param,
                           code="context_length_exceeded")

    def check_prompt_text(llm: LLM, texts: Sequence[str], param: str = "prompt") -> None:
        """check_prompt's context bound before tokenizing: text pieces that give at least twice n_ctx
        tokens by Tokenizer.min_tokens (a proven lower bound; the factor 2 is a margin on the proof)
        cannot fit, so they are a 400 at once instead of after seconds of tokenizing (megabytes)
        and the memory that takes. A prompt that could fit is never refused here."""
        low = sum(llm.tokenizer.min_tokens(t) for t in texts)
        if low >= 2 * llm.n_ctx:
            n = sum(len(t) for t in texts)
            raise APIError(400, f"the prompt has {n} characters, at least {low} tokens; this model's context holds "
                           f"{llm.n_ctx}", param=param, code="context_length_exceeded")

    def fim_prompt(llm: LLM, prefix: str, suffix: str, *, extra: list[InfillChunk] | None = None, prompt: str = "",
                   n: int | None = None, param: str = "input_prefix", unsupported: int = 501) -> list[int]:
        """The FIM prompt's ids (pyminfer.infill), checked like any prompt; a model without FIM
        tokens is ``unsupported`` (501 for /infill, as llama.cpp's server; 400 for a suffix)."""
        fim = llm.tokenizer.fim_ids
        if prompt and all(k in fim for k in ("pre", "suf", "mid")):  # (without them: infill_ids' 501 / 400)
            check_prompt_text(llm, [prompt])  # tokenized on its own and kept whole; the rest is cut to fit
        try:
            ids = infill_ids(llm.tokenizer, prefix, suffix, extra=extra or (), prompt=prompt, n_ctx=llm.n_ctx,
                             n_predict=n)
        except InfillUnsupportedError as e:
            if unsupported == 501:
                raise APIError(501, str(e), type="not_supported_error") from None
            raise APIError(400, f"{param}: {e}", param=param, code="unsupported_parameter") from None
        except ValueError as e:
            raise APIError(400, str(e), param=param) from None
        # the other pieces are cut to fit: only the prompt (/infill's) can make the whole too long
        check_prompt(llm, ids, param="prompt" if prompt else param)
        return ids

    def max_tokens(req: _GenRequest, default: int | None) -> int | None:
        """The request's token limit (max_tokens / n_predict), else ``default``; None means until
        end of generation or a full context (LLM.generate's own limit: it stopped one token short
        when computed here as n_ctx - n_prompt)."""
        given, m = req.token_limit()
        return m if given else default

    def completion_prompts(req: CompletionRequest, llm: LLM) -> list[list[int]]:
        """The request's prompts as token ids: one, or each of a batch (OpenAI's list of strings or
        of token-id lists; llama.cpp's list of prompts), checked in order (the first bad one is
        the 400, its index in the message). A streamed batch is a 400: its chunks would interleave.
        A non-empty suffix: one text prompt, the text before the gap (fim_prompt)."""
        p = req.prompt
        if req.suffix:
            if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str):  # a batch of one
                p = p[0]
            if not isinstance(p, str):
                raise APIError(400, "suffix (fill-in-the-middle) needs one text prompt: the text before the gap",
                               param="prompt", code="invalid_value")
            return [fim_prompt(llm, p, req.suffix, n=max_tokens(req, None), param="suffix", unsupported=400)]
        # llama.cpp's rule (tokenize_input_prompts): a string, a list of ids, or a list of ids and text
        # pieces is one prompt; any other list is a batch of such prompts (a batch of one included)
        kind = _prompt_kind(p)
        if kind is not None:
            return [completion_prompt(p, kind, llm)]
        assert isinstance(p, list)  # (the request model admits nothing else)
        if req.stream and len(p) > 1:
            raise APIError(400, f"a batch of {len(p)} prompts cannot be streamed: send one prompt per streamed "
                           "request", param="prompt")
        out = []
        for i, x in enumerate(p):
            try:
                kind = _prompt_kind(x)
                if kind is None:  # (llama.cpp's refusal: a list of strings alone, say)
                    raise APIError(400, "must be a string, a list of token ids, or a list of strings and token ids",
                                   param="prompt")
                out.append(completion_prompt(x, kind, llm))
            except APIError as e:
                e.message = f"prompt {i}: {e.message}"
                raise
        return out

    def completion_prompt(p: Any, kind: str, llm: LLM) -> list[int]:
        """One prompt ``p`` of _prompt_kind ``kind`` (text, token ids or a mixed list) as checked token
        ids; raises APIError (400) for ids outside the vocabulary, bad text or a prompt that does not
        fit n_ctx."""
        if kind == "mixed":
            # llama.cpp's mixed prompt ([12, 34, "text", 56]): one prompt, each text piece tokenized,
            # the model's special tokens only with a text piece that comes first (its tokenize_mixed)
            check_prompt_text(llm, [x for x in p if isinstance(x, str)])
            try:
                ids: list[int] = []
                for i, x in enumerate(p):
                    # special tokens (BOS, EOS where the model adds them) around the first piece only
                    first = None if i == 0 else False
                    ids += llm.tokenizer.encode(x, add_bos=first, add_eos=first) if isinstance(x, str) else [x]
                ids = llm.prompt_ids(ids)  # the ids in range
            except (TypeError, ValueError) as e:
                raise APIError(400, str(e), param="prompt") from None
            check_prompt(llm, ids)
            return ids
        if isinstance(p, str):
            check_prompt_text(llm, [p])
        try:
            ids = llm.prompt_ids(p)
        except (TypeError, ValueError) as e:
            raise APIError(400, str(e), param="prompt") from None
        check_prompt(llm, ids)
        return ids

    @app.post("/v1/completions")
    @app.post("/completions")
    async def completions(request: Request) -> Any:
        req = await _parse(request, CompletionRequest)
        state.metrics.count_request("completions")
        llm = check_model(req)
        batch = await _off_loop(completion_prompts, req, llm)
        ids = batch[0]
        params = _params(req, state.defaults)
        n = max_tokens(req, 16)
        cid = f"cmpl-{uuid.uuid4().hex}"

        def piece(text: str, finish: str | None, index: int = 0, lps: list[TokenLogprob] | None = None,
                  shift: int = 0, echo: Any = None) -> dict[str, Any]:
            lp = _completion_logprobs(llm, lps, shift, echo) if lps is not None else None
            return {"id": cid, "object": "text_completion", "created": int(time.time()), "model": req.model or state.model_id,
                    "choices": [{"text": text, "index": index, "logprobs": lp, "finish_reason": finish}]}

        async def echoed(b: list[int]) -> tuple[str, Any]:
            """OpenAI's echo: the prompt's text (as the model reads it: detokenized, special
            tokens included) and, with logprobs, its ids and LLM.prompt_logprobs (_score: on the
            generation thread, whose cache then holds the prompt for the generation after it)."""
            if not req.echo:
                return "", None
            text = llm.detokenize(b)
            if params.logprobs is None:
                return text, None
            return text, (b, await _score(state, request, llm, b, params.logprobs))

        if len(batch) > 1:  # OpenAI: one choice per prompt, in order (run one after another), usage summed
            choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0,
                                  "prompt_tokens_details": {"cached_tokens": 0}}
            for i, b in enumerate(batch):
                head, echo = await echoed(b)
                res = await _run(state, request, llm, b, params, n, req.cache_prompt)
                choices += piece(head + res.text, res.finish_reason, i, res.logprobs, len(head), echo)["choices"]
                u = _usage(len(b), res)
                for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
                    usage[k] += u[k]
                usage["prompt_tokens_details"]["cached_tokens"] += u["prompt_tokens_details"]["cached_tokens"]
            return JSONResponse({**piece("", None), "choices": choices, "usage": usage})

        head, echo = await echoed(ids)
        if req.stream:
            def first() -> list[dict[str, Any]]:  # the echoed prompt comes first, as vLLM streams it
                return [piece(head, None, 0, [] if echo else None, 0, echo)] if req.echo else []

            def delta(text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
                return piece(text, None, 0, lps if params.logprobs is not None else None, len(head))

            def final(res: GenerationResult) -> dict[str, Any]:
                d = piece("", res.finish_reason)
                d["usage"] = _usage(len(ids), res)
                d["timings"] = _timings(res)
                return d

            return _sse(state, request, llm, ids, params, n, first, delta, final,
                        usage_piece=piece if _include_usage(req) else None, cache=req.cache_prompt)
        res = await _run(state, request, llm, ids, params, n, req.cache_prompt)
        out = piece(head + res.text, res.finish_reason, 0, res.logprobs, len(head), echo)
        out["usage"] = _usage(len(ids), res)
        out["timings"] = _timings(res)
        return JSONResponse(out)

    def chat_prompt(llm: LLM, req: ChatRequest, *, ids: bool = False) -> Any:
        """The request's messages through the model's chat template, with the assistant's opening,
        or open at the end of a last assistant message that is to be continued (the request's
        continue_final_message, else the server's assistant prefill: a last assistant message
        with text and no tool calls); ids: as token ids, special tokens parsed. 500 for a template
        that fails (the model's fault), 400 for a message it cannot render."""
        msgs = [m.model_dump(exclude_none=True) for m in req.messages]
        cont, agp = req.continue_final_message, req.add_generation_prompt
        if cont and agp:
            raise APIError(400, "continue_final_message and add_generation_prompt cannot both be true (the last "
                           "message is either continued or answered)", param="add_generation_prompt",
                           code="invalid_value")
        if cont is None:
            last = msgs[-1]
            cont = (agp is None and state.prefill_assistant and last["role"] == "assistant"
                    and not last.get("tool_calls"))
        try:
            text = llm.apply_chat_template(msgs, add_generation_prompt=agp is not False,
                                           continue_final_message=cont)
            if not ids:
                return text
            check_prompt_text(llm, [text], "messages")
            return llm.tokenize(text, parse_special=True)
        except ChatTemplateError as e:  # the model's fault, not the request's
            raise APIError(500, str(e), type="server_error", code="chat_template_error") from None
        except ValueError as e:  # MessageError: its param is the field's path
            raise APIError(400, str(e), param=getattr(e, "param", "messages"), code="invalid_value") from None

    @app.post("/apply-template")
    async def apply_template(request: Request) -> JSONResponse:
        """llama.cpp's: the prompt text a chat request's messages become (the chat template with the
        assistant's opening), without generating: {"prompt": ...}."""
        req = await _parse(request, ChatRequest)
        llm = check_model(req)
        return JSONResponse({"prompt": await _off_loop(chat_prompt, llm, req)})

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions(request: Request) -> Any:
        req = await _parse(request, ChatRequest)
        state.metrics.count_request("chat_completions")
        llm = check_model(req)
        ids = await _off_loop(lambda: chat_prompt(llm, req, ids=True))
        check_prompt(llm, ids, param="messages")
        params = _params(req, state.defaults)
        n = max_tokens(req, None)
        cid = f"chatcmpl-{uuid.uuid4().hex}"

        def piece(d: dict[str, Any], finish: str | None, obj: str = "chat.completion.chunk",
                  lps: list[TokenLogprob] | None = None) -> dict[str, Any]:
            return {"id": cid, "object": obj, "created": int(time.time()), "model": req.model or state.model_id,
                    "choices": [{"index": 0, "delta": d,
                                 "logprobs": {"content": _lp_entries(llm, lps, False)} if lps is not None else None,
                                 "finish_reason": finish}]}

        if req.stream:
            def first() -> list[dict[str, Any]]:
                return [piece({"role": "assistant", "content": ""}, None)]

            def delta(text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
                return piece({"content": text}, None, lps=lps if params.logprobs is not None else None)

            def final(res: GenerationResult) -> dict[str, Any]:
                d = piece({}, res.finish_reason)
                d["usage"] = _usage(len(ids), res)
                d["timings"] = _timings(res)
                return d

            def usage_only(_: str, __: None) -> dict[str, Any]:
                return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": req.model or state.model_id, "choices": []}

            return _sse(state, request, llm, ids, params, n, first, delta, final,
                        usage_piece=usage_only if _include_usage(req) else None, cache=req.cache_prompt)
        res = await _run(state, request, llm, ids, params, n, req.cache_prompt)
        out = {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": req.model or state.model_id,
               "choices": [{"index": 0, "message": {"role": "assistant", "content": res.text},
                            "logprobs": {"content": _lp_entries(llm, res.logprobs, False)}
                            if res.logprobs is not None else None,
                            "finish_reason": res.finish_reason}],
               "usage": _usage(len(ids), res), "timings": _timings(res)}
        return JSONResponse(out)

    @app.post("/completion")
    async def completion(request: Request) -> Any:
        """llama.cpp's native completion endpoint: the same request fields and generation as
        /v1/completions, llama.cpp's response shape, and no token limit unless n_predict (or
        max_tokens) sets one."""
        req = await _parse(request, CompletionRequest)
        state.metrics.count_request("completion")
        llm = check_model(req)
        batch = await _off_loop(completion_prompts, req, llm)
        return await native_completion(request, req, llm, batch)

    @app.post("/infill")
    async def infill(request: Request) -> Any:
        """llama.cpp's fill-in-the-middle endpoint: input_prefix / input_suffix around the gap,
        input_extra ([{"filename", "text"}]) before them, prompt at the end of the prefix
        (pyminfer.infill); the answer (the middle) as /completion gives it. 501 for a model
        without FIM tokens."""
        req = await _parse(request, InfillRequest)
        state.metrics.count_request("infill")
        llm = check_model(req)
        extra = [InfillChunk(c.text, c.filename) for c in req.input_extra]
        ids = await _off_loop(lambda: fim_prompt(llm, req.input_prefix, req.input_suffix, extra=extra,
                                                 prompt=req.prompt, n=max_tokens(req, None)))
        return await native_completion(request, req, llm, [ids])

    async def native_completion(request: Request, req: _GenRequest, llm: LLM, batch: list[list[int]]) -> Any:
        """llama.cpp's response to /completion (and /infill) for the prompts ``batch``."""
        if req.echo:
            raise APIError(400, "not supported by this server: echo (OpenAI's /v1/completions echoes its prompt; "
                           "llama.cpp's /completion does not)", param="echo", code="unsupported_parameter")
        ids = batch[0]
        params = _params(req, state.defaults)
        n = max_tokens(req, None)

        def final(res: GenerationResult, content: str, ids: list[int] = ids, probs: bool = True) -> dict[str, Any]:
            extra = ({"completion_probabilities": _lp_entries(llm, res.logprobs, True)}
                     if probs and res.logprobs is not None else {})
            return {"content": content, "id_slot": 0, "stop": True, "model": req.model or state.model_id, **extra,
                    "tokens_predicted": len(res.generated_ids), "tokens_evaluated": len(ids),
                    # llama.cpp's: the tokens the KV cache holds now (every generated token but
                    # the last has been evaluated); the prompt tokens reused are timings.cache_n
                    "tokens_cached": len(ids) + max(len(res.generated_ids) - 1, 0),
                    # llama-server's truncated: generation stopped at a full context (its context
                    # shift is off by default, as it always is here)
                    "truncated": res.stop_reason == "context",
                    "stop_type": _STOP_TYPES[res.stop_reason], "stopping_word": res.stop_word,
                    # llama-server's: the settings as /slots shows them, with the seed the sampler used
                    # (drawn at random when the request gave none: send it back to repeat the run)
                    "generation_settings": {**_slot_params(params, n, req.stream), "seed": res.seed},
                    "timings": _timings(res)}

        if req.stream:  # llama.cpp's stream: one object per piece, the last with stop true; no [DONE]
            def delta(text: str, lps: list[TokenLogprob]) -> dict[str, Any]:
                d = {"content": text, "stop": False, "id_slot": 0}
                if params.logprobs is not None:
                    d["completion_probabilities"] = _lp_entries(llm, lps, True)
                return d

            return _sse(state, request, llm, ids, params, n, lambda: [], delta,
                        lambda res: final(res, "", probs=False), done_marker=False, cache=req.cache_prompt)
        if len(batch) > 1:  # llama.cpp: an array of results, one per prompt, in order
            results = []
            for b in batch:
                res = await _run(state, request, llm, b, params, n, req.cache_prompt)
                out = {**final(res, res.text, b), "index": len(results)}
                results.append(_pick_fields(req.response_fields, out) if req.response_fields else out)
            return JSONResponse(results)
        res = await _run(state, request, llm, ids, params, n, req.cache_prompt)
        out = final(res, res.text)
        return JSONResponse(_pick_fields(req.response_fields, out) if req.response_fields else out)

    return app


# llama.cpp's stop_type for each GenerationResult.stop_reason
_STOP_TYPES = {"eos": "eos", "stop_string": "word", "max_tokens": "limit", "context": "limit", "indent": "limit",
               "time": "limit"}


def _piece(b: bytes) -> str | list[int]:
    """A token's piece as llama.cpp's /tokenize gives it: its text when its bytes are valid UTF-8,
    else the list of its byte values (part of a character split over tokens, e.g. an emoji)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return list(b)


def _include_usage(req: _GenRequest) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage


# ---------------------------------------------------------------------------------------------- running jobs
def _job(state: ServerState, llm: LLM, ids: list[int], params: SamplingParams, n: int | None, cancel: threading.Event,
         emit: Callable[[Chunk], None] | None, cache: bool = True) -> GenerationResult | None:
    """Runs in the single worker thread: one generation, stopped early when ``cancel`` is set;
    ``cache``: the request's cache_prompt (LLM.generate's)."""
    if cancel.is_set():  # a disconnect while queued, or the server shutting down (an error, not a cancel)
        state.metrics.add(0, 0, None, not state.closing.is_set())
        return None
    with state.metrics.lock:  # what /slots shows while this runs
        state.task = (state.n_tasks, _slot_params(params, n, emit is not None))
        state.n_tasks += 1
    try:
        return _job_run(state, llm, ids, params, n, cancel, emit, cache)
    finally:
        with state.metrics.lock:
            state.task = None


def _slot(state: ServerState, running: bool = True) -> dict[str, Any]:
    """The one slot this server has, in llama.cpp's shape (/slots' element; /props'
    default_generation_settings with ``running`` False): its context, speculation, whether a
    request runs and, while a generation runs (``running``), its task id and settings, else
    id_task -1 and the request defaults (also while a prompt is scored, echo with logprobs: not a
    generation, it has no sampling settings to show)."""
    llm = state.require()
    dp = state.defaults
    with state.metrics.lock:
        busy = state.metrics.processing > 0
        task = state.task
    spec = llm.draft is not None or llm.spec_ngram is not None
    if running and task is not None:  # as llama-server's slot shows its running task
        return {"id": 0, "id_task": task[0], "n_ctx": llm.n_ctx, "speculative": spec, "is_processing": True,
                "params": task[1]}
    if dp is None:  # the request fields' own defaults
        dp = SamplingParams(**{k: _GenRequest.model_fields[k].default for k in _DEFAULTED})
    # a request with no fields: n_predict -1 (until end of generation or a full context, /completion's
    # default), no stop strings, n_indent and t_max_predict_ms off, not streamed
    params = {**_slot_params(dp, None, False), "stop": [], "n_indent": 0, "t_max_predict_ms": -1}
    return {"id": 0, "id_task": -1, "n_ctx": llm.n_ctx, "speculative": spec, "is_processing": busy or task is not None,
            "params": params}


def _slot_params(params: SamplingParams, n: int | None, stream: bool) -> dict[str, Any]:
    """A generation's settings in the shape of /slots' params (n_predict -1: no limit; seed -1: random)."""
    return {"n_predict": -1 if n is None else n, "seed": -1 if params.seed is None else params.seed,
            **{k: getattr(params, k) for k in _DEFAULTED if k not in ("seed", "samplers")},
            "stop": list(params.stop), "stream": stream, "samplers": list(params.chain), "n_indent": params.n_indent,
            "t_max_predict_ms": params.t_max_predict_ms if params.t_max_predict_ms > 0 else -1}


def _job_run(state: ServerState, llm: LLM, ids: list[int], params: SamplingParams, n: int | None,
             cancel: threading.Event, emit: Callable[[Chunk], None] | None, cache: bool) -> GenerationResult | None:
    """_job's generation itself."""
    res: GenerationResult | None = None
    n_gen = 0
    it = llm.generate(ids, max_tokens=n, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                      min_p=params.min_p, repeat_penalty=params.repeat_penalty, repeat_last_n=params.repeat_last_n,
                      seed=params.seed, stop=params.stop, stream=True, cache_prompt=cache, samplers=params.samplers,
                      n_indent=params.n_indent, t_max_predict_ms=params.t_max_predict_ms, logprobs=params.logprobs,
                      min_keep=params.min_keep)
    assert not isinstance(it, GenerationResult)
    try:
        for ch in it:
            n_gen += len(ch.token_ids)
            if ch.result is not None:
                res = ch.result
            elif emit is not None:
                emit(ch)
            if cancel.is_set():
                break
    finally:
        it.close()  # type: ignore[attr-defined]
    if res is not None:
        n_gen = len(res.generated_ids)
    # stopped by a client disconnect (not by the server shutting down: that is an error, counted
    # with the 503 it answers)
    state.metrics.add(len(ids), n_gen, res, res is None and not state.closing.is_set())
    return res


def _shutting_down() -> APIError:
    """The error of a generation stopped because the server is exiting (ServerState.begin_shutdown)."""
    return APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down")


async def _tracked(state: ServerState, request: Request, work: Callable[[threading.Event], _T]) -> _T:
    """``work(cancel)`` on the generation thread, tracked: counted in /metrics' processing, and
    ``cancel`` set when the server shuts down (ServerState.track) or the client goes away (asked
    before it starts, then every 0.5 s: a batch's short prompts finish between the polls, so a
    disconnected batch once ran to its end). Returns what ``work`` returns; raises what it raises."""
    cancel = threading.Event()
    loop = asyncio.get_running_loop()
    state.track(cancel)
    with state.metrics.lock:
        state.metrics.processing += 1
    try:
        if await request.is_disconnected():
            cancel.set()
        fut = loop.run_in_executor(state.worker, work, cancel)
        while True:
            done, _ = await asyncio.wait({fut}, timeout=0.5)
            if done:
                break
            if await request.is_disconnected():
                cancel.set()
        return fut.result()
    except asyncio.CancelledError:
        cancel.set()
        raise
    finally:
        state.untrack(cancel)
        with state.metrics.lock:
            state.metrics.processing -= 1


async def _run(state: ServerState, request: Request, llm: LLM, ids: list[int], params: SamplingParams,
               n: int | None, cache: bool = True) -> GenerationResult:
    """A non-streaming generation (_tracked); a client that goes away cancels it (_job then counts
    it as cancelled and returns None: a 499; a 503 when the server is shutting down)."""
    res = await _tracked(state, request, lambda cancel: _job(state, llm, ids, params, n, cancel, None, cache))
    if res is None:
        if state.closing.is_set():
            raise _shutting_down()
        raise APIError(499, "the client closed the request", code="client_closed")
    return res


async def _score(state: ServerState, request: Request, llm: LLM, ids: list[int],
                 n_top: int) -> list[TokenLogprob | None]:
    """LLM.prompt_logprobs(ids, n_top) on the generation thread (OpenAI's echo with logprobs),
    tracked as a generation is (_tracked): stopped before its next forward when the client goes
    away (499, counted as cancelled) or the server shuts down (503)."""
    if state.closing.is_set():
        raise _shutting_down()

    def job(cancel: threading.Event) -> list[TokenLogprob | None]:
        if cancel.is_set():  # gone while queued behind another request
            raise ScoringCancelled("cancelled before it started")
        return llm.prompt_logprobs(ids, n_top, cancel=cancel)

    try:
        return await _tracked(state, request, job)
    except ScoringCancelled:
        if state.closing.is_set():
            raise _shutting_down() from None
        state.metrics.add(0, 0, None, True)
        raise APIError(499, "the client closed the request", code="client_closed") from None


def _sse(state: ServerState, request: Request, llm: LLM, ids: list[int], params: SamplingParams, n: int | None,
         first: Callable[[], list[dict[str, Any]]], delta: Callable[[str, list[TokenLogprob]], dict[str, Any]],
         final: Callable[[GenerationResult], dict[str, Any]], *,
         usage_piece: Callable[..., dict[str, Any]] | None = None, done_marker: bool = True,
         cache: bool = True) -> StreamingResponse:
    """A streaming generation as server-sent events: ``data: {json}`` chunks (``first()``, then
    ``delta(text, logprobs)`` per piece with text or token logprobs, then ``final(result)``, then a
    usage-only chunk from ``usage_piece`` when given: OpenAI's ``stream_options.include_usage``,
    where every other chunk then has
    ``"usage": null``), then ``data: [DONE]`` unless ``done_marker`` is false (llama.cpp's
    /completion has none). The generation stops at the next token when the client disconnects."""
    if state.closing.is_set():  # a 503 response, not a 200 stream that holds only the error
        raise _shutting_down()
    loop = asyncio.get_running_loop()
    cancel = threading.Event()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def put(item: tuple[str, Any]) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (server shutting down)
            cancel.set()

    def work() -> None:
        try:
            res = _job(state, llm, ids, params, n, cancel, lambda ch: put(("chunk", ch)), cache)
            put(("done", res))
        except BaseException as e:  # noqa: BLE001 - reported to the client as an error event
            put(("error", e))

    def sse(obj: Any) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    def chunk(d: dict[str, Any]) -> bytes:
        # OpenAI's stream_options.include_usage: every chunk but the last, usage-only one carries
        # "usage": null (a client that adds up usage over chunks must see it once)
        if usage_piece is not None:
            d["usage"] = None
        return sse(d)

    async def events() -> AsyncIterator[bytes]:
        # the job starts with the body, so the finally below always pairs with it: a client gone
        # before the body started left a generation running to its limit, never untracked
        state.track(cancel)
        with state.metrics.lock:
            state.metrics.processing += 1
        loop.run_in_executor(state.worker, work)
        try:
            for d in first():
                yield chunk(d)
            while True:
                kind, val = await queue.get()
                if kind == "chunk":
                    if val.text or val.logprobs:
                        yield chunk(delta(val.text, val.logprobs))
                elif kind == "done":
                    if val is None:
                        if state.closing.is_set():  # not a disconnect: tell the client why it ends
                            with state.metrics.lock:
                                state.metrics.errors += 1
                            yield sse(_shutting_down().body())
                            if done_marker:
                                yield b"data: [DONE]\n\n"
                        return
                    fin = final(val)
                    usage = fin.get("usage")
                    yield chunk(fin)
                    if usage_piece is not None:
                        u = usage_piece("", None)
                        u["choices"] = []
                        u["usage"] = usage
                        yield sse(u)
                    if done_marker:
                        yield b"data: [DONE]\n\n"
                    return
                else:
                    err = val if isinstance(val, APIError) else APIError(500, f"{type(val).__name__}: {val}",
                                                                         type="server_error")
                    yield sse(err.body())
                    if done_marker:
                        yield b"data: [DONE]\n\n"
                    return
        finally:
            cancel.set()  # a disconnect (or any early exit) stops the generation at the next token
            state.untrack(cancel)
            with state.metrics.lock:
                state.metrics.processing -= 1

    return StreamingResponse(events(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


# ---------------------------------------------------------------------------------------------- CLI
class _CatchAll:
    """ASGI middleware: an unhandled exception becomes the 500 JSON error (type server_error), logged
    with its traceback, and is not re-raised. Starlette's outermost ServerErrorMiddleware answers
    with the app's Exception handler and then re-raises, and uvicorn then drops the keep-alive
    connection, so a client's next request on it failed with "connection reset" (a response
    already started, e.g. a stream, still re-raises: nothing better can be sent)."""

    def __init__(self, app: Any, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_(msg: Any) -> None:
            nonlocal started
            if msg["type"] == "http.response.start":
                started = True
            await send(msg)

        try:
            await self.app(scope, receive, send_)
        except Exception as exc:  # noqa: BLE001 - every error must become a response
            if started:
                raise
            logging.getLogger("uvicorn.error").exception("pyminfer: error while serving %s", scope.get("path"))
            with self.state.metrics.lock:
                self.state.metrics.errors += 1
            await APIError(500, f"{type(exc).__name__}: {exc}", type="server_error").response()(scope, receive, send)


def main_serve(args: Any) -> int:
    """``pyminfer serve``: start uvicorn at once, load the model in a background thread."""
    try:
        import uvicorn
    except ModuleNotFoundError as e:
        from .cli import server_extra_missing

        raise server_extra_missing(e)  # noqa: B904

    from .cli import _load

    def loader() -> LLM:
        model, draft = _load(args)
        from .cli import _ngram

        return LLM.from_models(model, draft, spec_draft_n=getattr(args, "spec_draft_n", 4),
                               spec_adaptive=bool(getattr(args, "spec_draft_adaptive", False)), spec_ngram=_ngram(args))

    from .models import DEFAULT_MODEL

    from .cli import _params as cli_params

    defaults = cli_params(args) if hasattr(args, "temp") else None
    state = ServerState(loader, aliases=[getattr(args, "alias", None) or "", args.model or DEFAULT_MODEL],
                        prefill_assistant=not getattr(args, "no_prefill_assistant", False), defaults=defaults)
    app = create_app(state)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False,
                            timeout_graceful_shutdown=3)
    class _Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # on the event loop, ~0.1 s after Ctrl-C / SIGTERM and before the graceful wait: not in
            # the signal handler (handle_exit), which runs on this same thread and could interrupt
            # track / untrack holding the lock begin_shutdown takes (a deadlock)
            state.begin_shutdown()
            await super().shutdown(sockets)

    server = _Server(config)
    failed: list[BaseException] = []

    def on_fail(e: BaseException) -> None:
        failed.append(e)
        server.should_exit = True

    state.on_load_error = on_fail
    try:
        server.run()
    except SystemExit as e:  # uvicorn's startup failure (3): it logged why (a port in use, a bad host)
        if e.code == 3:
            raise RuntimeError(f"the server could not start on {args.host}:{args.port} (uvicorn's error above)") from None
        raise
    finally:
        if state.llm is not None:
            state.llm.close()
    return 1 if failed else 0
