#!/usr/bin/env python3
"""Writes tests/data/chat_templates/token_fixtures.json: the token ids Hugging Face transformers'
apply_chat_template(messages, tokenize=True, add_generation_prompt=...) gives for the
Mixtral-Instruct fixture conversations on Mixtral's own SentencePiece model, which tests/chat/chat_token_ids_test.cpp
requires moe-run's ChatEncoder to reproduce.

    scripts/make_chat_token_fixtures.py     # shares build/chat-template-venv with
                                            # make_chat_template_fixtures.py (adds its pins)

The tokenizer: models/moekit-tiny-moe/tokenizer.model, the copy in the repository of
mistralai/Mixtral-8x7B-v0.1's tokenizer.model (Apache-2.0, LICENCE-mistral-common beside it; the
Instruct model ships the same file). transformers builds its LlamaTokenizer from that file (a
`tokenizers` BPE with byte fallback and a Metaspace pre-tokenizer) with the settings of
mistralai/Mixtral-8x7B-Instruct-v0.1's tokenizer_config.json, written into a temporary folder:

- tokenizer_class "LlamaTokenizer", bos_token "<s>", eos_token "</s>", unk_token "<unk>" (ids 1, 2,
  0: added tokens with normalized false, so the text is split at them before the pre-tokenizer),
  add_bos_token true, add_eos_token false, clean_up_tokenization_spaces false,
  spaces_between_special_tokens false: the model's tokenizer_config.json. add_bos_token does not
  matter here: apply_chat_template(tokenize=True) encodes the rendered text with
  add_special_tokens=False, the template writes "<s>" itself.
- legacy true: the same file sets it. With transformers 5's LlamaTokenizer it makes the Metaspace
  prepend_scheme "always" (each stretch between added tokens gets the "▁" of SentencePiece's
  dummy prefix, unless it already begins with a space); legacy false would make it "first" (only
  the text's first stretch). Both are recorded (`ids_legacy_false`) where they differ.
- add_prefix_space: absent from the file, so LlamaTokenizer's default (true).

Each case also records, where they differ from HF's, the ids SentencePiece itself gives the same
stretches (`ids_sentencepiece`): transformers 5 orders the BPE merges it derives from a
tokenizer.model by piece id, not by SentencePiece's scores, which cuts runs of spaces differently;
moekit follows SentencePiece there (docs/engine.md, "Chat and server").

Caveat: these settings are the tokenizer_config.json's as published on the Hub, not read from the
file on this machine (it cannot reach the Hub; the search tool found the model card, which says
"<s>" and "</s>" are special tokens and "[INST]" plain text, but no copy of the config). The Hub's
tokenizer.json is not used either: it may carry its own normalizer, which AutoTokenizer on the
Hub folder would use instead of the one built here.
"""
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_chat_template_fixtures as strings  # noqa: E402  (templates, conversations, venv)

ROOT = strings.ROOT
PINS = [*strings.PINS, "tokenizers==0.23.3", "sentencepiece==0.2.3", "protobuf==7.36.2"]
MODEL = ROOT / "models" / "moekit-tiny-moe" / "tokenizer.model"
OUT = ROOT / "tests" / "data" / "chat_templates" / "token_fixtures.json"
# The Mistral formats on Mixtral's tokenizer: today's Mixtral-Instruct template, and the one its
# first revision had (Mistral-7B-Instruct-v0.2's), whose stretches after "<s>"/"</s>" have no space.
TEMPLATE_NAMES = ["mixtral-instruct", "mistral-instruct-legacy"]

# Beyond the string fixtures' conversations: where token boundaries are at stake (runs of spaces,
# indentation, digits; "<s>"/"</s>" typed in a message, which HF's tokenizer splits out as the
# special tokens, as moekit's encoder does).
EXTRA_CONVERSATIONS = {
    "code and digits": [
        {"role": "user", "content": "def f(x):\n    return x * 2  # 2024-11-29 12:00"},
        {"role": "assistant", "content": "```python\nprint(f(21))\n```"},
        {"role": "user", "content": "And  f(0.5)?"},
    ],
    "special texts typed in a message": [
        {"role": "user", "content": "say </s> then <s>x"},
    ],
    "replies with leading spaces": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "  two spaces"},
        {"role": "user", "content": " one"},
    ],
}

TOKENIZER_CONFIG = {
    "tokenizer_class": "LlamaTokenizer",
    "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": None,
    "add_bos_token": True, "add_eos_token": False,
    "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
    "legacy": True,
}


def tokenizer(folder, legacy):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(folder, legacy=legacy)


def sentencepiece_ids(sp, text):
    """The ids SentencePiece itself gives `text`, "<s>"/"</s>" as their ids, each stretch between
    them encoded as HF's Metaspace "always" cuts it: SentencePiece's dummy prefix stands for one
    leading space, so a stretch that has one loses it (" [INST]" and "[INST]" both give "▁[")."""
    ids, rest = [], text
    while rest:
        at = [(rest.find(s), s) for s in ("<s>", "</s>") if rest.find(s) >= 0]
        cut, special = min(at) if at else (len(rest), None)
        stretch = rest[:cut]
        if stretch:
            ids += sp.encode(stretch[1:] if stretch.startswith(" ") else stretch)
        if special is None:
            break
        ids.append(sp.piece_to_id(special))
        rest = rest[cut + len(special):]
    return ids


def cases_for(tok, tok_other, templates, sp):
    cases = []
    for name in TEMPLATE_NAMES:
        template = templates[name][0]
        for conv_name, messages in {**strings.CONVERSATIONS, **EXTRA_CONVERSATIONS}.items():
            for add_generation_prompt in (False, True):
                case = {"template": name, "conversation": conv_name,
                        "add_generation_prompt": add_generation_prompt}
                try:
                    text = tok.apply_chat_template(messages, chat_template=template,
                                                   tokenize=False,
                                                   add_generation_prompt=add_generation_prompt)
                    ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True,
                                                  return_dict=False,
                                                  add_generation_prompt=add_generation_prompt)
                except Exception as e:  # the template refuses the conversation
                    case["error"] = str(e)
                    cases.append(case)
                    continue
                case["rendered"] = text
                case["ids"] = list(ids)
                case["pieces"] = tok.convert_ids_to_tokens(list(ids))
                other = tok_other.apply_chat_template(messages, chat_template=template,
                                                      tokenize=True, return_dict=False,
                                                      add_generation_prompt=add_generation_prompt)
                if list(other) != case["ids"]:
                    case["ids_legacy_false"] = list(other)
                spm_ids = sentencepiece_ids(sp, text)
                if spm_ids != case["ids"]:
                    case["ids_sentencepiece"] = spm_ids
                    case["pieces_sentencepiece"] = [sp.id_to_piece(i) for i in spm_ids]
                cases.append(case)
    return cases


def main():
    strings.PINS = PINS
    strings.ensure_venv_for(__file__, "import transformers, jinja2, sentencepiece, google.protobuf")
    import google.protobuf
    import sentencepiece
    import tokenizers
    import transformers

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "tokenizer.model").write_bytes(MODEL.read_bytes())
        (Path(d) / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
        tok = tokenizer(d, legacy=True)
        tok_other = tokenizer(d, legacy=False)
        sp = sentencepiece.SentencePieceProcessor(model_file=str(MODEL))
        cases = cases_for(tok, tok_other, strings.TEMPLATES, sp)
    rendered = {(c["template"], c["conversation"], c["add_generation_prompt"]): c.get("expected")
                for c in json.loads((OUT.parent / "fixtures.json").read_text())["cases"]}
    for c in cases:  # the same strings as the string fixtures (the same transformers renders)
        if c["conversation"] in EXTRA_CONVERSATIONS:
            continue
        assert c.get("rendered") == rendered[(c["template"], c["conversation"],
                                              c["add_generation_prompt"])], c
    out = {
        "generated_by": "scripts/make_chat_token_fixtures.py",
        "transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
        "sentencepiece": sentencepiece.__version__, "protobuf": google.protobuf.__version__,
        "tokenizer_model": str(MODEL.relative_to(ROOT)),
        "tokenizer_class": type(tok).__name__,
        "tokenizer_config": TOKENIZER_CONFIG,
        "pre_tokenizer": str(tok.backend_tokenizer.pre_tokenizer),
        "normalizer": str(tok.backend_tokenizer.normalizer),
        "templates": {n: strings.TEMPLATES[n][0] for n in TEMPLATE_NAMES},
        "conversations": {**strings.CONVERSATIONS, **EXTRA_CONVERSATIONS},
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    n = sum("ids" in c for c in cases)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(cases)} cases, {n} with ids, "
          f"{sum('ids_legacy_false' in c for c in cases)} that legacy false would change, "
          f"{sum('ids_sentencepiece' in c for c in cases)} where SentencePiece differs")


if __name__ == "__main__":
    main()
