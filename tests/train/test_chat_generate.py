"""Chat templates and stops in the generate step: with ``chat`` the model is fed exactly the template's ids and stops
at the turn's end; generation stops at the generation config's end ids; a stop string counts once the completion has
text before it (decoder-only and encoder-decoder alike); a GGUF import keeps the file's chat template, its control
tokens whole and its end id.

The models are scripted: every layer adds nothing to the residual stream (zero output projections), the embedding is
one-hot and the head maps each token to its successor, so the next token is ``NEXT[token]`` by a logit of 8 over 0:
the same tokens on any CPU."""

from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, T5Config, T5ForConditionalGeneration

import mase_lite as ml
from mase_lite import UserError
from mase_lite.runtime.generation import generate, generate_seq2seq, stop_at
from mase_lite.workloads.tokenizer import train_wordpiece

TEXTS = ["the cat sat on the mat .", "a dog ran to the big tree .", "the small bird sang a song ."]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
VOCAB = 64


@pytest.fixture(scope="module")
def plain():
    return train_wordpiece(TEXTS, vocab_size=90)


@pytest.fixture(scope="module")
def chatty():
    tokenizer = train_wordpiece(TEXTS, vocab_size=90)
    tokenizer.add_tokens(["<|user|>", "<|assistant|>", "<|end|>"], special_tokens=True)
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def ids(tokenizer, *tokens):
    return tokenizer.convert_tokens_to_ids(list(tokens))


def successors(tokenizer, *chain):
    """NEXT as a {token id: next id} map from a chain of tokens, each naming the next (a token again: a cycle)."""
    chain = ids(tokenizer, *chain)
    nexts = dict(zip(chain, chain[1:]))
    assert all(nexts[a] == b for a, b in zip(chain, chain[1:])), "a token with two successors"
    return nexts


def scripted_llama(nexts, eos=None):
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=VOCAB, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                         bos_token_id=None, eos_token_id=eos, pad_token_id=None)).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(VOCAB))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.copy_(_head(nexts))
    return model


def scripted_t5(nexts):
    model = T5ForConditionalGeneration(T5Config(vocab_size=VOCAB, d_model=VOCAB, d_kv=16, d_ff=16, num_layers=1,
                                                num_heads=4, decoder_start_token_id=0, pad_token_id=0,
                                                eos_token_id=None)).eval()
    with torch.no_grad():
        model.shared.weight.copy_(_head(nexts))  # T5 ties the head to it: the decoder gets its own embedding
        model.decoder.embed_tokens = torch.nn.Embedding.from_pretrained(torch.eye(VOCAB))
        for block in model.decoder.block:
            for linear in (block.layer[0].SelfAttention.o, block.layer[1].EncDecAttention.o,
                           block.layer[2].DenseReluDense.wo):
                linear.weight.zero_()
    return model


def _head(nexts):
    head = torch.zeros(VOCAB, VOCAB)
    for token, following in nexts.items():
        head[following, token] = 1.0
    return head


def fed_ids(model):
    """The ids of each forward call into the model's embedding (prefill first)."""
    calls = []
    model.model.embed_tokens.register_forward_pre_hook(lambda module, args: calls.append(args[0][0].tolist()))
    return calls


def test_a_chat_prompt_is_the_templates_ids_and_the_completion_ends_at_the_turns_end(chatty):
    model = scripted_llama(successors(chatty, "<|assistant|>", "a", "dog", "<|end|>", "the", "cat"))
    calls = fed_ids(model)
    out = generate(model, chatty, ["the cat"], max_new_tokens=8, chat=True)
    expected = chatty.apply_chat_template([{"role": "user", "content": "the cat"}], add_generation_prompt=True)
    assert calls[0] == expected["input_ids"] == ids(chatty, "<|user|>", "the", "cat", "<|end|>", "<|assistant|>")
    (c,) = out.completions
    assert (c["completion"], c["stopped"], c["tokens"]) == ("a dog", "eos", ids(chatty, "a", "dog", "<|end|>"))


def test_generation_stops_at_an_end_id_of_the_generation_config_as_transformers_does(plain):
    model = scripted_llama(successors(plain, "cat", "a", "dog", "the", "cat"))
    model.generation_config.eos_token_id = [7, *ids(plain, "dog")]
    (c,) = generate(model, plain, ["the cat"], max_new_tokens=8).completions
    prompt = torch.tensor([ids(plain, "the", "cat")])
    theirs = model.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)[0, 2:].tolist()
    assert (c["completion"], c["stopped"]) == ("a dog", "eos") and c["tokens"] == theirs == ids(plain, "a", "dog")


def test_chat_without_a_template_is_refused_naming_the_field(plain):
    model = scripted_llama({})
    with pytest.raises(UserError, match=r"^pass 'generate' params\.chat: the tokenizer has no chat template") as err:
        ml.passes.generate(model, {"prompts": ["the cat"], "chat": True}, data=SimpleNamespace(tokenizer=plain))
    with pytest.raises(UserError) as direct:
        generate(model, plain, ["the cat"], chat=True)
    assert direct.value.location == ("chat",) and "leave chat false" in str(err.value)
    with pytest.raises(UserError, match=r"^pass 'generate' params\.chat: the tokenizer has no chat template"):
        ml.passes.generate(scripted_t5({}), {"prompts": ["the cat"], "chat": True},
                           data=SimpleNamespace(tokenizer=plain))


@pytest.mark.parametrize(("text", "stop", "at"), [
    ("a dog. the cat.", ["."], 5), (". a dog.", ["."], 7), ("  . a dog", ["."], None), (".", ["."], None),
    ("\n\nhi\n\nyou", ["\n\n"], 4), ("a dog", ["dog", "a d"], 2), ("a dog", [" "], 1)])
def test_a_stop_string_counts_once_the_completion_has_text_before_it(text, stop, at):
    assert stop_at(text, stop) == at


@pytest.mark.parametrize(("stop", "completion", "tokens"), [
    (["."], ". a dog", [".", "a", "dog", "."]),  # the first "." ends nothing
    (["dog"], ". a ", [".", "a", "dog"]),
    (["song"], ". a dog. a dog. a dog.", None)])  # never: the length ends it
def test_stop_strings_at_the_start_and_in_the_middle(plain, stop, completion, tokens):
    nexts = successors(plain, "cat", ".", "a", "dog", ".")
    params = {"prompts": ["the cat"], "max_new_tokens": 10, "stop": stop, "console": False}
    (c,) = ml.passes.generate(scripted_llama(nexts), params, data=SimpleNamespace(tokenizer=plain))[1]["completions"]
    direct = generate(scripted_llama(nexts), plain, ["the cat"], max_new_tokens=10, stop=stop).completions[0]
    assert c["completion"] == direct["completion"] == completion
    assert c["stopped"] == ("stop" if tokens else "length")
    assert direct["tokens"] == ids(plain, *tokens) if tokens else len(direct["tokens"]) == 10


@pytest.mark.parametrize(("stop", "completion", "tokens"), [(["."], ". a dog", [".", "a", "dog", "."]),
                                                            (["dog"], ". a ", [".", "a", "dog"])])
def test_an_encoder_decoder_stops_alike(plain, stop, completion, tokens):
    """The decoder starts at token 0: NEXT[0] is its first token."""
    model = scripted_t5({0: ids(plain, ".")[0], **successors(plain, ".", "a", "dog", ".")})
    (c,) = generate_seq2seq(model, plain, ["the cat"], max_new_tokens=10, stop=stop).completions
    assert (c["completion"], c["stopped"], c["tokens"]) == (completion, "stop", ids(plain, *tokens))


def test_an_encoder_decoder_chat_prompt_is_the_templates_and_ends_at_the_turns_end(chatty):
    model = scripted_t5({0: ids(chatty, "a")[0], **successors(chatty, "a", "dog", "<|end|>", "the")})
    calls = []
    model.encoder.embed_tokens.register_forward_pre_hook(lambda module, args: calls.append(args[0][0].tolist()))
    (c,) = generate_seq2seq(model, chatty, ["the cat"], max_new_tokens=8, chat=True).completions
    assert calls[0] == ids(chatty, "<|user|>", "the", "cat", "<|end|>", "<|assistant|>")
    assert (c["completion"], c["stopped"], c["tokens"]) == ("a dog", "eos", ids(chatty, "a", "dog", "<|end|>"))


def test_an_empty_stop_string_is_refused(plain):
    with pytest.raises(UserError, match=r"params\.stop\.0: String should have at least 1 character"):
        ml.passes.generate(scripted_llama({}), {"prompts": ["the cat"], "stop": [""]},
                           data=SimpleNamespace(tokenizer=plain))


def test_a_gguf_import_keeps_the_chat_template_its_control_tokens_and_its_end_id(chatty, tmp_path):
    """Exported with its tokenizer and read back: the same template, the same chat ids (control tokens whole), the
    file's eos as the config's (not LlamaConfig's default 2), and the chat completion of the original."""
    from transformers import AutoModelForCausalLM

    pytest.importorskip("gguf")
    from mase_lite.deploy import export
    from mase_lite.importers import hub

    model = scripted_llama(successors(chatty, "<|assistant|>", "a", "dog", "<|end|>", "the", "cat"),
                           eos=chatty.eos_token_id)
    export(model, "gguf", tmp_path / "m.gguf", tokenizer=chatty)
    tokenizer = hub.read_tokenizer(tmp_path / "m.gguf")
    imported = hub.read_model(tmp_path / "m.gguf", AutoModelForCausalLM)
    chat = [{"role": "user", "content": "the cat"}]
    assert tokenizer.chat_template == TEMPLATE
    assert tokenizer.apply_chat_template(chat, add_generation_prompt=True)["input_ids"] == \
        chatty.apply_chat_template(chat, add_generation_prompt=True)["input_ids"]
    assert imported.config.eos_token_id == chatty.eos_token_id == 3 and imported.config.bos_token_id == 2
    (c,) = generate(imported, tokenizer, ["the cat"], max_new_tokens=8, chat=True).completions
    assert (c["completion"], c["stopped"]) == ("a dog", "eos")
