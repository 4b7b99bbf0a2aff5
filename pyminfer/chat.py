"""``pyminfer chat``: interactive multi-turn chat in the terminal.

Earlier turns stay in the KV cache: the session keeps the list of token ids whose K/V are valid,
builds each new prompt as those ids plus the tokens of the new template text, and passes the
common-prefix length as ``n_past`` so only the new message is prefilled.

Commands: ``/clear`` (forget the conversation), ``/exit`` (or Ctrl-D), ``/help``; any other
``/word`` line is refused as a mistyped command (a message starting with / needs a space first). Ctrl-C stops the current
reply and keeps the session. A stats line (tokens/s, acceptance when speculative) follows each reply.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any, Iterator, Sequence

from .engine import ContextFull, log
from .generate import Chunk, GenerationResult, generate_stream
from .ngram import NgramSpec
from .sampling import SamplingParams

HELP = "commands: /clear (new conversation), /exit (quit; or Ctrl-D), /help; Ctrl-C stops a reply"


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two id lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


_GEN_HAS_DRAFT_N_PAST = "draft_n_past" in inspect.signature(generate_stream).parameters


class ChatSession:
    """A conversation whose tokens stay in the KV cache between turns.

    ``cache_ids``: ids whose K/V are valid in the target cache (positions 0..len-1);
    ``draft_ids``: the same for the draft model's cache (when speculative decoding is on).
    ``spec_draft_n`` / ``spec_adaptive`` / ``spec_ngram``: as generate_stream's (None: 4, or 1 with
    spec_adaptive).
    """

    def __init__(self, model: Any, draft: Any = None, *, params: SamplingParams | None = None,
                 max_tokens: int = 1024, system: str | None = None, spec_draft_n: int | None = None,
                 spec_adaptive: bool = False, spec_ngram: NgramSpec | None = None):
        self.model, self.draft = model, draft
        self.tok = model.tokenizer
        self.params = params or SamplingParams()
        self.max_tokens = max_tokens
        self.system = system
        self.spec_draft_n, self.spec_adaptive = spec_draft_n, spec_adaptive
        self.spec_ngram = spec_ngram
        self.clear()

    def clear(self) -> None:
        """Forget the conversation (the cache is simply overwritten by the next turn)."""
        self.messages: list[dict[str, str]] = [{"role": "system", "content": self.system}] if self.system else []
        self.cache_ids: list[int] = []
        self.draft_ids: list[int] = []
        self._last_prompt_text: str | None = None  # template text of the last prompt (generation prompt included)
        self._last_seq: list[int] = []  # the last prompt ids + the reply ids (without a final end-of-generation)
        self._last_reply = ""

    def check_system_fits(self) -> None:
        """Raise ValueError when the system message alone, in the chat template with an empty user
        turn, needs the whole context (n_ctx tokens) or more: no turn could then be answered, and
        /clear keeps it. Nothing to check without a system message."""
        if not self.system:
            return
        text = self._render([{"role": "system", "content": self.system}, {"role": "user", "content": ""}])
        n = len(self.tok.encode(text, parse_special=True))
        if n >= self.model.n_ctx:
            raise ValueError(f"--system needs {n} tokens in the chat template, the context holds n_ctx="
                             f"{self.model.n_ctx}: shorten it or raise -c/--ctx-size")

    # ------------------------------------------------------------------ prompt building
    def _render(self, messages: list[dict[str, str]]) -> str:
        if not self.tok.chat_template:  # plain transcript for models without a template
            return "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return self.tok.apply_chat_template(messages, add_generation_prompt=True)

    def build_prompt(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids for ``messages`` that reuse the previous turn's ids where the template text
        continues the previous prompt + reply (so the cache prefix stays valid); otherwise the
        whole rendered text, tokenized."""
        text = self._render(messages)
        prev = self._last_prompt_text
        if prev is not None and self._last_seq:
            head = prev + self._last_reply
            if text.startswith(head):
                delta = text[len(head):]
                return self._last_seq + self.tok.encode(delta, parse_special=True, add_bos=False)
        return self.tok.encode(text, parse_special=True)

    # ------------------------------------------------------------------ one turn
    def send(self, user_text: str) -> Iterator[Chunk]:
        """Add a user message and stream the reply. The last chunk carries the GenerationResult.
        The conversation records the reply even when the caller stops early (Ctrl-C): call
        ``finish_turn`` from a ``finally`` (``stream_reply`` does it for you).
        Raises ContextFull when even the newest message alone does not fit."""
        msgs = self.messages + [{"role": "user", "content": user_text}]
        ids = self.build_prompt(msgs)
        # drop the oldest turns until the prompt leaves room to answer
        room = min(256, max(self.model.n_ctx // 4, 1))
        dropped = 0
        while len(ids) + room > self.model.n_ctx and self._drop_oldest(msgs):
            ids = self.tok.encode(self._render(msgs), parse_special=True)
            dropped += 1
        if len(ids) >= self.model.n_ctx:  # before the log below: nothing is dropped then (msgs is a copy)
            raise ContextFull(f"the message needs {len(ids)} tokens; the context holds n_ctx={self.model.n_ctx}")
        if dropped:
            log(f"pyminfer: the conversation no longer fits n_ctx={self.model.n_ctx}: dropped its {dropped} oldest "
                f"exchange{'s' if dropped > 1 else ''}")
        n_past = common_prefix(self.cache_ids, ids)
        kw: dict[str, Any] = {}
        if self.spec_ngram is not None:
            kw["spec_ngram"] = self.spec_ngram
        if self.draft is not None:
            kw.update(draft=self.draft, spec_draft_n=self.spec_draft_n, spec_adaptive=self.spec_adaptive)
            if _GEN_HAS_DRAFT_N_PAST:
                kw["draft_n_past"] = common_prefix(self.draft_ids, ids)
        self.messages = msgs
        self._turn = _Turn(ids, n_past)
        # while the prefill runs, only the common prefix is known to be valid
        self.cache_ids = ids[:n_past]
        if self.draft is not None:
            self.draft_ids = ids[:kw.get("draft_n_past", 0)]
        for ch in generate_stream(self.model, ids, self.params, self.max_tokens, n_past=n_past, **kw):
            self._turn.add(ch)
            # once anything comes out the whole prompt is in the cache
            self.cache_ids = ids
            yield ch

    def finish_turn(self) -> GenerationResult | None:
        """Record the (maybe partial) reply as the assistant message and update the cache bookkeeping."""
        t = getattr(self, "_turn", None)
        if t is None:
            return None
        self._turn = None
        reply = "".join(t.texts)
        res = t.result
        self.messages.append({"role": "assistant", "content": reply})
        self._last_reply = reply
        if res is None:
            # stopped early (Ctrl-C): the reply was cut mid-stream, so the next turn re-renders the
            # history and reuses the cached prefix that still matches it. Every token yielded but
            # the last has its K/V in the cache (the invariant of a finished turn: a yielded token
            # is fed forward by the next step or round, and a native forward is never cut halfway),
            # so the cut reply's tokens count too, not only the prompt's.
            if t.generated:
                self.cache_ids = list(t.prompt) + t.generated[:-1]
            self._last_prompt_text, self._last_seq = None, []
            return None
        gen = list(res.generated_ids)
        # every generated token but the last one has its K/V in the cache
        self.cache_ids = list(t.prompt) + gen[:-1]
        if gen and gen[-1] in self.tok.eog_ids:
            gen = gen[:-1]
        self._last_prompt_text = self._render(self.messages[:-1])
        self._last_seq = list(t.prompt) + gen
        if self.draft is not None:
            dn = (res.spec or {}).get("draft_n_past")
            self.draft_ids = (list(t.prompt) + list(res.generated_ids))[:dn] if isinstance(dn, int) else []
        return res

    def _drop_oldest(self, msgs: list[dict[str, str]]) -> bool:
        """Remove the oldest non-system message pair from ``msgs`` (in place); False if none left."""
        start = 1 if msgs and msgs[0]["role"] == "system" else 0
        if len(msgs) - start <= 1:
            return False
        del msgs[start]
        if len(msgs) - start > 1 and msgs[start]["role"] == "assistant":
            del msgs[start]
        self._last_prompt_text = None
        return True


class _Turn:
    def __init__(self, prompt: list[int], n_past: int):
        self.prompt, self.n_past = prompt, n_past
        self.generated: list[int] = []
        self.texts: list[str] = []
        self.result: GenerationResult | None = None

    def add(self, ch: Chunk) -> None:
        self.generated.extend(ch.token_ids)
        self.texts.append(ch.text)
        if ch.result is not None:
            self.result = ch.result


def stats_line(res: GenerationResult | None, n_reused: int, n_prompt: int, n_gen: int, interrupted: bool) -> str:
    """The line printed after each reply."""
    parts = []
    if res is not None:
        t = res.timings
        parts.append(f"{n_gen} tok, {t['decode_tok_s']:.1f} tok/s")
        parts.append(f"prompt {n_prompt} tok ({n_reused} cached, {int(t['prefill_tokens'])} new, "
                     f"{t['prefill_tok_s']:.1f} tok/s)")
        if res.spec:
            s = res.spec
            rate = f"{100 * s['acceptance_rate']:.1f}%" if s["drafted"] else "n/a"  # (nothing drafted)
            parts.append(f"spec acceptance {rate} ({s['accepted']}/{s['drafted']}), "
                         f"{s['tokens_per_round']:.2f} tok/round")
        parts.append(f"finish: {res.finish_reason} ({res.stop_reason})")
    else:
        parts.append(f"{n_gen} tok")
    if interrupted:
        parts.append("interrupted")
    return "[" + " | ".join(parts) + "]"


def run_chat(session: ChatSession, *, stdin: Any = None, out: Any = None, err: Any = None) -> int:
    """The read-eval loop: read a line, stream the reply, print the stats line.

    A line that is not valid text (bytes that are not UTF-8 reach here as lone surrogates, see
    ``cli.cmd_chat``) or a message too long for the context even alone is refused with a message
    and skipped, and the loop goes on, as a REPL does; the return value is then 1 at the end (so a
    script piping lines in sees the failure), else 0."""
    from .tokenizer import InvalidUnicodeError, lone_surrogate

    out = out or sys.stdout
    err = err or sys.stderr
    interactive = sys.stdin.isatty() if stdin is None else False
    if interactive:
        try:
            import readline  # noqa: F401  (line editing and history for input())
        except ImportError:
            pass
    print(HELP, file=err, flush=True)
    refused = 0
    while True:
        try:
            if stdin is None:
                line = input("> ")
            else:
                out.write("> ")
                out.flush()
                line = stdin.readline()
                if not line:
                    raise EOFError
        except EOFError:
            out.write("\n")
            out.flush()
            return 1 if refused else 0
        except UnicodeDecodeError as e:  # a stdin that strict-decodes (cli.cmd_chat could not reconfigure it)
            refused += 1
            print(f"(error: this line is not valid UTF-8 (byte 0x{e.object[e.start]:02x}); pyminfer reads UTF-8. "
                  "Line skipped)", file=err, flush=True)
            continue
        except KeyboardInterrupt:
            out.write("\n")
            print("(/exit or Ctrl-D to quit)", file=err, flush=True)
            continue
        line = line.rstrip("\n")
        # a command is a line that starts with "/": " /exit" (a leading space) is a message
        cmd = line.rstrip()
        if not cmd.strip():
            continue
        if cmd in ("/exit", "/quit", "/bye"):
            return 1 if refused else 0
        if cmd == "/clear":
            session.clear()
            print("(conversation cleared)", file=err, flush=True)
            continue
        if cmd in ("/help", "/?"):
            print(HELP, file=err, flush=True)
            continue
        if re.fullmatch(r"/[A-Za-z]+", cmd):  # a mistyped command (/exti) is not a message to the model
            print(f"(unknown command {cmd}; {HELP}. A message that starts with / needs a space before it)",
                  file=err, flush=True)
            continue
        interrupted = False
        n_gen = 0
        try:
            it = session.send(line)
            try:
                for ch in it:
                    n_gen += len(ch.token_ids)
                    if ch.text:
                        out.write(ch.text)
                        out.flush()
            except KeyboardInterrupt:
                interrupted = True
            finally:
                it.close()
        except InvalidUnicodeError as e:  # raised while building the prompt: the turn never started
            refused += 1
            i = lone_surrogate(line)  # where in the line (the error's index is in the whole prompt)
            at = f" at offset {len(line[:i].encode('utf-8', 'surrogateescape'))}" if i is not None else ""
            byte = f" (byte 0x{e.byte:02x}{at})" if e.byte is not None else ""
            print(f"(error: this line is not valid UTF-8{byte}; pyminfer reads UTF-8. Line skipped)", file=err,
                  flush=True)
            continue
        except ContextFull as e:  # the message alone does not fit: dropped, like a line that is not UTF-8
            refused += 1
            print(f"\n(error: {e}; /clear to start over)", file=err, flush=True)
            if getattr(session, "_turn", None) is not None:
                session._turn = None
                session.messages = session.messages[:-1]
            continue
        turn = session._turn
        # the last prompt token is always evaluated (generate_stream), even when all of it was cached
        n_reused = min(turn.n_past, max(len(turn.prompt) - 1, 0)) if turn is not None else 0
        n_prompt = len(turn.prompt) if turn is not None else 0
        res = session.finish_turn()
        if res is not None:
            n_gen = len(res.generated_ids)
        out.write("\n")
        out.flush()
        print(stats_line(res, n_reused, n_prompt, n_gen, interrupted), file=err, flush=True)


def main_chat(args: Any) -> int:
    """``pyminfer chat``: load the model(s) with the CLI's loader and run the loop."""
    from .cli import _check_common, _load, _n_predict, _ngram, _params

    _check_common(args)  # before the (slow) load: -n, -c, --system ...
    _params(args).validate()
    model, draft = _load(args)
    try:
        if not model.tokenizer.chat_template:
            log("pyminfer: warning: this model has no chat template; replies may be poor")
        else:  # every turn renders it: a template that does not compile is an error now, not at turn 1
            model.tokenizer.check_chat_template()
        session = ChatSession(model, draft, params=_params(args), max_tokens=_n_predict(args, model),
                              system=getattr(args, "system", None), spec_draft_n=args.spec_draft_n,
                              spec_adaptive=args.spec_draft_adaptive, spec_ngram=_ngram(args))
        session.check_system_fits()  # every turn carries it, and /clear keeps it: refuse it now
        return run_chat(session)
    finally:
        model.close()
        if draft is not None:
            draft.close()
