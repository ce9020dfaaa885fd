"""The overlap benchmark's PNG (benchmarks/overlap_report.py): a style per contender, no two
alike and the same in every panel, and a legend clear of the axes and their labels."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from overlap_report import LIMIT, Report, Result, series_styles  # noqa: E402  (a script's folder)

AG_GEMM = [
    "GEMM alone", "allgather alone", LIMIT, "AG then GEMM", "symm_mem fused",
    *(
        f"{contender} S={chunks}"
        for chunks in (4, 8)
        for contender in ("NCCL per chunk", "hostir (nccl)", "hostir (cuda)", "hostir (cuda, pool streams)")
    ),
    "hostir (cuda, symmetric X) S=4", "hostir (cuda, symmetric X) S=8",
    "hostir p2p (nccl) S=2", "hostir p2p (cuda) S=2", "hostir p2p (cuda, symmetric X) S=2",
]  # fmt: skip
"""The 20 series of the AG+GEMM panel of a run on 2 GPUs."""


def report_of(tmp_path: Path) -> Report:
    report = Report(tmp_path, {"ranks": 2, "backend": "nccl"}, {})
    for problem, labels in (("allgather_matmul", AG_GEMM), ("matmul_allreduce", AG_GEMM[:8])):
        for m in (8192, 16384, 32768):
            for index, label in enumerate(labels):
                contender, _, chunks = label.partition(" S=")
                report.results.append(
                    Result(problem, m, 8192, 3584, contender, ms=m / 8192 + index / 10, chunks=int(chunks) if chunks else None)
                )
    return report


def test_no_two_series_look_alike_and_the_limit_is_dashed():
    styles = series_styles(AG_GEMM)
    assert list(styles) == AG_GEMM
    assert len({(s["color"], s["marker"], s["linestyle"]) for s in styles.values()}) == len(AG_GEMM)
    assert len({(s["color"], s["marker"]) for s in styles.values()}) == len(AG_GEMM)
    assert styles[LIMIT] == dict(color="black", linestyle="--", marker="")


def test_each_contender_has_one_style_in_every_panel_and_the_legend_clears_the_axes(tmp_path: Path):
    report = report_of(tmp_path)
    figure = report.plot()
    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == AG_GEMM
    legend_box = legend.get_window_extent(renderer)
    styles = series_styles(AG_GEMM)
    for axis in figure.axes:
        assert not legend_box.overlaps(axis.get_tightbbox(renderer)), "the legend covers a panel or its labels"
        for line in axis.get_lines():
            style = styles[line.get_label()]
            assert (line.get_color(), line.get_marker(), line.get_linestyle()) == (
                style["color"], style["marker"], style["linestyle"],
            )  # fmt: skip
    assert Path(report.write_plot()).read_bytes().startswith(b"\x89PNG")
