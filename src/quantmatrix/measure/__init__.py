"""Measurements, apart from the verdicts that judge them (checks/): what vLLM's layers held after a load
(sentinel, findings, loaded), what the kernel really reads (observed), the model a checkpoint's files decode to
(dequant), and transformers' greedy output of a checkpoint (hf). A measurement is data: it never says whether that
is good; checks/ does, from the matrix's expectations."""
