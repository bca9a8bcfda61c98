"""The Llama-family decoder that generation runs: its logits equal the model's own forward over the whole
sequence at every step (Llama with grouped-query attention, Qwen2 with q/k/v biases, Mistral; float32, packed,
bfloat16), a prompt given in parts equals it given at once, and any other model is left to its own forward."""

import pytest
import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel

import mase_lite as ml
from mase_lite import UserError
from mase_lite.kernels import mxint8, packed4
from mase_lite.runtime.decoder import Decoder

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)


def model(kind="Llama", dtype=torch.float32, **extra):
    torch.manual_seed(0)
    config = getattr(transformers, f"{kind}Config")(**SIZES, **extra)
    return getattr(transformers, f"{kind}ForCausalLM")(config).to(dtype).eval()


def steps(decoder, ids, tokens):
    """The decoder's logits after the prompt and after each of ``tokens``."""
    decoder.reset()
    out = [decoder(ids)]
    for token in tokens:
        out.append(decoder(torch.tensor([[token]])))
    return torch.stack(out)


def whole(m, ids, tokens):
    """The model's own logits over the whole sequence so far, at the same positions."""
    sequence = torch.cat([ids, torch.tensor([tokens])], 1)
    logits = m(input_ids=sequence).logits[0]
    return logits[ids.shape[1] - 1:]


@pytest.mark.parametrize("kind,extra", [("Llama", {}), ("Qwen2", {}), ("Mistral", {"sliding_window": None}),
                                        ("Llama", {"attention_bias": True, "mlp_bias": True})])
def test_logits_equal_the_models_forward_at_every_step(kind, extra):
    m = model(kind, **extra)
    ids, tokens = torch.tensor([[3, 14, 15, 92, 65]]), [35, 89, 79, 32]
    with torch.no_grad():
        torch.testing.assert_close(steps(Decoder.of(m, 16), ids, tokens), whole(m, ids, tokens), rtol=1e-5, atol=1e-5)


def test_a_long_prompt_attends_by_runs_as_the_models_forward():
    """150 positions go by runs of 64 (64, 64 and 22), each over the keys up to its last; a prompt after 40 earlier
    positions starts its runs there (40-104, 104-140); each ends with the model's own logits."""
    from mase_lite.runtime import decoder as module
    assert module.QUERY_RUN == 64
    m = model()
    ids = torch.randint(0, 97, (1, 150), generator=torch.Generator().manual_seed(0))
    decoder = Decoder.of(m, 160)
    with torch.no_grad():
        expected = m(input_ids=ids).logits[0]
        torch.testing.assert_close(decoder(ids), expected[-1], rtol=1e-5, atol=1e-5)
        decoder.reset()
        torch.testing.assert_close(decoder(ids[:, :40]), expected[39], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(decoder(ids[:, 40:140]), expected[139], rtol=1e-5, atol=1e-5)
    assert [(first, last) for first, last, _ in Decoder._runs(40, 140, "cpu")] == [(40, 104), (104, 140)]


def test_a_prompt_in_parts_equals_it_at_once():
    m = model()
    decoder = Decoder.of(m, 12)
    with torch.no_grad():
        at_once = decoder(torch.tensor([[5, 6, 7, 8, 9]]))
        decoder.reset()
        decoder(torch.tensor([[5, 6]]))
        in_parts = decoder(torch.tensor([[7, 8, 9]]))
    torch.testing.assert_close(in_parts, at_once, rtol=1e-5, atol=1e-5)
    assert decoder.length == 5


@pytest.mark.parametrize("packing", ["mxint8", "q4_0", "mxfp4", "mxint8 int8", "q4_0 int8", "mxfp4 int8"])
def test_a_packed_model_decodes_as_its_own_forward(packing):
    m = model()
    if packing.startswith("mxint8"):
        mxint8.pack_linears(m, activations="int8" if "int8 int8" in packing else "float")
    else:
        packed4.pack_linears(m, packing.split()[0], activations="int8" if "int8" in packing else "float")
    ids, tokens = torch.tensor([[1, 2, 3]]), [4, 5, 6]
    with torch.no_grad():
        torch.testing.assert_close(steps(Decoder.of(m, 8), ids, tokens), whole(m, ids, tokens), rtol=1e-5, atol=1e-5)


def test_a_fake_quantized_model_runs_its_quantizers():
    m, _ = ml.passes.quantize(model(), {"preset": "W4A16", "ignore": ["lm_head"]})
    ids, tokens = torch.tensor([[9, 8, 7]]), [6, 5]
    with torch.no_grad():
        torch.testing.assert_close(steps(Decoder.of(m, 8), ids, tokens), whole(m, ids, tokens), rtol=1e-5, atol=1e-5)


def test_bfloat16_stays_within_its_precision():
    m = model(dtype=torch.bfloat16)
    ids, tokens = torch.tensor([[3, 1, 4, 1, 5]]), [9, 2]
    with torch.no_grad():
        got, expected = steps(Decoder.of(m, 8), ids, tokens), whole(m, ids, tokens)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), expected.float(), rtol=0.02, atol=0.03)


def test_a_hooked_layer_is_called_as_a_module():
    m = model()
    seen = []
    m.model.layers[1].mlp.down_proj.register_forward_hook(lambda *args: seen.append(1))
    with torch.no_grad():
        Decoder.of(m, 8)(torch.tensor([[1, 2]]))
    assert seen == [1]


@pytest.mark.parametrize("elsewhere, during", [(2, 1), (0, 2)])
def test_a_busy_machine_decodes_on_the_cores_other_processes_leave(monkeypatch, elsewhere, during):
    """Two cores that two threads elsewhere keep busy: torch's ops of a token run on one thread (their joins made
    two threads 2.9x slower than one for a float32 token there), and torch's count is restored after."""
    from mase_lite.infra import cores
    from mase_lite.numerics.native import threads

    monkeypatch.setattr(threads, "ADAPTIVE", True)
    monkeypatch.setattr(cores, "running_elsewhere", lambda: elsewhere)
    monkeypatch.setattr(cores, "usable_cores", lambda: 2)
    threads.forget()
    m, seen, count = model(), [], torch.get_num_threads()
    m.model.layers[0].mlp.down_proj.register_forward_hook(lambda *args: seen.append(torch.get_num_threads()))
    torch.set_num_threads(2)
    try:
        with torch.no_grad():
            Decoder.of(m, 8)(torch.tensor([[1, 2]]))
        assert seen == [during] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(count)
        threads.forget()


def test_other_models_are_left_to_their_own_forward():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    assert Decoder.of(gpt2, 8) is None
    assert Decoder.of(model("Qwen3", head_dim=16), 8) is None  # query/key norms
    assert Decoder.of(model("Mistral", sliding_window=4), 8) is None  # a window shorter than the context
    assert Decoder.of(model("Mistral", sliding_window=8), 8) is not None
    assert Decoder.of(model(hidden_act="gelu"), 8) is None
    replaced = model()
    replaced.model.layers[1].mlp = torch.nn.Identity()  # a pass swapped a block's MLP: its computation is another
    assert Decoder.of(replaced, 8) is None
    custom = model()
    custom.model.layers[0].self_attn.__class__ = type("MyAttention", (torch.nn.Module,), {"forward": lambda s, *a: a})
    assert Decoder.of(custom, 8) is None


def test_shapes_and_lengths_it_cannot_take_are_named():
    decoder = Decoder.of(model(), 4)
    with pytest.raises(UserError, match=r"Decoder: 5 positions exceed its max_length 4"):
        decoder(torch.tensor([[1, 2, 3, 4, 5]]))
    with pytest.raises(UserError, match=r"token ids of shape \[1, n\], got \(2, 3\)"):
        decoder(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    assert decoder.length == 0
