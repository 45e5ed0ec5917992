"""Issue 44, item 4: a report's tables render values from the runs (group values from tags or params, metric names)
as text. A `|` cannot add a column, a newline cannot end a row, HTML and link syntax do not pass into table.md (nor
rich markup into the terminal's tables), and the same values round-trip exactly through the CSV files."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from battery import rlvrlab
from markdown_it import MarkdownIt

from rlvrlab.report.escape import code, md

HOSTILE = [
    "a|b",
    "<script>alert(1)</script>",
    "[click](javascript:alert(1))",
    "<javascript:alert(1)>",
    "![img](http://x/y.png)",
    "`c|d`",
    "e\\|f",
    "&lt;b&gt;&#60;",
    "line1\nline2",
    "[/]rich [bold]markup",
]
SEEDS = [1, 2, 3]


def render(text: str) -> str:
    """table.md as a renderer that passes raw HTML (CommonMark with GFM tables) shows it."""
    return MarkdownIt("commonmark", {"html": True}).enable("table").render(text)


def rendered_text(html: str) -> str:
    """The text of a rendered fragment: tags removed, entities decoded."""
    import html as html_module

    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_value_renders_as_itself_in_one_table_cell(value: str) -> None:
    table = f"| group | x |\n|---|---|\n| {md(value)} | 1 |\n"
    html = render(table)
    cells = re.findall(r"<td>(.*?)</td>", html, flags=re.S)
    assert len(cells) == 2, html  # no column added, the row not ended
    assert rendered_text(cells[0]) == " ".join(value.splitlines())
    assert "<script" not in html and "<a " not in html and "<img" not in html and "<code" not in html


@pytest.mark.parametrize("value", ["plain", "a`b", "``x``", "`lead", "trail`", "p<0.1 | q"], ids=repr)
def test_a_code_span_holds_any_text(value: str) -> None:
    html = render(f"### Event {code(value)}\n")
    assert re.findall(r"<code>(.*?)</code>", html) and rendered_text(html).strip() == f"Event {value}"


def test_ordinary_text_is_unchanged() -> None:
    """What reports held before stays byte for byte: labels, p < 0.05, a seeds list, a metric name."""
    for text in ("ucpo_tau=0.2", "p < 0.05 with at least 5 seeds", "0,1,2 (3)", "loss/grad_norm:max:60", "a & b"):
        assert md(text) == text


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    """An experiment `hostile` whose runs' `arm` tag holds the hostile values (three seeds each), and a baseline."""
    import mlflow

    folder = tmp_path_factory.mktemp("hostile_tables")
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        experiment = mlflow.create_experiment("hostile", artifact_location=str(folder / "artifacts"))
        for index, arm in enumerate(["baseline", *HOSTILE]):
            for seed in SEEDS:
                with mlflow.start_run(experiment_id=experiment):
                    mlflow.log_param("seed", seed)
                    mlflow.set_tag("arm", arm)
                    mlflow.set_tag("mlflow.source.git.commit", "0" * 40)
                    for step in range(4):
                        mlflow.log_metric("reward", 0.1 * index + 0.01 * seed + 0.001 * step, step=step)
    finally:
        mlflow.set_tracking_uri(previous)
    return uri


def test_a_report_over_hostile_group_values(store: str, tmp_path: Path) -> None:
    """`rlvrlab report --group-by arm` over them: every row of table.md has the header's cells, each group's label
    renders as itself, no HTML, link or image passes, the terminal's tables show the labels (rich markup in them is
    text), and table.csv and per_seed.csv give back every value exactly."""
    out = tmp_path / "report"
    result = rlvrlab("report", "--experiment", "hostile", "--group-by", "arm", "--seed-key", "seed",
                     "--tracking-uri", store, "--metric", "reward:mean:2", "--baseline", "arm=baseline", "--no-eval",
                     "--format", "md,csv", "--out", str(out), env={"COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "arm=[/]rich [bold]markup" in result.stdout  # the terminal's table: rich markup in a label is text
    html = render((out / "table.md").read_text())
    assert "<script" not in html and "<a " not in html and "<img" not in html
    for table in re.findall(r"<table>(.*?)</table>", html, flags=re.S):
        header = len(re.findall(r"<th[ >]", table))
        for row in re.findall(r"<tbody>(.*?)</tbody>", table, flags=re.S)[0].split("</tr>")[:-1]:
            assert len(re.findall(r"<td[ >]", row)) == header, row
    first_cells = {rendered_text(c) for c in re.findall(r"<tr>\s*<td>(.*?)</td>", html, flags=re.S)}
    assert {"arm=" + " ".join(v.splitlines()) for v in HOSTILE} <= first_cells  # each label as itself
    with (out / "table.csv").open(newline="") as f:
        assert {row["group"] for row in csv.DictReader(f)} == {f"arm={v}" for v in ["baseline", *HOSTILE]}
    with (out / "per_seed.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["group"] for row in rows} == {f"arm={v}" for v in ["baseline", *HOSTILE]}
    assert {int(row["seed"]) for row in rows} == set(SEEDS)
