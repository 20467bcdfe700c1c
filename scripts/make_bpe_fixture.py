#!/usr/bin/env python3
"""Byte-level BPE fixtures for tests/engine/bpe_vocab_test.cpp (moe-run's BpeVocab).

Trains two SMALL byte-level BPE tokenizers with Hugging Face `tokenizers` on the repository's
README.md and docs/*.md plus a few multilingual lines (only with --retrain or when there are none
yet; see below), and writes under tests/engine/data/bpe/:

  qwen2/tokenizer.json         Qwen2's layout: NFC normalizer, Sequence[Split(Qwen2 regex,
                               Isolated), ByteLevel(use_regex=false)], ByteLevel decoder; added
                               tokens <|endoftext|>, <|im_start|>, <|im_end|> (special) and
                               <tool_call>, <e\u0301> (not special, "normalized": true, so HF
                               matches <e\u0301> after NFC, as "<\u00e9>", in either spelling;
                               HF 0.23 also decodes it from "<\u00e9>", whose \u00e9 is GPT-2's
                               symbol for the byte 0xE9, so to "<\ufffd>")
  qwen2/tokenizer_config.json  eos_token <|im_end|> (bos_token null, as Qwen2)
  qwen2.gguf                   the same vocabulary as GGUF metadata only (no tensors):
                               tokenizer.ggml.model "gpt2", pre "qwen2", tokens, merges,
                               token_type (special added -> 3 control, other added -> 4
                               user-defined, as llama.cpp's convert script), eos id
  gpt2/tokenizer.json          GPT-2's layout: ByteLevel(use_regex=true) pre-tokenizer, no
                               normalizer; added token <|endoftext|>
  gpt2.gguf                    as qwen2.gguf with pre "gpt2", bos = eos = <|endoftext|>
  cases.json                   {"qwen2": [...], "gpt2": [...]}: for each test string `text`, HF's
                               `ids` (encode(text, add_special_tokens=False)) and `decoded`
                               (decode(ids, skip_special_tokens=False)); where they differ, also
                               `ids_without_normalizer` and `decoded_without_normalizer`: the same
                               from the tokenizer.json with "normalizer": null, which is what the
                               GGUF vocabularies (no normalizer, as llama.cpp) must give

Some test strings are not in Unicode NFC (combining marks, Hangul jamo, singletons such as
U+212B ANGSTROM SIGN, marks out of canonical order): HF's NFC normalizer changes their ids.

Run to regenerate; without --retrain the committed tokenizer.json files are kept (their added
tokens completed) and only the GGUF files and cases.json are rewritten, so the output does not
depend on the current README.md and docs (written with tokenizers 0.23.3 and gguf from PyPI):
  python3 -m venv build/bpe-venv && build/bpe-venv/bin/pip install tokenizers gguf
  build/bpe-venv/bin/python scripts/make_bpe_fixture.py [--retrain]
--retrain trains new vocabularies from the README.md and docs/*.md of the checkout (every id in
the fixtures changes).
"""
import json
import sys
from pathlib import Path

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "engine" / "data" / "bpe"

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
QWEN2_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
               r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")

EXTRA_CORPUS = [
    "Le café est très bon. Où est la bibliothèque? Ça va, merci beaucoup.",
    "Die Straße ist schön, und die Bäume sind grün. Übermorgen fahren wir nach München.",
    "El niño comió una manzana. ¿Dónde está el baño? ¡Qué día tan bonito!",
    "今天天气很好。我们去公园散步吧。你好，世界！",
    "日本語のテキストです。東京は大きな都市です。",
    "안녕하세요. 만나서 반갑습니다.",
    "Привет, мир! Как дела? Всё хорошо.",
    "Emoji: 🙂 🎉 👍 ❤️ — and symbols © ® ™ € £ ¥ ± × ÷ ≤ ≥ ≠.",
    "Numbers 0123456789 3.14159 2,718 1e-9 42% $100 #7 @home.",
    "I'm sure you'll see it's what we've done; they'd say you're right. DON'T SHOUT, IT'S LOUD.",
    "def f(x):\n    return x * 2  # doubles\n\nfor i in range(10):\n\tprint(i)\r\n",
]

TEST_STRINGS = [
    "",
    "Hello world",
    "Hello, world! How are you today?",
    "I'm can't we'll they've she'd you're It's",
    "IT'S DON'T WE'LL I'M YOU'D THEY'RE WE'VE",
    "'s 't 're 've 'm 'll 'd",
    "12345 3.14159 1,000,000 2026-11-24 0x7fff 1e10",
    "a  b   c\t\td\n\n\ne   \n  f",
    "   leading spaces",
    "trailing spaces   ",
    "line one\nline two\r\nline three\n",
    "\n\n\n",
    " ",
    "Hello, world!!! (test) [x] {y} <z> ... --- ??? ;;; ::",
    "café naïve résumé Ångström façade São Paulo Straße Übermorgen",
    "你好，世界。今天天气很好。日本語のテキストです。",
    "안녕하세요 Привет мир",
    "🙂👍🏽 🎉 ❤️ emoji 🇫🇷!",
    "<|endoftext|>",
    "Hello<|endoftext|> world<|im_start|>user\nhi<|im_end|>\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>",
    "call <tool_call>{\"name\": \"f\"} now",
    "<|endoftext",
    "def f(x):\n    return x * 2  # doubles\n",
    "non\u00a0breaking\u00a0space and\u2003em space",
    "mixed: 3 apples, 12 pears & 7 plums — 22 fruits (approx.)",
    "MoE offloading: experts are loaded from NVMe with O_DIRECT and io_uring.",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "=====================================",
    # Not in NFC (the qwen2 tokenizer's NFC normalizer changes them; gpt2 has none).
    "cafe\u0301",
    "A\u030a",
    "\u1100\u1161 \u1100\u1161\u11a8",
    "e\u0301\u0301",
    "a\u0301\u0323 \u212b \u2126",
    "Le cafe\u0301 est tre\u0300s bon, Ångstro\u0308m",
    "x<e\u0301>y <\u00e9> <e\u0301\u0301>",
    "e\u0301<|im_end|>\u0301e<|im_start|>\u0301",
]


def corpus():
    texts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    texts += [p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))]
    texts += EXTRA_CORPUS * 3
    return texts


def train(pre_tokenizer, normalizer, vocab_size):
    tok = Tokenizer(models.BPE())
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def write_gguf(tok_json, path, pre, bos, eos):
    vocab = tok_json["model"]["vocab"]
    added = {a["id"]: a for a in tok_json["added_tokens"]}
    n = max(list(vocab.values()) + list(added)) + 1
    tokens = [""] * n
    types = [gguf.TokenType.NORMAL] * n
    for t, i in vocab.items():
        tokens[i] = t
    for i, a in added.items():
        tokens[i] = a["content"]
        types[i] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    assert all(tokens), "holes in the vocabulary"
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "qwen2moe")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    if bos is not None:
        w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def cases(tok):
    j = json.loads(tok.to_str())
    j["normalizer"] = None  # rebuilt from JSON, so the normalized added tokens' matcher has none either
    raw = Tokenizer.from_str(json.dumps(j))
    out = []
    for s in TEST_STRINGS:
        ids = tok.encode(s, add_special_tokens=False).ids
        c = {"text": s, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)}
        raw_ids = raw.encode(s, add_special_tokens=False).ids
        if raw_ids != ids:
            c["ids_without_normalizer"] = raw_ids
            c["decoded_without_normalizer"] = raw.decode(raw_ids, skip_special_tokens=False)
        out.append(c)
    return out


def trained(name, retrain, *args):
    """The committed tokenizer OUT/name/tokenizer.json, or with --retrain (or none there) a new one."""
    path = OUT / name / "tokenizer.json"
    if path.exists() and not retrain:
        return Tokenizer.from_file(str(path))
    return train(*args)


def main():
    retrain = "--retrain" in sys.argv[1:]
    (OUT / "qwen2").mkdir(parents=True, exist_ok=True)
    (OUT / "gpt2").mkdir(parents=True, exist_ok=True)

    # Adding an added token that is already there changes nothing, so this is idempotent.
    qwen = trained("qwen2", retrain, pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]),
        normalizers.NFC(), 700)
    qwen.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    qwen.add_tokens([AddedToken("<tool_call>", normalized=True),
                     AddedToken("<e\u0301>", normalized=True)])
    qwen.save(str(OUT / "qwen2" / "tokenizer.json"))
    (OUT / "qwen2" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": None, "eos_token": "<|im_end|>"}, indent=1) + "\n")
    qj = json.loads((OUT / "qwen2" / "tokenizer.json").read_text(encoding="utf-8"))
    write_gguf(qj, OUT / "qwen2.gguf", "qwen2", None, qwen.token_to_id("<|im_end|>"))

    gpt2 = trained("gpt2", retrain, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), None, 600)
    gpt2.add_special_tokens(["<|endoftext|>"])
    gpt2.save(str(OUT / "gpt2" / "tokenizer.json"))
    gj = json.loads((OUT / "gpt2" / "tokenizer.json").read_text(encoding="utf-8"))
    eot = gpt2.token_to_id("<|endoftext|>")
    write_gguf(gj, OUT / "gpt2.gguf", "gpt2", eot, eot)

    (OUT / "cases.json").write_text(
        json.dumps({"qwen2": cases(qwen), "gpt2": cases(gpt2)}, ensure_ascii=False, indent=1) + "\n",
        encoding="utf-8")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"wrote {OUT} ({total} bytes)")


if __name__ == "__main__":
    main()
