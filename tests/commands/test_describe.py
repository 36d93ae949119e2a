"""`vapo-lab components --markdown`: the registry's table, and the copy docs/training.md carries."""

from pathlib import Path

from typer.testing import CliRunner

from vapo_lab.cli import app
from vapo_lab.commands.describe import components_markdown
from vapo_lab.registry.components import COMPONENTS, settings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "training.md"


def test_the_table_has_a_row_per_key_of_every_component():
    rows = components_markdown().splitlines()[2:]
    assert len(rows) == sum(len(settings(c)) for c in COMPONENTS)
    assert [r.split(" | ")[0].strip("| ") for r in rows] == [
        c.name for c in COMPONENTS for _ in settings(c)
    ]
    # clip_higher's off value is the interpolation its off.yaml states, shown as such
    (clip,) = [r for r in rows if r.startswith("| clip_higher |")]
    assert "`loss.eps_high` | `0.28` | `= loss.eps_low`" in clip


def test_the_command_prints_it_unwrapped():
    result = CliRunner().invoke(app, ["components", "--markdown"], env={"COLUMNS": "60"})
    assert result.exit_code == 0 and result.output.strip() == components_markdown()


def test_the_docs_carry_the_registrys_table():
    assert components_markdown() in DOCS.read_text()
