"""Isolated vLLM engine runs for the e2e tier: the parent-side runner and its session store, the child that
starts the engine, the poison general plugin that runs inside it, and the stored references.

runner and child share nothing but engine.protocol (file and environment names): the child never imports the
runner, and nothing here imports the checks that judge a run.
"""
