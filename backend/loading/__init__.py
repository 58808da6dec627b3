"""What a profile, hub id or folder becomes: a tokenizer and its chat template
(:mod:`~backend.loading.tokenizers`: the ``TokenizerBundle`` the engine, the checks and the UI use),
the models that need nothing from the Hub (:mod:`~backend.loading.models`: the embedded SmolLM2
and tiny random ones) and the text of a loaded tokenizer's ids (:mod:`~backend.loading.token_text`:
the token view's decoder). It sits on top of the families (it reads their tables and knows no
family by name) and the token core, and below the generators, the engine, the checks and the UI.
The family-agnostic machinery it loads with (vocabularies, rendering, templates) belongs in
:mod:`backend.tokens`; what a family declares belongs in :mod:`backend.families`.
"""
