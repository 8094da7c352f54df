"""`spectrakit report`: README/docs tables regenerated from one results.json."""

from __future__ import annotations

from spectrakit.cli import main
from spectrakit.experiments.io import report


def test_report_updates_marked_block(tmp_path, capsys):
    out = tmp_path / "compare"
    rows = [{"optimizer": "adamw", "val_loss": 4.679, "overhead_%": None},
            {"optimizer": "spectra-adamw", "val_loss": 4.264, "overhead_%": 13.95}]
    report("compare", rows, str(out), command="spectrakit compare", columns=["optimizer", "val_loss", "overhead_%"])
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- results:compare -->\nold table\n<!-- /results:compare -->\nend\n")
    assert main(["report", str(out / "results.json"), "--into", str(readme)]) == 0
    text = readme.read_text()
    assert "old table" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "| adamw | 4.679 | - |" in text and "| spectra-adamw | 4.264 | 13.95 |" in text
    assert "command: `spectrakit compare`" in text
    capsys.readouterr()
    assert main(["report", str(out / "results.json"), "--into", str(readme), "--name", "other"]) == 2
    assert capsys.readouterr().err.startswith("error: --into: no")
