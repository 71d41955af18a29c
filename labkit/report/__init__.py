"""`labkit report`: the lab report a reviewer can verify.

    labkit report                          # runs/ -> runs/report/report.md, report.html, manifest.json, evidence.tar.gz
    labkit report --runs DIR --out DIR --title "chunked prefill, before/after" [--with-logs] [--json]
    labkit report verify runs/report/evidence.tar.gz

Modules: plan (workloads/labs.yaml, the labs and how their results are recognised), results (reading runs/:
results, inputs, UNREADABLE files), status (each lab's verdict and evidence, the caveats), figures (matplotlib
pictures), render (Markdown and self-contained HTML), archive (what travels, the manifest, provenance),
verify (re-checking an archive), command (the Typer commands).
"""
