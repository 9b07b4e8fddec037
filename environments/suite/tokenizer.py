"""The suite's tiny tokenizer: a byte-level BPE in Qwen's mould, with Qwen2.5's chat template.

The files ship in `environments/suite/tiny_tokenizer/` (a normal Hugging Face tokenizer
directory, loadable with `AutoTokenizer.from_pretrained(TOKENIZER_DIR)`), so token ids never
change under a trained checkpoint (a rebuild after the suite's text changed gives other ids).
This module rebuilds them deterministically:

    python -m environments.suite.tokenizer --out=environments/suite/tiny_tokenizer

It lives with the suite, not in `seal_jax/`, because it is trained on the suite's text; the
device side only ever sees a tokenizer directory.

Like Qwen's: NFC normalisation, Qwen's pre-tokenizer regex (digits one by one) over byte-level
BPE, `<|endoftext|>` / `<|im_start|>` / `<|im_end|>` as special tokens, `<tool_call>`,
`</tool_call>`, `<tool_response>`, `</tool_response>` as added (non-special) tokens, and
additionally `<tools>` / `</tools>` (single ids for the tools section). Added tokens come after
the BPE vocabulary, as in Qwen. eos is `<|im_end|>`, pad `<|endoftext|>`, no bos.
"""

import re
from collections.abc import Iterator
from pathlib import Path

from absl import app, flags
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
from tokenizers import pre_tokenizers as pre
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

from environments.episode import Episode, EpisodeConfig
from environments.policies import NO_ACTION, oracle_turns
from environments.suite.tasks import load_tasks
from environments.task import ToolTask

TOKENIZER_DIR = Path(__file__).with_name("tiny_tokenizer")
VOCAB_SIZE = 1024  # BPE cap incl. the 256 bytes (the suite saturates it at 861); added on top.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
TOOLS_TAGS = ("<tools>", "</tools>")
# Qwen2's pre-tokenizer pattern (from its tokenizer.json).
QWEN_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen2.5-Instruct's chat template: tools in the system message, <tool_call> in assistant
# messages, tool results as <tool_response> blocks inside a user turn.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n\
You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and \
arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \
\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. \
You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or \
(message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
_ADDED_TOKENS = re.compile(
    "|".join(re.escape(t) for t in SPECIAL_TOKENS + TOOL_TOKENS + TOOLS_TAGS)
)


def _transcripts(task: ToolTask) -> Iterator[list[dict]]:
    """Two episodes of a task: the oracle's, and a clumsy one that draws error messages.

    The clumsy one (training mode) first calls every shown tool without arguments and writes a
    broken block, then answers in plain text.
    """
    oracle = Episode(task)
    oracle.reset()
    for messages in oracle_turns(task):
        for text in messages:
            oracle.act(text)
        oracle.finish_turn()
    yield oracle.transcript
    clumsy = Episode(task, EpisodeConfig(mode="training"))
    clumsy.reset()
    blocks = [
        f'<tool_call>\n{{"name": "{d["name"]}", "arguments": {{}}}}\n</tool_call>'
        for d in task.docs
    ]
    clumsy.act("\n".join(blocks + ["<tool_call>\n{oops\n</tool_call>"]))
    done = False
    while not done:
        _, done = clumsy.step(NO_ACTION)
    yield clumsy.transcript


def training_corpus(tasks: list[ToolTask]) -> list[str]:
    """The chat-template renders of the tasks' transcripts, cut at the added tokens.

    Cutting keeps the added tokens' text out of the BPE merges (they get their own ids).
    """
    pieces = []
    for task in tasks:
        for transcript in _transcripts(task):
            (text,), _ = render_jinja_template([transcript], chat_template=CHAT_TEMPLATE)
            pieces += [piece for piece in _ADDED_TOKENS.split(text) if piece]
    return pieces


def _bpe(corpus: list[str]) -> Tokenizer:
    """Trains Qwen's byte-level BPE pipeline on `corpus`, then appends the added tokens."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN_SPLIT), behavior="isolated"),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t in TOOL_TOKENS + TOOLS_TAGS]
    )
    return tokenizer


def build_tokenizer(out_dir: str | Path) -> Path:
    """Builds the tokenizer from the suite's training tasks and saves it to `out_dir`.

    The same ids every time: the corpus is generated from fixed seeds and BPE training is
    deterministic given its input.
    """
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_bpe(training_corpus(load_tasks("train"))),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens=["<|im_start|>", "<|im_end|>"],  # Qwen's additional specials
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    out_dir = Path(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def main(argv: list[str]) -> None:
    """Writes the tokenizer directory given by --out."""
    del argv
    print(build_tokenizer(flags.FLAGS.out))


if __name__ == "__main__":
    flags.DEFINE_string("out", str(TOKENIZER_DIR), "Directory to write the tokenizer to.")
    app.run(main)
