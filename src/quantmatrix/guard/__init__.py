"""The production guard: a vLLM general plugin (`quantmatrix_guard`, quantmatrix.guard.plugin:register) that refuses to
serve a model whose kernels would read what the checkpoint never supplied. `record` notes what vLLM's weight loaders
wrote; `judge` checks every MoE and linear layer against its backend's read-set with the post-load audit's own
verdict code (measure.findings, checks.audit). Needs neither pytest nor a matrix."""
