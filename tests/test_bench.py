# Tests for bench.py. Run: python -m pytest tests/test_bench.py -q
# Reference: the bench's own second paths: the full-recompute generation must give the KV
# cache's tokens, and the per-sample autograd loop must give the hooks' inner products.
import re

import torch

import bench


def test_quick_bench_rows(capsys, tmp_path):
    rows = bench.main(["--quick=True", f"--base_ckpt={tmp_path / 'none.pt'}", f"--data_root={tmp_path}"])
    assert [r[0] for r in rows] == ["sampling", "step cost", "influence T=8"]
    assert "random weights" in rows[1][1] and float(rows[1][2].rstrip("x")) > 0
    assert "identical greedy tokens: True" in rows[0][1]
    err = float(re.search(r"hooks max rel err vs loop ([0-9.e+-]+)", rows[2][1]).group(1))
    assert err <= 1e-5
    assert all(r[4] in ("met", "MISSED") for r in rows)
    assert "| sampling |" in capsys.readouterr().out


def test_full_recompute_matches_kv_cache():
    from sample import generate
    model = bench.bench_model("cpu", 48)
    prompts = torch.randint(1, 394, (3, 8), generator=torch.Generator().manual_seed(1))
    idx, _, _ = generate(model, prompts.tolist(), 12, eot_id=-1, temperature=0)
    assert torch.equal(idx, bench.full_recompute_greedy(model, prompts, 12))
