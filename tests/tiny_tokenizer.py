"""A tiny local tokenizer for the tests that drive a serve with text (SGLang's bench client, the
serve's --tokenizer): words w0..w255 and one unknown token, split on whitespace, no special tokens
added; saved as tokenizer.json with a tokenizer_config.json, so transformers' AutoTokenizer loads
the folder as SGLang's bench does."""

from __future__ import annotations

import json

VOCAB = 256


def write_tiny_tokenizer(folder) -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"[UNK]": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "[UNK]", "model_max_length": 4096})
    )
    return str(folder)
