# The bench's knobs refused in one line before any row, naming the bench's own key: shapes nested other than
# their defaults, sizes whose model context would be unbounded, and step_new_tokens beyond the step rows'
# context (which train_grpo would report as its max_new_tokens, a key the bench does not have).
# Run: python -m pytest -q tests/test_bench_knobs.py
import re

import pytest

from bench import run as bench
from configurator import UserError, cli_main
from test_bench import no_rows  # noqa: F401 (fixture: every row replaced by a spy)

HALF = [(4, 4, 128, 395), [4, 4, 128, 395], (((4, 4, 128, 395),),), ((4, 4, 128),), ((4, 4, 128, 395, 1),),
        ((4, 4, 128, 395), 4), ((4, 4, 0, 395),), ((4, 3, 128, 395),), ((True, 4, 128, 395),),
        (("4", 4, 128, 395),), ((4.0, 4, 128, 395),), ((4, 4, 128, None),), ((),), ()]
WIDE = [((6, 6, 384),), (6, 6), (6, 6, 384, 1), ((6,), (6,), (384,)), (6, 5, 384), (0, 6, 384), (6, True, 384),
        (6, 6, "384"), (6, 6, 384.0)]
SEQ = [((64,),), (64, (256,)), (0,), (True,), (64.0,), ()]


@pytest.mark.parametrize("key,value", [("half_shapes", v) for v in HALF] + [("posthoc_wide", v) for v in WIDE]
                         + [("seq_lens", v) for v in SEQ])
def test_a_shape_of_the_wrong_nesting_or_values_is_one_line(no_rows, capsys, key, value):  # noqa: F811
    with pytest.raises(SystemExit) as e:
        cli_main(bench.main, ["--quick", "--rows=sampling", f"--{key}={value!r}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"error: config key '{key}' = ") and err.count("\n") == 1, err
    assert no_rows == []


@pytest.mark.parametrize("key,value", [("half_shapes", ((4, 4, 128, 395),)), ("half_shapes", [[1, 2, 32, 64]]),
                                       ("half_shapes", ((1, 2, 32, 64), (2, 2, 64, 96))), ("posthoc_wide", ()),
                                       ("posthoc_wide", [2, 2, 64]), ("seq_lens", (8, 16))])
def test_well_nested_shapes_are_taken(no_rows, key, value):  # noqa: F811
    bench.main(["--quick", "--rows=sampling", f"--{key}={value!r}"])
    ((_, cfg),) = no_rows
    assert list(cfg[key]) == list(value)


@pytest.mark.parametrize("key,prompt", [("new_tokens", 32), ("seq_lens", 32), ("thr_new_tokens", 8),
                                        ("mem_new_tokens", 8)])
def test_new_tokens_are_bounded_by_the_context(no_rows, key, prompt):  # noqa: F811
    """--quick's prompts: sampling and influence 32 tokens, throughput and memory 8. At the bound the rows run."""
    most = bench.MAX_CONTEXT - prompt
    for n in (most + 1, 2 * bench.MAX_CONTEXT, 100_000):
        v = f"({n},)" if key == "seq_lens" else str(n)
        with pytest.raises(UserError, match=rf"config key '{key}' = .*{n}.* at most {bench.MAX_CONTEXT}: give at most "
                                            rf"{most} new tokens"):
            bench.main(["--quick", "--rows=sampling", f"--{key}={v}"])
    assert no_rows == []
    bench.main(["--quick", "--rows=sampling", f"--{key}={f'({most},)' if key == 'seq_lens' else most}"])
    assert len(no_rows) == 1


@pytest.mark.parametrize("rows", ["step_cost", "rewards", "sampling,rewards"])
def test_step_new_tokens_beyond_the_context_names_the_benchs_key(no_rows, rows):  # noqa: F811
    for n in (500, 100_000):
        with pytest.raises(UserError) as e:
            bench.main(["--quick", f"--rows={rows}", f"--step_new_tokens={n}"])
        msg = str(e.value)
        assert msg.startswith(f"config key 'step_new_tokens' = {n} is not allowed") and "max_new_tokens" not in msg
    assert no_rows == []
    room = int(re.search(r"--step_new_tokens=(\d+) or less", msg).group(1))
    with pytest.raises(UserError, match="step_new_tokens"):
        bench.main(["--quick", f"--rows={rows}", f"--step_new_tokens={room + 1}"])
    bench.main(["--quick", f"--rows={rows}", f"--step_new_tokens={room}"])  # the bound itself is taken
    assert [name for name, _ in no_rows] == rows.split(",")


@pytest.mark.parametrize("value", ["fast", "Default", "reduce_overhead"])
def test_an_unknown_compile_mode_is_one_line(no_rows, capsys, value):  # noqa: F811
    """--compile takes '' or a torch.compile mode; anything else is refused before any row (and any compile)."""
    with pytest.raises(SystemExit) as e:
        cli_main(bench.main, ["--quick", "--rows=vs_generate", f"--compile={value}"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: config key 'compile' = ") and "'default'" in err, err
    assert err.count("\n") == 1 and no_rows == []
    bench.main(["--quick", "--rows=vs_generate", "--compile=max-autotune-no-cudagraphs"])  # a mode torch has
    assert no_rows[0][1]["compile"] == "max-autotune-no-cudagraphs"
