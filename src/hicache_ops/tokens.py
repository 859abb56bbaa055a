"""Reading prompts: token lists from flags, JSON/JSONL files or stdin, or text via a local tokenizer.

Every malformed input ends in an InputError naming the value (and the line) and the fix.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from hicache_ops.errors import InputError


@dataclass(frozen=True)
class Prompt:
    """One prompt: its token ids and, when the input line carried them, its namespace."""

    input_ids: list[int]
    extra_key: str | None = None
    cache_salt: str | None = None
    source: str = ""  # where it came from, for messages ("prompts.jsonl:3")


def _check_ids(value: object, where: str) -> list[int]:
    if not isinstance(value, list):
        raise InputError(f"{where}: input_ids must be a JSON array of integers, got {type(value).__name__}.")
    for i, t in enumerate(value):
        if isinstance(t, bool) or not isinstance(t, int):
            raise InputError(f"{where}: token {i} is {t!r}, not an integer token id.")
        if t < 0:
            raise InputError(f"{where}: token {i} is {t}, negative; token ids are >= 0.")
    return value


def parse_token_list(text: str) -> list[int]:
    """Parse `--tokens 1,2,3` (commas and/or spaces)."""
    if "," in text and any(not part.strip() for part in text.split(",")):
        raise InputError(
            f"--tokens {text!r} has an empty item between commas; give ids such as 1,2,3 (no ,, and no trailing comma)."
        )
    pieces = text.replace(",", " ").split()
    if not pieces:
        raise InputError("--tokens is empty; give comma-separated token ids such as 1,2,3.")
    ids = []
    for i, piece in enumerate(pieces):
        try:
            value = int(piece)
        except ValueError:
            raise InputError(f"token {i} is {piece!r}, not an integer; --tokens takes ids such as 1,2,3.") from None
        if value < 0:
            raise InputError(f"token {i} is {value}, negative; token ids are >= 0.")
        ids.append(value)
    return ids


def _read_text(path: str) -> tuple[str, str]:
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    p = Path(path)
    if not p.is_file():
        raise InputError(f"token file {path!r} does not exist or is not a file.")
    try:
        return p.read_text(encoding="utf-8"), p.name
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read token file {path!r}: {exc}.") from None


def _prompt_from_record(record: object, where: str, tokenizer: Tokenizer | None) -> Prompt:
    if isinstance(record, list):
        return Prompt(_check_ids(record, where), source=where)
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected an object with input_ids (or text), got {type(record).__name__}.")
    extra_key = record.get("extra_key")
    cache_salt = record.get("cache_salt")
    for name, value in (("extra_key", extra_key), ("cache_salt", cache_salt)):
        if value is not None and not isinstance(value, str):
            raise InputError(f"{where}: {name} must be a string or null, got {value!r}.")
    if "input_ids" in record:
        ids = _check_ids(record["input_ids"], where)
    elif "text" in record:
        if tokenizer is None:
            raise InputError(
                f"{where}: the record has text but no input_ids.",
                hint="Pass --tokenizer DIR (a local Hugging Face tokenizer folder) to tokenize it.",
            )
        if not isinstance(record["text"], str):
            raise InputError(f"{where}: text must be a string.")
        ids = tokenizer.encode(record["text"])
    else:
        raise InputError(f"{where}: the record has neither input_ids nor text.")
    return Prompt(ids, extra_key=extra_key, cache_salt=cache_salt, source=where)


def read_prompts(path: str, tokenizer: Tokenizer | None = None) -> list[Prompt]:
    """Prompts from a file (or "-" for stdin): one JSON array of ints, one JSON object, or JSONL.

    JSONL lines are objects with `input_ids` (or `text`, tokenized with `tokenizer`) and
    optional `extra_key` / `cache_salt`; blank lines are skipped.
    """
    text, name = _read_text(path)
    stripped = text.strip()
    if not stripped:
        raise InputError(f"token file {name} is empty; it needs a JSON array of ids or JSONL with input_ids.")
    # A whole-file JSON document first (a pretty-printed array spans lines).
    try:
        whole = json.loads(stripped)
    except json.JSONDecodeError:
        whole = None
    else:
        return [_prompt_from_record(whole, name, tokenizer)]
    prompts = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(
                f"{where} is not valid JSON ({exc.msg}).",
                hint='Each line must be one JSON object such as {"input_ids": [1, 2, 3]}.',
            ) from None
        prompts.append(_prompt_from_record(record, where, tokenizer))
    return prompts


class Tokenizer:
    """A local Hugging Face tokenizer folder (tokenizer.json), loaded without hub access.

    Encodes with special tokens, as SGLang's tokenizer manager does for a text prompt.
    """

    def __init__(self, folder: str):
        path = Path(folder)
        if not path.is_dir():
            raise InputError(
                f"tokenizer folder {folder!r} does not exist.", hint="Pass a local folder that holds tokenizer.json."
            )
        tokenizer_json = path / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise InputError(
                f"tokenizer folder {folder!r} has no tokenizer.json.",
                hint="Save the model's fast tokenizer into that folder.",
            )
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:  # pragma: no cover - tokenizers is a dependency
            raise InputError("the tokenizers package is not installed; pip install tokenizers.") from None
        try:
            self._tokenizer = HFTokenizer.from_file(str(tokenizer_json))
        except Exception as exc:  # the Rust library raises a bare Exception
            raise InputError(f"cannot load {tokenizer_json}: {exc}.") from None

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(list(ids))

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size()


def load_prompt(
    *,
    tokens: str | None = None,
    tokens_file: str | None = None,
    line: int | None = None,
    text: str | None = None,
    tokenizer: str | None = None,
) -> Prompt:
    """The one prompt named by exactly one of --tokens, --tokens-file or --text."""
    given = [
        name
        for name, value in (("--tokens", tokens), ("--tokens-file", tokens_file), ("--text", text))
        if value is not None
    ]
    if len(given) != 1:
        raise InputError(
            "give the prompt exactly once: --tokens, --tokens-file or --text"
            + (f" (got {', '.join(given)})." if given else "."),
        )
    if tokens is not None:
        return Prompt(parse_token_list(tokens), source="--tokens")
    if text is not None:
        if tokenizer is None:
            raise InputError("--text needs --tokenizer DIR, a local Hugging Face tokenizer folder.")
        return Prompt(Tokenizer(tokenizer).encode(text), source="--text")
    assert tokens_file is not None  # exactly one of the three was given, and it was neither of the others
    prompts = read_prompts(tokens_file, Tokenizer(tokenizer) if tokenizer else None)
    if line is None:
        if len(prompts) > 1:
            raise InputError(
                f"{tokens_file} holds {len(prompts)} prompts; this command takes one.",
                hint="Pick one with --line N (1-based, counting prompts).",
            )
        return prompts[0]
    if not 1 <= line <= len(prompts):
        raise InputError(f"--line {line} is outside 1..{len(prompts)}, the prompts in {tokens_file}.")
    return prompts[line - 1]
