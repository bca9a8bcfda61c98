"""The ``generate`` pass: complete prompts with the model (greedy or sampled, with its key/value cache) and report
the completions and tokens per second of prefill and decode. It runs the model's own modules, float,
fake-quantized or packed alike, in graph and module mode; the tokenizer is the run's.

A prompt is encoded as text, or with ``chat`` as a user's message in the tokenizer's chat template (a pretrained
model's, or a GGUF's ``tokenizer.chat_template``) with the assistant's turn opened. A completion ends at the
tokenizer's eos, the model's ``generation_config.eos_token_id`` and, with ``chat``, the token the template ends an
assistant's turn with (``<|im_end|>``, ``<|eot_id|>``); or at a stop string, which counts once the completion has
text before it (a first "." ends nothing) and is cut off with what follows; or after ``max_new_tokens``.

Example::

    {"pass": "generate", "params": {"prompts": ["the small dog"], "max_new_tokens": 16, "stop": ["."]}}
    {"pass": "generate", "params": {"prompts": ["Name a colour."], "chat": true}}
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, model_validator
from tqdm import tqdm

from mase_lite.infra.errors import UserError
from mase_lite.infra.files import read_regular
from mase_lite.infra.limits import TEXT_PER_BYTE
from mase_lite.passes.registry import PassError, PassParams, PassResult, Seed, register_pass
from mase_lite.runtime.generation import Sampling, generate, generate_seq2seq


def _has_text(prompt: str) -> str:
    if not prompt.strip():
        raise ValueError("a prompt needs text to complete")
    return prompt


class GenerateParams(PassParams):
    prompts: list[Annotated[str, AfterValidator(_has_text)]] = Field(default_factory=list,
                                                                     description="the prompts to complete")
    prompts_file: str | None = Field(None, min_length=1, description="a text file of prompts, one per line")
    max_new_tokens: int = Field(32, ge=1, le=4096, description="tokens to generate at most per prompt")
    do_sample: bool = Field(False, description="sample the next token; false: greedy (the most likely)")
    temperature: float = Field(1.0, gt=0, description="logits are divided by it before sampling")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens")
    top_p: float | None = Field(None, gt=0, le=1, description="sample among the most likely tokens holding this mass")
    seed: Seed = Field(0, description="seed of the sampling generator")
    stop: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list, description="strings that end a completion once it has text before them (cut off)")
    chat: bool = Field(False, description="encode each prompt as a user's message in the tokenizer's chat template")
    label: str = Field("generate", min_length=1, description="name of the metrics in the run's report")
    console: bool = Field(True, description="print each completion")

    @model_validator(mode="after")
    def _some_prompt(self) -> "GenerateParams":
        if not self.prompts and self.prompts_file is None:
            raise ValueError("give prompts or a prompts_file")
        return self


@register_pass("generate", kind="analysis", params=GenerateParams, requires=("data",), needs_graph=False,
               metrics=("prefill_tokens_per_second", "decode_tokens_per_second", "new_tokens"))
def generate_pass(mg, params: GenerateParams, ctx):
    """Complete prompts (greedy or sampled, key/value cache); completions and prefill/decode tokens per second."""
    tokenizer = getattr(ctx.data, "tokenizer", None)
    if tokenizer is None:
        raise PassError("generate needs the run's tokenizer: a text task's data section")
    prompts = list(params.prompts) + (_file_prompts(params.prompts_file) if params.prompts_file is not None else [])
    model = getattr(mg, "source_model", mg.model)
    config = getattr(model, "config", None)
    if not hasattr(model, "generate") or getattr(config, "is_encoder_decoder", False) is None:
        raise PassError(f"generate runs transformers language models; this model is a {type(model).__name__}")
    sampling = Sampling(params.do_sample, params.temperature, params.top_k, params.top_p, params.seed)
    run = generate_seq2seq if getattr(config, "is_encoder_decoder", False) else generate
    try:
        out = run(model, tokenizer, prompts, params.max_new_tokens, sampling, params.stop, params.chat)
    except UserError as err:  # a prompt of the file is named by the file
        if err.location[:1] == ("prompts",) and err.location[1] >= len(params.prompts):
            err.location = ("prompts_file",)
        raise
    completions = [{k: c[k] for k in ("prompt", "completion", "stopped")} for c in out.completions]
    if params.console:
        for c in completions:
            tqdm.write(f"{c['prompt']!r} -> {c['completion']!r} ({c['stopped']})")
    metrics = {"prefill_tokens_per_second": out.prefill_tokens_per_second,
               "decode_tokens_per_second": out.decode_tokens_per_second, "new_tokens": out.decode_tokens}
    return PassResult({"completions": completions, "runner": out.runner}, metrics=metrics, label=params.label)


def _file_prompts(path: str) -> list[str]:
    """The non-blank lines of the regular file ``path``; a FIFO, a device or a file beyond memory is refused unread."""
    try:
        text = read_regular(path, "a prompts file", per_byte=TEXT_PER_BYTE).decode("utf-8")
    except UserError as err:
        raise PassError(str(err), location=("prompts_file",)) from None
    except UnicodeDecodeError as err:
        raise PassError(f"{path}: not UTF-8 text (byte {err.start})", location=("prompts_file",)) from None
    return [line for line in text.splitlines() if line.strip()]

