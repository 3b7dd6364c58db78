"""The pytest plugin (entry points `pytest11: quantmatrix, quantmatrix_e2e`): matrix cases become pytest items
with markers, fixtures measure, and one `judge` turns each check's Verdict into the case's outcome and JUnit
properties. Settings are resolved once at configure time; caches live on one session object."""
