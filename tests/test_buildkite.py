"""The CI test areas describe the real test groups."""

from __future__ import annotations

import os

from tools.check_test_areas import ROOT, check


def test_every_named_path_exists_and_every_test_has_an_area():
    problems, named = check()
    assert not problems, "\n".join(problems)
    assert "tests/v1/worker/gpu" in named  # the V2 area exists


def test_v2_area_has_no_enforce_eager_workaround():
    with open(os.path.join(ROOT, ".buildkite", "test_areas", "model_runner_v2.yaml")) as f:
        text = f.read()
    assert "ENFORCE_EAGER" not in text.replace("No ENFORCE_EAGER=1 workaround", "")
    assert "VLLM_USE_V2_MODEL_RUNNER=1" in text


def test_checker_catches_a_missing_path(tmp_path):
    areas = tmp_path / ".buildkite" / "test_areas"
    areas.mkdir(parents=True)
    (areas / "x.yaml").write_text("steps:\n- commands:\n  - pytest -q tests/nope.py\n")
    problems, _ = check(str(tmp_path))
    assert any("tests/nope.py does not exist" in p for p in problems)
