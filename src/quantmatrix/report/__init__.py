"""The nightly report: every runner's JUnit file merged, diffed against last night, written for people.

Data flows one way, one module per step:

    read       each JUnit file -> rows (worker processes when there are many files); bad files named
    build      rows -> folded cases (reruns and split entries combined), each diffed as it arrives, then
               the cross-arch comparison -> model.NightReport
    diff       last night's summary.json -> history, tags (new failure, fixed, coverage lost, flaky, ...)
    crossarch  greedy tokens of one checkpoint/mode/check compared across archs
    write      summary.json (build.summary_json), matrix.md (render_md), index.html (render_html)

`model` holds the types they share and imports nothing of the package; `quantmatrix report` (cli/report.py)
runs the whole path. Exit code: 0 nothing is red (failing, still failing, untested or lost), 1 something is.
"""
