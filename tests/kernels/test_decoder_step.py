"""The native decoding step (``decoder.c``) of a Llama-family model whose Linears take int8 activations: its
logits follow the layer-by-layer decoder within the int8 rounding of float32 differences, the same bits at every
vector level and thread count, and it steps aside where it does not apply."""

import pytest
import torch
import transformers

from mase_lite.kernels import mxint8, packed4
from mase_lite.kernels import cpu
from mase_lite.runtime.decoder import Decoder
from tests.kernels.native_decoding import PROMPT, assert_follows, layer_by_layer, steps

SIZES = dict(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=64)

pytestmark = pytest.mark.skipif(not cpu.available_levels(), reason="no C compiler: the kernels are not built")


def packed(packing="q4_0", kind="Llama", skip=(), mlp_width=None, **extra):
    """A small model with every Linear packed with int8 activations (``mlp_width``: layer 1's MLP that wide)."""
    torch.manual_seed(0)
    model = getattr(transformers, f"{kind}ForCausalLM")(getattr(transformers, f"{kind}Config")(**{**SIZES, **extra})).eval()
    if mlp_width:
        mlp, hidden = model.model.layers[1].mlp, SIZES["hidden_size"]
        mlp.gate_proj, mlp.up_proj = torch.nn.Linear(hidden, mlp_width, bias=False), torch.nn.Linear(hidden, mlp_width, bias=False)
        mlp.down_proj = torch.nn.Linear(mlp_width, hidden, bias=False)
    if packing == "mxint8":
        mxint8.pack_linears(model, activations="int8", skip=skip)
    else:
        packed4.pack_linears(model, packing, activations="int8", skip=skip)
    return model


@pytest.mark.parametrize("packing", ["mxint8", "q4_0", "mxfp4", "mxint4"])
@pytest.mark.parametrize("kind,extra", [("Llama", {}), ("Qwen2", {}), ("Mistral", {"sliding_window": None}),
                                        ("Llama", {"attention_bias": True, "mlp_bias": True})])
def test_logits_follow_the_layer_by_layer_decoder(packing, kind, extra):
    model = packed(packing, kind, **extra)
    decoder = Decoder.of(model, 12)
    assert decoder.step is not None and decoder.step.head
    assert_follows(steps(decoder), layer_by_layer(model))


@pytest.mark.parametrize("width", [32, 160])  # narrower, as structured pruning leaves an MLP, and wider than the config
def test_layers_of_different_widths_each_run_their_own(width):
    model = packed("q4_0", mlp_width=width)
    decoder = Decoder.of(model, 12)
    assert decoder.step is not None
    assert_follows(steps(decoder), layer_by_layer(model))


def test_a_head_it_does_not_run_is_applied_to_its_normed_state():
    model = packed("mxint8", skip=("lm_head",))
    decoder = Decoder.of(model, 12)
    assert decoder.step is not None and not decoder.step.head
    assert_follows(steps(decoder), layer_by_layer(model))


def test_every_level_and_thread_count_gives_the_same_bits(monkeypatch):
    model = packed("q4_0", num_attention_heads=8, num_key_value_heads=2)
    expected = None
    previous = torch.get_num_threads()
    try:
        for level in cpu.available_levels():
            monkeypatch.setenv(cpu.LEVEL_ENV, level)
            for count in (1, 2, 3):
                torch.set_num_threads(count)
                got = steps(Decoder.of(model, 12))
                expected = got if expected is None else expected
                assert torch.equal(got, expected), (level, count)
    finally:
        torch.set_num_threads(previous)


def test_the_torch_setting_runs_the_layers_themselves(monkeypatch):
    model = packed("mxint8")
    monkeypatch.setenv(cpu.LEVEL_ENV, "torch")
    decoder = Decoder.of(model, 12)
    assert torch.equal(steps(decoder), layer_by_layer(model))


def test_it_steps_aside_where_it_does_not_apply():
    model = packed("q4_0")
    model.model.layers[1].mlp.up_proj.activations = "float"  # one Linear with float activations
    assert Decoder.of(model, 12).step is None
    model = packed("q4_0")
    model.model.layers[0].self_attn.k_proj.register_forward_hook(lambda *args: None)
    assert Decoder.of(model, 12).step is None
    mixed = packed("q4_0")
    mixed.model.layers[0].self_attn.v_proj = packed("mxint8").model.layers[0].self_attn.v_proj  # q/k/v of two kinds
    assert Decoder.of(mixed, 12).step is None


def test_prompts_between_tokens_share_its_cache():
    model = packed("mxint8")
    calls = [PROMPT, torch.tensor([[9]]), torch.tensor([[10, 11]]), torch.tensor([[12]])]
    native, reference = Decoder.of(model, 12), Decoder.of(model, 12)
    reference.step = None
    with torch.no_grad():
        got, expected = [torch.stack([d(ids) for ids in calls]) for d in (native, reference)]
    assert native.length == 7
    assert_follows(got, expected)
