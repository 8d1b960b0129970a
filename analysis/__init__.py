"""Looking at finished runs: post-hoc attribution's command line, the audit, the report and the figures.

    attribute.py  python -m analysis.attribute --out_dir=RUN --question=...; find_critical_samples (tracin.tracin_cp)
    audit.py      --audit=N's parts: which rollouts taught the final model's first N wrong test answers
    report.py     the HTML page of an attribution or audit
    plot.py       python -m analysis.plot RUN...: reward, accuracy, selection rate, step time; the influence figure
    summarize.py  python -m analysis.summarize RUN...: a Markdown table comparing runs
    countdown_demo.py  the demo figure: curves and greedy answers before and after training
    outputs.py    the files they write where a user names them: never a file they did not write

Where it plugs in: these read a run directory (checkpoints, log.jsonl, rollouts.jsonl) and call the
lecture's tracin.tracin_cp and model.generate; nothing here runs during training.
"""
