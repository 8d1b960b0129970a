# experiments/*.sh without training a model: a fake `python` first on PATH records each call's
# arguments (one per line) and plays the part of train_grpo.py (a checkpoint in --out_dir, or a stop
# with exit status 130 where $STOP_IN names the run) and analysis.attribute (its JSON). Checked: the same
# command again after a stop goes on (finished runs resumed to their end, the stopped one resumed
# or started) instead of refusing its own OUT; SEED / SEEDS / THREADS / OUT are checked before any
# work; an OUT with a space stays one argument.
# Run: python -m pytest tests/test_experiments_sh.py -q
import os
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ["countdown.sh", "countdown_defect.sh", "countdown_hack.sh", "defect.sh", "audit.sh",
           "threads.sh"]
FAKE = r"""#!/usr/bin/env bash
{ printf 'CALL'; printf ' <%s>' "$@"; echo; } >> "$CALLS"
out=""
for a in "$@"; do
  case "$a" in --out_dir=*) out=${a#--out_dir=};; --out_json=*) json=${a#--out_json=};; esac
done
case "$1" in
  train_grpo.py|train_base.py)
    if [ -n "${STOP_IN:-}" ] && [[ "$out" == *"$STOP_IN" ]]; then
      echo "interrupted" >&2; exit 130
    fi
    mkdir -p "$out" && touch "$out/ckpt.pt" && echo "${OMP_NUM_THREADS:-}" > "$out/threads"
    if [ "$1" = train_base.py ]; then echo "done: 8 iters in 1s, test accuracy 0.5"; fi ;;
  -c) case "$2" in *matplotlib*) exit 1;; *) echo "2.x";; esac ;;
  *) if [ "$1 $2" = "-m analysis.attribute" ]; then echo '{"result": {}}' | tr -d '\n' > "$json"; exit 0; fi
     if [ -n "${FAIL_TABLE:-}" ]; then echo "table failed" >&2; exit 1; fi; echo "| table |" ;;
esac
"""


@pytest.fixture
def fake(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(FAKE)
    (bin_dir / "python").chmod(0o755)
    calls = tmp_path / "calls.txt"

    def run(script, **env):
        calls.write_text("")
        e = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls), **env}
        r = subprocess.run(["bash", os.path.join(ROOT, "experiments", script)], env=e,
                           capture_output=True, text=True, timeout=60)
        return r, [line for line in calls.read_text().splitlines() if "train_grpo.py" in line or
                   "analysis.attribute" in line]
    return run


@pytest.mark.parametrize("script", SCRIPTS + ["common.sh"])
def test_every_script_parses(script):
    assert subprocess.run(["bash", "-n", os.path.join(ROOT, "experiments", script)]).returncode == 0


def test_countdown_goes_on_after_a_stop(fake, tmp_path):
    out = str(tmp_path / "demo")
    r, calls = fake("countdown.sh", OUT=out, SEED="7", STOP_IN="/tracin")
    assert r.returncode == 130, r.stderr
    assert "run the same command again" in r.stderr.splitlines()[-1], r.stderr
    assert [c.endswith(f"<--out_dir={out}/grpo>") for c in calls] == [True, False]
    r, calls = fake("countdown.sh", OUT=out, SEED="7")  # the same command again: not refused
    assert r.returncode == 0, r.stderr
    assert calls[0] == (f"CALL <train_grpo.py> <config/countdown_grpo.py> <--seed=7> "
                        f"<--out_dir={out}/grpo> <--init_from=resume>")
    assert calls[1] == (f"CALL <train_grpo.py> <config/countdown_tracin.py> <--seed=7> "
                        f"<--out_dir={out}/tracin>")
    # and once more: both runs resumed (to their end)
    r, calls = fake("countdown.sh", OUT=out, SEED="7")
    assert r.returncode == 0 and all(c.endswith("<--init_from=resume>") for c in calls)


def test_a_run_stopped_before_its_first_checkpoint_is_named_with_the_fix(fake, tmp_path):
    out = tmp_path / "demo"
    fake("countdown.sh", OUT=str(out), STOP_IN="/grpo")
    (out / "grpo").mkdir()
    (out / "grpo" / "log.jsonl").write_text("{}\n")
    r, calls = fake("countdown.sh", OUT=str(out))
    assert r.returncode == 2 and not calls
    assert r.stderr.strip() == (f"error: {out}/grpo holds a run stopped before its first "
                                f"checkpoint: remove it (rm -r '{out}/grpo'), then run the same "
                                "command again")


def test_an_out_with_a_space_stays_one_argument(fake, tmp_path):
    out = str(tmp_path / "my runs" / "cd defect")
    r, calls = fake("countdown_defect.sh", OUT=out, SEEDS="3  4")
    assert r.returncode == 0, r.stderr
    expected = [f"{out}/{k}_s{s}>" for s in (3, 4) for k in ("grpo", "nll")]
    assert [c.split("<--out_dir=")[1] for c in calls] == expected
    assert os.path.isfile(os.path.join(out, "summary.md"))


def test_the_hack_script_trains_every_method_on_the_hackable_verifier(fake, tmp_path):
    """Three runs per seed, each on the claim verifier with the exact reward at weight 0; TracIn
    'pg' on 4 validation prompts; the tables over every run, in the order grpo, pg, nll."""
    out = str(tmp_path / "hack")
    r, calls = fake("countdown_hack.sh", OUT=out, SEEDS="5 6")
    assert r.returncode == 0, r.stderr
    assert [c.split("<--out_dir=")[1] for c in calls] == \
        [f"{out}/{k}_s{s}>" for s in (5, 6) for k in ("grpo", "pg", "nll")]
    hack = "<--reward_funcs=('countdown_claim', 'think_format', 'countdown')> " \
           "<--reward_weights=(1.0, 0.1, 0.0)> <--beta=0.0>"
    assert all(hack in c for c in calls)
    assert all(("<--tracin_val_loss=pg> <--tracin_val_batch_size=4>" in c) == ("/pg_" in c)
               for c in calls)
    assert all(("config/countdown_grpo.py" in c) == ("/grpo_" in c) for c in calls)
    summary = open(os.path.join(out, "summary.md")).read()
    assert "countdown_hack.sh, commit" in summary and "| table |" in summary


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("key, value, said", [
    ("SEEDS", "1 2 x", '"x" is not a whole number'), ("SEEDS", "  ", "SEEDS is empty"),
    ("SEEDS", "*", '"*"'),
    ("SEEDS", "1,2", '"1,2"'), ("SEEDS", "-1", '"-1"'), ("SEEDS", "1;ls", '"1;ls"'),
    ("SEED", "1 2 3", 'SEED="1 2 3" is not allowed'), ("SEED", "", 'SEED="" is not allowed'),
    ("SEED", "1.5", "give one whole number"), ("THREADS", "two", 'THREADS="two" is not allowed'),
    ("SEED", "007", "no leading zeros"), ("SEED", "12345678901", "to 999999999"),
    ("THREADS", "0", "from 1 to"), ("SEEDS", "1 2 1", "1 is given twice"), ("SEEDS", "08", '"08"'),
    ("THREADS", "", 'THREADS="" is not allowed'), ("OUT", "-x", "starts with '-'")])
def test_bad_arguments_are_refused_before_any_work(fake, tmp_path, script, key, value, said):
    uses = {"countdown.sh": ("SEED", "OUT"), "countdown_defect.sh": ("SEEDS", "THREADS", "OUT"),
            "countdown_hack.sh": ("SEEDS", "THREADS", "OUT"),
            "defect.sh": ("SEEDS", "THREADS", "OUT"),
            "audit.sh": ("SEEDS", "THREADS", "OUT"), "threads.sh": ("THREADS", "OUT")}[script]
    if key not in uses:
        pytest.skip(f"{script} takes no {key}")
    (tmp_path / "runs").mkdir()
    env = {"OUT": str(tmp_path / "out"), "RUNS": str(tmp_path / "runs"), key: value}
    if key == "THREADS" and value == "":
        env["THREADS"] = " "  # (an empty one is the default)
        said = 'THREADS=" " is not allowed'
    if key == "SEED" and value == "":
        pytest.skip("an empty SEED is the default")
    r, calls = fake(script, **env)
    assert r.returncode == 2 and not calls and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: ") and said in r.stderr, r.stderr
    assert not os.path.exists(env["OUT"]) or key == "OUT"


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_out_this_script_did_not_make_is_refused(fake, tmp_path, script):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (tmp_path / "runs").mkdir()
    r, calls = fake(script, OUT=str(out), RUNS=str(tmp_path / "runs"))
    assert r.returncode == 2 and not calls
    assert f"OUT={out} exists and was not made by experiments/{script}" in r.stderr
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_audit_keeps_the_audits_already_written(fake, tmp_path):
    runs, out = tmp_path / "cmp C", tmp_path / "audit out"
    for run in ("grpo_s1", "grpo_s2", "nll_s1", "nll_s2", "pg_s1", "pg_s2"):
        (runs / run).mkdir(parents=True)
    r, calls = fake("audit.sh", RUNS=str(runs), OUT=str(out), SEEDS="1 2", VARIANT_RUN="grpo_s2")
    assert r.returncode == 0, r.stderr
    assert len(calls) == 2 + 2 + 2 + 3 + 4 and f"<--out_dir={runs}/grpo_s1>" in calls[0]
    # cut off by a stop: done again
    (out / "grpo_s2__audit64.json").write_text('{"result": {"scores"')
    r, calls = fake("audit.sh", RUNS=str(runs), OUT=str(out), SEEDS="1 2", VARIANT_RUN="grpo_s2")
    assert r.returncode == 0 and [c.split("<--out_json=")[1].split(">")[0] for c in calls] == \
        [f"{out}/grpo_s2__audit64.json"]
    r, _ = fake("audit.sh", RUNS=str(tmp_path / "none"), OUT=str(tmp_path / "o2"))
    assert r.returncode == 2 and "RUNS=" in r.stderr and "is not a directory" in r.stderr
    r, _ = fake("audit.sh", RUNS=str(runs), OUT=str(tmp_path / "o3"), VARIANT_RUN="x; rm -r /")
    assert r.returncode == 2 and "VARIANT_RUN=" in r.stderr


def test_defect_writes_its_figure_into_out_not_over_the_readme_asset(fake, tmp_path):
    fig = os.path.join(ROOT, "assets", "tracin_vs_grpo.png")
    before = open(fig, "rb").read() if os.path.exists(fig) else None
    r, calls = fake("defect.sh", OUT=str(tmp_path / "c"), SEEDS="4 5 6 7")
    assert r.returncode == 0 and len(calls) == 12, r.stderr
    assert (open(fig, "rb").read() if before is not None else None) == before
    script = open(os.path.join(ROOT, "experiments", "defect.sh")).read()
    assert '--out="$OUT/tracin_vs_grpo.png"' in script
    assert "assets/tracin_vs_grpo.png --" not in script


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_argument_is_refused_settings_go_in_the_environment(fake, tmp_path, script):
    """Before: `bash experiments/defect.sh 7 8` started the whole experiment, the 7 and 8 unread."""
    (tmp_path / "runs").mkdir()
    r = subprocess.run(["bash", os.path.join(ROOT, "experiments", script), "7", "8"],
                       env={**os.environ, "OUT": str(tmp_path / "o"), "RUNS": str(tmp_path / "runs")},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(f"error: experiments/{script} takes no "
                                                     "arguments (given: 7 8)"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not os.path.exists(tmp_path / "o")


def test_without_python_on_the_path_nothing_is_made(tmp_path):
    tools = tmp_path / "tools"
    tools.mkdir()
    for tool in ("dirname", "basename"):  # what the scripts run before their checks
        os.symlink(subprocess.run(["which", tool], capture_output=True, text=True).stdout.strip(),
                   tools / tool)
    r = subprocess.run(["/bin/bash", os.path.join(ROOT, "experiments", "defect.sh")],
                       env={"PATH": str(tools), "OUT": str(tmp_path / "o")}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("error: no python on PATH"), r.stderr
    assert len(r.stderr.splitlines()) == 1 and not os.path.exists(tmp_path / "o")


@pytest.mark.parametrize("script", ["defect.sh", "countdown.sh", "countdown_defect.sh"])
def test_a_failed_table_keeps_the_summary_written_before(fake, tmp_path, script):
    out = tmp_path / "o"
    r, _ = fake(script, OUT=str(out), SEEDS="1")
    assert r.returncode == 0, r.stderr
    before = (out / "summary.md").read_text()
    assert "| table |" in before
    r, _ = fake(script, OUT=str(out), SEEDS="1", FAIL_TABLE="1")
    assert r.returncode == 2 and "summary.md is left as it was" in r.stderr.splitlines()[-1]
    assert (out / "summary.md").read_text() == before
    assert sorted(os.listdir(out)) == sorted(n for n in os.listdir(out) if not n.endswith(".tmp"))


def test_audit_names_a_run_its_runs_directory_lacks(fake, tmp_path):
    runs = tmp_path / "runs"
    for run in ("grpo_s1", "nll_s1", "grpo_s3"):
        (runs / run).mkdir(parents=True)
    r, calls = fake("audit.sh", RUNS=str(runs), OUT=str(tmp_path / "o"), SEEDS="1")
    assert r.returncode == 2 and not calls
    assert r.stderr.strip() == (f"error: RUNS={runs} holds no run pg_s1: give the OUT of "
                                "experiments/defect.sh run with these SEEDS, e.g. RUNS=out/cmpC")



def test_threads_trains_a_base_and_the_demo_at_each_thread_count(fake, tmp_path):
    """Per thread count, in the order given: the base into its own directory, then TracIn-GRPO on
    that base, both at that count; after a stop the same command resumes what was started."""
    out = str(tmp_path / "thr eads")
    r, _ = fake("threads.sh", OUT=out, THREADS="2 1", STOP_IN="/tracin_t1")
    assert r.returncode == 130, r.stderr
    r, _ = fake("threads.sh", OUT=out, THREADS="2 1")
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    base = "CALL <train_base.py> <config/tiny_base.py> <--out_dir={}/base_t{}> <--init_from=resume>"
    tracin = ("CALL <train_grpo.py> <config/tiny_tracin.py> <--base_ckpt={0}/base_t{1}/ckpt.pt> "
              "<--out_dir={0}/tracin_t{1}>")
    assert calls[:4] == [base.format(out, 2), tracin.format(out, 2) + " <--init_from=resume>",
                         base.format(out, 1), tracin.format(out, 1)]
    for run, n in [("base_t2", 2), ("tracin_t2", 2), ("base_t1", 1), ("tracin_t1", 1)]:
        assert open(os.path.join(out, run, "threads")).read().strip() == str(n)
    summary = open(os.path.join(out, "summary.md")).read()
    assert "threads.sh, commit" in summary and "2,1 thread(s)" in summary
    assert "- 2 thread(s): done: 8 iters" in summary and "| table |" in summary


@pytest.mark.parametrize("threads, said", [("1 1", "1 is given twice"), ("1,2", '"1,2" is not'),
                                           ("2 0", '"0" is not a whole number from 1')])
def test_threads_refuses_a_bad_list_of_counts(fake, tmp_path, threads, said):
    r, calls = fake("threads.sh", OUT=str(tmp_path / "o"), THREADS=threads)
    assert r.returncode == 2 and not calls and said in r.stderr, r.stderr
    assert not os.path.exists(tmp_path / "o")
