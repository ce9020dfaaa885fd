"""hostir.config (the settings, their variables and defaults) and hostir.logs (what hostir says)."""

from __future__ import annotations

import logging

import pytest
import torch

import hostir.config as config
from hostir import logs
from hostir_dialect.builder import FusionBuilder
from hostir_dialect.text import HostirError
from hostir.runtime.codegen import kernels
from hostir.runtime.launch import run_on_local_ranks


def test_each_setting_reads_its_variable_when_read(monkeypatch):
    for name in ("HOSTIR_DUMP", "HOSTIR_NUM_STREAMS", "HOSTIR_TIMEOUT_S", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert (config.dump, config.num_streams, config.timeout_s, config.local_world_size) == (frozenset(), 4, 120.0, None)
    monkeypatch.setenv("HOSTIR_DUMP", " fusion, host_ir,,")
    monkeypatch.setenv("HOSTIR_NUM_STREAMS", "7")
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", "1e12")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert config.dump == {"fusion", "host_ir"}
    assert (config.num_streams, config.timeout_s, config.local_world_size) == (7, 1e9, 2)


@pytest.mark.parametrize(
    ("variable", "text", "message"),
    [
        ("HOSTIR_DUMP", "fusion,kernels", r"HOSTIR_DUMP: names \['kernels'\]; it takes a comma-separated list of explain, "),
        ("HOSTIR_NUM_STREAMS", "0", r"HOSTIR_NUM_STREAMS: expected a whole number, at least 1, got '0'"),
        ("HOSTIR_TIMEOUT_S", "inf", r"HOSTIR_TIMEOUT_S: expected a finite number of seconds, at least 1, got 'inf'"),
        ("RANK", "-1", r"RANK: expected a whole number, as torchrun sets it, got '-1'"),
    ],
)
def test_a_variable_without_a_valid_value_is_an_error_naming_it(monkeypatch, variable, text, message):
    monkeypatch.setenv(variable, text)
    with pytest.raises(HostirError, match=message):
        config.check()


def test_patch_and_assignment_override_the_variable_and_are_checked(monkeypatch):
    monkeypatch.setenv("HOSTIR_NUM_STREAMS", "3")
    with config.patch(num_streams=2, dump={"explain"}):
        assert (config.num_streams, config.dump) == (2, {"explain"})
        with config.patch(num_streams=5):
            assert config.num_streams == 5
        assert config.num_streams == 2
    assert (config.num_streams, config.dump) == (3, frozenset())
    config.num_streams = 6
    try:
        assert config.num_streams == 6
        with config.patch(num_streams=1):
            assert config.num_streams == 1
        assert config.num_streams == 6
    finally:
        del config.num_streams
    assert config.num_streams == 3
    with pytest.raises(HostirError, match="HOSTIR_NUM_STREAMS: expected a whole number, at least 1, got '0'"):
        config.num_streams = 0
    with pytest.raises(HostirError, match=r"HOSTIR_DUMP: names \['host'\]"):
        with config.patch(dump={"host"}):
            pass
    with pytest.raises(AttributeError, match="has no setting 'streams'; its settings are dump, num_streams"):
        config.patch(streams=2).__enter__()
    with pytest.raises(AttributeError, match="torchrun's RANK, which torch.distributed reads"):
        config.rank = 3


@config.patch(timeout_s=33.0)
def test_a_patch_decorates_a_function():
    assert config.timeout_s == 33.0


def _settings_of_a_rank() -> tuple[int, float, frozenset[str]]:
    return config.num_streams, config.timeout_s, config.dump


def test_the_ranks_of_a_launch_take_the_launchers_settings(monkeypatch):
    """What the launcher patched reaches its ranks, which start from a server that imported
    hostir before the launch: a setting is read when it is read."""
    monkeypatch.setenv("HOSTIR_TIMEOUT_S", "45")
    with config.patch(num_streams=2, dump={"fusion", "pipelining"}):
        ranks = run_on_local_ranks(_settings_of_a_rank, 2, join_group=False, timeout_s=120)
    assert ranks == [(2, 45.0, frozenset({"fusion", "pipelining"}))] * 2


def test_a_kind_is_said_once_where_it_is_wanted(monkeypatch, capsys, caplog):
    """HOSTIR_DUMP prints a kind on stderr; a logger that is on (TORCH_LOGS) logs it instead,
    once; a recorder keeps it; nothing shows a kind nobody asked for."""
    monkeypatch.delenv("HOSTIR_DUMP", raising=False)
    assert not logs.wanted("fusion")
    logs.say("fusion", "unseen")
    assert capsys.readouterr().err == "" and not caplog.records
    with config.patch(dump={"fusion"}):
        assert logs.wanted("fusion") and not logs.wanted("host_ir")
        logs.say("fusion", "printed")
        assert capsys.readouterr().err == "printed\n"
        with caplog.at_level(logging.DEBUG, logger="hostir"):
            logs.say("fusion", "logged")
        assert capsys.readouterr().err == ""
        assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == [("hostir.fusion", logging.DEBUG, "logged")]
        with logs.recorded("fusion") as kept:
            logs.say("fusion", "kept")
        assert kept == ["kept"] and capsys.readouterr().err == ""
    with caplog.at_level(logging.INFO, logger="hostir"):
        assert logs.wanted("pipelining") and logs.wanted("explain") and not logs.wanted("host_ir")
    assert set(logs.LEVELS) == set(config.DUMP_KINDS)


class _CompilingCupy:
    """CuPy's RawKernel as far as KernelCache uses it, compiling nothing: the dump is made
    before the compilation, which needs a GPU."""

    class RawKernel:
        def __init__(self, source: str, name: str):
            self.source = source

        def compile(self) -> None:
            pass


def test_cuda_kernel_dumps_each_kernel_when_it_is_compiled(monkeypatch, capsys):
    fb = FusionBuilder("scaled")
    fb.output(fb.input([None], "f32") * 0.0712890625)
    segment = next(op for op in fb.build().walk() if getattr(op, "sym_name", None) is not None)
    source = kernels.generated_source(segment, [torch.ones(8)], [torch.empty(8)])
    monkeypatch.setattr(kernels, "cupy", _CompilingCupy)
    cache = kernels.KernelCache()
    with config.patch(dump={"cuda_kernel"}):
        cache.kernel(source, "scaled")
        printed = capsys.readouterr().err
        assert printed.startswith("// hostir: the CUDA kernel of segment @scaled\n")
        assert "0.0712890625f" in printed and printed.endswith(source + "\n")
        cache.kernel(source, "scaled")
        assert capsys.readouterr().err == "", "a cached kernel is not compiled, so not printed, again"
    cache.kernel(source.replace("0.0712890625f", "0.5f"), "scaled")
    assert capsys.readouterr().err == ""


def test_the_documented_settings_are_the_settings():
    """docs/frontend.md's table of settings names each setting with its variable, and each
    kind of HOSTIR_DUMP and its logger."""
    from pathlib import Path

    document = (Path(__file__).resolve().parents[2] / "docs" / "frontend.md").read_text()
    table = document.split("### Settings: `hostir.config`", 1)[1].split("\n\n")[2]
    rows = [row for row in table.splitlines() if row.startswith("| `")]
    documented = {name.strip("` ") for row in rows for name in row.split("|")[1].split(",")}
    assert documented == set(config.SETTINGS)
    for name, setting in config.SETTINGS.items():
        row = next(row for row in rows if f"`{name}`" in row)
        assert f"`{setting.variable}`" in row or not setting.patchable, row
    kinds = document.split("## Seeing what hostir did", 1)[1].split("\n\n")[2]
    for kind, level in logs.LEVELS.items():
        assert f"| `hostir.{kind}` | {logging.getLevelName(level)} |" in kinds and f"| `{kind}` |" in kinds, kind
