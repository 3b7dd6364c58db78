"""Verdicts: each check of suites/ is one function `(case, what was measured...) -> Verdict`, judged by the
plugin's one `judge`. A verdict names the cell, what was routed where, why that is wrong, and the numbers that
decided; the expectations come from the matrix, never from a literal scheme name."""
