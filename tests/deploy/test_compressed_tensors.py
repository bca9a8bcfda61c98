"""compressed-tensors export: transformers (with the compressed-tensors package) loads the directory and its logits
equal the tool's quantized logits bit for bit; where transformers cannot load a scheme on CPU in float32 (its own
asymmetric and MXFP4 checkpoints fail too), compressed-tensors' own compressor and decompressor are held to our
tensors and values bit for bit. Refusals name the layer, the format and the nearest scheme, and write nothing."""

import json
import logging

import pytest
import safetensors.torch
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

import mase_lite as ml
from mase_lite import UserError
from mase_lite.deploy import export

ct = pytest.importorskip("compressed_tensors")


def llama(tied: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                                        tie_word_embeddings=tied)).eval()


def quantized(rules: dict, tied: bool = False) -> ml.MaseGraph:
    mg = ml.MaseGraph(llama(tied), hf_input_names=["input_ids"])
    mg, _ = ml.passes.quantize(mg, {"by": "type", "rules": rules})
    return mg


def transformers_logits(path, ids) -> torch.Tensor:
    logging.getLogger("transformers").setLevel(logging.ERROR)
    model = AutoModelForCausalLM.from_pretrained(path)
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(0))
W8_FULL = {"name": "scaled_integer", "width": 8, "granularity": "channel", "full_range": True}
SCHEMES = {
    "w4_group_symmetric": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}},
    "w4_group_full_float16": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32,
                                         "full_range": True, "scale_dtype": "float16"}},
    "w8_channel": {"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel"}},
    "fixed_point": {"weight": {"name": "integer", "width": 8, "frac_width": 6}},
    "mxint8": {"weight": {"name": "mxint", "element_width": 8}},
    "mxint4": {"weight": {"name": "mxint", "element_width": 4}},
    "w8a8_dynamic_token": {"weight": W8_FULL, "data_in": {**W8_FULL, "granularity": "channel"}},
    "w8a8_static_tensor": {"weight": W8_FULL, "data_in": {**W8_FULL, "granularity": "tensor", "scale": 0.02}},
    "fp8_channel": {"weight": {"name": "scaled_float"}},
    "fp8_tensor": {"weight": {"name": "scaled_float", "granularity": "tensor"}},
    "fp8_dynamic_token": {"weight": {"name": "scaled_float"}, "data_in": {"name": "scaled_float"}},
    "fp8_static_tensor": {"weight": {"name": "scaled_float", "granularity": "tensor"},
                          "data_in": {"name": "scaled_float", "granularity": "tensor", "scale": 0.01}},
}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_transformers_reproduces_the_quantized_logits(scheme, tmp_path):
    mg = quantized({"head": None, "linear": SCHEMES[scheme]})
    with torch.no_grad():
        ours = mg.model(input_ids=IDS).logits
    info = export(mg, "compressed-tensors", tmp_path / "hf")
    assert info["ignore"] == ["lm_head"] and len(info["quantized"]) == 7
    assert torch.equal(transformers_logits(tmp_path / "hf", IDS), ours)


def test_the_config_names_every_group_and_what_stays_float(tmp_path):
    w4 = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}
    mg = quantized({"head": None, "linear": w4})
    mg, _ = ml.passes.quantize(mg, {"by": "regex", "rules": {".*down_proj": {"weight": {"name": "mxint", "element_width": 8}}}})
    export(mg, "compressed-tensors", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    q = config["quantization_config"]
    assert q["quant_method"] == "compressed-tensors" and q["quantization_status"] == "compressed"
    assert q["ignore"] == ["lm_head"] and q["format"] == "pack-quantized"
    targets = sorted(t for g in q["config_groups"].values() for t in g["targets"])
    assert len(q["config_groups"]) == 2 and "model.layers.0.mlp.down_proj" in targets and len(targets) == 7
    assert config["architectures"] == ["LlamaForCausalLM"]
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    assert tensors["model.layers.0.self_attn.q_proj.weight_packed"].dtype == torch.int32
    assert tensors["model.layers.0.self_attn.q_proj.weight_packed"].shape == (64, 64 * 4 // 32)
    assert "model.layers.0.self_attn.q_proj.weight" not in tensors
    assert torch.equal(transformers_logits(tmp_path / "hf", IDS), mg.model(input_ids=IDS).logits.detach())


def test_a_quantized_head_tied_to_the_embedding_is_written_untied(tmp_path):
    mg = quantized({"linear": {"weight": {"name": "scaled_integer", "width": 8, "granularity": "channel"}}}, tied=True)
    export(mg, "compressed-tensors", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and config["quantization_config"]["ignore"] == []
    assert torch.equal(transformers_logits(tmp_path / "hf", IDS), mg.model(input_ids=IDS).logits.detach())


def _decompressed(compressor, tensors: dict, prefix: str, scheme) -> torch.Tensor:
    local = {k.removeprefix(prefix + "."): v for k, v in tensors.items() if k.startswith(prefix + ".")}
    return compressor.decompress(local, scheme)["weight"]


def test_asymmetric_groups_are_compressed_tensors_own_bytes(tmp_path):
    """transformers 5 with compressed-tensors 0.20 cannot load asymmetric pack-quantized checkpoints, its own
    included (the zero point's packed shape is refused); our tensors are what its compressor writes for the same
    values and scales, and its decompressor gives our values back bit for bit."""
    from compressed_tensors.compressors.pack_quantized import PackedQuantizationCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    fmt = {"name": "scaled_integer", "width": 4, "symmetric": False, "granularity": "group", "group_size": 32}
    mg = quantized({"head": None, "linear": {"weight": fmt}})
    export(mg, "compressed-tensors", tmp_path / "hf")
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
        num_bits=4, type="int", symmetric=False, strategy="group", group_size=32))
    layer = mg.model.get_submodule("model.layers.0.mlp.up_proj")
    weight = layer.weight_quantizer(layer.weight).detach()
    prefix = "model.layers.0.mlp.up_proj"
    assert torch.equal(_decompressed(PackedQuantizationCompressor, tensors, prefix, scheme), weight)
    ours = {k.removeprefix(prefix + "."): v for k, v in tensors.items() if k.startswith(prefix + ".")}
    zero = ct.compressors.pack_quantized.unpack_from_int32(ours["weight_zero_point"], 4, (128, 2), packed_dim=0)
    theirs = PackedQuantizationCompressor.compress(
        {"weight": weight, "weight_scale": ours["weight_scale"], "weight_zero_point": zero}, scheme)
    assert all(torch.equal(theirs[k], ours[k]) for k in ("weight_packed", "weight_zero_point", "weight_shape"))


def test_mxfp4_is_compressed_tensors_own_layout(tmp_path):
    """transformers decompresses MXFP4 to bfloat16, which a float32 model cannot multiply (its own checkpoints
    too); compressed-tensors' decompressor gives our weights bit for bit."""
    from compressed_tensors.compressors.mxfp4 import MXFP4PackedCompressor
    from compressed_tensors.quantization import QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import MXFP4A16

    mg = quantized({"head": None, "linear": {"weight": {"name": "mxfp", "element_format": "e2m1"}}})
    info = export(mg, "compressed-tensors", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["quantization_config"]["format"] == "mxfp4-pack-quantized" and len(info["quantized"]) == 7
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    scheme = QuantizationScheme(targets=["Linear"], **MXFP4A16)
    for name in info["quantized"]:
        layer = mg.model.get_submodule(name)
        weight = layer.weight_quantizer(layer.weight).detach()
        assert torch.equal(_decompressed(MXFP4PackedCompressor, tensors, name, scheme).float(), weight)


@pytest.mark.parametrize("rules, message", [
    ({"linear": {"weight": {"name": "log", "width": 4}}},
     r"compressed-tensors cannot hold layer 'model.layers.0.self_attn.q_proj': weight format log \(width=4\); "
     r"nearest compressed-tensors scheme: int4 or int8 weights"),
    ({"linear": {"weight": {"name": "scaled_integer", "width": 8}, "data_in": {"name": "scaled_integer", "width": 8}}},
     r"activation format scaled_integer .*full_range=False.*nearest compressed-tensors scheme: 8-bit scaled_integer "
     r"activations with full_range true"),
    ({"linear": {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 48}}},
     r"groups of 48 over 64 columns"),
    ({"linear": {"data_out": {"name": "integer", "width": 8, "frac_width": 4}}}, r"an output format \(integer\)"),
])
def test_refusals_name_the_layer_and_write_nothing(rules, message, tmp_path):
    mg = quantized({"head": None, **rules})
    with pytest.raises(UserError, match=message):
        export(mg, "compressed-tensors", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_model_that_is_not_from_transformers_is_refused(tmp_path):
    mg = ml.MaseGraph(torch.nn.Sequential(torch.nn.Linear(4, 4)), example_inputs={"input": torch.randn(2, 4)})
    with pytest.raises(UserError, match="compressed-tensors writes transformers models; this model is a Sequential"):
        export(mg, "compressed-tensors", tmp_path / "hf")


def test_float_tensors_can_ship_in_bfloat16(tmp_path):
    """Embeddings, norms and the float head in bfloat16 (as checkpoints usually ship); the quantized layers' codes
    and scales are the same bytes; transformers computing in float32 gives logits close to the tool's."""
    w4 = {"weight": {"name": "scaled_integer", "width": 4, "granularity": "group", "group_size": 32}}
    mg = quantized({"head": None, "linear": w4})
    export(mg, "compressed-tensors", tmp_path / "f32")
    export(mg, "compressed-tensors", tmp_path / "bf16", float_dtype="bfloat16")
    f32 = safetensors.torch.load_file(tmp_path / "f32" / "model.safetensors")
    bf16 = safetensors.torch.load_file(tmp_path / "bf16" / "model.safetensors")
    assert bf16["model.embed_tokens.weight"].dtype == torch.bfloat16 and bf16["lm_head.weight"].dtype == torch.bfloat16
    packed = "model.layers.0.mlp.up_proj.weight_packed"
    assert torch.equal(bf16[packed], f32[packed])
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with torch.no_grad():
        theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)(input_ids=IDS).logits
        ours = mg.model(input_ids=IDS).logits
    assert (theirs - ours).abs().max() <= 0.02 * ours.abs().max()
    with pytest.raises(UserError, match="the pt2 export takes no option 'float_dtype'"):
        export(mg, "pt2", tmp_path / "m.pt2", float_dtype="bfloat16")


NVFP4 = {"name": "nvfp4", "per_tensor": "global_scale"}


def _dequantizing_load(path):
    """transformers decompresses NVFP4 to bfloat16 (compressed-tensors' unpacking dtype), which a float32 model
    cannot multiply unless it dequantizes at load."""
    import warnings

    from transformers.utils.quantization_config import CompressedTensorsConfig

    logging.getLogger("transformers").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoModelForCausalLM.from_pretrained(path, quantization_config=CompressedTensorsConfig(dequantize=True))


def test_nvfp4_is_compressed_tensors_own_bytes_and_values(tmp_path):
    """Our packed codes, E4M3 scales and global scale are what compressed-tensors' compressor writes for our
    values; its decoding in float32 gives our weights bit for bit, and transformers loads their bfloat16 rounding
    (its NVFP4 unpacking dtype), so its logits are ours within that rounding."""
    from compressed_tensors.compressors.nvfp4 import NVFP4PackedCompressor
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    from compressed_tensors.quantization import QuantizationScheme, preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import dequantize

    mg = quantized({"head": None, "linear": {"weight": NVFP4}})
    info = export(mg, "compressed-tensors", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "nvfp4-pack-quantized" and len(info["quantized"]) == 7
    (group,) = config["config_groups"].values()
    assert group["weights"]["strategy"] == "tensor_group" and group["weights"]["group_size"] == 16
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    args = preset_name_to_scheme("NVFP4A16", ["Linear"]).weights
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    model = _dequantizing_load(tmp_path / "hf")
    for name in info["quantized"]:
        layer = mg.model.get_submodule(name)
        weight = layer.weight_quantizer(layer.weight).detach()
        ours = {k.removeprefix(name + "."): v for k, v in tensors.items() if k.startswith(name + ".")}
        assert ours["weight_packed"].dtype == torch.uint8 and ours["weight_scale"].dtype == torch.float8_e4m3fn
        theirs = NVFP4PackedCompressor.compress({"weight": weight, "weight_scale": ours["weight_scale"].float(),
                                                 "weight_global_scale": ours["weight_global_scale"]}, scheme)
        packed = ours["weight_packed"]  # compressed-tensors packs -0.0 as +0 (code 8 -> 0); we keep the sign
        unsigned_zero = torch.where(packed & 0xF == 8, packed & 0xF0, packed)
        unsigned_zero = torch.where(unsigned_zero >> 4 == 8, unsigned_zero & 0xF, unsigned_zero)
        assert torch.equal(theirs["weight_packed"], unsigned_zero)
        rows, half = ours["weight_packed"].shape
        elements = unpack_fp4_from_uint8(ours["weight_packed"], rows, 2 * half, dtype=torch.float32)
        decoded = dequantize(elements, ours["weight_scale"].float(), args=args,
                             global_scale=ours["weight_global_scale"], dtype=torch.float32)
        assert torch.equal(decoded, weight)
        assert torch.equal(model.get_submodule(name).weight, weight.bfloat16().float())
    with torch.no_grad():
        expected, got = mg.model(input_ids=IDS).logits, model(input_ids=IDS).logits
    assert (got - expected).abs().max() <= 2e-3 * expected.abs().max()


def test_nvfp4_w4a4_writes_the_input_global_scale_and_imports_back(tmp_path):
    """W4A4 NVFP4 (compressed-tensors' NVFP4 scheme): a calibrated activation amax becomes input_global_scale,
    and reading the directory back gives the same formats and logits bit for bit."""
    from mase_lite.importers.compressed_tensors import read
    from mase_lite.numerics.scaled import nvfp4_global_scale

    mg = quantized({"head": None, "linear": {"weight": NVFP4, "data_in": {**NVFP4, "tensor_amax": 3.5}}})
    info = export(mg, "compressed-tensors", tmp_path / "hf")
    tensors = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())["quantization_config"]
    (group,) = config["config_groups"].values()
    assert group["input_activations"]["dynamic"] == "local" and group["input_activations"]["group_size"] == 16
    name = info["quantized"][0]
    assert torch.equal(tensors[f"{name}.input_global_scale"], nvfp4_global_scale(torch.tensor([3.5])))
    back = read(tmp_path / "hf", AutoModelForCausalLM)
    formats = back.get_submodule(name).quant_formats()
    assert formats["weight"]["name"] == "nvfp4" and formats["weight"]["per_tensor"] == "global_scale"
    amax = torch.tensor([formats["data_in"]["tensor_amax"]])  # an amax of the same global scale (3.5 or a neighbour)
    assert torch.equal(nvfp4_global_scale(amax), nvfp4_global_scale(torch.tensor([3.5])))
    with torch.no_grad():
        assert torch.equal(back(input_ids=IDS).logits, mg.model(input_ids=IDS).logits)


def test_torchao_convention_nvfp4_is_refused_naming_the_preset(tmp_path):
    mg = quantized({"head": None, "linear": {"weight": {"name": "nvfp4"}}})
    with pytest.raises(UserError, match=r"layer 'model.layers.0.self_attn.q_proj': weight format nvfp4 "
                                        r"\(block_size=16, per_tensor=torchao\).*nvfp4 with per_tensor global_scale"):
        export(mg, "compressed-tensors", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("float_dtype", ["float32", "bfloat16", "float16"])
def test_a_float_model_exports_as_the_plain_directory_transformers_loads(float_dtype, tmp_path):
    """No quantized layer: the Hugging Face directory a study starts from (config, weights in the dtype asked for, the
    tie kept: the embedding written once), which transformers loads to the model's own logits."""
    model = llama(tied=True)
    export(model, "compressed-tensors", tmp_path / "hf", float_dtype=float_dtype)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == float_dtype and config["tie_word_embeddings"]
    stored = safetensors.torch.load_file(tmp_path / "hf" / "model.safetensors")
    assert "lm_head.weight" not in stored and {t.dtype for t in stored.values()} == {getattr(torch, float_dtype)}
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    expected = llama(tied=True)  # the same weights rounded to the dtype (buffers such as rotary frequencies stay float32)
    expected.load_state_dict({k: v.to(getattr(torch, float_dtype)).float() for k, v in model.state_dict().items()})
    with torch.no_grad():
        assert torch.equal(loaded(input_ids=IDS).logits, expected(input_ids=IDS).logits)
