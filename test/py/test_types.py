"""The fusion dialect's attributes and tensor type: construction, queries, verifiers, text."""

import itertools
import re

import pytest
from xdsl.dialects.builtin import ArrayAttr, IndexType, IntAttr, IntegerType, bf16, f32, f64, i1
from xdsl.parser import Parser
from xdsl.utils.exceptions import ParseError, VerifyException

from hostir_dialect import hostir_context
from hostir_dialect.builder import ELEMENT_TYPES
from hostir_dialect.fusion import (
    DIDX,
    DYNAMIC,
    SERIAL,
    SINGLE_DEVICE,
    STREAM,
    SUPPORTED_ELEMENT_TYPES,
    DeviceMeshAttr,
    ParallelType,
    ParallelTypeAttr,
    TensorType,
    element_type_name,
)
from hostir_dialect.text import HostirError, parse_module


def parse_attribute(text: str):
    return Parser(hostir_context(), text).parse_attribute()


# --------------------------------------------------------------------------- #
# DeviceMeshAttr                                                               #
# --------------------------------------------------------------------------- #


def test_mesh_from_a_list_or_an_array_attr():
    mesh = DeviceMeshAttr([3, 1, 2])
    assert mesh.ids == (3, 1, 2)
    assert mesh.size == 3
    assert DeviceMeshAttr(ArrayAttr([IntAttr(3), IntAttr(1), IntAttr(2)])) == mesh
    assert SINGLE_DEVICE.ids == (0,)


@pytest.mark.parametrize(
    "devices, message",
    [
        ([], "at least one device"),
        ([0, -1], "non-negative"),
        ([0, 2, 2, 1, 1], "lists device(s) [1, 2] more than once"),
        ([0, 2**31], f"device id {2**31} is too large: a device id is a torch.distributed rank"),
        ([2**40], "(at most 2147483647)"),
    ],
)
def test_mesh_verifier(devices, message):
    with pytest.raises(VerifyException, match=re.escape(message)):
        DeviceMeshAttr(devices)


@pytest.mark.parametrize("devices", [[0], [0, 1, 2, 3, 4, 5, 6, 7], [5, 2]])
def test_mesh_text(devices):
    text = f"#fusion.mesh<{devices}>"
    mesh = parse_attribute(text)
    assert mesh == DeviceMeshAttr(devices)
    assert str(mesh) == text


def test_mesh_parse_error_points_at_the_list():
    with pytest.raises(ParseError, match="more than once") as error:
        parse_attribute("#fusion.mesh<[1, 1]>")
    assert error.value.span.text == "[1, 1]"


# --------------------------------------------------------------------------- #
# ParallelTypeAttr                                                             #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "constant, kind",
    [(SERIAL, ParallelType.SERIAL), (DIDX, ParallelType.DIDX), (STREAM, ParallelType.STREAM)],
)
def test_parallel_type_text(constant, kind):
    text = f"#fusion<parallel_type {kind.value}>"
    assert constant == ParallelTypeAttr(kind)
    assert parse_attribute(text) == constant
    assert str(constant) == text


def test_unknown_parallel_type_does_not_parse():
    with pytest.raises(ParseError):
        parse_attribute("#fusion<parallel_type didy>")


# --------------------------------------------------------------------------- #
# TensorType: construction and queries                                         #
# --------------------------------------------------------------------------- #


def test_tensor_defaults_are_one_device_and_serial_axes():
    t = TensorType([DYNAMIC, 4], f32)
    assert t.mesh == SINGLE_DEVICE
    assert t.parallel_types() == (ParallelType.SERIAL,) * 2
    assert t.didx_axis is None and t.stream_axis is None and not t.is_sharded


def test_tensor_axes_by_attribute_enum_or_name():
    by_attr = TensorType([8, 2, 3], f32, [0, 1], [STREAM, DIDX, SERIAL])
    assert (
        TensorType(
            [8, 2, 3], f32, [0, 1], [ParallelType.STREAM, ParallelType.DIDX, ParallelType.SERIAL]
        )
        == by_attr
    )
    assert (
        TensorType([8, 2, 3], f32, DeviceMeshAttr([0, 1]), ["stream", "didx", "serial"]) == by_attr
    )


def test_tensor_queries():
    t = TensorType([DYNAMIC, 4, 7, 5], bf16, range(4), ["stream", "didx", "serial", "serial"])
    assert t.get_shape() == (DYNAMIC, 4, 7, 5)
    assert t.rank == 4
    assert t.element_type == bf16
    assert t.mesh.ids == (0, 1, 2, 3)
    assert t.parallel_types() == (
        ParallelType.STREAM,
        ParallelType.DIDX,
        ParallelType.SERIAL,
        ParallelType.SERIAL,
    )
    assert t.axes_of(ParallelType.SERIAL) == (2, 3)
    assert t.didx_axis == 1
    assert t.stream_axis == 0
    assert t.is_sharded
    assert t.local_shape() == (DYNAMIC, 1, 7, 5)
    assert t.sharding_str() == "mesh = [0, 1, 2, 3], axes = [stream, didx, _, _]"


def test_local_shape_of_a_dynamic_didx_axis_is_one():
    assert TensorType([DYNAMIC, 3], f32, range(6), ["didx", "serial"]).local_shape() == (1, 3)


def test_with_replaces_only_what_it_is_given():
    t = TensorType([DYNAMIC, 4], f32, range(4), ["stream", "didx"])
    assert t.with_(element_type=bf16) == TensorType(
        [DYNAMIC, 4], bf16, range(4), ["stream", "didx"]
    )
    assert t.with_(shape=[3, 4]) == TensorType([3, 4], f32, range(4), ["stream", "didx"])
    assert t.with_(axes=["serial", "serial"]) == TensorType([DYNAMIC, 4], f32, range(4))
    assert t.with_(mesh=[4, 5, 6, 7]) == TensorType(
        [DYNAMIC, 4], f32, [4, 5, 6, 7], ["stream", "didx"]
    )


def test_with_a_new_rank_resets_the_axes_to_serial():
    t = TensorType([DYNAMIC, 4], f32, range(4), ["stream", "didx"])
    assert t.with_(shape=[2, 3, 5]) == TensorType([2, 3, 5], f32, range(4))


@pytest.mark.parametrize(
    "axis, expected", [(0, ([4, 5], ["didx", "serial"])), (1, ([DYNAMIC, 5], ["stream", "serial"]))]
)
def test_without_axis_drops_the_axis_and_its_parallel_type(axis, expected):
    t = TensorType([DYNAMIC, 4, 5], f64, range(4), ["stream", "didx", "serial"])
    shape, axes = expected
    assert t.without_axis(axis) == TensorType(shape, f64, range(4), axes)


# --------------------------------------------------------------------------- #
# TensorType: verifier                                                         #
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: TensorType([4, 4], f32, [0], ["serial"]), "rank 2 has 1 parallel types"),
        (lambda: TensorType([4, -3], f32), "axis 1 has negative extent -3"),
        (
            lambda: TensorType([4, 2**63], f32),
            re.escape(f"axis 1 has extent {2**63}, too large: an extent must fit in a signed"),
        ),
        (lambda: TensorType([4], IntegerType(16)), "element type i16 is not supported"),
        (lambda: TensorType([4], IndexType()), "element type index is not supported"),
        (lambda: TensorType([2, 2], f32, [0, 1], ["didx", "didx"]), r"axes \[0, 1\] are both didx"),
        (
            lambda: TensorType([2, 2, 2], f32, [0, 1], ["stream", "serial", "stream"]),
            r"axes \[0, 2\] are both stream",
        ),
        (
            lambda: TensorType([3, 4], f32, range(4), ["didx", "serial"]),
            "didx axis 0 has extent 3 but the mesh has 4",
        ),
    ],
)
def test_tensor_verifier(build, message):
    with pytest.raises(VerifyException, match=message):
        build()


def test_the_largest_int64_is_a_valid_extent_and_the_largest_int32_a_valid_device_id():
    largest = 2**63 - 1
    type = TensorType([largest, DYNAMIC], f32, [2**31 - 1])
    assert type.get_shape() == (largest, DYNAMIC)
    assert type.mesh.ids == (2**31 - 1,)


@pytest.mark.parametrize("extent", [DYNAMIC, 4])
def test_didx_extent_is_the_mesh_size_or_dynamic(extent):
    assert TensorType([extent], f32, range(4), ["didx"]).didx_axis == 0


def test_every_supported_element_type_is_accepted():
    assert set(SUPPORTED_ELEMENT_TYPES) == set(ELEMENT_TYPES)
    for name, element_type in ELEMENT_TYPES.items():
        assert element_type_name(TensorType([2], element_type).element_type) == name


def test_a_bad_type_in_a_module_is_a_located_error():
    text = (
        "func.func @f(%a: !fusion.tensor<[3], f32, mesh = [0, 1], axes = [didx]>) {\n"
        "  func.return\n"
        "}\n"
    )
    with pytest.raises(HostirError, match="didx axis 0 has extent 3 but the mesh has 2") as error:
        parse_module(text, "bad.mlir")
    assert (error.value.location.file, error.value.location.line, error.value.location.column) == (
        "bad.mlir",
        1,
        32,
    )
    assert str(error.value).startswith("bad.mlir:1:32: error:")


@pytest.mark.parametrize(
    "text, message",
    [
        ("!fusion.tensor<[4], f32, axes = [didy]>", "unknown parallel type 'didy'"),
        ("!fusion.tensor<[4], f32, devices = [0]>", "mesh"),
        ("!fusion.tensor<[-4], f32>", "'\\?' as an extent"),
        ("!fusion.tensor<[4], f32, axes = [_, _]>", "rank 1 has 2 parallel types"),
    ],
)
def test_tensor_parse_errors(text, message):
    with pytest.raises(ParseError, match=message):
        parse_attribute(text)


# --------------------------------------------------------------------------- #
# TensorType: text                                                             #
# --------------------------------------------------------------------------- #

SHAPES = ([], [4], [DYNAMIC, 2], [2, DYNAMIC, 8])
MESHES = ([0], [1], [0, 1], [7, 3])
AXES = ("serial", "didx", "stream")


def tensor_types():
    """Every valid combination of the parameters above (an invalid one fails to build)."""
    for shape, name, mesh in itertools.product(SHAPES, ELEMENT_TYPES, MESHES):
        for axes in itertools.product(AXES, repeat=len(shape)):
            try:
                yield TensorType(shape, ELEMENT_TYPES[name], mesh, axes)
            except VerifyException:
                continue


def expected_text(t: TensorType) -> str:
    """The text of `t`, written independently of the printer: defaults are left out."""
    extents = ", ".join("?" if d == DYNAMIC else str(d) for d in t.get_shape())
    text = f"!fusion.tensor<[{extents}], {element_type_name(t.element_type)}"
    if t.mesh.ids != (0,):
        text += f", mesh = {list(t.mesh.ids)}"
    if set(t.parallel_types()) - {ParallelType.SERIAL}:
        text += (
            ", axes = ["
            + ", ".join("_" if p == ParallelType.SERIAL else p.value for p in t.parallel_types())
            + "]"
        )
    return text + ">"


def test_tensor_text_of_every_parameter_combination():
    types = list(tensor_types())
    assert len(types) > 300  # every shape, element type, mesh, and parallel types that fit
    for t in types:
        text = expected_text(t)
        assert str(t) == text
        assert parse_attribute(text) == t


def test_default_mesh_and_axes_written_out_parse_to_the_defaults():
    assert parse_attribute("!fusion.tensor<[?, 4], i1, mesh = [0], axes = [_, _]>") == TensorType(
        [DYNAMIC, 4], i1
    )
    assert parse_attribute("!fusion.tensor<[4], f32, axes = [stream]>") == TensorType(
        [4], f32, [0], ["stream"]
    )
    assert parse_attribute("!fusion.tensor<[4], f32, mesh = [2, 3]>") == TensorType(
        [4], f32, [2, 3]
    )
