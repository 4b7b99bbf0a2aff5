"""The ``pyminfer`` command: run, tokenize, bench, chat, serve, synth.

``run`` streams only the generated text to stdout; load time and prefill/decode speed go to
stderr (``--json`` prints one JSON object instead).

Text input (prompts, files, standard input, chat lines) must be UTF-8: bytes that are not are
refused with an error naming the input, rather than replaced (llama.cpp substitutes U+FFFD), so a
prompt is never silently altered. A closed stdout (``pyminfer run ... | head``) ends the command
quietly with status 141 (128 + SIGPIPE), as a tool killed by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any, Sequence

INT_MAX = 2**31 - 1  # the native core's int arguments (n_ctx, threads); engine.INT_MAX, without importing it


def _model_help() -> str:
    from .models import DEFAULT_MODEL, runnable_models

    return (f"GGUF file or a known model name ({', '.join(runnable_models())}; default: {DEFAULT_MODEL}, "
            "fetched into the cache)")


def _add_model_args(p: argparse.ArgumentParser, ub_default: str = "512 on CUDA, 64 on the CPU",
                    ctx_default: str = "min(4096, trained)") -> None:
    p.add_argument("-m", "--model", default=None, help=_model_help())
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"],
                   help="where the model runs (default auto: CUDA when a GPU is visible, else the CPU)")
    p.add_argument("-t", "--threads", type=int, default=0, help="CPU threads (0: all cores)")
    p.add_argument("-c", "--ctx-size", type=int, default=None,
                   help=f"context size n_ctx, 0..{INT_MAX} (default {ctx_default}; 0: the trained context)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=None, metavar="N",
                   help=f"most tokens per forward, at most max(n_ctx, 16); prompts are evaluated in chunks of N "
                        f"(default {ub_default})")


def _int_list(text: str) -> list[int]:
    """argparse type of llama-bench's list flags: ``512`` or ``128,256`` -> [512] / [128, 256]."""
    try:
        out = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"want an integer or a comma-separated list of them, got {text!r}") from None
    return out


class _Given(argparse.Action):
    """Store the value and note the option as given on the command line (``args.given``), so that
    options which only matter beside another one can be reported when that one is missing."""

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(ns, self.dest, values)
        given = getattr(ns, "given", None) or set()
        given.add(option_string or self.dest)
        ns.given = given


def _add_spec_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec-draft", default=None, metavar="MODEL", help="draft model for speculative decoding")
    p.add_argument("--spec-draft-n", type=int, default=4, metavar="D", action=_Given,
                   help="draft tokens per round (0..8); with --spec-draft-adaptive the first depth tried "
                        "(default: %(default)s, with --spec-draft-adaptive 1; lowered to -ub - 1 for a smaller -ub)")
    p.add_argument("--spec-draft-adaptive", action="store_true", help="choose the draft depth each round")
    p.add_argument("--spec-type", default="none", choices=["none", "ngram-simple"],
                   help="draft without a model too (as llama.cpp): ngram-simple = the tokens that followed the "
                        "latest earlier occurrence of the last n tokens; tried before --spec-draft each round")
    p.add_argument("--spec-ngram-size-n", type=int, default=3, metavar="N", action=_Given,
                   help="ngram-simple: tokens matched (default: %(default)s)")
    p.add_argument("--spec-ngram-size-m", type=int, default=5, metavar="M", action=_Given,
                   help="ngram-simple: most tokens drafted a round, 1..8 (default: %(default)s)")


def _ngram(args: argparse.Namespace) -> Any:
    """The n-gram draft settings of --spec-type (pyminfer.ngram.NgramSpec), or None when it is
    'none'. Raises ValueError for sizes out of range."""
    if getattr(args, "spec_type", "none") != "ngram-simple":
        return None
    from .ngram import NgramSpec

    return NgramSpec(n=args.spec_ngram_size_n, m=args.spec_ngram_size_m)


def _add_sampling_args(p: argparse.ArgumentParser, stop: bool = True) -> None:
    # the defaults are llama.cpp's (common/common.h), so the same flags sample the same way
    p.add_argument("--temp", type=float, default=0.8,
                   help="temperature; <= 0: greedy, as llama.cpp (default: %(default)s)")
    p.add_argument("--top-k", type=int, default=40, help="<= 0: off (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=0.95, help="1.0: off (default: %(default)s)")
    p.add_argument("--min-p", type=float, default=0.05, help="0.0: off (default: %(default)s)")
    p.add_argument("--repeat-penalty", type=float, default=1.0, help="finite, > 0; 1.0: off (default: %(default)s)")
    p.add_argument("--repeat-last-n", type=int, default=64,
                   help="tokens the penalty looks back over; 0: off, -1: the whole context (default: %(default)s)")
    p.add_argument("--seed", type=int, default=None, help="RNG seed (-1 or absent: random)")
    if stop:
        p.add_argument("--stop", action="append", default=[],
                       help="stop string (repeatable; literal text, no escapes: a shell's $'\\n' for a newline)")
    p.add_argument("--samplers", default=None, metavar="SAMPLERS",
                   help="the sampler chain in order, separated by ';', as llama.cpp: penalties, top_k, top_p, "
                        "min_p, temperature, infill (dry, typ_p, xtc, top_n_sigma do nothing; llama.cpp's other "
                        "spellings such as top-k or temp too) "
                        "(default: penalties;top_k;top_p;min_p;temperature)")
    p.add_argument("--sampling-seq", "--sampler-seq", dest="sampling_seq", default=None, metavar="SEQUENCE",
                   help="the chain as llama.cpp's letters: e penalties, k top_k, p top_p, m min_p, t temperature, "
                        "i infill (default: ekpmt)")


def _load(args: argparse.Namespace) -> tuple[Any, Any]:
    from .engine import Model, log
    from .models import resolve_model

    path = resolve_model(args.model)
    # a missing draft file is reported before the target's (slow) load
    draft_path = resolve_model(args.spec_draft) if getattr(args, "spec_draft", None) else None
    model = Model(path, device=args.device, n_ctx=args.ctx_size, n_threads=args.threads, max_nt=args.ubatch_size)
    log(f"pyminfer: loaded {path.name} ({model.config.arch}, {model.gguf.file_type}, {model.device}) "
        f"in {model.load_time:.2f} s")
    draft = None
    if getattr(args, "spec_draft", None):
        from .spec import check_draft

        draft = Model(draft_path, device=args.device, n_ctx=model.n_ctx, n_threads=args.threads,
                      max_nt=args.ubatch_size)
        check_draft(model, draft)
        log(f"pyminfer: draft {draft.gguf.path.name} loaded in {draft.load_time:.2f} s")
    return model, draft


def _n_predict(args: argparse.Namespace, model: Any) -> int:
    """-n/--n-predict as a token limit for ``model``: -1 (llama.cpp's "no limit") is n_ctx + 1,
    which a generation cannot reach (a prompt takes at least one position; the last token needs
    none, so a one-token prompt leaves room for n_ctx, and n_ctx would end it as 'max_tokens'
    instead of 'context'); other values as given (checked >= -1 by _check_common)."""
    return model.n_ctx + 1 if args.n_predict == -1 else args.n_predict


def _params(args: argparse.Namespace) -> Any:
    from .sampling import SamplingParams

    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                          seed=None if args.seed is None or args.seed < 0 else args.seed,  # -1: random, as llama.cpp
                          stop=list(getattr(args, "stop", [])), samplers=_chain(args))


def _chain(args: argparse.Namespace) -> tuple[str, ...] | None:
    """--samplers or --sampling-seq (ValueError for both, or for a name / letter not known)."""
    from .sampling import parse_samplers

    if args.samplers is not None and args.sampling_seq is not None:
        raise ValueError("--samplers and --sampling-seq both set the sampler chain: give one")
    if args.samplers is not None:
        return parse_samplers([n for n in args.samplers.split(";") if n], alt_names=True)
    if args.sampling_seq is not None:
        if ";" in args.sampling_seq:
            raise ValueError(f"--sampling-seq takes letters (e.g. ekpmt), got {args.sampling_seq!r}")
        return parse_samplers(args.sampling_seq) if args.sampling_seq else ()
    return None


def _check_common(args: argparse.Namespace) -> None:
    """Argument checks that need no model, run before the (slow) load."""
    if args.threads < 0:
        raise ValueError("--threads must be >= 0 (0: all cores)")
    ncpu = os.cpu_count() or 1
    if args.threads > 4 * ncpu:
        raise ValueError(f"--threads {args.threads} is more than 4x this machine's {ncpu} cores (0: all cores)")
    if args.ctx_size is not None and not 0 <= args.ctx_size <= INT_MAX:
        raise ValueError(f"-c/--ctx-size must be in 0..{INT_MAX} (0: the model's trained context), got {args.ctx_size}")
    if args.ubatch_size is not None and not 1 <= args.ubatch_size <= INT_MAX:
        raise ValueError(f"-ub/--ubatch-size must be in 1..{INT_MAX}, got {args.ubatch_size}")
    if getattr(args, "n_predict", 0) < -1:  # run and chat; checked here so chat refuses it before loading
        raise ValueError("-n/--n-predict must be >= -1 (-1: until end of generation or a full context)")
    for opt in ("system", "stop"):  # text options (--stop repeatable): UTF-8, as every input
        vals = getattr(args, opt, None)
        for v in [vals] if isinstance(vals, str) else vals or []:
            _check_arg_text(v, f"--{opt}")
    if getattr(args, "spec_draft", None) is None and getattr(args, "spec_draft_adaptive", False):
        raise ValueError("--spec-draft-adaptive needs a draft model (--spec-draft MODEL)")
    from .spec import MAX_DEPTH, default_draft_n
    given = getattr(args, "given", None) or set()  # options that only matter beside another one
    if hasattr(args, "spec_draft_n") and "--spec-draft-n" not in given:  # (4; adaptive depth starts at 1)
        args.spec_draft_n = default_draft_n(bool(getattr(args, "spec_draft_adaptive", False)))
    n = getattr(args, "spec_draft_n", 4)
    if not 0 <= n <= MAX_DEPTH:  # before the warning below: a value no run could use is an error
        raise ValueError(f"--spec-draft-n must be in 0..{MAX_DEPTH}, got {n}")
    for opts, needs, missing in (
            (["--spec-draft-n"], "--spec-draft", getattr(args, "spec_draft", None) is None),
            (["--spec-ngram-size-n", "--spec-ngram-size-m"], "--spec-type ngram-simple",
             getattr(args, "spec_type", "none") == "none")):
        ignored = [o for o in opts if o in given]
        if ignored and missing:  # a warning, not an error: the rest of the run is what was asked
            from .engine import log

            log(f"pyminfer: warning: {', '.join(ignored)} ignored without {needs}")
    if getattr(args, "spec_draft", None) and args.ubatch_size is not None and args.ubatch_size < n + 1:
        # a depth the user did not ask for (the default), or the adaptive controller's first one, is
        # capped at what a verify forward of -ub tokens holds; an explicit fixed depth is an error
        if "--spec-draft-n" in given and not getattr(args, "spec_draft_adaptive", False):
            raise ValueError(f"-ub/--ubatch-size {args.ubatch_size} is too small for --spec-draft-n {n}: "
                             f"a verify forward takes {n + 1} tokens")
        args.spec_draft_n = args.ubatch_size - 1
        from .engine import log

        what = "the first draft depth" if getattr(args, "spec_draft_adaptive", False) else "the draft depth"
        log(f"pyminfer: warning: {what} lowered from {n} to {args.spec_draft_n} for -ub {args.ubatch_size} "
            f"(a verify forward takes depth + 1 tokens)" + ("; the draft model never drafts" if args.ubatch_size == 1
                                                             else ""))
    ng = _ngram(args)  # sizes checked here, before the load
    if ng is not None and args.ubatch_size is not None and args.ubatch_size < ng.m + 1:
        raise ValueError(f"-ub/--ubatch-size {args.ubatch_size} is too small for --spec-ngram-size-m {ng.m}: "
                         f"a verify forward takes {ng.m + 1} tokens")


def _check_arg_text(text: str, what: str) -> None:
    """ValueError naming the option when an argument was not UTF-8 (Python hands such argv bytes
    over as lone surrogates, via surrogateescape): the first bad byte and its byte offset in the
    argument, as for -f files; other lone surrogates by their character index."""
    from .tokenizer import InvalidUnicodeError, check_unicode

    try:
        check_unicode(text, what)
    except InvalidUnicodeError as e:
        if e.byte is None:
            raise
        offset = len(text[:e.index].encode("utf-8", "surrogateescape"))
        raise ValueError(f"{what} is not valid UTF-8 (byte 0x{e.byte:02x} at offset {offset}); "
                         "convert it first, e.g. iconv -f latin1 -t utf-8") from None


def _decode_utf8(data: bytes, what: str) -> str:
    """``data`` as UTF-8 text, every byte kept (CR and CRLF too: llama.cpp reads -f files as bytes,
    and -p "$(cat f)" passes them through), or a ValueError naming ``what`` and the first bad byte."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} is not valid UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); "
                         "convert it first, e.g. iconv -f latin1 -t utf-8") from None
    return text


def _read_prompt_file(name: str) -> str:
    """The prompt of ``-f NAME`` ('-': standard input), decoded as UTF-8."""
    if name == "-":
        buf = getattr(sys.stdin, "buffer", None)  # bytes, so the locale's encoding does not matter
        return _decode_utf8(buf.read(), "standard input") if buf is not None else sys.stdin.read()
    # bytes, not text mode: a text-mode read would turn CRLF and CR into LF
    with open(name, "rb") as f:
        return _decode_utf8(f.read(), name)


def cmd_run(args: argparse.Namespace) -> int:
    from .engine import log
    from .generate import generate_stream

    _check_common(args)
    if args.prompt is not None and args.file:
        raise ValueError("give the prompt with -p or -f, not both")
    prompt = args.prompt
    if prompt is not None:
        _check_arg_text(prompt, "-p/--prompt")
    elif args.file:
        prompt = _read_prompt_file(args.file)
    if prompt is None:
        raise ValueError("give a prompt with -p or -f")
    params = _params(args)
    params.validate()
    model, draft = _load(args)
    tok = model.tokenizer
    if args.chat:
        prompt = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    ids = tok.encode(prompt, parse_special=True)
    res = None
    for ch in generate_stream(model, ids, params, _n_predict(args, model), draft=draft, spec_draft_n=args.spec_draft_n,
                              spec_adaptive=args.spec_draft_adaptive, spec_ngram=_ngram(args)):
        if ch.result is not None:
            res = ch.result
        elif not args.json:
            sys.stdout.write(ch.text)
            sys.stdout.flush()
    assert res is not None
    if args.json:
        out = res.to_json()
        out["model"] = str(model.gguf.path.name)
        out["device"] = model.device
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        t = res.timings
        log(f"pyminfer: load {t['load_s']:.2f} s | prefill {t['prefill_tokens']} tok, {t['prefill_tok_s']:.1f} tok/s | "
            f"decode {len(res.generated_ids)} tok, {t['decode_tok_s']:.1f} tok/s | finish: {res.finish_reason} "
            f"({res.stop_reason}){'' if params.greedy else f' | seed {res.seed}'}")
        if res.spec:
            s = res.spec
            rate = f"{100 * s['acceptance_rate']:.1f}%" if s["drafted"] else "n/a"  # (nothing drafted)
            log(f"pyminfer: spec rounds {s['rounds']}, drafted {s['drafted']}, accepted {s['accepted']} "
                f"({rate}), {s['tokens_per_round']:.2f} tok/round, mean depth "
                f"{s['mean_depth']:.2f}, draft {s['draft_s']:.2f} s, verify {s['verify_s']:.2f} s")
            if s.get("ngram"):
                log(f"pyminfer: spec n-gram rounds {s['ngram_rounds']}, drafted {s['ngram_drafted']}, accepted "
                    f"{s['ngram_accepted']}")
    model.close()
    if draft:
        draft.close()
    return 0


def cmd_tokenize(args: argparse.Namespace) -> int:
    from .models import resolve_model
    from .tokenizer import Tokenizer

    sources = [x for x in (args.text is not None, args.prompt is not None, args.file is not None, args.stdin) if x]
    if len(sources) != 1:
        raise ValueError("give the text to tokenize in one way: TEXT, -p TEXT, -f FILE or --stdin"
                         + (" (got several)" if sources else ""))
    if args.text is not None or args.prompt is not None:
        text = args.text if args.text is not None else args.prompt
        _check_arg_text(text, "TEXT" if args.text is not None else "-p/--prompt")
    else:  # the file's bytes as they are (as -f of `run`), UTF-8 checked
        text = _read_prompt_file("-" if args.stdin else args.file)
    tok = Tokenizer.from_gguf(resolve_model(args.model))
    print(json.dumps(tok.encode(text, parse_special=not args.no_parse_special)))
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from .models import resolve_model
    from .synthetic import write_synthetic_gguf

    src = resolve_model(args.tokenizer_from)
    bar = None

    def progress(done: int, total: int) -> None:
        # made at the first tensor written, so that a refused argument prints no empty bar first
        nonlocal bar
        if bar is None:
            try:
                from tqdm import tqdm
            except ImportError:  # tqdm is a dependency; a missing one only loses the progress bar
                return
            bar = tqdm(total=total, unit="B", unit_scale=True, desc=f"synth {args.shape}", disable=args.quiet)
        bar.total = total
        bar.update(done - bar.n)

    try:
        n = write_synthetic_gguf(args.output, args.shape, src, seed=args.seed, n_layer=args.n_layer, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    print(f"wrote {args.output}: qwen2.5-{args.shape} shape, Q4_K_M mix, {n / 2**30:.2f} GiB of random weights "
          f"(tokenizer from {src.name})", file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import main_bench

    _check_common(args)
    if args.repetitions < 1:
        raise ValueError("-r/--repetitions must be >= 1")
    from .bench import VERIFY_CURVE_NT
    from .spec import MAX_DEPTH
    spec = bool(args.spec_draft) or _ngram(args) is not None
    if spec and args.verify_curve:  # (the speculative mode measured its own curve silently instead)
        raise ValueError("--verify-curve and --spec-draft / --spec-type are separate bench modes: run one at a time")
    for on, rows, what in ((args.verify_curve, VERIFY_CURVE_NT, "--verify-curve"),
                           (spec, MAX_DEPTH + 1, "--spec-draft / --spec-type")):
        if on and args.ubatch_size is not None and args.ubatch_size < rows:
            raise ValueError(f"-ub/--ubatch-size {args.ubatch_size} is too small for {what}: it runs forwards of "
                             f"up to {rows} tokens")
    # the lists (llama-bench's comma lists) stay in n_prompts / n_gens / depths; n_prompt, n_gen and
    # depth become their largest values, which size the context and the forwards
    args.n_prompts, args.n_gens = list(args.n_prompt), list(args.n_gen)
    args.depths = list(args.depth) if args.depth is not None else [0]
    if min(args.n_prompts + args.n_gens + args.depths) < 0:
        raise ValueError("-p, -n and -d/--depth must be >= 0")
    if (spec or args.verify_curve) and (len(args.n_gens) > 1 or len(args.depths) > 1):
        raise ValueError("-n and -d take one value with --verify-curve, --spec-draft or --spec-type (lists are for "
                         "the pp / tg tests)")
    args.n_prompt, args.n_gen = max(args.n_prompts), max(args.n_gens)
    args.depth = max(args.depths) if args.depth is not None else None
    if not (args.n_prompt or args.n_gen or args.verify_curve or spec):
        raise ValueError("nothing to measure: give -p and/or -n > 0, --verify-curve, --spec-draft or --spec-type")
    prompt_given = {"-p", "--n-prompt"} & (getattr(args, "given", None) or set())
    if prompt_given and (spec or args.verify_curve):  # a warning: the rest is what was asked
        from .engine import log

        log(f"pyminfer: warning: {prompt_given.pop()} ignored with "
            f"{'--verify-curve' if args.verify_curve and not spec else '--spec-draft / --spec-type'} (no pp test: "
            "that mode times decoding on its own prompts)")
    if spec and args.n_gen < 2:  # the first token comes from the prefill: no decode to time
        raise ValueError(f"-n/--n-gen must be >= 2 with --spec-draft / --spec-type (decode speed is timed from the "
                         f"second generated token), got {args.n_gen}")

    return main_bench(args)


def cmd_chat(args: argparse.Namespace) -> int:
    from .chat import main_chat

    reconfigure = getattr(sys.stdin, "reconfigure", None)
    if reconfigure is not None:
        # bad bytes become lone surrogates, refused when that line is tokenized: strict decoding
        # would fail on a whole buffered chunk of piped input, before its good lines are answered
        reconfigure(errors="surrogateescape")
    return main_chat(args)  # run_chat refuses and skips a line that is not UTF-8


class MissingExtraError(ImportError):
    """An optional dependency group is not installed (its message says which `pip install` adds it);
    `main` prints it as one line, not a traceback."""


# The top-level modules of the `server` extra (pyproject.toml) and what they pull in: a missing one
# of these is the extra's absence; any other import error in the server is a bug to show as is.
SERVER_MODULES = frozenset({"fastapi", "uvicorn", "starlette", "pydantic", "pydantic_core"})


def server_extra_missing(e: ModuleNotFoundError) -> ImportError:
    """What the server raises for ``e``: MissingExtraError (the install advice) when the module
    missing is one of SERVER_MODULES, else ``e`` itself (a real import bug, shown as is)."""
    if (e.name or "").split(".")[0] not in SERVER_MODULES:
        return e
    err = MissingExtraError("pyminfer serve needs fastapi and uvicorn: pip install 'pyminfer[server]'")
    err.__cause__ = e
    return err


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import main_serve  # MissingExtraError without fastapi / uvicorn

    _check_common(args)  # bad flags end here, not in every request once the server is up
    _params(args).validate()
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in 0..65535, got {args.port}")
    from .models import MODELS, cache_dir, check_known_model, resolve_model

    # A missing model or draft file, a known model of an architecture the engine does not run or
    # an unusable model cache ends here, before uvicorn starts and announces its address; known
    # names are fetched (slowly) by the loader thread, behind /health's 503.
    draft = getattr(args, "spec_draft", None)
    for name in (args.model, *([draft] if draft is not None else [])):  # args.model None: the default
        if name is None or name in MODELS:
            check_known_model(name)
            cache_dir()
        else:
            resolve_model(name)
    return main_serve(args)


def package_version() -> str:
    """The installed pyminfer distribution's version string (`pyminfer.__version__`: importlib.metadata),
    or 'unknown' in a source checkout without metadata; never raises. Shared by `pyminfer --version`
    and the server."""
    from . import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="pyminfer", description="GGUF inference with speculative decoding")
    ap.add_argument("--version", action="version", version=f"pyminfer {package_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    ap.subcommands = sub.choices  # type: ignore[attr-defined]  # name -> its parser (main's errors)

    r = sub.add_parser("run", help="generate text from a prompt")
    _add_model_args(r)
    r.add_argument("-p", "--prompt", default=None, help="the prompt (UTF-8)")
    r.add_argument("-f", "--file", default=None,
                   help="read the prompt from a file ('-': standard input); it must be UTF-8: other bytes are "
                        "an error, not replaced")
    r.add_argument("-n", "--n-predict", type=int, default=128,
                   help="tokens to generate; -1: until end of generation or a full context (default: %(default)s)")
    r.add_argument("--chat", action="store_true", help="wrap the prompt as a user message (chat template)")
    r.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    _add_sampling_args(r)
    _add_spec_args(r)
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("tokenize", help="print token ids as a JSON list")
    t.add_argument("-m", "--model", default=None, help=_model_help())
    t.add_argument("--no-parse-special", action="store_true")
    t.add_argument("text", metavar="TEXT", nargs="?", default=None,
                   help="text to tokenize (UTF-8; other bytes are an error)")
    t.add_argument("-p", "--prompt", default=None, help="the text, as an option (llama-tokenize's -p)")
    t.add_argument("-f", "--file", default=None, help="tokenize this file's text instead ('-': standard input)")
    t.add_argument("--stdin", action="store_true", help="tokenize standard input (llama-tokenize's --stdin)")
    t.set_defaults(func=cmd_tokenize)

    b = sub.add_parser("bench", help="prefill / decode throughput (llama-bench style)")
    _add_model_args(b, ub_default="the prompt, 64..512",
                    ctx_default="what the tests run need + 16 spare positions, at least 512; pp / tg: "
                                "-d + max(-p, -n)")
    # -p, -n and -d take comma lists as llama-bench's: a pp / tg test for each value, at each depth
    b.add_argument("-p", "--n-prompt", type=_int_list, default=[512], action=_Given, metavar="N[,N...]",
                   help="prompt tokens of the pp test (default: 512; not used by --verify-curve, "
                        "--spec-draft or --spec-type, which time decoding)")
    b.add_argument("-n", "--n-gen", type=_int_list, default=[128], metavar="N[,N...]",
                   help="tokens to generate (>= 2 with --spec-draft; default: 128)")
    b.add_argument("-r", "--repetitions", type=int, default=5)
    b.add_argument("-o", "--output", default="md", choices=["md", "json", "csv"])
    b.add_argument("-d", "--n-depth", "--depth", dest="depth", type=_int_list, default=None, metavar="N[,N...]",
                   help="context depth before the pp and tg tests, in tokens (llama-bench's -d; default 0), "
                        "or of the --verify-curve forwards (default 256)")
    b.add_argument("--verify-curve", action="store_true",
                   help="print C_T(nt)/C_T(1) for nt = 1..16, after -d context tokens (default 256)")
    _add_spec_args(b)
    b.set_defaults(func=cmd_bench)

    c = sub.add_parser("chat", help="interactive multi-turn chat (input lines must be UTF-8)")
    _add_model_args(c)
    _add_sampling_args(c)
    _add_spec_args(c)
    c.add_argument("-n", "--n-predict", type=int, default=1024,
                   help="most tokens a reply; -1: until end of generation or a full context (default: %(default)s)")
    c.add_argument("--system", default=None, help="system message")
    c.set_defaults(func=cmd_chat)

    y = sub.add_parser("synth", help="write a GGUF with random weights in a Qwen2.5 shape and Q4_K_M mix "
                                     "(benchmarks of sizes that cannot be carried)")
    y.add_argument("--shape", required=True, choices=["1.5b", "7b", "14b"])
    y.add_argument("-o", "--output", required=True, help="GGUF file to write")
    y.add_argument("--tokenizer-from", default=None, metavar="MODEL",
                   help="GGUF (or known model name) whose tokenizer to copy (default: qwen2.5-coder-0.5b)")
    y.add_argument("--seed", type=int, default=0)
    y.add_argument("--n-layer", type=int, default=None, help="fewer layers than the shape's (tests)")
    y.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    y.set_defaults(func=cmd_synth)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    _add_model_args(s)
    _add_spec_args(s)
    s.add_argument("-a", "--alias", default=None, metavar="NAME",
                   help="the model's name in the API (/v1/models, responses), as llama-server's --alias "
                        "(default: the -m argument as given)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8080, help="TCP port (0..65535)")
    # as llama-server: the sampling flags set the defaults of requests that leave those fields out
    _add_sampling_args(s, stop=False)
    s.add_argument("--no-prefill-assistant", action="store_true",
                   help="a chat ending with an assistant message gets a new answer instead of that message "
                        "continued (llama.cpp's server flag; a request's continue_final_message still decides)")
    s.set_defaults(func=cmd_serve)
    return ap


def _show_warning(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
    """Warnings (a draft larger than its target, ...) as one stderr line, like the errors."""
    print(f"pyminfer: warning: {message}", file=sys.stderr)


# llama.cpp flags pyminfer does not have, refused by name with the reason (README, "Run").
_LLAMA_ONLY: dict[tuple[str, ...], str] = {
    ("-ngl", "--n-gpu-layers", "--gpu-layers"): "every layer runs on the chosen --device (no partial offload)",
    ("-fa", "--flash-attn"): "attention is always fused",
    ("-cb", "--cont-batching", "-nocb", "--no-cont-batching", "-np", "--parallel"):
        "the server runs one generation at a time, the others wait",
    ("-tb", "--threads-batch"): "--threads serves prompts and generation alike",
    ("-ctk", "--cache-type-k", "-ctv", "--cache-type-v"): "the KV cache is f16",
    ("-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu"): "pyminfer runs on one GPU",
    ("--mlock", "--no-mmap"): "the model file is always memory-mapped, read only",
    ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft"): "the draft runs wholly on the chosen --device too",
    ("--draft-min", "--draft-p-min", "--spec-draft-p-min"):
        "a round drafts its depth (up to an end of generation); --spec-draft-adaptive picks it each round",
    ("-cd", "--ctx-size-draft"): "the draft's context size is the target's",
    ("-devd", "--device-draft"): "the draft runs on the chosen --device too",
    ("--draft-p-split",): "one draft sequence a round",
}
# llama.cpp's flags whose pyminfer counterpart has another name (refused, naming it: not aliased, since
# llama.cpp's --draft-max is an upper bound that its p-min cut shortens, pyminfer's depth is exact)
_LLAMA_RENAMED: dict[tuple[str, ...], str] = {
    ("-md", "--model-draft"): "--spec-draft MODEL",
    ("--draft", "--draft-n", "--draft-max"): "--spec-draft-n D (draft tokens a round, 0..8) or --spec-draft-adaptive",
}


def _llama_only(tok: str) -> str | None:
    """The refusal of llama.cpp's flag ``tok`` (``--flag=value`` too) that pyminfer does not have, or None."""
    flag = tok.split("=", 1)[0]
    for names, why in _LLAMA_ONLY.items():
        if flag in names:
            return f"unrecognized argument: {flag} (llama.cpp's flag; not in pyminfer: {why})"
    for names, ours in _LLAMA_RENAMED.items():
        if flag in names:
            return f"unrecognized argument: {flag} (llama.cpp's flag; pyminfer's: {ours})"
    return None


def _refuse_glued_flags(ap: argparse.ArgumentParser, argv: list[str]) -> None:
    """Exits with a usage error (status 2) on a token such as ``-ngl``, ``-fa`` or ``-cb``:
    llama.cpp's multi-letter short flags, which argparse reads as a one-letter flag with the rest
    glued on as its value (``-fa`` was ``-f a``: the prompt silently came from a file named a).
    llama.cpp's flags that pyminfer lacks (_LLAMA_ONLY, long forms too) are refused with the reason;
    other all-letter tokens that are not options of the parser they follow with a hint to write the
    value apart; a glued value with a digit or a dot (``-n16``, ``-mmodel.gguf``) still parses."""
    parser = ap
    for tok in argv:
        if tok == "--":
            return
        if parser is ap and tok in ap.subcommands:  # type: ignore[attr-defined]
            parser = ap.subcommands[tok]  # type: ignore[attr-defined]
            continue
        if tok.split("=", 1)[0] in parser._option_string_actions:
            continue
        why = _llama_only(tok)
        if why:
            parser.error(why)
        if not re.fullmatch(r"-[A-Za-z][A-Za-z-]+", tok):
            continue
        act = parser._option_string_actions.get(f"-{tok[1]}")
        if act is None or (act.choices is not None and tok[2:] in act.choices):  # -ojson: a value it takes
            continue
        if act.nargs == 0:  # a switch: argparse reads stacked switches (-qo x); -h... (llama.cpp's -hf) is no help
            if isinstance(act, argparse._HelpAction):
                parser.error(f"unrecognized argument: {tok} (not a pyminfer flag)")
            continue
        parser.error(f"unrecognized argument: {tok} (not a pyminfer flag; for -{tok[1]} with a value, "
                     f"write -{tok[1]} {tok[2:]})")


def main(argv: Sequence[str] | None = None) -> int:
    import warnings

    warnings.showwarning = _show_warning
    ap = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    _refuse_glued_flags(ap, argv)
    args, extra = ap.parse_known_args(argv)
    if extra:
        # with the subcommand's usage where they follow it (argparse's parse_args showed the top
        # level's); an unknown option before the subcommand is the top level's
        before = argv[:argv.index(args.cmd)] if args.cmd in argv else argv
        (ap if any(x in before for x in extra) else ap.subcommands[args.cmd]).error(
            f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (``| head``): stop quietly, as a tool killed by SIGPIPE.
        # Python docs, "Note on SIGPIPE": point stdout at devnull so the flush at exit cannot
        # raise (and print) the same error again.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout without a file descriptor (tests' capture)
            pass
        return 141
    except (ValueError, RuntimeError, MemoryError, KeyError, MissingExtraError) as e:
        advice = getattr(e, "advice", "")  # NaNLogitsError: what to do about a cached file
        print(f"pyminfer: error: {e}{'; ' + advice if advice else ''}", file=sys.stderr)
        return 1
    except OSError as e:  # missing or unreadable input, unwritable output, full disk
        name = f"{e.filename}: " if e.filename is not None else ""
        print(f"pyminfer: error: {name}{e.strerror or e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
