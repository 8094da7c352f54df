import argparse
import json
import os

from spectrakit.experiments import conv_bounds as exp


def test_small_run_writes_table(tmp_path):
    p = argparse.ArgumentParser()
    p.add_argument("--out")
    exp.add_arguments(p)
    args = p.parse_args(["--out", str(tmp_path), "--channels", "16", "--kernel-sizes", "3,5", "--input-size", "12",
                         "--exact-iters", "200", "--device", "cpu"])
    assert exp.main(args) == 0
    rows = json.load(open(os.path.join(tmp_path, "results.json")))["rows"]
    assert [r["kernel"] for r in rows] == ["16,16,3,3", "16,16,5,5"]
    for r in rows:
        assert 1.0 - 1e-3 <= r["TN/exact"] <= r["F4/exact"] and r["TN/exact"] <= 5.0
