"""Chat templates rendered with jinja2's sandbox."""
from __future__ import annotations

import pytest
from poot.errors import CheckpointError
from poot.models.chat import ChatTemplateError, render_chat, render_chat_for

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] "
          "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\n' }}{% endif %}")
MESSAGES = [{"role": "user", "content": "Hi é🙂"}]


def test_chatml_with_and_without_generation_prompt():
    assert render_chat(CHATML, MESSAGES) == \
        "<|im_start|>user\nHi é🙂<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat(CHATML, MESSAGES, add_generation_prompt=False) == \
        "<|im_start|>user\nHi é🙂<|im_end|>\n"


def test_bos_eos_and_block_whitespace():
    template = "{{ bos_token }}\n{% for m in messages %}\n  {{ m['content'] }}{{ eos_token }}\n" \
               "{% endfor %}"
    # trim_blocks/lstrip_blocks drop the newline after a block tag and the indent before it
    assert render_chat(template, MESSAGES * 2, bos_token="<s>", eos_token="</s>") == \
        "<s>\n  Hi é🙂</s>\n  Hi é🙂</s>\n"


def test_tojson_keeps_unicode():
    assert render_chat("{{ messages | tojson }}", MESSAGES) == \
        '[{"role": "user", "content": "Hi é🙂"}]'


def test_template_refusal_is_a_chat_template_error():
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('system first') }}" \
               "{% endif %}"
    with pytest.raises(ChatTemplateError, match="system first"):
        render_chat(template, MESSAGES)


@pytest.mark.parametrize("messages", [[], "hi", [{"role": "user"}], [{"role": 1, "content": "x"}],
                                      ["hi"]])
def test_malformed_messages(messages):
    with pytest.raises(ChatTemplateError):
        render_chat(CHATML, messages)


def test_sandbox_and_broken_templates():
    with pytest.raises(CheckpointError, match="failed"):
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", MESSAGES)
    with pytest.raises(CheckpointError, match="not valid Jinja"):
        render_chat("{% for m in messages %}", MESSAGES)
    with pytest.raises(CheckpointError, match="no chat template"):
        render_chat(None, MESSAGES)


def test_smollm2_template(smollm2_gguf):
    path = smollm2_gguf
    from poot.models.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(path)
    text = render_chat_for(tokenizer, [{"role": "user", "content": "What is 2+2?"}])
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                    "<|im_start|>assistant\n")
    ids = tokenizer.encode(text)
    assert ids[0] == 1 and ids.count(2) == 2  # <|im_start|> and <|im_end|> are single tokens


#: a template written for content lists (SmolVLM's shape): it iterates over each message's
#: content and prints the text parts, and prints nothing of a string content
LISTS = ("{% for m in messages %}{{ m.role }}:{% for part in m.content %}"
         "{% if part.type == 'text' %}{{ part.text }}{% endif %}{% endfor %}|{% endfor %}")


def test_a_content_list_template_gets_string_contents_as_text_parts():
    from poot.models.chat import render_chat_parts

    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi |"}]
    assert render_chat(LISTS, msgs) == "system:Be brief.|user:Hi ||"
    assert render_chat_parts(LISTS, msgs) == [
        ("system:", False), ("Be brief.", True), ("|user:", False), ("Hi |", True),
        ("|", False)]
    # a template for strings keeps them strings
    assert render_chat("{{ messages[0].content }}", msgs) == "Be brief."
