import argparse
import json
import os

import pytest

from spectrakit.data.fashion_mnist import available
from spectrakit.experiments import conv_regularization as exp


@pytest.mark.skipif(not available(), reason="Fashion-MNIST missing: install `dataset-fashion-mnist`")
def test_smoke_run_writes_table_and_plot(tmp_path):
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    exp.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--epochs", "1", "--train-size", "128", "--test-size", "128",
                         "--widths", "4,8", "--regularizers", "none,tn,2norm"])
    assert exp.main(args) == 0
    res = json.load(open(os.path.join(tmp_path, "results.json")))
    assert [r["regularizer"] for r in res["rows"]] == ["none", "tn", "2norm"]
    for r in res["rows"]:
        assert 0.0 <= r["test_acc"] <= 1.0 and r["time_per_epoch_s"] > 0 and r["TN max"] >= r["TN mean"] > 0
    assert os.path.getsize(os.path.join(tmp_path, "bound_vs_epoch.png")) > 1000


def test_bad_regularizer_name():
    with pytest.raises(ValueError, match="regularizers"):
        exp.run(regularizers=("l1",))
