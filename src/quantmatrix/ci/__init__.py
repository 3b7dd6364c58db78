"""quantmatrix in other projects' CI: the Buildkite fragment for vLLM's pipeline (the GitHub Action for checkpoint
producers is action.yml at the repository root)."""
