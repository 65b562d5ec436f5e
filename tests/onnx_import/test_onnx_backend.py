"""ONNX's node test suite (``onnx.backend.test.BackendTest``: 1,884 one-node and small-graph
cases that onnx generates in memory, each with inputs and the outputs of ONNX's reference) run
through `glcomp.onnx_backend.GlcompBackend`, on the reference runtime (all cases) and on GL (a
case per op family here; every case that passes on the reference in the slow profile).

ONNX's own runner prepares, runs and compares (its dtypes, shapes and tolerances). Each case
either passes or is an expected failure: its model holds an op glcomp does not import
(`UNSUPPORTED_OPS`, refused naming the op), a graph input or output of a type glcomp does not
compute (`UNSUPPORTED_TYPES`), or an attribute, shape or idiom listed in `EXPECTED_FAILURES`.
An expected failure must raise GlcompError matching its reason: never a crash, never a wrong
number; a case that passes while listed fails the test, so the lists stay true.

The ``ai.onnx.preview.training`` optimizer ops (Adam, Adagrad, Momentum) are one optimizer step on
explicit state tensors: the importer refuses them (glcomp runs its optimizers inside
``train_step``), and `test_optimizer_case_matches_glcomp_optimizer` checks glcomp's own Adagrad and
momentum SGD steps against those cases' expected outputs instead."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import onnx
import pytest

import glcomp
import glcomp.onnx as gonnx
from glcomp import optim
from glcomp.errors import GlcompError
from glcomp.nn.module import Module, Parameter
from glcomp.onnx_backend import GlcompBackend, GlcompBackendRep

with warnings.catch_warnings():  # onnx's generators overflow casts on purpose
    warnings.simplefilter("ignore")
    from onnx.backend.test import BackendTest
    from onnx.backend.test.loader import load_model_tests

    MODELS = {case.name: case for case in load_model_tests(kind="node")}

# The ops glcomp does not import (ONNX name, domain-qualified outside the default domain): a model
# holding one is refused, naming the first such node's op.
UNSUPPORTED_OPS: tuple[str, ...] = (
    "Acos",
    "Acosh",
    "AffineGrid",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "Attention",
    "Bernoulli",
    "BitCast",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "BlackmanWindow",
    "CastLike",
    "CausalConvWithState",
    "Ceil",
    "CenterCropPad",
    "Col2Im",
    "Compress",
    "ConvInteger",
    "Cos",
    "Cosh",
    "CumProd",
    "CumSum",
    "DFT",
    "DeformConv",
    "DepthToSpace",
    "DequantizeLinear",
    "Det",
    "DynamicQuantizeLinear",
    "Einsum",
    "EyeLike",
    "Floor",
    "GatherElements",
    "GatherND",
    "Greater",
    "GreaterOrEqual",
    "GridSample",
    "GroupNormalization",
    "HammingWindow",
    "HannWindow",
    "HardSwish",
    "Hardmax",
    "If",
    "ImageDecoder",
    "IsInf",
    "IsNaN",
    "Less",
    "LessOrEqual",
    "LinearAttention",
    "Loop",
    "LpNormalization",
    "LpPool",
    "MatMulInteger",
    "MaxUnpool",
    "MeanVarianceNormalization",
    "MelWeightMatrix",
    "Mish",
    "Mod",
    "NegativeLogLikelihoodLoss",
    "NonMaxSuppression",
    "NonZero",
    "Not",
    "OneHot",
    "OptionalGetElement",
    "OptionalHasElement",
    "Or",
    "QLinearConv",
    "QLinearMatMul",
    "QuantizeLinear",
    "RMSNormalization",
    "RNN",
    "RandomUniformLike",
    "Range",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceProd",
    "ReduceSumSquare",
    "ReverseSequence",
    "RoiAlign",
    "RotaryEmbedding",
    "Round",
    "STFT",
    "Scan",
    "Scatter",
    "ScatterElements",
    "ScatterND",
    "Sin",
    "Sinh",
    "Size",
    "SoftmaxCrossEntropyLoss",
    "SpaceToDepth",
    "SwiGLU",
    "Swish",
    "Tan",
    "TensorScatter",
    "TfIdfVectorizer",
    "ThresholdedRelu",
    "TopK",
    "Trilu",
    "Unique",
    "Xor",
    "ai.onnx.ml.ArrayFeatureExtractor",
    "ai.onnx.ml.Binarizer",
    "ai.onnx.ml.TreeEnsemble",
    "ai.onnx.preview.FlexAttention",
    "ai.onnx.preview.training.Adagrad",
    "ai.onnx.preview.training.Adam",
    "ai.onnx.preview.training.Momentum",
)

# ONNX element types glcomp does not compute (glcomp computes float32; float, integer and boolean
# values convert exactly or are refused): a model with a graph input or output of one is refused.
# "unknown" is a sequence, optional or map value rather than a tensor.
UNSUPPORTED_TYPES: tuple[str, ...] = (
    "BFLOAT16",
    "FLOAT4E2M1",
    "FLOAT8E4M3FN",
    "FLOAT8E4M3FNUZ",
    "FLOAT8E5M2FNUZ",
    "FLOAT8E8M0",
    "INT2",
    "INT4",
    "STRING",
    "UINT2",
    "UINT4",
    "unknown",
)

_AUTO_PAD = r"auto_pad='SAME_UPPER' is not supported; export with explicit pads"  # ConvTranspose's
_NOT_3D = r"only (1-D and )?2-D spatial inputs"
_EMPTY = r"every dimension must be positive"
_RESIZE = r"only mode 'nearest' with coordinate_transformation_mode 'asymmetric'"
PASSING = 486  # cases that pass on the reference runtime
_UNCOMPUTED = r"graph output 'z' is not a tensor computed from the inputs"  # masks, argmax indices


def _names(prefix: str, *suffixes: str) -> list[str]:
    return [prefix + s for s in suffixes]


# Cases of supported ops refused for an attribute, shape or value glcomp does not support, with
# the refusal they must get (a regular expression on the GlcompError's message).
EXPECTED_FAILURES: dict[str, str] = {
    "test_averagepool_2d_dilations": r"dilations \[2, 2\] are not supported for AveragePool",
    "test_convtranspose_autopad_same": _AUTO_PAD,
    **dict.fromkeys(
        [
            "test_averagepool_3d_default",
            *_names(
                "test_averagepool_3d_dilations_",
                "large_count_include_pad_is_0_ceil_mode_is_False",
                "large_count_include_pad_is_0_ceil_mode_is_True",
                "large_count_include_pad_is_1_ceil_mode_is_False",
                "large_count_include_pad_is_1_ceil_mode_is_True",
                "small",
            ),
            "test_maxpool_3d_default",
            *_names("test_maxpool_3d_dilations", "", "_use_ref_impl", "_use_ref_impl_large"),
            "test_convtranspose_3d",
        ],
        _NOT_3D,
    ),
    "test_maxpool_2d_dilations": r"dilations \[2, 2\] are supported only for strides that are multiples",
    "test_convtranspose_output_shape": r"output_shape \[10, 8\] is larger than",
    "test_lstm_with_peepholes": r"peephole weights \(input P\) are not supported",
    # The data sets hold NaN and infinities, which the runtimes refuse as inputs.
    **dict.fromkeys(
        _names(
            "test_cast_",
            "DOUBLE_to_FLOAT",
            "DOUBLE_to_FLOAT16",
            "FLOAT16_to_DOUBLE",
            "FLOAT16_to_FLOAT",
            "FLOAT8E5M2_to_FLOAT",
            "FLOAT8E5M2_to_FLOAT16",
            "FLOAT_to_DOUBLE",
            "FLOAT_to_FLOAT16",
        ),
        r"input 'input' holds NaN or infinite values",
    ),
    **dict.fromkeys(
        _names(
            "test_cast_",
            "FLOAT16_to_FLOAT8E5M2",
            "FLOAT_to_FLOAT8E5M2",
            "no_saturate_FLOAT16_to_FLOAT8E5M2",
            "no_saturate_FLOAT_to_FLOAT8E5M2",
        ),
        r"casting a computed tensor to a non-float type is not supported",
    ),
    # Zero-size tensors (CastLike's expanded form takes an empty `like`; empty reductions, splits).
    **dict.fromkeys(
        [
            *_names(
                "test_castlike_",
                "DOUBLE_to_FLOAT16_expanded",
                "DOUBLE_to_FLOAT_expanded",
                "FLOAT16_to_DOUBLE_expanded",
                "FLOAT16_to_FLOAT8E5M2_expanded",
                "FLOAT16_to_FLOAT_expanded",
                "FLOAT8E5M2_to_FLOAT16_expanded",
                "FLOAT8E5M2_to_FLOAT_expanded",
                "FLOAT_to_DOUBLE_expanded",
                "FLOAT_to_FLOAT16_expanded",
                "FLOAT_to_FLOAT8E5M2_expanded",
                "no_saturate_FLOAT16_to_FLOAT8E5M2_expanded",
                "no_saturate_FLOAT_to_FLOAT8E5M2_expanded",
            ),
            "test_reduce_l1_empty_set_expanded",
            "test_reduce_log_sum_empty_set_expanded",
            "test_reduce_log_sum_exp_empty_set",
            "test_reduce_max_empty_set",
            "test_reduce_max_empty_set_bool",
            "test_reduce_min_empty_set",
            "test_reduce_sum_empty_set",
            "test_reduce_sum_empty_set_non_reduced_axis_zero",
            "test_reduce_sum_square_empty_set_expanded",
            "test_reshape_allowzero_reordered",
            "test_split_zero_size_splits_opset13",
            "test_split_zero_size_splits_opset18",
        ],
        _EMPTY,
    ),
    # Pads computed from the input's shape by CenterCropPad's expansion (shape arithmetic on a
    # computed tensor, not folded at trace time).
    **dict.fromkeys(
        _names(
            "test_center_crop_pad_",
            "crop_and_pad_expanded",
            "crop_axes_chw_expanded",
            "crop_axes_hwc_expanded",
            "crop_expanded",
            "crop_negative_axes_hwc_expanded",
            "pad_expanded",
        ),
        r"pads must be a constant known at compile time",
    ),
    # RotaryEmbedding's expansion splits a computed tensor with an empty part (zero-size).
    **dict.fromkeys(
        _names(
            "test_rotary_embedding_",
            "3d_input_expanded",
            "expanded",
            "interleaved_expanded",
            "no_position_ids_expanded",
            "no_position_ids_interleaved_expanded",
        ),
        r"empty split outputs are not supported",
    ),
    **dict.fromkeys(
        [
            "test_dropout_default_mask",
            "test_dropout_default_mask_ratio",
            "test_training_dropout_zero_ratio_mask",
            "test_maxpool_with_argmax_2d_precomputed_pads",
            "test_maxpool_with_argmax_2d_precomputed_strides",
        ],
        _UNCOMPUTED,
    ),
    **dict.fromkeys(
        _names("test_training_dropout", "", "_default", "_default_mask", "_mask"),
        r"training_mode=True outside a train step",
    ),
    **dict.fromkeys(
        [
            *_names(
                "test_resize_downsample_scales_",
                "cubic",
                "cubic_A_n0p5_exclude_outside",
                "cubic_align_corners",
                "cubic_antialias",
                "linear",
                "linear_align_corners",
                "linear_antialias",
                "linear_half_pixel_symmetric",
                "nearest",
            ),
            *_names(
                "test_resize_downsample_sizes_",
                "cubic",
                "cubic_antialias",
                "linear_antialias",
                "linear_pytorch_half_pixel",
                "nearest",
                "nearest_not_larger",
                "nearest_not_smaller",
            ),
            *_names("test_resize_tf_crop_and_resize", "", "_axes_2_3", "_axes_3_2", "_extrapolation_value"),
            *_names(
                "test_resize_upsample_scales_",
                "cubic",
                "cubic_A_n0p5_exclude_outside",
                "cubic_align_corners",
                "cubic_asymmetric",
                "linear",
                "linear_align_corners",
                "linear_half_pixel_symmetric",
                "nearest",
                "nearest_axes_2_3",
                "nearest_axes_3_2",
            ),
            *_names(
                "test_resize_upsample_sizes_",
                "cubic",
                "nearest",
                "nearest_axes_2_3",
                "nearest_axes_3_2",
                "nearest_ceil_half_pixel",
                "nearest_floor_align_corners",
                "nearest_not_larger",
                "nearest_not_smaller",
                "nearest_round_prefer_ceil_asymmetric",
            ),
        ],
        _RESIZE,
    ),
}

# Passing cases run on GL in the quick profile: one or more per op family; the slow profile runs
# every passing case on GL.
GL_CASES = (
    "test_abs",
    "test_add_bcast",
    "test_div_int32_trunc",
    "test_matmul_3d",
    "test_gemm_all_attributes",
    "test_conv_with_strides_padding",
    "test_convtranspose_pads",
    "test_maxpool_2d_pads",
    "test_maxpool_2d_same_lower",
    "test_averagepool_2d_strides",
    "test_averagepool_2d_ceil",
    "test_maxpool_2d_ceil",
    "test_globalaveragepool",
    "test_batchnorm_epsilon_training_mode",
    "test_layer_normalization_3d_axis1_epsilon",
    "test_instancenorm_example",
    "test_lrn",
    "test_softmax_axis_1",
    "test_logsoftmax_example_1",
    "test_reduce_sum_keepdims_random",
    "test_reduce_max_do_not_keepdims_random",
    "test_transpose_all_permutations_3",
    "test_slice_negative_axes",
    "test_slice_neg_steps",
    "test_shape_start_1_end_negative_1",
    "test_flexattention_expanded_ver26",
    "test_concat_3d_axis_1",
    "test_gather_1",
    "test_reflect_pad",
    "test_tile",
    "test_split_variable_parts_1d_opset18",
    "test_where_example",
    "test_pow_bcast_array",
    "test_lstm_defaults",
    "test_gru_with_initial_bias",
    "test_clip_default_int8_min",
    "test_prelu_broadcast",
)


class GLBackend(GlcompBackend):
    """The backend on GL: ONNX's runner asks for device "CPU"; this runs every case on `ctx`."""

    ctx: Any = None

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> GlcompBackendRep:
        return super().prepare(model, "GL", ctx=cls.ctx, **kwargs)


# Cases whose GL results need a looser tolerance than ONNX's: mish's expansion computes
# x * tanh(log(1 + exp(x))), where llvmpipe's exp and log leave ~1e-6 absolute (1.5e-3 relative
# at x near -8, beyond ONNX's rtol=1e-3 and atol=1e-7) in 25 of its 10,000 elements.
GL_TOLERANCES = {"test_mish_expanded": {"rtol": 1e-3, "atol": 2e-6}}

# ONNX's generated test functions, one per case and device; the CPU ones run here.
# (Kept in a dict: pytest would collect unittest classes bound to module names.)
SUITES = {
    "reference": BackendTest(GlcompBackend, __name__).test_cases["OnnxBackendNodeModelTest"],
    "gl": BackendTest(GLBackend, __name__, test_kwargs=GL_TOLERANCES).test_cases["OnnxBackendNodeModelTest"],
}
CASES = sorted(MODELS)


def _qualified(node: Any) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def _type_name(value: Any) -> str:
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.elem_type:
        return "unknown"
    return onnx.TensorProto.DataType.Name(value.type.tensor_type.elem_type)


def expected_failure(case: str) -> str | None:
    """The refusal `case` must get (a regular expression), or None when it must pass. The
    backend checks graph types first, then the importer the ops, then their attributes."""
    model = MODELS[case].model
    initializers = {t.name for t in model.graph.initializer}
    values = [v for v in model.graph.input if v.name not in initializers] + list(model.graph.output)
    for value in values:
        if _type_name(value) in UNSUPPORTED_TYPES:
            return rf"has ONNX type {_type_name(value)};"
    for node in model.graph.node:
        if _qualified(node) in UNSUPPORTED_OPS:
            return rf"op type '{node.op_type}'"
    return EXPECTED_FAILURES.get(case)


def run_case(case: str, suite: str = "reference") -> None:
    """Run ONNX's generated test function for `case` (prepare, run each data set, compare with
    ONNX's tolerances and dtypes) from `suite`."""
    SUITES[suite].__dict__[f"{case}_cpu"](None)


def check_case(case: str, suite: str = "reference") -> None:
    """`case` passes, or is refused with its expected GlcompError."""
    reason = expected_failure(case)
    if reason is None:
        run_case(case, suite)
    else:
        with pytest.raises(GlcompError, match=reason):
            run_case(case, suite)


def test_the_lists_stay_true() -> None:
    assert len(MODELS) == 1884  # onnx 1.23's node cases; a new onnx release must revisit the lists
    for name in (*EXPECTED_FAILURES, *GL_CASES):
        assert name in MODELS, name
    assert not set(UNSUPPORTED_OPS) & set(gonnx.SUPPORTED_OPS)
    deciding = set()
    for case in CASES:
        reason = expected_failure(case)
        if reason is not None and reason.startswith("op type"):
            model = MODELS[case].model
            deciding.add(next(_qualified(n) for n in model.graph.node if _qualified(n) in UNSUPPORTED_OPS))
    assert deciding == set(UNSUPPORTED_OPS)  # every listed op is the reason of some case
    assert all(expected_failure(c) is None for c in GL_CASES)
    expected = [c for c in CASES if expected_failure(c) is not None]
    assert len(CASES) - len(expected) == PASSING


@pytest.mark.parametrize("case", CASES)
def test_node_case_on_reference(case: str) -> None:
    check_case(case)


@pytest.mark.parametrize("case", GL_CASES)
def test_node_case_on_gl(case: str, gl_ctx: Any) -> None:
    GLBackend.ctx = gl_ctx
    run_case(case, "gl")


@pytest.mark.slow_only
@pytest.mark.parametrize("case", [c for c in CASES if expected_failure(c) is None and c not in GL_CASES])
def test_every_passing_node_case_on_gl(case: str, gl_ctx: Any) -> None:
    GLBackend.ctx = gl_ctx
    run_case(case, "gl")


# -- the ai.onnx.preview.training optimizer cases against glcomp's optimizers -----------------------
class _Linear(Module):
    """Parameters p0, p1, ... of the given shapes; forward(g) = sum_i <p_i, g_i> for g the
    concatenated flat gradients, so the gradient of each p_i is exactly its slice of g."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        super().__init__()
        self.shapes = shapes
        for i, shape in enumerate(shapes):
            setattr(self, f"p{i}", Parameter(np.zeros(shape, np.float32)))

    def forward(self, g: Any) -> Any:
        total, offset = None, 0
        for i, shape in enumerate(self.shapes):
            size = int(np.prod(shape))
            term = (getattr(self, f"p{i}").reshape(-1) * g[offset : offset + size]).sum()
            total, offset = term if total is None else total + term, offset + size
        return total


def _attrs(node: Any) -> dict[str, Any]:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _glcomp_optimizer(node: Any, lr: float) -> tuple[optim.Optimizer, tuple[str, ...], dict[str, float]]:
    """glcomp's counterpart of an ONNX optimizer node at T = 0 (ONNX's first step: no bias
    correction, momentum coefficient 1): the optimizer, its slots in ONNX's state order, and the
    scalar state that makes glcomp's next step that first step."""
    a = _attrs(node)
    if node.op_type == "Adagrad":
        opt = optim.Adagrad(
            lr=lr, lr_decay=a.get("decay_factor", 0.0), weight_decay=a.get("norm_coefficient", 0.0),
            eps=a.get("epsilon", 0.0),
        )  # fmt: skip
        return opt, ("sum",), {"opt.step": 0.0}
    if node.op_type == "Momentum":
        nesterov = a["mode"] == b"nesterov"
        opt = optim.SGD(lr=lr, momentum=a["alpha"], weight_decay=a["norm_coefficient"], nesterov=nesterov)
        return opt, ("momentum_buffer",), {}
    assert a.get("norm_coefficient_post", 0.0) == 0.0  # glcomp's Adam has no post-update decay
    opt = optim.Adam(
        lr=lr, betas=(a.get("alpha", 0.9), a.get("beta", 0.999)), eps=a.get("epsilon", 0.0),
        weight_decay=a.get("norm_coefficient", 0.0),
    )  # fmt: skip
    # Bias corrections already at 1 (ONNX's T = 0 applies none): c = 1 - beta**t = 1, beta**t = 0.
    done = {"opt.bias_correction1": 1.0, "opt.bias_correction2": 1.0, "opt.beta1_power": 0.0}
    return opt, ("exp_avg", "exp_avg_sq"), done | {"opt.beta2_power": 0.0}


OPTIMIZER_CASES = (
    "test_adagrad",
    "test_adagrad_multiple",
    "test_momentum",
    "test_momentum_multiple",
    "test_nesterov_momentum",
    "test_adam",
    "test_adam_multiple",
)


@pytest.mark.parametrize("case", OPTIMIZER_CASES)
def test_optimizer_case_matches_glcomp_optimizer(case: str) -> None:
    """One train_step of glcomp's Adagrad / SGD momentum / Adam from the case's X, G and state
    gives ONNX's X_new and state outputs (the importer refuses these nodes: see the module
    docstring)."""
    test = MODELS[case]
    node = test.model.graph.node[0]
    assert _qualified(node) in UNSUPPORTED_OPS
    (inputs, expected), *_ = test.data_sets
    r, t, *rest = (np.asarray(v) for v in inputs)
    assert int(t) == 0  # every optimizer case is a first step
    opt, slots, scalars = _glcomp_optimizer(node, float(r))
    n = len(rest) // (2 + len(slots))
    xs, gs, states = rest[:n], rest[n : 2 * n], rest[2 * n :]
    model = _Linear([x.shape for x in xs])
    program = glcomp.compile(
        model,
        {"g": (sum(x.size for x in xs),)},
        loss=lambda out, y: out + (y * 0.0).sum(),
        optimizer=opt,
        target_spec=(1,),
    )
    rt = program.runtime("reference")
    opt_state = rt.optimizer_state() | scalars
    for j, slot in enumerate(slots):
        for i in range(n):
            opt_state[f"opt.p{i}.{slot}"] = states[j * n + i]
    rt.load_state_dict({f"p{i}": x for i, x in enumerate(xs)}, optimizer=opt_state)
    rt.train_step(g=np.concatenate([g.reshape(-1) for g in gs]), y=np.zeros(1, np.float32))
    got_state = rt.optimizer_state()
    got = [rt.state_dict()[f"p{i}"] for i in range(n)]
    got += [got_state[f"opt.p{i}.{slot}"] for slot in slots for i in range(n)]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7, err_msg=case)


# -- the backend's own interface -------------------------------------------------------------------
def _add_model(shape: tuple[int | None, ...] = (2, 3)) -> Any:
    from onnx import TensorProto, helper

    node = helper.make_node("Add", ["a", "b"], ["c"])
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "ab"]
    output = helper.make_tensor_value_info("c", TensorProto.FLOAT, shape)
    return helper.make_model(helper.make_graph([node], "add", inputs, [output]))


def test_backend_runs_lists_dicts_nodes_and_symbolic_shapes() -> None:
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    rep = GlcompBackend.prepare(_add_model(), "CPU")
    np.testing.assert_array_equal(rep.run([a, b])[0], a + b)
    np.testing.assert_array_equal(rep.run({"b": b, "a": a})["c"], a + b)
    node = onnx.helper.make_node("Mul", ["x", "y"], ["z"])
    np.testing.assert_array_equal(GlcompBackend.run_node(node, [a, a])[0], a * a)
    # A symbolic batch dimension compiles one program per batch size seen.
    rep = GlcompBackend.prepare(_add_model((None, 3)))
    for n in (1, 4):
        x = np.full((n, 3), 2.0, np.float32)
        np.testing.assert_array_equal(rep.run([x, x])[0], 2 * x)
    assert len(rep._programs) == 2
    assert GlcompBackend.supports_device("GL") and not GlcompBackend.supports_device("CUDA")


def test_backend_refuses_bad_arguments_naming_them() -> None:
    a = np.ones((2, 3), np.float32)
    with pytest.raises(GlcompError, match=r"device 'CUDA' is not one of \['CPU', 'GL'\]"):
        GlcompBackend.prepare(_add_model(), "CUDA")
    with pytest.raises(GlcompError, match=r"runtime 'webgpu' is not one of"):
        GlcompBackend.prepare(_add_model(), runtime="webgpu")
    with pytest.raises(GlcompError, match=r"prepare takes an onnx.ModelProto, not str"):
        GlcompBackend.prepare("model.onnx")
    rep = GlcompBackend.prepare(_add_model())
    with pytest.raises(GlcompError, match=r"inputs \['b'\] are missing"):
        rep.run([a])
    with pytest.raises(GlcompError, match=r"unknown inputs \['z'\]"):
        rep.run({"a": a, "b": a, "z": a})
    with pytest.raises(
        GlcompError, match=r"input 'a' has shape \(3, 3\) but the ONNX model declares \(2, 3\)"
    ):
        rep.run([np.ones((3, 3), np.float32), np.ones((3, 3), np.float32)])
    big = np.full((2, 3), 2**25, np.int64)
    with pytest.raises(GlcompError, match=r"integer input 'a' holds values beyond 2\*\*24"):
        rep.run([big, big])
