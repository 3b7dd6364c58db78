"""The matrix: YAML -> cells (checkpoint x arch x mode) -> cases (a check applied to a cell).

The top of the data path: it imports nothing of quantmatrix but `errors`. The vocabularies other parts share
(lint codes, synthetic spec flags, tensor roles) are defined here and imported from here.
"""
