"""Every vLLM-version-specific name quantmatrix touches, in one package.

vLLM's internals move between releases; the rest of quantmatrix speaks in behaviours (weight-only vs W4A4,
which tensor roles a backend reads) and asks these modules. When the installed vLLM no longer fits, they raise
AdapterMismatch: a check that cannot look must fail, never skip. Nothing here imports torch or vLLM at module
level, so collecting the suites stays free of both.
"""
