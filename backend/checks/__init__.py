"""What we conclude from traces that already exist: findings with their step and token position
(:mod:`~backend.checks.diagnostics`), the re-render audit of many rollouts
(:mod:`~backend.checks.audit`), a stored loss mask against its ids' structure
(:mod:`~backend.checks.mask_audit`), the logprob lens (:mod:`~backend.checks.logprobs`), GRPO
groups side by side (:mod:`~backend.checks.groups`), end states in words for people
(:mod:`~backend.checks.labels`) and the bounded-time sequence diff they use
(:mod:`~backend.checks.seqdiff`). Checks read traces and, for the token-level ones, the tokenizer
and the template; they never run a loop, read a file format or write one, so the engine,
generators, importers and exporters do not belong here (and nothing below the checks imports them).
"""
