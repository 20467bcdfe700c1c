#!/usr/bin/env python3
"""Writes tests/data/chat_templates/fixtures.json: the exact strings Hugging Face transformers renders
for the chat templates moekit implements (include/moekit/engine/chat_template.hpp), which
tests/chat/chat_template_test.cpp compares byte for byte.

    scripts/make_chat_template_fixtures.py          # creates build/chat-template-venv on first use

The strings come from transformers' render_jinja_template, the function
PreTrainedTokenizerBase.apply_chat_template(tokenize=False) calls with the tokenizer's special tokens
as keyword arguments (bos_token, eos_token); calling it directly needs no tokenizer files. A
template that raises (roles that do not alternate, a role it refuses) is recorded with HF's message.

Template texts: each is meant to be the `chat_template` of the named model's tokenizer_config.json
after JSON decoding. They are copies quoted in public code (this machine cannot fetch the hub), not
read from the model files; each says where it was found. Qwen1.5's and OLMoE-0924-Instruct's were
checked against several independent copies (see their comments).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "build" / "chat-template-venv"
PINS = ["transformers==5.23.0", "jinja2==3.1.6"]
OUT = ROOT / "tests" / "data" / "chat_templates" / "fixtures.json"


def ensure_venv_for(script, probe="import transformers, jinja2"):
    """Re-runs `script` inside the venv, installing PINS unless `probe` already imports there
    (make_chat_token_fixtures.py shares the venv and adds its pins)."""
    python = VENV / "bin" / "python"
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not python.exists():
        subprocess.check_call([sys.executable, "-m", "venv", str(VENV)])
    if subprocess.call([str(python), "-c", probe], stderr=subprocess.DEVNULL) != 0:
        subprocess.check_call([str(python), "-m", "pip", "install", "--quiet", *PINS])
    os.execv(str(python), [str(python), script, *sys.argv[1:]])


def ensure_venv():
    """Re-runs this script inside a venv with the pinned transformers and jinja2."""
    ensure_venv_for(__file__)


# mistralai/Mixtral-8x7B-Instruct-v0.1 (current revision; Mistral's "v1" format).
MIXTRAL_INSTRUCT = (
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content'] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}\n"
    "        {{- raise_exception('After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif %}\n"
    "    {%- if message['role'] == 'user' %}\n"
    "        {%- if loop.first and system_message is defined %}\n"
    "            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] + ' [/INST]' }}\n"
    "        {%- else %}\n"
    "            {{- ' [INST] ' + message['content'] + ' [/INST]' }}\n"
    "        {%- endif %}\n"
    "    {%- elif message['role'] == 'assistant' %}\n"
    "        {{- ' ' + message['content'] + eos_token}}\n"
    "    {%- else %}\n"
    "        {{- raise_exception('Only user and assistant roles are supported, with the exception "
    "of an initial optional system message!') }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n")

# mistralai/Mistral-7B-Instruct-v0.2 (and Mixtral-8x7B-Instruct-v0.1's first revision).
MISTRAL_INSTRUCT_LEGACY = (
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
    "user/assistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}"
    "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant "
    "roles are supported!') }}{% endif %}{% endfor %}")

# meta-llama/Llama-2-7b-chat-hf.
LLAMA2_CHAT = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation "
    "roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + "
    "system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}"
    "{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == "
    "'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")

# Qwen/Qwen1.5-MoE-A2.7B-Chat (ChatML with a default system message, no full stop after it: the
# Qwen1.5 chat models' tokenizer_config.json as printed from Qwen/Qwen1.5-0.5B-Chat at revision
# f82bd36 in public notes, and the tiny Qwen2-MoE test model onnx-internal-testing/
# tiny-random-Qwen2MoeForCausalLM's tokenizer_config.json; Qwen2 and later add the full stop).
QWEN15_CHAT = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Qwen/Qwen2.5-0.5B-Instruct's first template (its tokenizer_config.json before tools were added):
# Qwen1.5's with a full stop after the default system message.
QWEN2_INSTRUCT = QWEN15_CHAT.replace("assistant<|im_end|>", "assistant.<|im_end|>")

# ChatML without a default system message (e.g. teknium/OpenHermes-2.5-Mistral-7B).
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")

# allenai/OLMo-2-1124-7B-Instruct (Tulu 3's format, tokenizer_config.json chat_template as quoted in
# public code citing allenai/OLMo-2-1124-7B-SFT's file); without the leading {{ bos_token }} it is
# allenai/Llama-3.1-Tulu-3-8B's.
TULU = (
    "{% for message in messages %}{% if message['role'] == 'system' %}{{ '<|system|>\n' + "
    "message['content'] + '\n' }}{% elif message['role'] == 'user' %}{{ '<|user|>\n' + "
    "message['content'] + '\n' }}{% elif message['role'] == 'assistant' %}{% if not loop.last %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}{% else %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}{% endif %}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}{% endfor %}")
OLMO2_INSTRUCT = "{{ bos_token }}" + TULU

# allenai/OLMoE-1B-7B-0924-Instruct, tokenizer_config.json chat_template: Tulu 2's format, whose
# newlines are the template's own line breaks after each {{ }} (HF renders with trim_blocks, so
# those after {% %} go). Found the same in three places: the model's discussion #8 ("Differences in
# chat template compared to Zephyr", reformatted there), a llama-cpp-python preset for
# allenai/OLMoE-1B-7B-0924-Instruct-GGUF, and an offline renderer that refuses any tokenizer_config
# whose chat_template is not exactly this string.
OLMOE_0924_INSTRUCT = (
    "{{ bos_token }}{% for message in messages %}\n{% if message['role'] == 'system' %}\n"
    "{{ '<|system|>\n' + message['content'] }}\n{% elif message['role'] == 'user' %}\n"
    "{{ '<|user|>\n' + message['content'] }}\n{% elif message['role'] == 'assistant' %}\n"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n"
    "{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n"
    "{% endfor %}")

# meta-llama/Meta-Llama-3-8B-Instruct.
LLAMA3_INSTRUCT = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")

# name -> (template, bos_token, eos_token, the moekit format it must be detected as, source)
TEMPLATES = {
    "mixtral-instruct": (MIXTRAL_INSTRUCT, "<s>", "</s>", "mistral-v1",
                         "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "mistral-instruct-legacy": (MISTRAL_INSTRUCT_LEGACY, "<s>", "</s>", "llama2",
                                "mistralai/Mistral-7B-Instruct-v0.2"),
    "llama2-chat": (LLAMA2_CHAT, "<s>", "</s>", "llama2-sys", "meta-llama/Llama-2-7b-chat-hf"),
    "qwen1.5-chat": (QWEN15_CHAT, None, "<|im_end|>", "chatml", "Qwen/Qwen1.5-MoE-A2.7B-Chat"),
    "qwen2-instruct": (QWEN2_INSTRUCT, None, "<|im_end|>", "chatml", "Qwen/Qwen2.5-0.5B-Instruct"),
    "chatml": (CHATML, "<s>", "<|im_end|>", "chatml", "teknium/OpenHermes-2.5-Mistral-7B"),
    "olmoe-instruct": (OLMOE_0924_INSTRUCT, "<|endoftext|>", "<|endoftext|>", "tulu2",
                       "allenai/OLMoE-1B-7B-0924-Instruct"),
    "olmo2-instruct": (OLMO2_INSTRUCT, "<|endoftext|>", "<|endoftext|>", "tulu",
                       "allenai/OLMo-2-1124-7B-Instruct"),
    "tulu3": (TULU, "<|begin_of_text|>", "<|end_of_text|>", "tulu",
              "allenai/Llama-3.1-Tulu-3-8B"),
    "llama3-instruct": (LLAMA3_INSTRUCT, "<|begin_of_text|>", "<|eot_id|>", "llama3",
                        "meta-llama/Meta-Llama-3-8B-Instruct"),
}

SYSTEM = {"role": "system", "content": "You are terse."}
CONVERSATIONS = {
    "one user turn": [{"role": "user", "content": "Hello"}],
    "system then two turns": [
        SYSTEM,
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke."},
    ],
    "ends with the assistant": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ],
    "whitespace around contents": [
        {"role": "system", "content": "  be brief \n"},
        {"role": "user", "content": "  spaced out \n"},
        {"role": "assistant", "content": "\t I am an assistant  "},
        {"role": "user", "content": "\n"},
    ],
    "unicode and newlines": [
        {"role": "user", "content": "Grüße 🌍 和\nline two [INST] <|im_end|>"},
    ],
    "two user turns in a row": [
        {"role": "user", "content": "a"},
        {"role": "user", "content": "b"},
    ],
    "a tool message": [
        {"role": "user", "content": "weather?"},
        {"role": "tool", "content": "sunny"},
    ],
    "only a system message": [SYSTEM],
}


def main():
    ensure_venv()
    import jinja2
    import transformers
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = []
    for name, (template, bos, eos, _, _) in TEMPLATES.items():
        for conv_name, messages in CONVERSATIONS.items():
            for add_generation_prompt in (False, True):
                case = {"template": name, "conversation": conv_name,
                        "add_generation_prompt": add_generation_prompt}
                try:
                    rendered, _ = render_jinja_template(
                        conversations=[messages], chat_template=template,
                        add_generation_prompt=add_generation_prompt, bos_token=bos,
                        eos_token=eos)
                    case["expected"] = rendered[0]
                except jinja2.exceptions.TemplateError as e:
                    case["error"] = str(e)
                cases.append(case)
    out = {
        "generated_by": "scripts/make_chat_template_fixtures.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "templates": {n: {"template": t, "bos_token": b, "eos_token": e, "format": f, "source": s}
                      for n, (t, b, e, f, s) in TEMPLATES.items()},
        "conversations": CONVERSATIONS,
        "cases": cases,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}: {len(cases)} cases")


if __name__ == "__main__":
    main()
